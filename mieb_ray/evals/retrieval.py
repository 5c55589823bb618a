"""MIEB's SciMMIR retrieval tasks (SciMMIRI2TRetrieval: figures find their captions; SciMMIRT2IRetrieval: captions
find their figures) as an EvalSuite, equal to mteb 2.26.24's `AbsTaskRetrieval` (Any2AnyRetrieval) on the same
embeddings. mteb's task makes row i of the test split both query `query-test-i` and document `corpus-test-i`, the
one relevant to it; searches the whole corpus by cosine, keeping each query's top 1,000 by (score, doc id), both
descending; and scores the run with pytrec_eval (nDCG@10 the main score), MRR and the nAUCs of its confidence.

plan      driver: the test split planned by the one reader
captions  split_rows.labels(unit, "caption"), a task per read unit: each row's caption (`text`) as mteb reads it:
          stripped as a document (I2T: `_corpus_to_dict`), as it is as a query (T2I). A split with a blank or
          null caption is refused in one line (the hub's has none; mteb's corpus loader fails on a null one).
vectors   split_rows.vectors and .gather: each image-embedding shard read once, the split's images in row order
          (`scimmir/test/<index>`, what `build --split eval` keys); the captions' text embeddings (keyed by the text)
search    the top-k engine: the corpus laid out once in row order, query blocks scored by MtebTop: mteb's own
          search (torch.topk of 1,001 per corpus chunk of 50,000, then the best 1,000 by (score, doc id)), so that
          even exact ties at the cut fall as in mteb; a task per block keeps, per query, the rank of its document
          and the max, std and difference of its top two scores (mteb's confidence)
metrics   driver: metrics.retrieval of the ranks and confidences

With --exclude, the clean scores are mteb's on the test split without the rows whose image the audit flagged:
those rows leave both the queries and the corpus, and the rest are numbered anew, as a filtered split would be.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np

from mieb_ray import formats, storage
from mieb_ray.errors import UserError
from mieb_ray.evals import metrics, run_report, split_rows
from mieb_ray.evals.protocol import EmbedInputs, task_result, text_table, text_vectors, unscorable
from mieb_ray.evals.source_task import SourceTask
from mieb_ray.io import embeddings, reader
from mieb_ray.io.contamination import Flags
from mieb_ray.pipelines.build import build_eval_splits
from mieb_ray.runtime import tasks
from mieb_ray.runtime.cluster import RunContext
from mieb_ray.topk import engine

TOP_K = max(metrics.K_VALUES)  # mteb's search keeps each query's top 1,000
QUERY_BLOCK = 1024  # queries per engine block: 4 x QUERY_BLOCK x CORPUS_CHUNK bytes of scores per task
CORPUS_CHUNK = 50_000  # SearchEncoderWrapper.corpus_chunk_size
UNIT_ROWS = 100_000
BLOCK_BYTES = 128 << 20


@dataclass(frozen=True)
class RetrievalTask(SourceTask):
    queries: str  # "image" (figures find captions) or "text" (captions find figures)


TASKS = (RetrievalTask("SciMMIRI2TRetrieval", "scimmir", "image"),
         RetrievalTask("SciMMIRT2IRetrieval", "scimmir", "text"))
BY_NAME = {t.name: t for t in TASKS}


def select_tasks(names: list[str] | None) -> list[RetrievalTask]:
    """The tasks named (the registry has checked the names), or all."""
    return [BY_NAME[n] for n in names] if names else list(TASKS)


def id_order(ids: list) -> np.ndarray:
    """Per doc, its place in the descending order of the docs' ids: how mteb (its heap of (score, id)) and
    pytrec_eval break ties."""
    place = np.empty(len(ids), np.int64)
    place[sorted(range(len(ids)), key=ids.__getitem__, reverse=True)] = np.arange(len(ids))
    return place


@dataclass(frozen=True)
class MtebTop:
    """Reducer: each query's top k docs as mteb's SearchEncoderWrapper finds them: (q, k) scores and doc rows,
    best first by (score, doc id), both descending. Per corpus chunk torch.topk keeps k + 1 (its choice among
    tied scores is torch's, and mteb's); of those the best k by (score, id). The corpus is one partition whose
    group ids are its rows; `order` is id_order of its ids."""

    k: int
    order: np.ndarray = field(compare=False)

    def score(self, part, queries: np.ndarray, data=None) -> tuple[np.ndarray, np.ndarray]:
        import torch

        if len(part.docs) and queries.shape[1] != part.vectors.shape[1]:
            raise UserError(f"query embeddings have dim {queries.shape[1]} but the corpus's dim {part.vectors.shape[1]}"
                            " (image and text embeddings of different models?)")
        q, values, rows = torch.from_numpy(queries), [], []
        for lo in range(0, len(part.docs), CORPUS_CHUNK):
            scores = q @ torch.from_numpy(part.vectors[lo:lo + CORPUS_CHUNK]).T
            top, cols = torch.topk(scores, min(self.k + 1, scores.shape[1]), dim=1)
            values.append(top.numpy())
            rows.append(part.group_ids[lo + cols.numpy()])
        if not values:
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        values, rows = np.concatenate(values, 1), np.concatenate(rows, 1)
        order = np.lexsort((self.order[rows], -values), axis=1)[:, :self.k]
        return np.take_along_axis(values, order, 1), np.take_along_axis(rows, order, 1)

    @staticmethod
    def merge(parts: list):
        raise ValueError("the retrieval corpus is laid out in one partition: nothing to merge")


# ---------------------------------------------------------------------------------------------- tasks


@tasks.remote(num_cpus=1)
def _texts(uri: str, captions: list[str]) -> np.ndarray:
    return text_vectors(uri, captions, "captions")[1]


@tasks.remote(num_cpus=1)
def _kept(vectors: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    return vectors if keep is None else vectors[keep]


@tasks.remote(num_cpus=1)
def _corpus(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return vectors, np.arange(len(vectors))


@tasks.remote(num_cpus=1)
def _block(vectors: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return np.ascontiguousarray(vectors[lo:hi])


@tasks.remote(num_cpus=1)
def _summary(top: tuple[np.ndarray, np.ndarray], lo: int) -> dict[str, np.ndarray]:
    """Per query lo, lo + 1, ... of a block: the rank of its document (doc lo + j) in its top list (TOP_K + 1: not
    in it) and mteb's confidence scores of the list."""
    values, rows = top
    found = rows == np.arange(lo, lo + len(values))[:, None]
    confidence = [metrics.confidence(v) for v in values]
    return {"rank": np.where(found.any(1), found.argmax(1) + 1, TOP_K + 1),
            **{k: np.array([c[k] for c in confidence]) for k in ("max", "std", "diff1")}}


