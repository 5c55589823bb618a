"""The eval job: BioVITA text-to-image taxon retrieval scored from embedding shards, equal to mteb's
`BioVITAT2IReranking`.

Per subset, on the top-k engine (mieb_ray/topk): a task reads the corpus' id and taxon columns into a key lookup
(corpus id -> doc, taxon); the image embeddings are laid out once in taxon-aligned partitions through it; a task
reads top_ranked into each query block's sparse pools and candidate taxon ids, another the query texts'
embeddings; score tasks (query block x partition) give every query's max over each candidate taxon's photos in
its pool (CandidateMax), merged in a tree. The driver holds the query side and the final (Q x 100) maxima:
ranks, top-k accuracy, and the outputs (results JSON in the layout of mteb's TaskResult, per-query ranks, an
HTML report). It never reads an image embedding.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from mieb_ray import __version__, storage
from mieb_ray.errors import UserError, find_user_error
from mieb_ray.io import embeddings
from mieb_ray.retrieval import biovita
from mieb_ray.retrieval.groupmax import NEG, rank_of, ranked
from mieb_ray.topk import engine
from mieb_ray.topk.kernels import CandidateMax, Candidates

K_VALUES = (1, 5, 10)
MTEB_VERSION = "2.26.24"  # the scorer we equal
RESULTS_FILE = f"{biovita.TASK}.json"


@dataclass(frozen=True)
class EvalConfig:
    """One eval-biovita job's settings."""

    data: str  # "hf" or a mirror root
    image_embeddings: str  # embed output of the corpus photos, keyed by corpus id
    text_embeddings: str  # embed output of the query texts, keyed by the text
    out: str
    subsets: tuple[str, ...] = biovita.SUBSETS
    query_block: int = 256  # queries per score task
    partitions: int | None = None  # taxon-aligned corpus partitions (None: the engine's default)
    gallery: int = 12  # query cards per subset in the report


def scored_queries(q: biovita.Queries) -> biovita.Queries:
    """The queries mteb counts: those with qrels (`_filter_queries_without_positives`)."""
    keep = [i for i, qid in enumerate(q.query_ids) if qid in q.qrels]
    if not keep:
        raise UserError(f"BioVITA subset {q.name}: no query has relevant images (qrels)")
    if len(keep) == len(q.query_ids):
        return q
    pick = lambda xs: [xs[i] for i in keep]  # noqa: E731
    return biovita.Queries(q.name, pick(q.query_ids), pick(q.query_texts), pick(q.correct_taxa),
                           pick(q.candidate_taxa), q.qrels)


def subset_scores(best: np.ndarray, correct: np.ndarray) -> tuple[dict, np.ndarray]:
    ranks = rank_of(best, correct)
    scores = {f"taxon_top_{k}_accuracy": float((ranks <= k).mean()) if len(ranks) else 0.0 for k in K_VALUES}
    return scores, ranks


def task_result(scores: dict[str, dict], seconds: float, phases: list[dict]) -> dict:
    """mteb's TaskResult layout, as `TaskResult.to_disk` writes it (floats rounded to 6 decimals). Only the
    taxon metrics: mteb's document-level ones (ndcg, recall...) are not BioVITA's measure."""
    entries = [{**{k: round(v, 6) for k, v in s.items()}, "main_score": round(s["taxon_top_1_accuracy"], 6),
                "hf_subset": name, "languages": ["eng-Latn"], "mteb_version": MTEB_VERSION}
               for name, s in scores.items()]
    return {"dataset_revision": biovita.REVISION, "task_name": biovita.TASK, "mteb_version": MTEB_VERSION,
            "scores": {biovita.SPLIT: entries}, "evaluation_time": round(seconds, 6), "kg_co2_emissions": None,
            "date": time.time(), "evaluation_phases": phases}


# ---------------------------------------------------------------------------------------------- tasks


@ray.remote(num_cpus=1, num_returns=3)
def _corpus(data: str, name: str):
    """The key lookup (corpus id -> doc = row, group = taxon id), the taxon vocabulary, the photo count."""
    ids, taxa = biovita.read_corpus(data, name)
    vocabulary, groups = biovita.taxon_ids(taxa)
    return engine.KeyLookup(pa.array(ids, pa.string()), np.arange(len(ids), dtype=np.int64), groups), \
        vocabulary, len(ids)


