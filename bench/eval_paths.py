"""A task type scored two ways: by its hand-built suite (the 23 sources' splits read by our readers, scored on the
top-k engine) and through mteb's own code (evals/mteb_suite.py: mteb's loader and evaluator, answered from the
content-keyed cache). The rule in docs/architecture.md ("which path a task type takes") rests on this table.

Contenders, each a whole `eval --model` call in this process on the same hub-layout mirror (one source, --rows train
and --eval-rows eval rows) with the same tiny CLIP (encoding is the same work on either path: each image once; a
tiny model keeps it from hiding the rest), one task type at a time (zero-shot, linear probe, clustering):
  1. hand-built   registry's suite for the task: build its eval split (and the probe's train draw), embed, score
  2. via mteb     MtebSuite on the same task: mteb loads the split twice (collect, score), embed what the cache
                  lacks, mteb's evaluator
  3. via mteb, cached  the same again: the cache holds every input, so nothing is embedded
Both paths' scores are checked equal (every metric, within 1e-5) before anything is timed.

Run from the repository root:
    .venv/bin/python bench/eval_paths.py [--rows 2000] [--eval-rows 2000] [--repeat 2]
    .venv/bin/python bench/eval_paths.py --rows 100 --eval-rows 100 --repeat 1 --records /tmp/records   # smoke
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported

# a fresh `datasets` cache, set before `datasets` is imported (it reads the place once): a cache shared with earlier
# runs can serve an old mirror's rows for a new one at a path of the same name
HF_HOME = tempfile.mkdtemp(prefix="bench-hf-")
os.environ.update(HF_HOME=HF_HOME, HF_HUB_OFFLINE="1")
h.use_test_fixtures()
from support.mteb_tasks import assert_same_scores  # noqa: E402

from mieb_ray.demo_data.mirror import make_mirror  # noqa: E402
from mieb_ray.demo_data.models import make_tiny_clip  # noqa: E402
from mieb_ray.evals import job, registry  # noqa: E402
from mieb_ray.evals.mteb_suite import MtebSuite  # noqa: E402

TYPES = {"zero-shot": "CIFAR10ZeroShot", "linear probe": "CIFAR10", "clustering": "CIFAR10Clustering"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000, help="train rows of the source (the probe's draw)")
    parser.add_argument("--eval-rows", type=int, default=2000, help="eval rows scored")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--types", default=",".join(TYPES), help="comma-separated: " + ", ".join(TYPES))
    h.add_records_option(parser)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="eval-paths-"))
    try:
        mirror = str(work / "mirror")
        make_mirror(mirror, rows=args.rows, datasets=["cifar10"], eval_rows=args.eval_rows)
        model = make_tiny_clip(str(work / "model"))
        quiet = lambda *a: None  # noqa: E731

        def hand(task: str, out: Path):
            return job.evaluate(registry.select(task), registry.Options(mirror), str(out), log=quiet, model=model,
                                executor="local", overwrite=True)

        def via_mteb(task: str, out: Path):
            suite = registry.Suite("mteb", (task,), None)
            return job.evaluate([(suite, [task])], registry.Options(mirror), str(out), log=quiet, model=model,
                                executor="local", overwrite=True, scorers=[MtebSuite([task], mirror)])

        contenders = []
        for kind in args.types.split(","):
            task = TYPES[kind]
            a, b = hand(task, work / f"check-hand-{kind}"), via_mteb(task, work / f"check-mteb-{kind}")
            assert_same_scores(a[task], b[task])  # the same scores, or nothing is worth timing
            main = a[task]["scores"]["test"][0]["main_score"]
            print(f"[eval_paths] {task}: both paths give the same scores (main score {main})")

            def fresh(name, fn, task=task):
                def call(i):
                    out = work / f"{name}-{i}"
                    shutil.rmtree(out, ignore_errors=True)  # nothing cached: embeds and builds anew
                    fn(task, out)
                return call

            def cached(i, task=task, kind=kind):
                via_mteb(task, work / f"check-mteb-{kind}")  # its cache holds every input already

            contenders += [
                h.Contender(f"{kind}: hand-built", "eval --model: build the split, embed, score (hand-built suite)",
                            call=fresh(f"hand-{kind}", hand)),
                h.Contender(f"{kind}: via mteb", "eval --model: mteb loads (collect), embed, mteb loads and scores",
                            call=fresh(f"mteb-{kind}", via_mteb), baseline=f"{kind}: hand-built"),
                h.Contender(f"{kind}: via mteb, cached", "the same with every input in the cache: nothing embedded",
                            call=cached, baseline=f"{kind}: hand-built"),
            ]
        bench = h.Benchmark("eval_paths", f"one task type, hand-built suite vs mteb's own code, {args.eval_rows:,} "
                            "eval rows, a tiny CLIP", contenders, group="Eval", repeat=args.repeat)
        record = h.run(bench)
        record.finish(figures={"rows": args.rows, "eval_rows": args.eval_rows}, records=args.records, notes=[
            "Each contender is a whole `eval --model` call in one process on a one-source hub-layout mirror; the "
            "tiny CLIP makes encoding cheap, so the table shows what each path adds around the model.",
            "Both paths' scores were checked equal before timing."])
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(HF_HOME, ignore_errors=True)


if __name__ == "__main__":
    main()
