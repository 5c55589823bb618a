"""The zero-shot eval against mteb's own `mteb.evaluate`, same precomputed embeddings, same scores: the whole call,
process start to results JSON.

Data: the fixture mirror's eval splits (real pictures, the hub's layout) and 512-d embeddings of them and of the
prompts in our shard format (tests/support/embedding_fixtures.py). Not timed. Two shapes:
  1. CIFAR100ZeroShot at its real size, 10,000 test images (one task: the common case of a quick check);
  2. every task of the suite (the 22 classification tasks and SciMMIR), scaled to --rows eval images each (the
     real suite is sources.EVAL_TOTAL_ROWS images; UCF101 alone 697,222).

Contenders, each a fresh process timed from spawn to exit, one after the other:
  1. mteb 2.26.24   bench/contenders/mteb_zeroshot_call.py: import mteb; per task, load the eval split with `datasets`
                    (a warm cache, as a user's hub cache: one untimed warm-up run first), `mteb.evaluate` with an
                    encoder returning the precomputed embeddings, write the TaskResult JSON.
  2. mieb-ray       `python -m mieb_ray eval-zeroshot --tasks ... --data ... --image-embeddings ...
                    --text-embeddings ... --out ...`: embeddings this small are scored in-process (--executor
                    auto), Ray never started; reads labels through the build's readers, scores mteb's and the
                    fixed prompts, writes <Task>.json, predictions.parquet, summary.json, report.html and the
                    manifest.
  3. mieb-ray, Ray  the same with `--executor ray`: starts a local Ray (--no-ray-row leaves it out).

One harness table (bench/harness.py) with both shapes' contenders, each against its shape's mteb; the record
bench/records/eval_zeroshot.json; checks that every metric mteb reports is identical in ours.

Run from the repository root:
    .venv/bin/python bench/eval_zeroshot.py [--rows 500] [--repeat 2]
    .venv/bin/python bench/eval_zeroshot.py --shapes suite --tasks CIFAR10ZeroShot --rows 50 --repeat 1 \
        --no-ray-row --records /tmp/records                                               # a smoke run
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported

h.use_test_fixtures()
from support.embedding_fixtures import make_zeroshot_embeddings  # noqa: E402

from mieb_ray.demo_data.mirror import make_mirror  # noqa: E402
from mieb_ray.evals.zeroshot_tasks import TASKS, select_tasks  # noqa: E402
from mieb_ray.sources import EVAL_TOTAL_ROWS  # noqa: E402

MTEB = ("mteb 2.26.24: `python bench/contenders/mteb_zeroshot_call.py` (import mteb, load splits from a warm "
        "`datasets` cache, `mteb.evaluate`, write JSON)")
OURS = ("`python -m mieb_ray eval-zeroshot` (in-process: imports, labels, score both prompt sets, write JSON, "
        "predictions, summary, report)")
RAY = "`python -m mieb_ray eval-zeroshot --executor ray` (the same on a local Ray it starts and stops)"


def same_scores(ours: Path, theirs: Path, tasks) -> bool:
    for task in tasks:
        mine = json.loads((ours / f"{task.name}.json").read_text())["scores"][task.split][0]
        want = json.loads((theirs / f"{task.name}.json").read_text())["scores"][task.split][0]
        if any(mine.get(k) != v for k, v in want.items()):
            print(f"  MISMATCH {task.name}: {want} vs {mine}")
            return False
    return True


class Shape:
    """One shape's data (not timed), its mteb warm-up, and its contenders: fresh processes."""

    def __init__(self, label: str, tasks, rows: dict[str, int], work: Path, ray_row: bool):
        self.label, self.tasks, self.work, self.ray_row = label, tasks, work, ray_row
        work.mkdir(parents=True)
        root = str(work / "data")
        t0 = time.perf_counter()
        make_mirror(root, rows=1, datasets=[t.slug for t in tasks], files=1, eval_rows=rows)
        images, texts = str(work / "img"), str(work / "txt")
        make_zeroshot_embeddings(tasks, rows, images, texts, dim=512,
                                 image_shards=max(1, sum(rows.values()) // 5000))
        print(f"[{label}] mirror and embeddings of {sum(rows.values()):,} eval images in "
              f"{time.perf_counter() - t0:.0f}s", flush=True)
        self.flags = ["--tasks", ",".join(t.name for t in tasks), "--data", root, "--image-embeddings", images,
                      "--text-embeddings", texts]
        print(f"[{label}] mteb warm-up (fills the datasets cache) {h.run_process(self.mteb(-1)):.1f}s", flush=True)

    def mteb(self, i: int) -> list[str]:
        return [sys.executable, str(h.CONTENDERS / "mteb_zeroshot_call.py"), *self.flags, "--cache",
                str(self.work / "hf-cache"), "--out", str(self.work / (f"mteb{i}" if i >= 0 else "mteb-warm"))]

    def ours(self, tag: str, *more: str):
        return lambda i: [sys.executable, "-m", "mieb_ray", "eval-zeroshot", *self.flags, *more, "--out",
                          str(self.work / f"{tag}{i}")]

    def contenders(self) -> list[h.Contender]:
        mteb = f"mteb [{self.label}]"
        out = [h.Contender(mteb, MTEB, argv=self.mteb),
               h.Contender(f"mieb-ray [{self.label}]", OURS, argv=self.ours("ours"), baseline=mteb)]
        if self.ray_row:
            out.append(h.Contender(f"mieb-ray, Ray [{self.label}]", RAY, argv=self.ours("ray", "--executor", "ray"),
                                   baseline=mteb))
        return out

    def figures(self, last: int) -> dict:
        """After the runs: scores identical to mteb's (the last run of each), what the manifest says."""
        ours = self.work / f"ours{last}"
        manifest = json.loads((ours / "_manifest.json").read_text())
        same = same_scores(ours, self.work / f"mteb{last}", self.tasks)
        if self.ray_row:
            same = same and same_scores(self.work / f"ray{last}", self.work / f"mteb{last}", self.tasks)
        return {"tasks": len(self.tasks), "every metric identical to mteb's": same,
                "executor taken (manifest)": manifest.get("executor"),
                "mieb-ray's own scoring and writing, from its manifest (s)": round(manifest["seconds"], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=500, help="eval images per task in the whole-suite shape (default 500)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--shapes", default="cifar100,suite", help="cifar100 (real size), suite (scaled); default both")
    ap.add_argument("--tasks", default=None, help="the suite shape's tasks, comma-separated (default: all)")
    ap.add_argument("--work", type=Path, default=Path("bench/_work/eval_zeroshot"))
    ap.add_argument("--no-ray-row", dest="ray_row", action="store_false",
                    help="leave out the whole call with --executor ray (a local Ray started and stopped)")
    h.add_records_option(ap)
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    shapes, titles = [], []
    if "cifar100" in args.shapes:
        shapes.append(Shape("CIFAR100", select_tasks("CIFAR100ZeroShot"), {"cifar100": 10_000}, work / "cifar100",
                            args.ray_row))
        titles.append("CIFAR100ZeroShot at real size (10,000 test images, 100 classes)")
    if "suite" in args.shapes:
        tasks = select_tasks(args.tasks) if args.tasks else TASKS
        label = f"{len(tasks)} tasks"
        shapes.append(Shape(label, tasks, {t.slug: args.rows for t in tasks}, work / "suite", args.ray_row))
        titles.append(f"{'all ' if len(tasks) == len(TASKS) else ''}{len(tasks)} zero-shot tasks scaled to "
                      f"{args.rows:,} eval images each ({len(tasks) * args.rows:,} in all; the real suite has "
                      f"{EVAL_TOTAL_ROWS:,})")
    headline = shapes[-1]
    bench = h.Benchmark(
        "eval_zeroshot", "; ".join(titles) + "; 512-d embeddings, the whole call (process start to results JSON)",
        [c for s in shapes for c in s.contenders()], group="Eval", repeat=args.repeat,
        ratio=(f"mieb-ray [{headline.label}]", f"mteb [{headline.label}]"))
    record = h.run(bench)
    record.finish(figures={s.label: s.figures(args.repeat - 1) for s in shapes}, notes=[
        "Each contender a fresh process timed from spawn to exit, one after the other; mteb's splits from a warm "
        "`datasets` cache (one untimed warm-up run per shape filled it, as a user's hub cache).",
        "Both sides start from the same precomputed 512-d embeddings and the fixture mirror's eval splits; mteb's "
        "DataLoader still converts each image to RGB (a decode), as an mteb user pays; ours reads labels only.",
        "mieb-ray also scores the fixed prompts, which mteb does not."])


if __name__ == "__main__":
    main()