# ---------------------------------------------------------------------------------------------- the suite


@dataclass
class _Search:
    """One search: a task's queries against its corpus (all rows, or the clean ones)."""

    task: RetrievalTask
    rows: int
    summaries: list  # refs, one per query block
    about: dict = field(default_factory=dict)  # the clean run's images, left_out and audit


@dataclass
class _Pending:
    searches: list[_Search]
    start: float
    images_uri: str


def search(queries, corpus, n: int) -> list:
    """Refs to the block summaries of n queries (a ref to their (n, d) vectors; query i's document is doc i)
    against n docs (a ref), whose ids are `corpus-<split>-<i>` (their order: that of str(i))."""
    blocks = [(lo, min(lo + QUERY_BLOCK, n)) for lo in range(0, n, QUERY_BLOCK)]
    tops = _tops(queries, corpus, blocks, MtebTop(TOP_K, id_order([str(i) for i in range(n)])))
    return [_summary.remote(top, lo) for top, (lo, _) in zip(tops, blocks)]


def _tops(queries, corpus, blocks: list[tuple[int, int]], reducer: MtebTop) -> list:
    """Refs to each query block's top docs (MtebTop) in a corpus laid out as one partition."""
    # one partition, in row order: MtebTop replays mteb's per-chunk top-k over the whole corpus, so its query blocks,
    # not the corpus, are what spreads over the cluster (SciMMIR's corpus: 16,263 rows)
    lay = engine.layout(chunks=[_corpus.remote(corpus)], partitions=1)
    return engine.search(lay, [_block.remote(queries, lo, hi) for lo, hi in blocks], reducer)


