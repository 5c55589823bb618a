"""MIEB(lite), all 51 tasks, through the command line on fixture mirrors, against mteb's own run of the same model.

Data: the 23 sources' mirror (mieb_ray/demo_data/mirror.py, --rows train and --eval-rows eval rows each) and a
mirror of every other MIEB(lite) task in its hub repo's layout (tests/support/hub_tasks/), one root; a tiny CLIP
(make_tiny_clip) saved as a hub model is. Contenders:
  1. mteb 2.26.24    mteb.evaluate of each task with mteb's own CLIP wrapper on the model, one process
                     (tests/support/mteb_tasks.mteb_result): the user's alternative, one task after another
  2. mieb-ray        `mieb-ray eval --tasks "MIEB(lite)" --sources MIRROR --model MODEL --out OUT`, a fresh process:
                     builds the sources' eval splits, collects the other tasks' inputs with mteb's loaders, embeds
                     every image and text once, scores; in this process or on a local Ray as placement says
  3. mieb-ray, again the same command with --overwrite: every embedding is reused (nothing encoded)
Every task's TaskResult of run 2 is compared with mteb's (every metric of every split and subset, within 1e-6) and the
tasks that differ are listed with their first difference. A random tiny CLIP scores most images and labels almost
alike, so wherever a score rests on a near-tie (an argmax over 211 prompts, a logistic regression stopped at 100
iterations on a few rows per class) the last bits of the float arithmetic decide it, and those differ between mteb's
run and ours (batches, threads: embeddings equal to 1e-6). tests/unit/evals/test_mteb_*.py and test_model_runs.py
check equality where the fixtures keep clear of such ties. The nauc_*_max of the tasks whose queries retrieve themselves
(tests/support/mteb_tasks.noise_decided, as those tests do) is float noise at any size, and is not compared.

Run from the repository root:
    .venv/bin/python bench/mieb_lite.py [--rows 200] [--eval-rows 100]
    .venv/bin/python bench/mieb_lite.py --rows 40 --eval-rows 20 --records /tmp/records      # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported

# a fresh `datasets` cache, set before `datasets` is imported (it reads the place once): a cache shared with earlier
# runs can serve an old mirror's rows for a new one at a path of the same name
HF_HOME = tempfile.mkdtemp(prefix="bench-hf-")
os.environ.update(HF_HOME=HF_HOME, HF_HUB_OFFLINE="1")
h.use_test_fixtures()
from support.hub_tasks import compositionality, retrieval, sts, tasks_misc  # noqa: E402
from support.mteb_tasks import assert_same_scores, mteb_result, noise_decided  # noqa: E402

from mieb_ray.demo_data.mirror import make_mirror  # noqa: E402
from mieb_ray.demo_data.models import make_tiny_clip  # noqa: E402
from mieb_ray.evals import benchmarks, registry  # noqa: E402

WRITERS = {**tasks_misc.TASKS, **sts.TASKS, **compositionality.TASKS, **retrieval.TASKS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200, help="train rows of each of the 23 sources")
    parser.add_argument("--eval-rows", type=int, default=100, help="eval rows of each of the 23 sources")
    h.add_records_option(parser)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mieb-lite-"))
    env = h.fresh_process_env()  # HF_HOME: this process's
    try:
        mirror, out = work / "mirror", work / "out"
        t0 = time.time()
        make_mirror(mirror, rows=args.rows, eval_rows=args.eval_rows)
        for write in dict.fromkeys(WRITERS[t] for t in benchmarks.LITE if t in WRITERS):
            write(str(mirror))
        model = make_tiny_clip(str(work / "model"))
        print(f"[mieb_lite] mirrors and model written in {time.time() - t0:.1f}s", flush=True)
        argv = [sys.executable, "-m", "mieb_ray", "eval", "--tasks", "MIEB(lite)", "--sources", str(mirror),
                "--model", model, "--out", str(out)]
        seconds = {"mieb-ray": [h.run_process(argv, env)], "mieb-ray, again": [h.run_process([*argv, "--overwrite"],
                                                                                              env)]}
        t0 = time.time()
        theirs = {task: mteb_result(task, str(mirror), model) for task in benchmarks.LITE}
        seconds["mteb 2.26.24"] = [time.time() - t0]
        by_suite = {task: suite.name for suite, names in registry.select("MIEB(lite)") for task in names}
        differ = {}
        for task in benchmarks.LITE:
            ours = json.loads((out / by_suite[task] / f"{task}.json").read_text())
            try:
                assert_same_scores(ours, theirs[task], skip=lambda key, task=task: noise_decided(task, key))
            except AssertionError as exc:  # the first metric that differs, and by how much
                differ[task] = str(exc)
        print(f"[mieb_lite] {len(benchmarks.LITE) - len(differ)} of {len(benchmarks.LITE)} tasks equal mteb's, every "
              f"metric; differing: {differ or 'none'}", flush=True)
        suites = {s: sum(1 for t in by_suite.values() if t == s) for s in dict.fromkeys(by_suite.values())}
        bench = h.Benchmark("mieb_lite", f"MIEB(lite), {len(benchmarks.LITE)} tasks on fixture mirrors, a tiny CLIP", [
            h.Contender("mteb 2.26.24", "mteb.evaluate per task with mteb's CLIP wrapper, one process (data loaded "
                        "from a warm datasets cache)"),
            h.Contender("mieb-ray", "`mieb-ray eval --tasks \"MIEB(lite)\" --model`, a fresh process: eval splits "
                        "built, inputs collected, each embedded once, scored", baseline="mteb 2.26.24"),
            h.Contender("mieb-ray, again", "the same with --overwrite: every embedding reused",
                        baseline="mteb 2.26.24")], group="Eval", ratio=("mieb-ray", "mteb 2.26.24"))
        h.measured(bench, seconds).finish(figures={"tasks by suite": suites, "rows": args.rows,
                                                   "eval_rows": args.eval_rows, "tasks differing from mteb": differ},
                                          records=args.records, notes=[
            "Every task's TaskResult compared with mteb's, every metric of every split and subset (within 1e-6).",
            "mteb's run reads the mirrors after mieb-ray's: its datasets cache is warm, as a user's hub cache "
            "would be."])
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(HF_HOME, ignore_errors=True)


if __name__ == "__main__":
    main()
