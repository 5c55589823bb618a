"""BioVITA text-to-image taxon retrieval as an EvalSuite (evals/protocol.py), scored from embedding shards,
equal to mteb's `BioVITAT2IReranking`.

Per subset, on the top-k engine (mieb_ray/topk): a task reads the corpus' id and taxon columns into a key lookup
(corpus id -> doc, taxon); the image embeddings are laid out once in taxon-aligned partitions through it; a task
reads top_ranked into each query block's sparse pools and candidate taxon ids, another the query texts'
embeddings; score tasks (query block x partition) give every query's max over each candidate taxon's photos in
its pool (CandidateMax), merged in a tree. The driver holds the query side and the final (Q x 100) maxima:
ranks, top-k accuracy, and the outputs (results JSON in the layout of mteb's TaskResult, per-query ranks, an
HTML report). It never reads an image embedding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mieb_ray import __version__, formats, storage
from mieb_ray.errors import UserError
from mieb_ray.evals import biovita_data as biovita
from mieb_ray.evals import protocol
from mieb_ray.evals.biovita_report import render
from mieb_ray.evals.protocol import EmbedInputs
from mieb_ray.io import contamination, embeddings
from mieb_ray.io.contamination import Flags
from mieb_ray.runtime import tasks
from mieb_ray.runtime.cluster import RunContext
from mieb_ray.topk import engine
from mieb_ray.topk.groupmax import NEG, rank_of, ranked
from mieb_ray.topk.kernels import CandidateMax, Candidates

K_VALUES = (1, 5, 10)
RESULTS_FILE = f"{biovita.TASK}.json"


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


def chance_scores(best: np.ndarray, correct: np.ndarray) -> dict[str, float]:
    """The top-k accuracies a model of random embeddings expects, for the report (a model's lead over them is its
    effect). A taxon with no photo in the query's pool ranks last (its score is NEG) whatever the model, so the
    correct taxon ranks at random among the candidates that have one: k/100 when all 100 do; a correct taxon
    with none has the rank the candidate order gives it."""
    scored = best != NEG
    n = scored.sum(1)
    has_photo = np.take_along_axis(scored, correct[:, None], axis=1)[:, 0]
    fixed = rank_of(best, correct)  # read only where the correct taxon has no photo: no model moves it
    return {f"chance_top_{k}": float(np.where(has_photo, np.minimum(k, n) / np.maximum(n, 1), fixed <= k).mean())
            if len(correct) else 0.0 for k in K_VALUES}


def task_result(scores: dict[str, dict], seconds: float, phases: list[dict]) -> dict:
    """mteb's TaskResult layout, one entry per subset. Only the taxon metrics: mteb's document-level ones (ndcg,
    recall...) are not BioVITA's measure."""
    entries = [{**s, "main_score": s["taxon_top_1_accuracy"], "hf_subset": name, "languages": ["eng-Latn"]}
               for name, s in scores.items()]
    return protocol.task_result(biovita.TASK, biovita.REVISION, biovita.SPLIT, entries, seconds, phases)


# ---------------------------------------------------------------------------------------------- tasks


@tasks.remote(num_cpus=1, num_returns=3)
def _corpus(data: str, name: str):
    """The key lookup (corpus id -> doc = row, group = taxon id), the taxon vocabulary, the photo count."""
    ids, taxa = biovita.read_corpus(data, name)
    vocabulary, groups = biovita.taxon_ids(taxa)
    return engine.KeyLookup(pa.array(ids, pa.string()), np.arange(len(ids), dtype=np.int64), groups), \
        vocabulary, len(ids)