@ray.remote(num_cpus=1)
def _candidates(data: str, name: str, query_ids: list[str], candidate_taxa: list[list[str]],
                blocks: list[tuple[int, int]], lookup: engine.KeyLookup, vocabulary: list[str]):
    """Per query block: candidate taxon ids and the top_ranked pools as CSR of docs."""
    indptr, positions = biovita.pool_positions(data, name, query_ids, lookup.keys)  # doc = corpus position
    indptr, docs = biovita.pool_csr(indptr, positions, len(lookup.docs))
    groups = biovita.candidate_groups(candidate_taxa, vocabulary)
    out = [Candidates(groups[a:b], indptr[a:b + 1] - indptr[a], docs[indptr[a]:indptr[b]]) for a, b in blocks]
    return out if len(out) > 1 else out[0]


@ray.remote(num_cpus=1)
def _query_vectors(uri: str, blocks: list[list[str]], what: str):
    """The dim, then per block the (q, d) float32 embeddings of its texts (text embeddings keyed by text)."""
    tables = [embeddings.open_shard(u) for u in embeddings.shard_uris(uri)]
    dims = sorted({t["embedding"].type.list_size for t in tables})
    if len(dims) > 1:
        raise storage.StorageError(f"{storage.display(uri)} mixes embedding dimensions {dims}")
    where = {}
    for n, table in enumerate(tables):
        where.update({k: (n, r) for r, k in enumerate(table["key"].to_pylist())})
    duplicates = sum(t.num_rows for t in tables) - len(where)
    if duplicates:
        raise UserError(f"{storage.display(uri)} holds {duplicates} duplicate keys")
    missing = [k for k in dict.fromkeys(t for b in blocks for t in b) if k not in where]
    if missing:
        shown = ", ".join(repr(k) for k in missing[:5])
        raise UserError(f"{len(missing)} {what} have no embedding in {storage.display(uri)} (e.g. {shown})")
    matrices = [embeddings.matrix(t) for t in tables]
    return [dims[0] if dims else 0,
            *(np.stack([matrices[where[k][0]][where[k][1]] for k in b]).astype(np.float32) for b in blocks)]


@ray.remote(num_cpus=1)
def _photos(data: str, name: str, docs: list[int]) -> dict[int, tuple[str, bytes | None]]:
    """Corpus id and image bytes of a few docs (rows of the corpus), for the report."""
    ids, _ = biovita.read_corpus(data, name)
    wanted = {d: ids[d] for d in docs}
    images = biovita.read_images(data, name, set(wanted.values()))
    return {d: (i, images.get(i)) for d, i in wanted.items()}


