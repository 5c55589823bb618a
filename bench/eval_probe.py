"""The linear-probe eval against mteb's own `mteb.evaluate`, same precomputed embeddings, same scores: the whole
call, process start to results JSON (issue 27).

Data (not timed): a mirror of the tasks' sources in the hub's layout (tests' fixture mirror, make_mirror) with the
real row counts of each task's train and eval splits (mteb's descriptive stats; --scale shrinks them), labels
cycling through the classes as the fixture mirror lays them (WebDataset splits in tars of 10,000 rows, as on the
hub); every image a 1x1 PNG whose pixel spells its writing index, so mteb's side can find each row's vector.
Synthetic 512-d float32 embeddings, a class centre plus noise, in our shard format
(tests/support/embedding_fixtures.py), as two embed outputs: the train rows mteb's undersampling draws (the union
of the experiments' samples, keyed `<slug>/<position>` as mieb-train), and every eval row
(`<slug>/<split>/<position>`, as build --split eval); a position is a row's place in its split as `datasets` reads
it (tars in name order: `10.tar` before `2.tar`; read_order).

Contenders, each a fresh process timed from spawn to exit, one after the other:
  1. mieb-ray       `python -m mieb_ray eval --tasks ... --sources MIRROR --image-embeddings TRAIN,EVAL --out ...`
                    (--executor auto: it decides whether to start Ray; the manifest says which it took).
  2. mteb 2.26.24   bench/contenders/mteb_probe_call.py: import mteb; read the embeddings into lookup tables; per
                    task, load its train and eval splits with `datasets` (a warm cache, as a user's hub cache: an
                    untimed warm-up loads every split first), `mteb.evaluate` with an encoder that looks the
                    embeddings up, write the TaskResult JSON. Its tasks spread over --mteb-processes processes
                    at once (default: the machine's cores), balanced by train rows times experiments (groups).

Prints the harness table (bench/harness.py) and writes bench/records/eval_probe.json; checks that every metric
mteb reports (the means and every experiment's scores) is identical in ours.

Run from the repository root:
    .venv/bin/python bench/eval_probe.py [--tasks A,B] [--scale 1.0] [--repeat 2] [--mteb-processes N] [--work DIR]
    .venv/bin/python bench/eval_probe.py --tasks CIFAR10 --scale 0.01 --repeat 1 --records /tmp/records  # smoke
At real size mteb's side takes days on 2 cores (Imagenet1k and UCF101: their undersampling's label reads, groups()
says how they grow); mieb-ray's takes about a minute. Leave those two out with --tasks for a run that finishes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import struct
import sys
import time
import zlib
from pathlib import Path

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported
import numpy as np

h.use_test_fixtures()
from support.embedding_fixtures import write_embeddings  # noqa: E402

from mieb_ray.demo_data.mirror import label_order, make_mirror  # noqa: E402
from mieb_ray.evals.probe_tasks import TASKS, ProbeTask, samples, select_tasks, train_rows  # noqa: E402

DIM = 512
SHARD_ROWS = 50_000  # embedding rows per shard
TAR_ROWS = 10_000  # rows a WebDataset tar holds, as CLIP_benchmark's --max-count on the hub
NOISE = 5.0  # per-dimension noise around a class centre of unit-variance coordinates: accuracies 0.4-0.9


def real_sizes(task: ProbeTask) -> tuple[int, int]:
    """(train rows, eval rows) of the real task: mteb's descriptive stats of it."""
    root = Path(importlib.util.find_spec("mteb").origin).parent  # not imported: the driver stays light
    stats = json.loads((root / "descriptive_stats" / "Image" / "ImageClassification" / f"{task.name}.json")
                       .read_text())
    return stats["train"]["num_samples"], stats[task.split]["num_samples"]


def sizes(task: ProbeTask, scale: float) -> tuple[int, int]:
    """Real sizes times `scale`; the train split keeps samples_per_label rows per class (full draws), the eval
    split one row per class."""
    train, evaluated = real_sizes(task)
    if scale >= 1:
        return train, evaluated
    classes = len(label_order(task.slug))
    return (min(train, max(round(train * scale), task.samples_per_label * classes)),
            min(evaluated, max(round(evaluated * scale), classes)))


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


_PNG_HEAD = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
_PNG_TAIL = _chunk(b"IEND", b"")


def index_png(source, index: int) -> bytes:
    """A 1x1 RGB PNG whose pixel spells `index` (24 bits: UCF101's 1,786,096 rows fit)."""
    return _PNG_HEAD + _chunk(b"IDAT", zlib.compress(b"\x00" + index.to_bytes(3, "big"))) + _PNG_TAIL


