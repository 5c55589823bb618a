"""The MIEB zero-shot suite as an EvalSuite: all its tasks, or some, scored together from one set of embedding shards.

plan      driver: each task's eval split planned by the one reader (footers, first tar headers); the
          ClassLabel names give mteb's prompts and mieb-train's fixed prompts
load      a task per read unit of an eval split: its (index, label) pairs
prompts   one task reads every prompt's text embedding: the prompt corpus, one partition of the top-k engine
images    a task per batch of image-embedding shards, each shard opened once: the rows whose key is
          `<slug>/<split>/<index>` of a chosen task, as one query block
score     the engine's score tasks, query block x the prompt partition, reducer ClassArgmax: mteb's scores of
          each image against its task's two prompt sets, the argmax, the top 3 and the score of class 1
collect   driver: per task the predictions by split index (every image exactly once), mteb's metrics
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mieb_ray import formats, storage
from mieb_ray.captions import ClassTable
from mieb_ray.errors import UserError
from mieb_ray.evals.protocol import EmbedInputs, task_result, text_table, text_vectors, unscorable
from mieb_ray.evals.zeroshot_report import render
from mieb_ray.evals.zeroshot_scoring import (
    PROMPT_SETS,
    ClassArgmax,
    TaskPrompts,
    metrics,
)
from mieb_ray.evals.zeroshot_tasks import ZeroShotTask
from mieb_ray.io import embeddings, reader
from mieb_ray.io.contamination import Flags
from mieb_ray.mieb_train import label_ids
from mieb_ray.pipelines.build import build_eval_splits
from mieb_ray.runtime import tasks
from mieb_ray.runtime.cluster import RunContext
from mieb_ray.sources import by_slug
from mieb_ray.topk import engine

UNIT_ROWS = 50_000  # eval-split rows per label-reading task
BLOCK_BYTES = 128 << 20  # image-embedding shard bytes per query block
GALLERY_TASKS = 4  # tasks with a gallery of misclassified images in the report
GALLERY_IMAGES = 8  # misclassified images shown per task


@dataclass
class Planned:
    """One task's eval split: its read units, its prompts under both sets, its labels (a ref until collected)."""

    task: ZeroShotTask
    units: list
    prompts: dict[str, list[str]]
    classes: ClassTable  # mieb-train's classes: names, captions (the fixed prompts), the source's names
    labels: list = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- tasks


@tasks.remote(num_cpus=1)
def _labels(unit: reader.Unit, classes: ClassTable) -> tuple[np.ndarray, np.ndarray]:
    """(index, label id) of one read unit's rows (SciMMIR's class codes looked up as mteb's class_code does); a
    missing label is -1."""
    source = by_slug(unit.source)
    index, label = [], []
    for chunk in reader.read(unit, [reader.source_columns(source)["label"]]):
        index.append(chunk["index"].to_numpy())
        label.append(pc.fill_null(label_ids(source, classes, chunk["label"]), -1).to_numpy())
    if not index:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(index), np.concatenate(label)


@tasks.remote(num_cpus=1, num_returns=2)
def _prompt_corpus(uri: str, prompts: list[str]):
    """The dim, and the prompt corpus chunk (vectors, group = row) from text embeddings keyed by the text."""
    dim, vectors = text_vectors(uri, prompts, "prompts")
    return dim, (vectors, np.arange(len(prompts), dtype=np.int64))


@tasks.remote(num_cpus=1, num_returns=3)
def _image_block(uris: list[str], prefixes: list[str]):
    """One query block from a batch of shards, each opened once: the vectors of rows keyed
    `<prefix><index>` for a chosen task's prefix, their task numbers, and the block's metadata."""
    vectors, task_of, index, rows, dims, bad = [], [], [], 0, set(), []
    for uri in uris:
        table = embeddings.open_shard(uri)
        rows += table.num_rows
        dims |= {embeddings.dim(table)} - {None}
        keys = table["key"].combine_chunks() if table.num_rows else pa.array([], pa.string())
        matrix = embeddings.matrix(table) if table.num_rows else None
        for t, prefix in enumerate(prefixes):
            mine = pc.starts_with(keys, prefix).to_numpy(zero_copy_only=False)
            if not mine.any():
                continue
            rest = pc.utf8_slice_codeunits(pc.filter(keys, pa.array(mine)), len(prefix))
            try:
                idx = pc.cast(rest, pa.int64()).to_numpy()
            except pa.ArrowInvalid:
                bad.append(next(prefix + r for r in rest.to_pylist() if not r.isdigit()))
                continue
            vectors.append(matrix[np.flatnonzero(mine)].astype(np.float32))
            task_of.append(np.full(len(idx), t, np.int32))
            index.append(idx)
    dim = sorted(dims)
    d = dim[0] if len(dim) == 1 else 0
    meta = {"rows": rows, "dims": dim, "bad_keys": bad[:5],
            "task": np.concatenate(task_of) if task_of else np.zeros(0, np.int32),
            "index": np.concatenate(index) if index else np.zeros(0, np.int64)}
    block = np.concatenate(vectors) if vectors else np.zeros((0, d), np.float32)
    return block, meta["task"], meta