@tasks.remote(num_cpus=1)
def _candidates(data: str, name: str, query_ids: list[str], candidate_taxa: list[list[str]],
                blocks: list[tuple[int, int]], lookup: engine.KeyLookup, vocabulary: list[str], gallery: int,
                drop: frozenset[str] = frozenset()):
    """Per query block: candidate taxon ids and the top_ranked pools as CSR of docs, without the photos `drop`
    names (the clean run's: as mteb's cleaning drops them from the corpus and the top-ranked lists); best photos
    are found for the report's first `gallery` queries only."""
    indptr, positions = biovita.pool_positions(data, name, query_ids, lookup.keys)  # doc = corpus position
    if drop:
        gone = pc.is_in(lookup.keys, value_set=pa.array(sorted(drop), pa.string())).to_numpy(zero_copy_only=False)
        kept = ~gone[positions]
        query = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        indptr = np.r_[0, np.cumsum(np.bincount(query[kept], minlength=len(indptr) - 1))].astype(np.int64)
        positions = positions[kept]
    indptr, docs = biovita.pool_csr(indptr, positions, len(lookup.docs))
    groups = biovita.candidate_groups(candidate_taxa, vocabulary)
    out = [Candidates(groups[a:b], indptr[a:b + 1] - indptr[a], docs[indptr[a]:indptr[b]],
                      best_docs=max(0, min(gallery, b) - a)) for a, b in blocks]
    return out if len(out) > 1 else out[0]


@tasks.remote(num_cpus=1)
def _query_vectors(uri: str, blocks: list[list[str]], what: str):
    """The dim, then per block the (q, d) float32 embeddings of its texts."""
    dim, vectors = protocol.text_vectors(uri, [t for b in blocks for t in b], what)
    return [dim, *np.split(vectors, np.cumsum([len(b) for b in blocks])[:-1])]


@tasks.remote(num_cpus=1)
def _photos(data: str, name: str, docs: list[int]) -> dict[int, tuple[str, bytes | None]]:
    """Corpus id and image bytes of a few docs (rows of the corpus), for the report."""
    ids, _ = biovita.read_corpus(data, name)
    wanted = {d: ids[d] for d in docs}
    images = biovita.read_images(data, name, set(wanted.values()))
    return {d: (i, images.get(i)) for d, i in wanted.items()}


# ---------------------------------------------------------------------------------------------- the suite


@dataclass
class _Run:
    """One subset in flight: refs and the query side."""

    queries: biovita.Queries
    layout: engine.Layout
    dim: object  # ref: the text embeddings' dim
    results: list  # refs: per query block, (scores, docs) (q, 100)
    photos: object  # ref: the corpus size
    start: float
    flagged: frozenset[str] = frozenset()  # with --exclude: the corpus ids the audit flagged
    clean: _Run | None = None  # and the same search without them (None: none flagged)