def _get(refs):
    """ray.get, a UserError raised in a task re-raised as itself (one line, no task traceback)."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        user = find_user_error(exc.cause) if exc.cause is not None else None
        if user is None:
            raise
        raise user from None


# ---------------------------------------------------------------------------------------------- the job


@dataclass
class _Run:
    """One subset in flight: refs and the query side."""

    queries: biovita.Queries
    layout: engine.Layout
    dim: object  # ref: the text embeddings' dim
    results: list  # refs: per query block, (scores, docs) (q, 100)
    photos: object  # ref: the corpus size
    start: float


def _submit(config: EvalConfig, q: biovita.Queries, image_shards: list[str], t_score: float) -> _Run:
    start = time.time() - t_score
    lookup, vocabulary, n_photos = _corpus.remote(config.data, q.name)
    lay = engine.layout(image_shards, lookup=lookup, partitions=config.partitions)
    n = len(q.query_ids)
    blocks = [(a, min(a + config.query_block, n)) for a in range(0, n, config.query_block)]
    vectors = _query_vectors.options(num_returns=len(blocks) + 1).remote(
        config.text_embeddings, [q.query_texts[a:b] for a, b in blocks], f"{q.name} query texts")
    data = _candidates.options(num_returns=len(blocks)).remote(
        config.data, q.name, q.query_ids, q.candidate_taxa, blocks, lookup, vocabulary)
    data = data if len(blocks) > 1 else [data]
    return _Run(q, lay, vectors[0], engine.search(lay, vectors[1:], CandidateMax(), data), n_photos, start)


def _check(config: EvalConfig, run: _Run) -> None:
    """The one-line errors, in order: query texts, corpus photos, dimensions."""
    text_dim = _get(run.dim)
    n, sample, duplicates = engine.missing_keys(run.layout)
    where = storage.display(config.image_embeddings)
    if n:
        raise UserError(f"{n} {run.queries.name} corpus ids have no embedding in {where} "
                        f"(e.g. {', '.join(repr(k) for k in sample)})")
    if duplicates:
        raise UserError(f"{where} holds {duplicates} duplicate keys")
    image_dim = run.layout.stats()["dim"]
    if isinstance(image_dim, list):
        raise storage.StorageError(f"{where} mixes embedding dimensions {image_dim}")
    if text_dim != image_dim:
        raise UserError(f"text embeddings have dim {text_dim} but image embeddings dim {image_dim} "
                        f"({storage.display(config.text_embeddings)} vs {where})")


def evaluate(config: EvalConfig, log=print) -> dict:
    """Score the embeddings on the subsets; write results JSON, per-query ranks and the HTML report."""
    t0 = time.time()
    c = config
    storage.check_output(c.out)
    queries = {name: scored_queries(biovita.load_queries(c.data, name)) for name in c.subsets}
    image_shards = embeddings.shard_uris(c.image_embeddings)  # the manifest's list: no shard is opened here
    t_score = time.time()
    runs = {name: _submit(c, q, image_shards, t_score) for name, q in queries.items()}
    photos = dict(zip(runs, _get([r.photos for r in runs.values()])))
    log(f"[eval] {', '.join(f'{n}: {len(r.queries.query_ids)} queries, {photos[n]} images' for n, r in runs.items())}")
    scores, per_query, tops, phases = {}, [], {}, []
    for name, run in runs.items():
        _check(c, run)
        q = run.queries
        merged = _get(run.results)
        best, docs = np.concatenate([s for s, _ in merged]), np.concatenate([d for _, d in merged])
        correct = np.array([cands.index(t) for cands, t in zip(q.candidate_taxa, q.correct_taxa)])
        scores[name], ranks = subset_scores(best, correct)
        tops[name] = (best, docs, ranks)
        per_query += [{"subset": name, "query_id": i, "text": t, "correct_taxon": ct, "rank": int(r)}
                      for i, t, ct, r in zip(q.query_ids, q.query_texts, q.correct_taxa, ranks)]
        phases.append({"name": "Scoring", "start": run.start, "end": time.time() - t_score, "split": biovita.SPLIT,
                       "subset": name})
        stats = run.layout.stats()
        log(f"[eval] {name}: " + ", ".join(f"top-{k} {scores[name][f'taxon_top_{k}_accuracy']:.4f}" for k in K_VALUES)
            + f" ({stats['matched']:,} photos in {stats['partitions']} partitions; image shards read "
              f"{stats['read_ratio']:.2f}x)")
    seconds = time.time() - t_score
    task_score = float(np.mean([s["taxon_top_1_accuracy"] for s in scores.values()]))
    result = task_result(scores, seconds, phases)
    models = {k: (storage.read_manifest(u) or {}).get("model")
              for k, u in (("image", c.image_embeddings), ("text", c.text_embeddings))}
    result["mieb_ray"] = {
        "version": __version__, "task_score": task_score, "data": storage.display(c.data),
        "image_embeddings": {"uri": storage.display(c.image_embeddings), "model": models["image"]},
        "text_embeddings": {"uri": storage.display(c.text_embeddings), "model": models["text"]},
        "queries": {n: len(q.query_ids) for n, q in queries.items()},
    }
    storage.delete(storage.join(c.out, storage.MANIFEST))  # a rerun replaces the outputs: none complete until it ends
    storage.write_bytes(storage.join(c.out, RESULTS_FILE), (json.dumps(result, indent=2) + "\n").encode())
    _write_ranks(c.out, per_query)
    _write_report(c, queries, tops, scores, result)
    storage.write_manifest(c.out, {"format": "mieb-biovita-eval", "format_version": 1, "version": __version__,
                                   "files": [RESULTS_FILE, "ranks.parquet", "report.html"],
                                   "task_score": task_score})
    log(f"[eval] task score (mean top-1) {task_score:.4f}; scoring {seconds:.2f}s; total {time.time() - t0:.1f}s "
        f"-> {storage.display(c.out)}")
    return result


def embed_biovita(data: str, model: str, revision: str | None, out: str, log=print, **pools) -> tuple[str, str]:
    """Embed the corpus images (keyed by id) and the distinct query texts (keyed by the text) with the embed
    pipeline, into OUT/embeddings/; an output already complete there for this model is reused. `pools`: the
    embed job's workers, gpus_per_worker, cpus_per_worker."""
    from mieb_ray.pipelines.embed import EmbedConfig, embed

    root = storage.join(out, "embeddings")
    first, *others = biovita.SUBSETS
    corpus = {name: set(biovita.read_corpus(data, name)[0]) for name in biovita.SUBSETS}  # ids only
    for name in others:  # the hub's subsets share one corpus of photos, by id
        if corpus[name] - corpus[first]:
            raise UserError(f"BioVITA subset {name} has photos that {first} lacks; embed each corpus apart")
    texts = sorted({t for name in biovita.SUBSETS for t in biovita.load_queries(data, name).query_texts})
    queries = storage.join(root, "_queries", "queries.parquet")
    local = storage.staging_path(queries)
    pq.write_table(pa.table({"key": texts, "text": texts}), local)
    storage.commit(local, queries)
    corpus = biovita.corpus_files(data, first)
    folder = corpus[0].rsplit("/", 1)[0]
    targets = {"image": (folder, storage.join(root, "images")), "text": (queries, storage.join(root, "texts"))}
    for modality, (source, target) in targets.items():
        done = storage.read_manifest(target)
        if done and done.get("model", {}).get("name") == model:
            log(f"[eval] reusing {modality} embeddings at {storage.display(target)}")
            continue
        embed(EmbedConfig(source, target, model, revision=revision, modality=modality,
                          key_column="key" if modality == "text" else "id", overwrite=True, **pools), log=log)
    return targets["image"][1], targets["text"][1]


