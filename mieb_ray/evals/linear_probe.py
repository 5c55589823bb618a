"""MIEB's linear-probe tasks as an EvalSuite: up to 19 tasks scored together from one set of image embeddings,
equal to mteb 2.26.24's `AbsTaskClassification` on the same embeddings.

plan      driver: each task's train and eval splits planned by the one reader (footers, first tar headers)
labels    a task per read unit of both splits (split_rows.labels), labels as the source holds them
samples   driver: mteb's undersampling of each task's train labels (probe_tasks.samples); the union of the
          experiments' rows is all a task needs of the train embeddings
vectors   split_rows.vectors and .gather: each shard read once, a task's drawn train rows (`<slug>/<index>`, as
          mieb-train keys them) and its eval split (`<slug>/<split>/<index>`) gathered in order
fit       a task per (task, experiment): sklearn's LogisticRegression as mteb configures it, then mteb's metrics
collect   driver: per task the mean of each metric and every experiment's scores, in mteb's TaskResult
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mieb_ray import formats, storage
from mieb_ray.evals import run_report, split_rows
from mieb_ray.evals.metrics import classification
from mieb_ray.evals.probe_tasks import MAX_ITER, SEED, ProbeTask, samples, train_rows
from mieb_ray.evals.protocol import EmbedInputs, task_result, unscorable
from mieb_ray.io import embeddings, reader
from mieb_ray.io.contamination import Flags
from mieb_ray.pipelines.build import build_eval_splits
from mieb_ray.runtime import placement, tasks
from mieb_ray.runtime.cluster import RunContext
from mieb_ray.sources import by_slug
from mieb_ray.topk import engine

UNIT_ROWS = 100_000  # split rows per label-reading task
BLOCK_BYTES = 128 << 20  # image-embedding shard bytes per read task


@dataclass
class Planned:
    task: ProbeTask
    train: list  # read units of the train split
    eval: list  # of the eval split
    drawn: list[list[int]] = field(default_factory=list)  # per experiment: source indices, in mteb's order
    union: np.ndarray | None = None  # sorted source indices of every drawn row
    train_labels: list = field(default_factory=list)  # per experiment: the drawn rows' labels
    eval_labels: list = field(default_factory=list)
    clean: dict | None = None  # with --exclude: drawn, train_labels, keep (eval rows), left_out, as above


# ---------------------------------------------------------------------------------------------- tasks


@tasks.remote(num_cpus=1)
def _write_drawn(unit: reader.Unit, slug: str, wanted: np.ndarray, dest: str) -> int:
    """The drawn rows of one train read unit, as a table to embed: `key` (`<slug>/<index>`, mieb-train's) and
    `image` (the source's bytes). Returns its rows; none: no file."""
    keys, images = [], []
    for chunk in reader.read(unit, [reader.source_columns(by_slug(slug))["image"]]):
        mine = np.isin(chunk["index"].to_numpy(), wanted)
        if mine.any():
            keep = pa.array(mine)
            keys += [f"{slug}/{i}" for i in pc.filter(chunk["index"], keep).to_pylist()]
            images.append(pc.filter(chunk["image"], keep))
    if keys:
        buffer = pa.BufferOutputStream()
        pq.write_table(pa.table({"key": keys, "image": pa.concat_arrays([c for a in images for c in a.chunks])}),
                       buffer)
        data = buffer.getvalue().to_pybytes()
        if not storage.exists(dest) or _read(dest) != data:  # the same table kept as it is: its files' times are
            storage.write_bytes(dest, data)  # part of its identity, so a rerun reuses its embeddings
    return len(keys)


def _read(uri: str) -> bytes:
    with storage.open_input(uri) as f:
        return f.read()


@tasks.remote(num_cpus=1)
def _fit(train: np.ndarray, evaluated: np.ndarray, positions: np.ndarray, y_train: list, y_eval: list,
         keep: np.ndarray | None = None) -> dict:
    """One experiment as mteb runs it: LogisticRegression(max_iter=100, random_state=42) fit on the drawn rows
    (`positions` in the union, in mteb's order), predictions on the eval split (the rows `keep` marks, when given:
    y_eval are theirs), mteb's metrics of them."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # mteb's 100 iterations often stop short, as there
        warnings.simplefilter("ignore", UserWarning)  # "more unique classes than half the samples": 16 per class
        model = LogisticRegression(max_iter=MAX_ITER, random_state=SEED).fit(train[positions], y_train)
    predicted = model.predict(evaluated if keep is None else evaluated[keep])
    return classification(y_eval, predicted, predicted)  # mteb's ap: of the predictions


def average(experiments: list[dict]) -> dict:
    """mteb's _calculate_avg_scores: each metric's mean over the experiments that have it (NaN where none)."""
    out = {}
    for k in experiments[0]:
        values = [e[k] for e in experiments if e[k] is not None]
        out[k] = float(np.mean(values)) if values else float("nan")
    return out


# ---------------------------------------------------------------------------------------------- the suite


@dataclass
class _Pending:
    planned: list[Planned]
    fits: list[list]  # per task, per experiment: a ref to its metrics
    start: float
    images_uri: str
    clean: list = field(default_factory=list)  # with --exclude: the same, without what the audit flagged


class LinearProbeSuite:
    """The chosen linear-probe tasks over one mirror (`sources`: "hf" or a mirror root)."""

    kind = formats.suite_kind("linear_probe")
    title = "Linear probe"  # its section of a run's page
    needs_texts = False

    def __init__(self, tasks_: list[ProbeTask], sources: str, exclude: str | None = None):
        self.tasks, self.sources, self.exclude = tasks_, sources, exclude
        self.flags = Flags.load(exclude) if exclude else None
        self._planned: list[Planned] | None = None

    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    def plan(self) -> list[Planned]:
        """Both splits of each task planned from file metadata (driver)."""
        if self._planned is None:
            def one(task: ProbeTask) -> Planned:
                train, _ = reader.plan_source(task.source, self.sources, UNIT_ROWS, split="train")
                evaluated, _ = reader.plan_source(task.source, self.sources, UNIT_ROWS, split=task.split)
                return Planned(task, train, evaluated)

            with ThreadPoolExecutor(8) as pool:
                self._planned = list(pool.map(one, self.tasks))
        return self._planned

    def draw(self, log) -> list[Planned]:
        """Every task's labels read, and its training rows drawn as mteb draws them (once)."""
        planned = self.plan()
        if all(p.union is not None for p in planned):
            return planned
        refs = [([split_rows.labels.remote(u) for u in p.train], [split_rows.labels.remote(u) for u in p.eval])
                for p in planned]
        for p, (train_refs, eval_refs) in zip(planned, refs):
            train = split_rows.in_order(p.task.name, "train", tasks.get(train_refs), self.sources)
            p.eval_labels = split_rows.in_order(p.task.name, p.task.split, tasks.get(eval_refs), self.sources)
            rows = train_rows(p.task, len(train))
            labels = [train[i] for i in rows]
            drawn = samples(labels, p.task.samples_per_label, p.task.experiments)
            p.drawn = [rows[d].tolist() for d in drawn]
            p.train_labels = [[labels[i] for i in d] for d in drawn]
            every = p.drawn
            if self.flags is not None:
                p.clean = self._clean(p, rows, labels)
                every = every + p.clean["drawn"]
            p.union = np.unique(np.concatenate([np.asarray(d, np.int64) for d in every]))
        log(f"[eval] {len(planned)} linear-probe tasks: {sum(len(p.union) for p in planned):,} train rows drawn "
            f"(mteb's {planned[0].task.samples_per_label if planned else 16} per label), "
            f"{sum(len(p.eval_labels) for p in planned):,} eval images")
        return planned

    def _clean(self, p: Planned, rows: np.ndarray, labels: list) -> dict:
        """mteb's draws on the train split without the rows the audit flagged (the same undersampling of what is
        left), and the eval rows it did not flag."""
        train_keys = [p.task.train_key(int(i)) for i in rows]
        kept = [n for n, k in enumerate(train_keys) if k not in self.flags.train]
        kept_rows, kept_labels = rows[kept], [labels[n] for n in kept]
        drawn = samples(kept_labels, p.task.samples_per_label, p.task.experiments)
        eval_keys = [f"{p.task.key_prefix()}{i}" for i in range(len(p.eval_labels))]
        keep = np.array([k not in self.flags.eval for k in eval_keys], bool)
        why = (f"the audit flagged all {len(keep):,} eval images" if not keep.any() else
               f"the audit flagged all {len(rows):,} train rows" if not kept else
               "the audit left train rows of one label (a logistic regression needs two)"
               if len(set(kept_labels)) < 2 else None)
        return {"drawn": [kept_rows[d].tolist() for d in drawn], "train_labels": [[kept_labels[i] for i in d]
                                                                                   for d in drawn],
                "keep": keep, "eval_labels": [y for y, k in zip(p.eval_labels, keep) if k], "unscorable": why,
                "left_out": {"eval": Flags.left_out(self.flags.eval, eval_keys),
                             "train": Flags.left_out(self.flags.train, train_keys)}}

    def embed_inputs(self, out: str, log, ctx: RunContext | None = None) -> EmbedInputs:
        """Two tables of images to embed: the drawn train rows only, read from the sources (keys `<slug>/<index>`,
        Caltech101's background rows included), and the eval splits built by the build job (reused when
        complete); no texts."""
        where = placement.choose("auto", None, ctx=ctx)
        with tasks.using(where.mode, where.ctx):
            planned = self.draw(log)
            digest = hashlib.sha256(json.dumps([[p.task.name, p.union.tolist()] for p in planned]).encode())
            drawn = storage.join(out, "probe-train", digest.hexdigest()[:12])
            written = tasks.get([_write_drawn.remote(u, p.task.slug, p.union,
                                                     storage.join(drawn, p.task.slug, f"{u.name.replace('/', '-')}"
                                                                  ".parquet"))
                                 for p in planned for u in p.train])
        log(f"[eval] the {sum(written):,} drawn train rows written to embed: {storage.display(drawn)}")
        evaluated = build_eval_splits(self.sources, out, log, [p.task.slug for p in planned], ctx)
        return EmbedInputs(f"{drawn},{evaluated}", "key", None, raw=True)

    def submit(self, images: str, texts: str | None, log) -> _Pending:
        start = time.time()
        planned = self.draw(log)
        where = storage.display(images)
        shards = embeddings.shard_uris(images)
        sizes = storage.file_sizes(shards) if shards else []
        wanted = [(p.task.train_key(""), p.task.key_prefix(), p.union) for p in planned]
        blocks = [split_rows.vectors.remote(shards[a:b], wanted) for a, b in engine.batches(sizes, BLOCK_BYTES)]
        flat = [ref for block in blocks for ref in block]
        fits, clean = [], []
        for t, p in enumerate(planned):
            train, evaluated = split_rows.gather.remote(t, p.task.name, (p.task.train_key(""), p.task.key_prefix()),
                                                        p.union, len(p.eval_labels), where, *flat)
            position = {int(i): n for n, i in enumerate(p.union)}
            at = [np.array([position[i] for i in drawn], np.int64) for drawn in p.drawn]
            fits.append([_fit.remote(train, evaluated, a, y, p.eval_labels) for a, y in zip(at, p.train_labels)])
            if p.clean is not None:  # the same fits without what the audit flagged, where that can be fit
                at = [np.array([position[i] for i in drawn], np.int64) for drawn in p.clean["drawn"]]
                clean.append([] if p.clean["unscorable"] else
                             [_fit.remote(train, evaluated, a, y, p.clean["eval_labels"], p.clean["keep"])
                              for a, y in zip(at, p.clean["train_labels"])])
        log(f"[eval] {len(shards)} image shards in {len(blocks)} blocks; "
            f"{sum(len(f) for f in fits)} fits ({len(planned)} tasks x their experiments)")
        return _Pending(planned, fits, start, images, clean)

    def collect(self, pending: _Pending, log) -> dict[str, dict]:
        results = {}
        for p, refs in zip(pending.planned, pending.fits):
            experiments = tasks.get(refs)
            entry = {**average(experiments), "scores_per_experiment": experiments}
            entry = {**entry, "main_score": entry["accuracy"], "hf_subset": "default", "languages": ["eng-Latn"]}
            seconds = time.time() - pending.start
            result = task_result(p.task.name, p.task.source.revision, p.task.split, [entry], seconds,
                                 [{"name": "Scoring", "start": 0.0, "end": seconds, "split": p.task.split,
                                   "subset": "default"}])
            result["mieb_ray"] = {"train_rows_drawn": len(p.union), "eval_images": len(p.eval_labels),
                                  "classes": len(set(p.eval_labels) | {y for ys in p.train_labels for y in ys}),
                                  "experiments": p.task.experiments, "samples_per_label": p.task.samples_per_label}
            if p.clean is not None:
                cleaned = tasks.get(pending.clean[len(results)])
                about = {"eval_images": len(p.clean["eval_labels"]), "left_out": p.clean["left_out"],
                         "audit": storage.display(self.exclude)}
                result["mieb_ray"]["clean"] = (
                    unscorable(p.task.name, p.clean["unscorable"], about) if p.clean["unscorable"] else
                    {**average(cleaned), "scores_per_experiment": cleaned, "main_score": average(cleaned)["accuracy"],
                     **about})
            results[p.task.name] = result
        log(f"[eval] {len(results)} linear-probe tasks fit and scored in {time.time() - pending.start:.1f}s")
        return results

    def write(self, out: str, results: dict[str, dict], pending: _Pending, log) -> tuple[list[str], dict]:
        rows = [{"task": p.task.name, "split": p.task.split, **results[p.task.name]["mieb_ray"],
                 "accuracy": results[p.task.name]["scores"][p.task.split][0]["accuracy"]} for p in pending.planned]
        mean = float(np.mean([r["accuracy"] for r in rows])) if rows else 0.0
        summary = {"title": "MIEB linear probe", "tasks": rows, "mean_accuracy": mean,
                   "model": embeddings.model_of(pending.images_uri)}
        storage.write_bytes(storage.join(out, "summary.json"), (json.dumps(summary, indent=2) + "\n").encode())
        storage.write_bytes(storage.join(out, "report.html"),
                            run_report.render([(self.title, None, results)], summary["model"]).encode())
        log(f"[eval] mean linear-probe accuracy over {len(rows)} tasks: {mean:.4f} -> {storage.display(out)}")
        return ["summary.json", "report.html"], {"mean_accuracy": mean}