class BioVITASuite:
    """BioVITAT2IReranking as an EvalSuite: one task, its subsets scored together."""

    kind = formats.suite_kind("biovita")
    title = "BioVITA text-to-image retrieval"  # its section of a run's page
    needs_texts = True

    def __init__(self, sources: str, subsets: tuple[str, ...] = biovita.SUBSETS, query_block: int = 256,
                 partitions: int | None = None, gallery: int = 12, exclude: str | None = None):
        """sources: "hf" or a mirror root; query_block: queries per score task; partitions: taxon-aligned corpus
        partitions (None: the engine's default); gallery: query cards per subset in the report; exclude: an audit
        output, whose flagged photos (by corpus id) a second search leaves out (mieb_ray.clean)."""
        self.sources, self.subsets, self.query_block, self.partitions = sources, subsets, query_block, partitions
        self.gallery, self.exclude = gallery, exclude
        self.flags = Flags.load(exclude) if exclude else None

    def task_names(self) -> list[str]:
        return [biovita.TASK]

    def embed_inputs(self, out: str, log, ctx: RunContext | None = None) -> EmbedInputs:
        """The corpus photos (keyed by id) and the distinct query texts, written to a table keyed by the text."""
        data = self.sources
        first, *others = biovita.SUBSETS
        corpus = {name: set(biovita.read_corpus(data, name)[0]) for name in biovita.SUBSETS}  # ids only
        for name in others:  # the hub's subsets share one corpus of photos, by id
            if corpus[name] - corpus[first]:
                raise UserError(f"BioVITA subset {name} has photos that {first} lacks; embed each corpus apart")
        texts = sorted({t for name in biovita.SUBSETS for t in biovita.load_queries(data, name).query_texts})
        queries = storage.join(out, "embeddings", "_queries", "queries.parquet")
        storage.commit_file(queries, lambda local: pq.write_table(pa.table({"key": texts, "text": texts}), local))
        return EmbedInputs(biovita.corpus_files(data, first)[0].rsplit("/", 1)[0], "id", queries)

    def submit(self, images: str, texts: str, log) -> dict[str, _Run]:
        queries = {name: scored_queries(biovita.load_queries(self.sources, name)) for name in self.subsets}
        image_shards = embeddings.shard_uris(images)  # the manifest's list (or the folder's): no shard is opened
        self.images, self.texts, self.t_score = images, texts, time.time()
        runs = {name: self._submit(q, image_shards, texts) for name, q in queries.items()}
        photos = dict(zip(runs, tasks.get([r.photos for r in runs.values()])))
        sizes = ", ".join(f"{n}: {len(r.queries.query_ids)} queries, {photos[n]} images" for n, r in runs.items())
        log(f"[eval] {sizes}")
        return runs

    def _submit(self, q: biovita.Queries, image_shards: list[str], texts: str) -> _Run:
        start = time.time() - self.t_score
        lookup, vocabulary, n_photos = _corpus.remote(self.sources, q.name)
        lay = engine.layout(image_shards, lookup=lookup, partitions=self.partitions)
        run = self._search(q, lay, lookup, vocabulary, n_photos, texts, start)
        if self.flags is not None:
            run.flagged = frozenset(i for i in biovita.read_corpus(self.sources, q.name)[0] if i in self.flags.eval)
        if run.flagged:  # the same layout searched again, its pools without them (a query's rank does not depend
            run.clean = self._search(q, lay, lookup, vocabulary, n_photos, texts, start, run.flagged)  # on others)
        return run

    def _search(self, q: biovita.Queries, lay, lookup, vocabulary, n_photos, texts: str, start: float,
                drop: frozenset[str] = frozenset()) -> _Run:
        n = len(q.query_ids)
        blocks = [(a, min(a + self.query_block, n)) for a in range(0, n, self.query_block)]
        vectors = _query_vectors.options(num_returns=len(blocks) + 1).remote(
            texts, [q.query_texts[a:b] for a, b in blocks], f"{q.name} query texts")
        data = _candidates.options(num_returns=len(blocks)).remote(
            self.sources, q.name, q.query_ids, q.candidate_taxa, blocks, lookup, vocabulary, self.gallery, drop)
        data = data if len(blocks) > 1 else [data]
        return _Run(q, lay, vectors[0], engine.search(lay, vectors[1:], CandidateMax(), data), n_photos, start)

    def _check(self, run: _Run) -> None:
        """The one-line errors, in order: query texts, corpus photos, dimensions."""
        text_dim = tasks.get(run.dim)
        n, sample, duplicates = engine.missing_keys(run.layout)
        where = storage.display(self.images)
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
                            f"({storage.display(self.texts)} vs {where})")

    def collect(self, runs: dict[str, _Run], log) -> dict[str, dict]:
        scores, self.per_query, self.tops, self.chance, phases = {}, [], {}, {}, []
        for name, run in runs.items():
            self._check(run)
            q = run.queries
            merged = tasks.get(run.results)
            best, docs = np.concatenate([s for s, _ in merged]), np.concatenate([d for _, d in merged])
            correct = np.array([cands.index(t) for cands, t in zip(q.candidate_taxa, q.correct_taxa)])
            scores[name], ranks = subset_scores(best, correct)
            self.scores = scores
            self.tops[name] = (best, docs, ranks)
            self.chance[name] = chance_scores(best, correct)
            self.per_query += [{"subset": name, "query_id": i, "text": t, "correct_taxon": ct, "rank": int(r)}
                               for i, t, ct, r in zip(q.query_ids, q.query_texts, q.correct_taxa, ranks)]
            phases.append({"name": "Scoring", "start": run.start, "end": time.time() - self.t_score,
                           "split": biovita.SPLIT, "subset": name})
            stats = run.layout.stats()
            log(f"[eval] {name}: " + ", ".join(f"top-{k} {scores[name][f'taxon_top_{k}_accuracy']:.4f}"
                                               for k in K_VALUES)
                + f" ({stats['matched']:,} photos in {stats['partitions']} partitions; image shards read "
                  f"{stats['read_ratio']:.2f}x)")
        seconds = time.time() - self.t_score
        task_score = float(np.mean([s["taxon_top_1_accuracy"] for s in scores.values()]))
        result = task_result(scores, seconds, phases)
        models = {"image": embeddings.model_of(self.images), "text": embeddings.model_of(self.texts)}
        result["mieb_ray"] = {
            "version": __version__, "task_score": task_score, "sources": storage.display(self.sources),
            "image_embeddings": {"uri": storage.display(self.images), "model": models["image"]},
            "text_embeddings": {"uri": storage.display(self.texts), "model": models["text"]},
            "queries": {n: len(r.queries.query_ids) for n, r in runs.items()},
        }
        if self.flags is not None:
            result["mieb_ray"]["clean"] = self._clean(runs)
        log(f"[eval] task score (mean top-1) {task_score:.4f}; scoring {seconds:.2f}s")
        return {biovita.TASK: result}

    def _clean(self, runs: dict[str, _Run]) -> dict:
        """The task's clean block: its scores per subset without the flagged photos (its own where none was), in
        mteb's layout as the mteb suite's are, their main score, the photos left out."""
        flagged = sorted(set().union(*(r.flagged for r in runs.values())))  # the subsets share one corpus
        about = {"left_out": {"eval": Flags.left_out(self.flags.eval, flagged)}, "audit": storage.display(self.exclude)}
        audited = contamination.audited_tasks(self.exclude)
        if audited is not None and biovita.TASK not in audited:  # no clean score where nobody looked
            return protocol.unscorable(biovita.TASK, f"the audit at {storage.display(self.exclude)} read none of its "
                                       "photos (an audit against other tables): audit --against mieb again", about)
        scores = {}
        for name, run in runs.items():
            if run.clean is None:  # nothing of this subset flagged: its scores stand
                scores[name] = dict(self.scores[name])
                continue
            q = run.queries  # those that keep a positive: mteb drops a query whose every relevant photo is gone
            kept = np.array([any(d not in run.flagged for d in q.qrels[i]) for i in q.query_ids], bool)
            if not kept.any():
                return protocol.unscorable(biovita.TASK, f"the audit flagged every relevant photo of {name}'s "
                                           "queries", about)
            best = np.concatenate([s for s, _ in tasks.get(run.clean.results)])
            correct = np.array([cands.index(t) for cands, t in zip(q.candidate_taxa, q.correct_taxa)])
            scores[name] = subset_scores(best[kept], correct[kept])[0]
        clean = task_result(scores, 0.0, [])["scores"]
        return {"main_score": float(np.mean([s["taxon_top_1_accuracy"] for s in scores.values()])),
                "scores": clean, **about}

    def write(self, out: str, results: dict[str, dict], runs: dict[str, _Run], log) -> tuple[list[str], dict]:
        _write_ranks(out, self.per_query)
        result = results[biovita.TASK]
        _write_report(self, out, {n: r.queries for n, r in runs.items()}, self.tops,
                      {n: {**s, **self.chance[n]} for n, s in self.scores.items()}, result)
        return [formats.RANKS, formats.REPORT], {"task_score": result["mieb_ray"]["task_score"]}


def _write_ranks(out: str, rows: list[dict]) -> None:
    table = pa.Table.from_pylist(rows)
    storage.commit_file(storage.join(out, formats.RANKS), lambda local: pq.write_table(table, local))


def _write_report(suite: BioVITASuite, out: str, queries, tops, scores, result) -> None:
    """The report's gallery: per subset the first queries' top-5 taxa, each with its best photo in the query's
    pool (the doc CandidateMax found; smallest doc on ties), read by one small task per subset."""
    cards, photo_refs = [], {}
    for name, q in queries.items():
        best, docs, ranks = tops[name]
        shown = min(suite.gallery, len(q.query_ids))
        top = ranked(best[:shown], 5)
        wanted = sorted({int(docs[i, p]) for i in range(shown) for p in top[i] if docs[i, p] >= 0})
        photo_refs[name] = _photos.remote(suite.sources, name, wanted) if wanted else None
        cards += [(name, i, top[i]) for i in range(shown)]
    photos = {name: tasks.get(ref) if ref is not None else {} for name, ref in photo_refs.items()}
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
    storage.write_bytes(storage.join(out, "report.html"), render(summary, gallery, images).encode())
