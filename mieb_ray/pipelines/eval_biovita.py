"""The eval job: BioVITA text-to-image taxon retrieval scored from embedding shards, equal to mteb's
`BioVITAT2IReranking`.

Per subset: query blocks x corpus blocks are Ray tasks (the corpus cut at taxon boundaries); each returns
its partial maxima of every query's 100 candidate taxa, which combine by `max`; ranks and top-k accuracy
follow. Outputs: the results JSON in the layout of mteb's TaskResult, per-query ranks, an HTML report.
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
from mieb_ray.errors import UserError
from mieb_ray.io import embeddings
from mieb_ray.retrieval import biovita
from mieb_ray.retrieval.groupmax import NEG, candidate_maxima, cosines, normalize, rank_of, ranked

K_VALUES = (1, 5, 10)
MTEB_VERSION = "2.26.24"  # the scorer we equal
RESULTS_FILE = f"{biovita.TASK}.json"


@dataclass
class Lookup:
    """Embeddings by key, from one embedding output."""

    index: dict[str, int]
    matrix: np.ndarray
    manifest: dict
    uri: str

    def take(self, keys: list[str], what: str) -> np.ndarray:
        missing = [k for k in dict.fromkeys(keys) if k not in self.index]
        if missing:
            shown = ", ".join(repr(k) for k in missing[:5])
            raise UserError(f"{len(missing)} {what} have no embedding in {storage.display(self.uri)} "
                            f"(e.g. {shown})")
        return self.matrix[[self.index[k] for k in keys]]


def load_lookup(uri: str) -> Lookup:
    keys, matrix = embeddings.read_all(uri)
    index = {k: i for i, k in enumerate(keys)}
    if len(index) != len(keys):
        raise UserError(f"{storage.display(uri)} holds {len(keys) - len(index)} duplicate keys")
    return Lookup(index, matrix, storage.read_manifest(uri) or {}, uri)


@dataclass
class Prepared:
    """One subset as arrays: queries, the corpus cut into taxon-aligned blocks, candidates and pools."""

    queries: np.ndarray  # (q, d) normalised
    docs: np.ndarray  # (n, d) normalised, corpus order
    doc_taxon: np.ndarray  # (n,) taxon id per doc
    blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (docs (n, d) normalised, taxon id (n,), doc index (n,))
    n_taxa: int
    candidates: np.ndarray  # (q, 100) taxon ids, -1 for a taxon without photos
    correct: np.ndarray  # (q,) position of the correct taxon among the candidates
    pools: list[np.ndarray]  # per query: doc indices of its top_ranked pool
    pool: np.ndarray  # (q, n) bool: the same pools as a matrix


def scored_queries(subset: biovita.Subset) -> biovita.Subset:
    """The queries mteb counts: those with qrels (`_filter_queries_without_positives`)."""
    keep = [i for i, q in enumerate(subset.query_ids) if q in subset.qrels]
    if not keep:
        raise UserError(f"BioVITA subset {subset.name}: no query has relevant images (qrels)")
    if len(keep) == len(subset.query_ids):
        return subset
    pick = lambda xs: [xs[i] for i in keep]  # noqa: E731
    return biovita.Subset(subset.name, subset.corpus_ids, subset.corpus_taxa, pick(subset.query_ids),
                          pick(subset.query_texts), pick(subset.correct_taxa), pick(subset.candidate_taxa),
                          pick(subset.top_ranked), subset.qrels)


def prepare(subset: biovita.Subset, text: Lookup, image: Lookup, corpus_blocks: int) -> Prepared:
    queries = normalize(text.take(subset.query_texts, f"{subset.name} query texts"))
    docs = normalize(image.take(subset.corpus_ids, f"{subset.name} corpus ids"))
    if queries.shape[1] != docs.shape[1]:
        raise UserError(f"text embeddings have dim {queries.shape[1]} but image embeddings dim {docs.shape[1]} "
                        f"({storage.display(text.uri)} vs {storage.display(image.uri)})")
    taxa = sorted(set(subset.corpus_taxa))
    taxon_id = {t: i for i, t in enumerate(taxa)}
    doc_taxon = np.array([taxon_id[t] for t in subset.corpus_taxa])
    candidates = np.array([[taxon_id.get(t, -1) for t in c] for c in subset.candidate_taxa])
    correct = np.array([c.index(t) for c, t in zip(subset.candidate_taxa, subset.correct_taxa)])
    doc_index = {d: i for i, d in enumerate(subset.corpus_ids)}
    pools = [np.array([doc_index[d] for d in pool], dtype=np.int64) for pool in subset.top_ranked]
    pool = np.zeros((len(pools), len(subset.corpus_ids)), dtype=bool)
    pool[np.repeat(np.arange(len(pools)), [len(p) for p in pools]), np.concatenate(pools or [np.zeros(0, int)])] = True
    # corpus blocks end on taxon boundaries, so no taxon's photos span two blocks
    order = np.argsort(doc_taxon, kind="stable")
    cuts = [i for i in np.linspace(0, len(order), corpus_blocks + 1).astype(int)[1:-1]]
    cuts = sorted({_next_boundary(doc_taxon[order], c) for c in cuts} - {0, len(order)})
    blocks = [(docs[idx], doc_taxon[idx], idx) for idx in np.split(order, cuts) if len(idx)]
    return Prepared(queries, docs, doc_taxon, blocks, len(taxa), candidates, correct, pools, pool)


def _next_boundary(sorted_taxa: np.ndarray, i: int) -> int:
    while 0 < i < len(sorted_taxa) and sorted_taxa[i] == sorted_taxa[i - 1]:
        i += 1
    return i


@ray.remote(num_cpus=1)
def _block_maxima(queries, docs, doc_taxon, n_taxa, candidates, pool):
    # a query scores only the docs of its pool (BioVITA's top_ranked list): `pool` is this block's columns
    return candidate_maxima(queries, docs, doc_taxon, n_taxa, candidates, pool)


def best_of_candidates(p: Prepared, query_block: int) -> np.ndarray:
    """(q, 100) max score of each candidate taxon over the query's pool: Ray tasks per query block x corpus
    block, combined by max."""
    blocks = [(ray.put(docs), ray.put(taxon), index) for docs, taxon, index in p.blocks]
    futures = []
    for lo in range(0, len(p.queries), query_block):
        sl = slice(lo, lo + query_block)
        queries, candidates = ray.put(p.queries[sl]), ray.put(p.candidates[sl])
        futures.append([_block_maxima.remote(queries, docs, taxon, p.n_taxa, candidates, p.pool[sl][:, index])
                        for docs, taxon, index in blocks])
    best = [np.maximum.reduce(ray.get(parts)) if len(parts) > 1 else ray.get(parts[0]) for parts in futures]
    return np.concatenate(best) if best else np.zeros((0, p.candidates.shape[1]), np.float32)


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


def evaluate(data: str, image_embeddings: str, text_embeddings: str, out: str, subsets=biovita.SUBSETS,
             query_block: int = 256, corpus_blocks: int = 4, gallery: int = 12, log=print) -> dict:
    """Score the embeddings on both subsets; write results JSON, per-query ranks and the HTML report."""
    t0 = time.time()
    storage.check_output(out)
    loaded = {name: biovita.load_subset(data, name) for name in subsets}
    text, image = load_lookup(text_embeddings), load_lookup(image_embeddings)
    log(f"[eval] {', '.join(f'{n}: {len(s.query_ids)} queries, {len(s.corpus_ids)} images' for n, s in loaded.items())}")
    t_score = time.time()
    scores, per_query, tops, prepared, phases = {}, [], {}, {}, []
    for name, subset in loaded.items():
        start = time.time() - t_score
        loaded[name] = subset = scored_queries(subset)
        prepared[name] = prepare(subset, text, image, corpus_blocks)
        best = best_of_candidates(prepared[name], query_block)
        scores[name], ranks = subset_scores(best, prepared[name].correct)
        tops[name] = (best, ranked(best, 5))
        per_query += [{"subset": name, "query_id": q, "text": t, "correct_taxon": c, "rank": int(r)}
                      for q, t, c, r in zip(subset.query_ids, subset.query_texts, subset.correct_taxa, ranks)]
        phases.append({"name": "Scoring", "start": start, "end": time.time() - t_score, "split": biovita.SPLIT,
                       "subset": name})
        log(f"[eval] {name}: " + ", ".join(f"top-{k} {scores[name][f'taxon_top_{k}_accuracy']:.4f}"
                                           for k in K_VALUES))
    seconds = time.time() - t_score
    task_score = float(np.mean([s["taxon_top_1_accuracy"] for s in scores.values()]))
    result = task_result(scores, seconds, phases)
    result["mieb_ray"] = {
        "version": __version__, "task_score": task_score, "data": storage.display(data),
        "image_embeddings": {"uri": storage.display(image_embeddings), "model": image.manifest.get("model")},
        "text_embeddings": {"uri": storage.display(text_embeddings), "model": text.manifest.get("model")},
        "queries": {n: len(s.query_ids) for n, s in loaded.items()},
    }
    storage.delete(storage.join(out, storage.MANIFEST))  # a rerun replaces the outputs: none is complete until it ends
    storage.write_bytes(storage.join(out, RESULTS_FILE), (json.dumps(result, indent=2) + "\n").encode())
    _write_ranks(out, per_query)
    _write_report(out, data, loaded, prepared, tops, scores, result, gallery)
    storage.write_manifest(out, {"format": "mieb-biovita-eval", "format_version": 1, "version": __version__,
                                 "files": [RESULTS_FILE, "ranks.parquet", "report.html"],
                                 "task_score": task_score})
    log(f"[eval] task score (mean top-1) {task_score:.4f}; scoring {seconds:.2f}s; total {time.time() - t0:.1f}s "
        f"-> {storage.display(out)}")
    return result


def embed_biovita(data: str, model: str, revision: str | None, out: str, log=print) -> tuple[str, str]:
    """Embed the corpus images (keyed by id) and the distinct query texts (keyed by the text) with the embed
    pipeline, into OUT/embeddings/; an output already complete there for this model is reused."""
    from mieb_ray.pipelines.embed import embed

    root = storage.join(out, "embeddings")
    subsets = {name: biovita.load_subset(data, name) for name in biovita.SUBSETS}
    first, *others = biovita.SUBSETS
    for name in others:  # the hub's subsets share one corpus of photos, by id
        if set(subsets[name].corpus_ids) - set(subsets[first].corpus_ids):
            raise UserError(f"BioVITA subset {name} has photos that {first} lacks; embed each corpus apart")
    texts = sorted({t for s in subsets.values() for t in s.query_texts})
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
        embed(source, target, model, revision=revision, modality=modality, key_column="key" if modality == "text"
              else "id", overwrite=True, log=log)
    return targets["image"][1], targets["text"][1]


def _write_ranks(out: str, rows: list[dict]) -> None:
    dest = storage.join(out, "ranks.parquet")
    local = storage.staging_path(dest)
    pq.write_table(pa.Table.from_pylist(rows), local)
    storage.commit(local, dest)


def best_photo(p: Prepared, q: int, taxon: int) -> int | None:
    """Index of the taxon's best-scoring photo in query q's pool, for the report (None: no photo)."""
    pool = p.pools[q][p.doc_taxon[p.pools[q]] == taxon]
    if taxon < 0 or not len(pool):
        return None
    return int(pool[np.argmax(cosines(p.queries[q:q + 1], p.docs[pool])[0])])


def _write_report(out, data, loaded, prepared, tops, scores, result, n_gallery) -> None:
    from mieb_ray.retrieval.report import render

    gallery, wanted = [], {}
    for name, subset in loaded.items():
        p, (best, top) = prepared[name], tops[name]
        ranks = rank_of(best, p.correct)
        for q in range(min(n_gallery, len(subset.query_ids))):
            items = []
            for pos in top[q]:
                photo = best_photo(p, q, int(p.candidates[q, pos]))
                best_id = None if photo is None else subset.corpus_ids[photo]
                items.append({"taxon": subset.candidate_taxa[q][pos],
                              "score": None if best[q, pos] == NEG else float(best[q, pos]), "best_id": best_id})
                if best_id is not None:
                    wanted.setdefault(name, set()).add(best_id)
            gallery.append({"subset": name, "query_id": subset.query_ids[q], "text": subset.query_texts[q],
                            "correct_taxon": subset.correct_taxa[q], "rank_of_correct": int(ranks[q]),
                            "top": items})
    images = {}
    for name, ids in wanted.items():
        images.update(biovita.read_images(data, name, ids))
    summary = {"task_score": result["mieb_ray"]["task_score"], "evaluation_time": result["evaluation_time"],
               "model": result["mieb_ray"]["image_embeddings"]["model"] or {},
               "subsets": {n: {**s, "queries": len(loaded[n].query_ids)} for n, s in scores.items()}}
    storage.write_bytes(storage.join(out, "report.html"), render(summary, gallery, images).encode())