def read_order(root: str, slug: str, repo: str, split: str, n: int) -> np.ndarray:
    """The writing index of each of a split's n rows, in the order `datasets` reads them (the positions mteb draws
    by and mieb-ray keys by): its tars sorted by name as strings (`10.tar` before `2.tar`), each tar's rows in
    order; a split of one parquet file as written."""
    tars = sorted(p.name for p in (Path(root) / repo / split).glob("*.tar"))
    if not tars:
        return np.arange(n)
    order = np.concatenate([np.arange(int(t[:-4]) * TAR_ROWS, min((int(t[:-4]) + 1) * TAR_ROWS, n)) for t in tars])
    assert len(order) == n, (slug, split, len(order), n)
    return order


def labels_of(slug: str, written: np.ndarray) -> np.ndarray:
    """The label ids of the rows of these writing indices, as the fixture mirror writes them (label_of)."""
    order = np.asarray(label_order(slug))
    return order[written % len(order)]


def make_embeddings(tasks, rows: dict[str, tuple[int, int]], root: str, train_out: str,
                    eval_out: str) -> tuple[int, int]:
    """The drawn train rows' and the eval rows' vectors, keyed by their positions in the splits of the mirror at
    root: a centre per (task, class) plus noise."""
    rng = np.random.default_rng(0)
    parts = {"train": ([], []), "eval": ([], [])}
    for task in tasks:
        n_train, n_eval = rows[task.slug]
        classes = len(label_order(task.slug))
        centres = rng.standard_normal((classes, DIM), dtype=np.float32)
        train = labels_of(task.slug, read_order(root, task.slug, task.source.repo, "train", n_train))
        kept = train_rows(task, n_train)  # as mteb: without the rows its dataset_transform drops
        drawn = samples(train[kept].tolist(), task.samples_per_label, task.experiments)
        union = kept[np.unique(np.concatenate([np.asarray(d, np.int64) for d in drawn]))]
        evaluated = labels_of(task.slug, read_order(root, task.slug, task.source.repo, task.split, n_eval))
        for kind, index, label, key in (("train", union, train[union], task.train_key("")),
                                        ("eval", np.arange(n_eval), evaluated, task.key_prefix())):
            noise = rng.standard_normal((len(index), DIM), dtype=np.float32)
            parts[kind][0].extend(f"{key}{i}" for i in index.tolist())
            parts[kind][1].append(centres[label] + np.float32(NOISE) * noise)
    for kind, out in (("train", train_out), ("eval", eval_out)):
        keys, matrix = parts[kind][0], np.concatenate(parts[kind][1])
        write_embeddings(out, keys, matrix, "image", "float32", max(1, math.ceil(len(keys) / SHARD_ROWS)),
                         {"fixture": "bench/eval_probe.py", "noise": NOISE})
    return len(parts["train"][0]), len(parts["eval"][0])