def top_docs(queries: np.ndarray, corpus: np.ndarray, ids: list, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's top k docs of the corpus as mteb's SearchEncoderWrapper finds them ((q, k) cosines and doc
    rows, best first by (score, id)), its query blocks scored by the top-k engine's tasks (on Ray, or in this
    process under tasks.using("local")): how the mteb suite searches a large retrieval corpus."""
    blocks = [(lo, min(lo + QUERY_BLOCK, len(queries))) for lo in range(0, len(queries), QUERY_BLOCK)]
    tops = tasks.get(_tops(tasks.put(queries), corpus, blocks, MtebTop(k, id_order(ids))))
    if not tops:
        return np.zeros((0, 0), np.float32), np.zeros((0, 0), np.int64)
    return np.concatenate([values for values, _ in tops]), np.concatenate([rows for _, rows in tops])


class RetrievalSuite:
    """The chosen SciMMIR retrieval tasks over one mirror (`sources`: "hf" or a mirror root)."""

    kind = formats.suite_kind("retrieval")
    title = "SciMMIR retrieval"  # its section of a run's page
    needs_texts = True

    def __init__(self, tasks_: list[RetrievalTask], sources: str, exclude: str | None = None):
        self.tasks, self.sources, self.exclude = tasks_, sources, exclude
        self.flags = Flags.load(exclude) if exclude else None
        self._captions: list[str] | None = None

    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    def captions(self) -> list[str]:
        """The test split's captions in row order (read once)."""
        if self._captions is None:
            task = self.tasks[0]
            units = reader.plan_source(task.source, self.sources, UNIT_ROWS, split=task.split)[0]
            parts = tasks.get([split_rows.labels.remote(u, "caption") for u in units])
            captions = split_rows.in_order(task.name, task.split, parts, self.sources)
            blank = [i for i, c in enumerate(captions) if not c.strip()]
            if blank:  # the embed job refuses blank texts, and mteb's corpus loader fails on a null one
                rows = ", ".join(map(str, blank[:5]))
                raise UserError(f"{task.name}: {len(blank):,} rows of the {task.split} split in "
                                f"{storage.display(self.sources)} have no caption (rows {rows}); the hub's split has "
                                "none")
            self._captions = captions
        return self._captions

    def texts(self, task: RetrievalTask) -> list[str]:
        """The captions as the task reads them: documents stripped (I2T), queries as they are (T2I)."""
        return [c.strip() for c in self.captions()] if task.queries == "image" else self.captions()

    def embed_inputs(self, out: str, log, ctx: RunContext | None = None) -> EmbedInputs:
        """The test split built by the build job (reused when complete); its distinct captions, keyed by the text."""
        data = build_eval_splits(self.sources, out, log, sorted({t.slug for t in self.tasks}), ctx)
        texts = list(dict.fromkeys(c for t in self.tasks for c in self.texts(t)))
        return EmbedInputs(data, "key", text_table(out, "captions", texts))

    def submit(self, images: str, texts: str, log) -> _Pending:
        start = time.time()
        task = self.tasks[0]  # every task reads the same split
        n = len(self.captions())
        shards = embeddings.shard_uris(images)
        sizes = storage.file_sizes(shards) if shards else []
        none = np.zeros(0, np.int64)
        wanted = [(f"{task.slug}/", task.key_prefix(), none)]
        blocks = [split_rows.vectors.remote(shards[a:b], wanted) for a, b in engine.batches(sizes, BLOCK_BYTES)]
        _, figures = split_rows.gather.remote(0, task.name, wanted[0][:2], none, n, storage.display(images),
                                              *[ref for block in blocks for ref in block])
        captions = {t.queries: _texts.remote(texts, self.texts(t)) for t in self.tasks}
        runs: list[tuple[np.ndarray | None, dict]] = [(None, {})]
        if self.flags is not None:  # the same search over the rows whose image the audit did not flag
            keys = [f"{task.key_prefix()}{i}" for i in range(n)]
            keep = np.array([k not in self.flags.eval for k in keys], bool)
            runs.append((keep, {"images": int(keep.sum()), "left_out": {"eval": Flags.left_out(self.flags.eval, keys)},
                                "audit": storage.display(self.exclude)}))
        searches = []
        for keep, about in runs:
            m = n if keep is None else int(keep.sum())
            if not m:  # every row flagged: no clean run to search (collect says why)
                searches += [_Search(t, 0, [], about) for t in self.tasks]
                continue
            images_kept = _kept.remote(figures, keep)
            for t in self.tasks:
                texts_kept = _kept.remote(captions[t.queries], keep)
                pair = (images_kept, texts_kept) if t.queries == "image" else (texts_kept, images_kept)
                searches.append(_Search(t, m, search(*pair, m), about))
        log(f"[eval] {len(self.tasks)} retrieval tasks, {n:,} queries and documents each, {len(shards)} image shards "
            f"in {len(blocks)} blocks")
        return _Pending(searches, start, images)

    def collect(self, pending: _Pending, log) -> dict[str, dict]:
        results = {}
        for s in pending.searches:
            if s.about and not s.rows:  # the clean run of a task scored above, with nothing left to search
                results[s.task.name]["mieb_ray"]["clean"] = unscorable(
                    s.task.name, f"the audit flagged all {results[s.task.name]['mieb_ray']['queries']:,} rows",
                    s.about)
                continue
            parts = tasks.get(s.summaries)
            got = {k: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0) for k in
                   ("rank", "max", "std", "diff1")}
            scores = metrics.retrieval(got["rank"], got)
            if s.about:  # the clean run of a task scored above
                results[s.task.name]["mieb_ray"]["clean"] = {**scores, "main_score": scores["ndcg_at_10"], **s.about}
                continue
            seconds = time.time() - pending.start
            entry = {**scores, "main_score": scores["ndcg_at_10"], "hf_subset": "default", "languages": ["eng-Latn"]}
            result = task_result(s.task.name, s.task.source.revision, s.task.split, [entry], seconds,
                                 [{"name": "Scoring", "start": 0.0, "end": seconds, "split": s.task.split,
                                   "subset": "default"}])
            result["mieb_ray"] = {"queries": s.rows, "documents": s.rows, "query_modality": s.task.queries}
            results[s.task.name] = result
        log(f"[eval] {len(results)} retrieval tasks scored in {time.time() - pending.start:.1f}s")
        return results

    def write(self, out: str, results: dict[str, dict], pending: _Pending, log) -> tuple[list[str], dict]:
        rows = [{"task": t.name, "split": t.split, "queries": results[t.name]["mieb_ray"]["queries"],
                 **{k: results[t.name]["scores"][t.split][0][k] for k in ("ndcg_at_10", "recall_at_1", "mrr_at_10")},
                 "clean_ndcg_at_10": results[t.name]["mieb_ray"].get("clean", {}).get("ndcg_at_10")}
                for t in self.tasks]
        summary = {"title": "MIEB SciMMIR retrieval", "tasks": rows, "model": embeddings.model_of(pending.images_uri)}
        storage.write_bytes(storage.join(out, "summary.json"), (json.dumps(summary, indent=2) + "\n").encode())
        storage.write_bytes(storage.join(out, "report.html"),
                            run_report.render([(self.title, None, results)], summary["model"]).encode())
        mean = float(np.mean([r["ndcg_at_10"] for r in rows])) if rows else 0.0
        log(f"[eval] mean nDCG@10 over {len(rows)} retrieval tasks: {mean:.4f} -> {storage.display(out)}")
        return ["summary.json", "report.html"], {"mean_ndcg_at_10": mean}