@tasks.remote(num_cpus=1)
def _images(units: list[reader.Unit], wanted: list[int]) -> dict[int, bytes | None]:
    """Image bytes of a few rows of an eval split (for the report's gallery)."""
    want, out = set(wanted), {}
    for unit in units:
        if not any(unit.lo <= w and (unit.hi is None or w < unit.hi) for w in want):
            continue
        for chunk in reader.read(unit, [reader.source_columns(by_slug(unit.source))["image"]]):
            for i, image in zip(chunk["index"].to_pylist(), pc.struct_field(chunk["image"], "bytes").to_pylist()):
                if i in want:
                    out[i] = image
    return out


# ---------------------------------------------------------------------------------------------- the suite


@dataclass
class _Pending:
    planned: list[Planned]
    texts_dim: object
    prompt_layout: engine.Layout
    blocks: list  # per image block: (metadata ref, result ref)
    start: float
    images_uri: str


class ZeroShotSuite:
    """The chosen zero-shot tasks over one mirror (`sources`: "hf" or a mirror root)."""

    kind = formats.suite_kind("zeroshot")
    title = "Zero-shot classification"  # its section of a run's page
    needs_texts = True

    def __init__(self, tasks: list[ZeroShotTask], sources: str, gallery_tasks: int = GALLERY_TASKS,
                 exclude: str | None = None):
        self.tasks, self.sources, self.gallery_tasks = tasks, sources, gallery_tasks
        self.flags = Flags.load(exclude) if exclude else None
        self.exclude = exclude
        self._planned: list[Planned] | None = None

    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    # -- what to load

    def plan(self) -> list[Planned]:
        """Plan each task's eval split from file metadata (driver); the prompts of both sets."""
        if self._planned is None:
            def one(task: ZeroShotTask) -> Planned:
                units, hub_names = reader.plan_source(task.source, self.sources, UNIT_ROWS, split=task.split)
                classes, mteb = task.classes(hub_names), task.mteb_prompts(hub_names)
                if len(mteb) != len(classes.text):
                    raise UserError(f"{task.name}: mteb has {len(mteb)} classes, the catalog {len(classes.text)}")
                return Planned(task, units, {"mteb": mteb, "fixed": list(classes.text)}, classes)

            with ThreadPoolExecutor(8) as pool:
                self._planned = list(pool.map(one, self.tasks))
        return self._planned

    def prompts(self) -> list[str]:
        """Every distinct prompt of both sets, in task order."""
        return list(dict.fromkeys(p for planned in self.plan() for s in PROMPT_SETS for p in planned.prompts[s]))

    # -- what to embed

    def embed_inputs(self, out: str, log, ctx: RunContext | None = None) -> EmbedInputs:
        """The eval splits built into OUT/eval-data/<id> by the build job (reused when complete), the prompts
        into a table keyed by their text."""
        data_out = build_eval_splits(self.sources, out, log, [t.slug for t in self.tasks], ctx)
        return EmbedInputs(data_out, "key", text_table(out, "prompts", self.prompts()))

    # -- how to score blocks

    def submit(self, images: str, texts: str, log) -> _Pending:
        start = time.time()
        planned = self.plan()
        for p in planned:
            p.labels = [_labels.remote(u, p.classes) for u in p.units]
        corpus, ranges = [], []
        for p in planned:
            spans = {}
            for s in PROMPT_SETS:
                spans[s] = (len(corpus), len(corpus) + len(p.prompts[s]))
                corpus += p.prompts[s]
            ranges.append(TaskPrompts(spans["mteb"], spans["fixed"], p.task.scorer))
        dim, chunk = _prompt_corpus.remote(texts, corpus)
        lay = engine.layout(chunks=[chunk], partitions=1)
        shards = embeddings.shard_uris(images)  # the manifest's list (or the folder's): no shard is opened
        sizes = storage.file_sizes(shards) if shards else []
        prefixes = [p.task.key_prefix() for p in planned]
        reader = _image_block.options(num_returns=3)
        blocks = [reader.remote(shards[a:b], prefixes) for a, b in engine.batches(sizes, BLOCK_BYTES)]
        results = engine.search(lay, [b[0] for b in blocks], ClassArgmax(tuple(ranges)), [b[1] for b in blocks])
        log(f"[eval] {len(planned)} zero-shot tasks, {len(corpus)} prompts, {len(shards)} image shards in "
            f"{len(blocks)} blocks")
        return _Pending(planned, dim, lay, [(b[2], r) for b, r in zip(blocks, results)], start, images)

    # -- how to merge

    def collect(self, pending: _Pending, log) -> dict[str, dict]:
        where = storage.display(pending.images_uri)
        metas = tasks.get([m for m, _ in pending.blocks])
        text_dim = tasks.get(pending.texts_dim)
        for m in metas:
            if m["bad_keys"]:
                raise UserError(f"{where} has keys that are not <slug>/<split>/<index>: "
                                f"{', '.join(map(repr, m['bad_keys']))}")
        dims = sorted({d for m in metas for d in m["dims"]})
        if len(dims) > 1:
            raise storage.StorageError(f"{where} mixes embedding dimensions {dims}")
        if dims and dims[0] != text_dim:
            raise UserError(f"text embeddings have dim {text_dim} but image embeddings dim {dims[0]}")
        scored = tasks.get([r for _, r in pending.blocks])
        self.predictions = {}
        results = {}
        for t, p in enumerate(pending.planned):
            results[p.task.name] = self._task(t, p, metas, scored, where, pending.start)
        log(f"[eval] scored {sum(len(v['label']) for v in self.predictions.values()):,} images in "
            f"{time.time() - pending.start:.1f}s")
        return results

    def _task(self, t: int, p: Planned, metas: list[dict], scored: list[dict], where: str, start: float) -> dict:
        index, label = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in zip(*tasks.get(p.labels)))
        n = int(index.max()) + 1 if len(index) else 0
        labels = np.full(n, -1, np.int64)
        labels[index] = label
        if len(index) != n or (labels < 0).any():
            bad = np.flatnonzero(labels < 0)[:5]
            raise UserError(f"{p.task.name}: rows {', '.join(map(str, bad))} of the {p.task.split} split have no "
                            f"label in {storage.display(self.sources)}")
        cols = {f"{s}_{c}": [] for s in PROMPT_SETS for c in ("pred", "top", "topv", "pos")}
        at = []
        for m, r in zip(metas, scored):
            mine = m["task"] == t
            if not mine.any():
                continue
            at.append(m["index"][mine])
            for c in cols:
                cols[c].append(r[c][mine])
        at = np.concatenate(at) if at else np.zeros(0, np.int64)
        counts = np.bincount(at[(at >= 0) & (at < n)], minlength=n) if n else np.zeros(0, np.int64)
        missing, extra = np.flatnonzero(counts == 0), int(((at < 0) | (at >= n)).sum())
        if len(missing) or extra:
            keys = ", ".join(repr(f"{p.task.key_prefix()}{i}") for i in missing[:5])
            raise UserError(f"{p.task.name}: {len(missing):,} of {n:,} images have no embedding in {where}"
                            + (f" (e.g. {keys})" if len(missing) else "")
                            + (f"; {extra:,} keys are beyond the split" if extra else ""))
        if (counts > 1).any():
            raise UserError(f"{where} holds {int((counts > 1).sum()):,} duplicate {p.task.name} keys")
        order = np.argsort(at, kind="stable")
        cols = {c: np.concatenate(v)[order] for c, v in cols.items()}
        self.predictions[p.task.name] = {"label": labels, **cols}
        scores = {s: metrics(labels, cols[f"{s}_pred"], cols[f"{s}_pos"]) for s in PROMPT_SETS}
        entry = {**scores["mteb"], "main_score": scores["mteb"]["accuracy"], "hf_subset": "default",
                 "languages": ["eng-Latn"]}
        seconds = time.time() - start
        result = task_result(p.task.name, p.task.source.revision, p.task.split, [entry], seconds,
                             [{"name": "Scoring", "start": 0.0, "end": seconds, "split": p.task.split,
                               "subset": "default"}])
        result["mieb_ray"] = {"fixed_prompts": scores["fixed"],
                              "difference": {"accuracy": scores["fixed"]["accuracy"] - scores["mteb"]["accuracy"]},
                              "images": n, "classes": len(p.prompts["mteb"]), "scorer": p.task.scorer}
        if self.flags is not None:  # each image's prediction stands alone: the clean scores are those of the rest
            keys = [f"{p.task.key_prefix()}{i}" for i in range(n)]
            keep = np.array([k not in self.flags.eval for k in keys], bool)
            about = {"images": int(keep.sum()), "left_out": {"eval": Flags.left_out(self.flags.eval, keys)},
                     "audit": storage.display(self.exclude)}
            if keep.any():
                clean = metrics(labels[keep], cols["mteb_pred"][keep], cols["mteb_pos"][keep])
                result["mieb_ray"]["clean"] = {**clean, "main_score": clean["accuracy"], **about}
            else:
                result["mieb_ray"]["clean"] = unscorable(p.task.name, f"the audit flagged all {n:,} eval images", about)
        return result

    # -- what to write

    def write(self, out: str, results: dict[str, dict], pending: _Pending, log) -> tuple[list[str], dict]:
        rows = []
        for p in pending.planned:
            pr, prefix = self.predictions[p.task.name], p.task.key_prefix()  # key_prefix looks the source up
            n = len(pr["label"])
            rows.append(pa.table({
                "task": pa.array([p.task.name] * n), "key": pa.array([f"{prefix}{i}" for i in range(n)]),
                "label": pr["label"], "mteb_pred": pr["mteb_pred"].astype(np.int64),
                "fixed_pred": pr["fixed_pred"].astype(np.int64)}))
        storage.commit_file(storage.join(out, "predictions.parquet"),
                            lambda local: pq.write_table(pa.concat_tables(rows) if rows else pa.table({}), local))

        summary = self.summary(results, pending)
        storage.write_bytes(storage.join(out, "summary.json"), (json.dumps(summary, indent=2) + "\n").encode())
        gallery, images = self._gallery(pending)
        storage.write_bytes(storage.join(out, "report.html"), render(summary, gallery, images).encode())
        m = summary["mean"]
        log(f"[eval] mean accuracy over {len(results)} tasks: mteb prompts {m['mteb']:.4f}, fixed prompts "
            f"{m['fixed']:.4f} ({m['difference']:+.4f}) -> {storage.display(out)}")
        return ["predictions.parquet", "summary.json", "report.html"], {"mean_accuracy": m}

    def summary(self, results: dict[str, dict], pending: _Pending) -> dict:
        rows = []
        for p in pending.planned:
            r = results[p.task.name]
            mteb = {k: v for k, v in r["scores"][p.task.split][0].items()
                    if k not in ("main_score", "hf_subset", "languages", "mteb_version")}
            fixed = r["mieb_ray"]["fixed_prompts"]
            pr = self.predictions[p.task.name]
            rows.append({"task": p.task.name, "split": p.task.split, "images": r["mieb_ray"]["images"],
                         "classes": r["mieb_ray"]["classes"], "mteb": mteb, "fixed": fixed,
                         "difference": fixed["accuracy"] - mteb["accuracy"],
                         "misclassified": int((pr["mteb_pred"] != pr["label"]).sum())})  # mteb's prompts
        mean = {s: float(np.mean([t[s]["accuracy"] for t in rows])) if rows else 0.0 for s in PROMPT_SETS}
        return {"title": "MIEB zero-shot classification",
                "model": embeddings.model_of(pending.images_uri),
                "evaluation_time": time.time() - pending.start, "tasks": rows,
                "mean": {**mean, "difference": mean["fixed"] - mean["mteb"]}}

    def _gallery(self, pending: _Pending) -> tuple[list[dict], dict[str, bytes]]:
        """The first misclassified images (mteb's prompts) of the tasks with the largest prompt effect."""
        def effect(p):
            pr = self.predictions[p.task.name]
            return -abs(float(np.mean(pr["fixed_pred"] == pr["label"]) - np.mean(pr["mteb_pred"] == pr["label"])))

        chosen = sorted(pending.planned, key=effect)[:self.gallery_tasks]
        wanted = {}
        for p in chosen:
            pr = self.predictions[p.task.name]
            wanted[p.task.name] = [int(i) for i in np.flatnonzero(pr["mteb_pred"] != pr["label"])[:GALLERY_IMAGES]]
        refs = {p.task.name: _images.remote(p.units, wanted[p.task.name])
                for p in chosen if wanted[p.task.name]}
        gallery, images = [], {}
        for p in chosen:
            if p.task.name not in refs:
                continue
            got, pr, names = tasks.get(refs[p.task.name]), self.predictions[p.task.name], p.classes.class_name
            for i in wanted[p.task.name]:
                key = f"{p.task.key_prefix()}{i}"
                if got.get(i):
                    images[key] = got[i]
                top = [{"class": names[c], "prompt": p.prompts["mteb"][c], "score": float(v)}
                       for c, v in zip(pr["mteb_top"][i], pr["mteb_topv"][i]) if c >= 0]
                fixed = int(pr["fixed_pred"][i])
                gallery.append({"task": p.task.name, "key": key, "true": names[pr["label"][i]], "top": top,
                                "fixed_pred": names[fixed], "fixed_correct": fixed == pr["label"][i]})
        return gallery, images
