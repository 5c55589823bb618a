"""MIEB's image clustering tasks (CIFAR10Clustering, CIFAR100Clustering) as an EvalSuite, equal to mteb 2.26.24's
`AbsTaskClusteringLegacy`: the eval split's image embeddings in row order clustered by sklearn's MiniBatchKMeans
(as many clusters as labels, batch 500, n_init "auto", random_state 42), scored against the labels with NMI (the
main score), V-measure, ARI and cluster accuracy (the best one-to-one match of clusters to labels).

plan      driver: each task's eval split planned by the one reader
labels    split_rows.labels, a task per read unit
vectors   split_rows.vectors and .gather: each image-embedding shard read once, a task's eval rows
          (`<slug>/<split>/<index>`, what `build --split eval` keys) gathered in order
fit       a task per task: the clustering and its metrics
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np

from mieb_ray import formats, storage
from mieb_ray.evals import metrics, run_report, split_rows
from mieb_ray.evals.protocol import EmbedInputs, task_result, unscorable
from mieb_ray.evals.source_task import SourceTask
from mieb_ray.io import embeddings, reader
from mieb_ray.io.contamination import Flags
from mieb_ray.pipelines.build import build_eval_splits
from mieb_ray.runtime import tasks
from mieb_ray.runtime.cluster import RunContext
from mieb_ray.topk import engine

SEED = 42  # mteb's Evaluator seed: MiniBatchKMeans' random_state
BATCH = 500  # ClusteringEvaluator's clustering_batch_size
UNIT_ROWS = 100_000
BLOCK_BYTES = 128 << 20


TASKS = (SourceTask("CIFAR10Clustering", "cifar10"), SourceTask("CIFAR100Clustering", "cifar100"))
BY_NAME = {t.name: t for t in TASKS}


def select_tasks(names: list[str] | None) -> list[SourceTask]:
    """The tasks named (the registry has checked the names), or all."""
    return [BY_NAME[n] for n in names] if names else list(TASKS)


@tasks.remote(num_cpus=1)
def _cluster(vectors: np.ndarray, labels: list, keep: np.ndarray | None = None) -> dict:
    """The clustering of the rows (those `keep` marks, in order) and its metrics."""
    from sklearn.cluster import MiniBatchKMeans

    if keep is not None:
        vectors, labels = vectors[keep], [label for label, k in zip(labels, keep) if k]
    model = MiniBatchKMeans(n_clusters=len(set(labels)), batch_size=BATCH, n_init="auto", compute_labels=True,
                            random_state=SEED).fit(vectors)
    return metrics.clustering(labels, model.labels_.tolist())


@dataclass
class Planned:
    task: SourceTask
    units: list
    labels: list = field(default_factory=list)


@dataclass
class _Pending:
    planned: list[Planned]
    scored: list  # per task: a ref to its metrics
    start: float
    images_uri: str
    clean: list = field(default_factory=list)  # with --exclude, per task: (ref to its metrics, left-out counts)


class ClusteringSuite:
    """The chosen clustering tasks over one mirror (`sources`: "hf" or a mirror root)."""

    kind = formats.suite_kind("clustering")
    title = "Image clustering"  # its section of a run's page
    needs_texts = False

    def __init__(self, tasks_: list[SourceTask], sources: str, exclude: str | None = None):
        self.tasks, self.sources, self.exclude = tasks_, sources, exclude
        self.flags = Flags.load(exclude) if exclude else None

    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    def embed_inputs(self, out: str, log, ctx: RunContext | None = None) -> EmbedInputs:
        """The eval splits built by the build job (reused when complete); no texts."""
        return EmbedInputs(build_eval_splits(self.sources, out, log, [t.slug for t in self.tasks], ctx), "key", None,
                           raw=True)

    def submit(self, images: str, texts: str | None, log) -> _Pending:
        start = time.time()
        planned = [Planned(t, reader.plan_source(t.source, self.sources, UNIT_ROWS, split=t.split)[0])
                   for t in self.tasks]
        refs = [[split_rows.labels.remote(u) for u in p.units] for p in planned]
        for p, r in zip(planned, refs):
            p.labels = split_rows.in_order(p.task.name, p.task.split, tasks.get(r), self.sources)
        shards = embeddings.shard_uris(images)
        sizes = storage.file_sizes(shards) if shards else []
        none = np.zeros(0, np.int64)
        wanted = [(f"{p.task.slug}/", f"{p.task.slug}/{p.task.split}/", none) for p in planned]
        blocks = [split_rows.vectors.remote(shards[a:b], wanted) for a, b in engine.batches(sizes, BLOCK_BYTES)]
        flat = [ref for block in blocks for ref in block]
        scored, clean = [], []
        for t, p in enumerate(planned):
            _, evaluated = split_rows.gather.remote(t, p.task.name, wanted[t][:2], none, len(p.labels),
                                                    storage.display(images), *flat)
            scored.append(_cluster.remote(evaluated, p.labels))
            if self.flags is not None:  # the same clustering of the images the audit did not flag
                keys = [f"{wanted[t][1]}{i}" for i in range(len(p.labels))]
                keep = np.array([k not in self.flags.eval for k in keys], bool)
                clean.append((_cluster.remote(evaluated, p.labels, keep) if keep.any() else None,
                              {"images": int(keep.sum()), "left_out": {"eval": Flags.left_out(self.flags.eval, keys)},
                               "audit": storage.display(self.exclude)}))
        log(f"[eval] {len(planned)} clustering tasks, {sum(len(p.labels) for p in planned):,} images, "
            f"{len(shards)} image shards in {len(blocks)} blocks")
        return _Pending(planned, scored, start, images, clean)

    def collect(self, pending: _Pending, log) -> dict[str, dict]:
        results = {}
        for p, ref in zip(pending.planned, pending.scored):
            scores = tasks.get(ref)
            seconds = time.time() - pending.start
            entry = {**scores, "main_score": scores["nmi"], "hf_subset": "default", "languages": ["eng-Latn"]}
            result = task_result(p.task.name, p.task.source.revision, p.task.split, [entry], seconds,
                                 [{"name": "Scoring", "start": 0.0, "end": seconds, "split": p.task.split,
                                   "subset": "default"}])
            result["mieb_ray"] = {"images": len(p.labels), "clusters": len(set(p.labels))}
            if pending.clean:
                ref, about = pending.clean[len(results)]
                clean = tasks.get(ref) if ref is not None else None
                result["mieb_ray"]["clean"] = ({**clean, "main_score": clean["nmi"], **about} if clean else
                                               unscorable(p.task.name, f"the audit flagged all {len(p.labels):,} "
                                                          "eval images", about))
            results[p.task.name] = result
        log(f"[eval] {len(results)} clustering tasks scored in {time.time() - pending.start:.1f}s")
        return results

    def write(self, out: str, results: dict[str, dict], pending: _Pending, log) -> tuple[list[str], dict]:
        rows = [{"task": p.task.name, "split": p.task.split, **results[p.task.name]["mieb_ray"],
                 **{k: results[p.task.name]["scores"][p.task.split][0][k]
                    for k in ("nmi", "v_measure", "ari", "cluster_accuracy")}} for p in pending.planned]
        summary = {"title": "MIEB image clustering", "tasks": rows,
                   "model": embeddings.model_of(pending.images_uri)}
        storage.write_bytes(storage.join(out, "summary.json"), (json.dumps(summary, indent=2) + "\n").encode())
        storage.write_bytes(storage.join(out, "report.html"),
                            run_report.render([(self.title, None, results)], summary["model"]).encode())
        mean = float(np.mean([r["nmi"] for r in rows])) if rows else 0.0
        log(f"[eval] mean NMI over {len(rows)} clustering tasks: {mean:.4f} -> {storage.display(out)}")
        return ["summary.json", "report.html"], {"mean_nmi": mean}