def groups(tasks, rows: dict[str, tuple[int, int]], n: int) -> str:
    """The tasks in n groups of about equal cost for mteb (`--tasks "A,B;C"`): largest first, each to the lightest
    group. Its cost grows as its train rows squared times its experiments: each experiment's undersampling reads
    every train row's label one at a time through `datasets`' Column, and one such read costs more the longer the
    split (measured: 0.31 ms at 50,000 rows, 1.6 at 262,144, 13 at 1,281,167, 18 at 1,786,096)."""
    bins = [[0, []] for _ in range(n)]
    for task in sorted(tasks, key=lambda t: -rows[t.slug][0] ** 2 * t.experiments):
        lightest = min(bins, key=lambda b: b[0])
        lightest[0] += rows[task.slug][0] ** 2 * task.experiments
        lightest[1].append(task.name)
    return ";".join(",".join(names) for _, names in bins if names)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # NaN in both
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def same_scores(ours: Path, theirs: Path, tasks) -> bool:
    """Every metric of mteb's scores[split][0] (means and scores_per_experiment) equal in ours."""
    same = True
    for task in tasks:
        mine = json.loads((ours / f"{task.name}.json").read_text())["scores"][task.split][0]
        want = json.loads((theirs / f"{task.name}.json").read_text())["scores"][task.split][0]
        wrong = [k for k, v in want.items() if not _same(mine.get(k), v)]
        if wrong:
            same = False
            for k in wrong:
                print(f"  MISMATCH {task.name} {k}: mteb {want[k]} vs ours {mine.get(k)}")
    return same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=None, help="comma-separated linear-probe tasks (default: all 19)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="fraction of each split's real rows (default 1: real sizes); train keeps at least "
                         "samples_per_label rows per class, eval at least one per class")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--mteb-processes", type=int, default=os.cpu_count(),
                    help="mteb's tasks spread over this many processes at once (default: the machine's cores)")
    ap.add_argument("--work", type=Path, default=Path("bench/_work/eval_probe"))
    h.add_records_option(ap)
    args = ap.parse_args()
    tasks = select_tasks(args.tasks.split(",") if args.tasks else None)
    rows = {t.slug: sizes(t, args.scale) for t in tasks}
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    root = str(work / "data")
    t0 = time.perf_counter()
    make_mirror(root, rows={t.slug: rows[t.slug][0] for t in tasks}, datasets=[t.slug for t in tasks],
                files=1, tar_rows=TAR_ROWS, eval_rows={t.slug: rows[t.slug][1] for t in tasks}, image_bytes=index_png)
    t1 = time.perf_counter()
    train_out, eval_out = str(work / "img-train"), str(work / "img-eval")
    n_train, n_eval = make_embeddings(tasks, rows, root, train_out, eval_out)
    print(f"mirror of {sum(r[0] for r in rows.values()):,} train + {sum(r[1] for r in rows.values()):,} eval rows "
          f"in {t1 - t0:.0f}s; embeddings of {n_train:,} drawn train rows + {n_eval:,} eval rows in "
          f"{time.perf_counter() - t1:.0f}s", flush=True)
    names, images = ",".join(t.name for t in tasks), f"{train_out},{eval_out}"
    spread = groups(tasks, rows, args.mteb_processes)

    def mteb_call(out: str, *extra: str) -> list[str]:
        return [sys.executable, str(h.CONTENDERS / "mteb_probe_call.py"), "--tasks", spread, "--data", root,
                "--image-embeddings", images, "--cache", str(work / "hf-cache"), "--out", str(work / out), *extra]

    warm = h.run_process(mteb_call("mteb-warm", "--load-only"))
    print(f"mteb warm-up (loads every split: fills the datasets cache) {warm:.1f}s", flush=True)
    size = "real sizes" if args.scale >= 1 else f"scaled to {args.scale:g} of the real rows"
    bench = h.Benchmark(
        "eval_probe", f"{'All 19' if len(tasks) == len(TASKS) else len(tasks)} linear-probe tasks at {size}: "
        f"{sum(v[0] for v in rows.values()):,} train + {sum(v[1] for v in rows.values()):,} eval rows, {DIM}-d "
        "embeddings; the whole call, process start to results JSON", [
            h.Contender("mieb-ray", "`python -m mieb_ray eval` (imports, labels of both splits, mteb's draws, gather "
                        "the embeddings, fit, write JSON, summary, report)", baseline="mteb",
                        argv=lambda i: [sys.executable, "-m", "mieb_ray", "eval", "--tasks", names, "--sources", root,
                                        "--image-embeddings", images, "--out", str(work / f"ours{i}")]),
            h.Contender("mteb", f"mteb 2.26.24: `python bench/contenders/mteb_probe_call.py` (import mteb, read the "
                        "embeddings, load train and eval splits from a warm `datasets` cache, `mteb.evaluate`, write "
                        f"JSON), tasks spread over {spread.count(';') + 1} processes at once",
                        argv=lambda i: mteb_call(f"mteb{i}"))],
        group="Eval", ratio=("mieb-ray", "mteb"), repeat=args.repeat)
    record = h.run(bench)
    last = args.repeat - 1
    manifest = json.loads((work / f"ours{last}" / "_manifest.json").read_text())
    summary = json.loads((work / f"ours{last}" / "summary.json").read_text())
    ratio = record.ratio("mieb-ray", "mteb")
    record.finish(figures={
        "every metric identical to mteb's (means and each experiment's)": same_scores(
            work / f"ours{last}", work / f"mteb{last}", tasks),
        "target <= 0.5x mteb's time": "met" if ratio <= 0.5 else "NOT met",
        "executor taken (manifest)": manifest.get("executor"),
        "mieb-ray's own work, from its manifest (s)": round(manifest.get("seconds", 0), 2),
        "tasks": len(summary["tasks"]), "mean accuracy": round(summary["mean_accuracy"], 4),
        "embeddings": f"{n_train:,} drawn train rows + {n_eval:,} eval rows, {DIM}-d float32, {SHARD_ROWS:,} rows "
                      "a shard, two embed outputs (train, eval)",
        "mteb's processes (their tasks)": spread.replace(";", " | "),
        "mteb's evaluation_time per task (s, its TaskResult)": "; ".join(
            f"{t.name} {json.loads((work / f'mteb{last}' / f'{t.name}.json').read_text())['evaluation_time']:.0f}"
            for t in tasks),
        "rows per task (train / eval)": "; ".join(f"{t.name} {rows[t.slug][0]:,} / {rows[t.slug][1]:,}"
                                                  for t in tasks)}, notes=[
        "Each a fresh process timed from spawn to exit, one after the other; mteb's splits from a warm `datasets` "
        "cache (an untimed warm-up loaded every split first).",
        "mteb's undersampling (each experiment) reads every train row's label one at a time through `datasets`' "
        "Column (`labels[i]`: 0.31 ms at 50,000 rows, 13 ms at Imagenet1k's 1,281,167, 18 ms at UCF101's 1,786,096 "
        "with datasets 5.2 here): its time grows as the train split squared, about a day each for Imagenet1k and "
        "UCF101 at real size; mieb-ray reads the label column once."])


if __name__ == "__main__":
    main()