def _write_ranks(out: str, rows: list[dict]) -> None:
    dest = storage.join(out, "ranks.parquet")
    local = storage.staging_path(dest)
    pq.write_table(pa.Table.from_pylist(rows), local)
    storage.commit(local, dest)


def _write_report(config: EvalConfig, queries, tops, scores, result) -> None:
    """The report's gallery: per subset the first queries' top-5 taxa, each with its best photo in the query's
    pool (the doc CandidateMax found; smallest doc on ties), read by one small task per subset."""
    from mieb_ray.retrieval.report import render

    cards, photo_refs = [], {}
    for name, q in queries.items():
        best, docs, ranks = tops[name]
        shown = min(config.gallery, len(q.query_ids))
        top = ranked(best[:shown], 5)
        wanted = sorted({int(docs[i, p]) for i in range(shown) for p in top[i] if docs[i, p] >= 0})
        photo_refs[name] = _photos.remote(config.data, name, wanted) if wanted else None
        cards += [(name, i, top[i]) for i in range(shown)]
    photos = {name: _get(ref) if ref is not None else {} for name, ref in photo_refs.items()}
    gallery, images = [], {}
    for name, i, top in cards:
        q, (best, docs, ranks) = queries[name], tops[name]
        items = []
        for pos in top:
            doc = int(docs[i, pos])
            best_id, image = photos[name].get(doc, (None, None))
            if image is not None:
                images[best_id] = image
            items.append({"taxon": q.candidate_taxa[i][pos],
                          "score": None if best[i, pos] == NEG else float(best[i, pos]), "best_id": best_id})
        gallery.append({"subset": name, "query_id": q.query_ids[i], "text": q.query_texts[i],
                        "correct_taxon": q.correct_taxa[i], "rank_of_correct": int(ranks[i]), "top": items})
    summary = {"task_score": result["mieb_ray"]["task_score"], "evaluation_time": result["evaluation_time"],
               "model": result["mieb_ray"]["image_embeddings"]["model"] or {},
               "subsets": {n: {**s, "queries": len(queries[n].query_ids)} for n, s in scores.items()}}
    storage.write_bytes(storage.join(config.out, "report.html"), render(summary, gallery, images).encode())
