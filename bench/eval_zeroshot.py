"""The zero-shot eval against mteb's own `mteb.evaluate`, same precomputed embeddings, same scores: the whole call,
process start to results JSON.

Data: the fixture mirror's eval splits (real pictures, the hub's layout) and 512-d embeddings of them and of the
prompts in our shard format (tests/embedding_fixtures.py). Not timed. Two shapes:
  1. CIFAR100ZeroShot at its real size, 10,000 test images (one task: the common case of a quick check);
  2. every task of the suite (the 22 classification tasks and SciMMIR), scaled to --rows eval images each (the
     real suite is sources.EVAL_TOTAL_ROWS images; UCF101 alone 697,222).

Contenders, each a fresh process timed from spawn to exit, one after the other:
  1. mteb 2.26.24   bench/mteb_zeroshot_call.py: import mteb; per task, load the eval split with `datasets`
                    (a warm cache, as a user's hub cache: one untimed warm-up run first), `mteb.evaluate` with an
                    encoder returning the precomputed embeddings, write the TaskResult JSON.
  2. mieb-ray       `python -m mieb_ray eval-zeroshot --tasks ... --data ... --image-embeddings ...
                    --text-embeddings ... --out ...`: embeddings this small are scored in-process (--executor
                    auto), Ray never started; reads labels through the build's readers, scores mteb's and the
                    fixed prompts, writes <Task>.json, predictions.parquet, summary.json, report.html and the
                    manifest.
  3. mieb-ray, Ray  the same with `--executor ray`: starts a local Ray (--no-ray-row leaves it out).

Prints a table per shape with the ratio, and checks that every metric mteb reports is identical in ours.

Run from the repository root:
    .venv/bin/python bench/eval_zeroshot.py [--rows 500] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import _baselines as b  # first: sets RAY_AUTH_MODE before Ray is imported
from embedding_fixtures import make_zeroshot_embeddings

from mieb_ray.evals.zeroshot_tasks import TASKS, select_tasks
from mieb_ray.fixtures.mirror import make_mirror
from mieb_ray.sources import EVAL_TOTAL_ROWS


def same_scores(ours: Path, theirs: Path, tasks) -> bool:
    for task in tasks:
        mine = json.loads((ours / f"{task.name}.json").read_text())["scores"][task.split][0]
        want = json.loads((theirs / f"{task.name}.json").read_text())["scores"][task.split][0]
        if any(mine.get(k) != v for k, v in want.items()):
            print(f"  MISMATCH {task.name}: {want} vs {mine}")
            return False
    return True


def shape(name: str, tasks, rows: dict[str, int], work: Path, repeat: int, ray_row: bool) -> dict:
    work.mkdir(parents=True)
    root = str(work / "data")
    t0 = time.perf_counter()
    make_mirror(root, rows=1, datasets=[t.slug for t in tasks], files=1, eval_rows=rows)
    images, texts = str(work / "img"), str(work / "txt")
    make_zeroshot_embeddings(tasks, rows, images, texts, dim=512, image_shards=max(1, sum(rows.values()) // 5000))
    print(f"[{name}] mirror and embeddings of {sum(rows.values()):,} eval images in {time.perf_counter() - t0:.0f}s",
          flush=True)
    env, names = b.fresh_process_env(), ",".join(t.name for t in tasks)
    flags = ["--tasks", names, "--data", root, "--image-embeddings", images, "--text-embeddings", texts]

    def mteb_call(out: Path) -> float:
        return b.run_process([sys.executable, str(b.BENCH / "mteb_zeroshot_call.py"), *flags,
                              "--cache", str(work / "hf-cache"), "--out", str(out)], env)

    print(f"[{name}] mteb warm-up (fills the datasets cache) {mteb_call(work / 'mteb-warm'):.1f}s", flush=True)
    mteb_t, ours_t, ray_t, load = [], [], [], os.getloadavg()[0]

    def ours(out: str, *more: str) -> float:
        return b.run_process([sys.executable, "-m", "mieb_ray", "eval-zeroshot", *flags, *more,
                              "--out", str(work / out)], env)

    for i in range(repeat):
        mteb_t.append(mteb_call(work / f"mteb{i}"))
        ours_t.append(ours(f"ours{i}"))
        if ray_row:
            ray_t.append(ours(f"ray{i}", "--executor", "ray"))
        print(f"[{name} {i + 1}] mteb {mteb_t[-1]:.2f}s, mieb-ray CLI {ours_t[-1]:.2f}s"
              + (f", with --executor ray {ray_t[-1]:.2f}s" if ray_row else ""), flush=True)
    last = repeat - 1
    manifest = json.loads((work / f"ours{last}" / "_manifest.json").read_text())
    same = same_scores(work / f"ours{last}", work / f"mteb{last}", tasks)
    if ray_row:
        same = same and same_scores(work / f"ray{last}", work / f"mteb{last}", tasks)
    return {"mteb": mteb_t, "ours": ours_t, "ray": ray_t, "load": (load, os.getloadavg()[0]),
            "ours_inner": manifest["seconds"], "executor": manifest.get("executor"), "same": same,
            "summary": json.loads((work / f"ours{last}" / "summary.json").read_text())}


def report(title: str, r: dict, repeat: int) -> None:
    t_mteb, t_ours = min(r["mteb"]), min(r["ours"])
    print(f"\n### {title}\n")
    rows = [["mteb 2.26.24: `python bench/mteb_zeroshot_call.py` (import mteb, load splits from a warm `datasets` "
             "cache, `mteb.evaluate`, write JSON)", f"{t_mteb:.2f}", "1.00", "1.0"],
            ["mieb-ray: `python -m mieb_ray eval-zeroshot` (in-process: imports, labels, score both prompt sets, "
             "write JSON, predictions, summary, report)", f"{t_ours:.2f}", f"{t_ours / t_mteb:.2f}",
             f"{t_mteb / t_ours:.1f}"]]
    if r["ray"]:
        t_ray = min(r["ray"])
        rows.append(["mieb-ray: `python -m mieb_ray eval-zeroshot --executor ray` (the same on a local Ray it "
                     "starts and stops)", f"{t_ray:.2f}", f"{t_ray / t_mteb:.2f}", f"{t_mteb / t_ray:.1f}"])
    print(b.markdown_table(["contender", f"seconds (fastest of {repeat})", "x mteb's time", "x faster than mteb"],
                           rows))
    accuracy = r["summary"]["tasks"]
    print(f"\n**whole call: mieb-ray {t_ours:.2f}s vs mteb {t_mteb:.2f}s = {t_ours / t_mteb:.2f}x mteb's time "
          f"({t_mteb / t_ours:.1f}x faster)**; executor taken (manifest): {r['executor']}; every metric identical "
          f"to mteb's: {'yes' if r['same'] else 'NO'} ({len(accuracy)} tasks; mieb-ray's own scoring and writing, "
          f"from its manifest: {r['ours_inner']:.2f}s)\n")
    b.footer(f"All runs: mteb {', '.join(f'{t:.2f}' for t in r['mteb'])} s; mieb-ray "
             f"{', '.join(f'{t:.2f}' for t in r['ours'])} s"
             + (f"; --executor ray {', '.join(f'{t:.2f}' for t in r['ray'])} s" if r["ray"] else ""),
             "Each a fresh process timed from spawn to exit, one after the other. mieb-ray also scores the fixed "
             "prompts, which mteb does not.",
             f"Load average (1 min) before / after: {r['load'][0]:.2f} / {r['load'][1]:.2f}.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=500, help="eval images per task in the whole-suite shape (default 500)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("bench/_work/eval_zeroshot"))
    ap.add_argument("--no-ray-row", dest="ray_row", action="store_false",
                    help="leave out the whole call with --executor ray (a local Ray started and stopped)")
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    cifar = select_tasks("CIFAR100ZeroShot")
    one = shape("CIFAR100", cifar, {"cifar100": 10_000}, work / "cifar100", args.repeat, args.ray_row)
    every = shape(f"{len(TASKS)} tasks", TASKS, {t.slug: args.rows for t in TASKS}, work / "all", args.repeat,
                  args.ray_row)
    print("\n" + "=" * 100)
    report("CIFAR100ZeroShot, real size: 10,000 test images, 100 classes, 512-d embeddings", one, args.repeat)
    report(f"All {len(TASKS)} zero-shot tasks, scaled to {args.rows:,} eval images each ({len(TASKS) * args.rows:,} in "
           f"all; the real suite has {EVAL_TOTAL_ROWS:,}), 512-d embeddings", every, args.repeat)


if __name__ == "__main__":
    main()
