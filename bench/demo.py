"""The demo, the README's first command: `mieb-ray demo` from process start to exit, this checkout against an
earlier revision, on the same machine in one run.

Contenders, each a fresh process (`python -m mieb_ray demo --out DIR`, a new DIR per run), --repeat rounds
interleaved:
  1. REV             the demo of the code at git revision --baseline-rev (a git worktree under --work)
  2. this checkout   the same command on this checkout's code
  3. imports alone   `python -c "import mieb_ray.cli, mieb_ray.demo"` on this checkout: what every run of the demo
                     pays before its first line (torch, transformers, datasets, webdataset)
Both demos do the same work: the fixture mirror made, 920 rows built, the table's images and texts embedded,
BioVITA and CIFAR10ZeroShot embedded and scored, the run's summary. Each runs outside the repository (its cwd is
--work), with its tree first on PYTHONPATH, so that it imports that tree's mieb_ray.

Run from the repository root:
    .venv/bin/python bench/demo.py --baseline-rev ff62ab4
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import harness as h


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-rev", default="ff62ab4", help="the earlier revision timed beside this checkout")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    h.add_records_option(parser)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    old = h.worktree(work, args.baseline_rev)

    def env(tree: Path) -> dict:
        return {**h.fresh_process_env(), "PYTHONPATH": os.pathsep.join(
            p for p in (str(tree), os.environ.get("PYTHONPATH")) if p), "HF_HUB_OFFLINE": "1"}

    for tree in (old, h.ROOT):  # each contender imports its own tree's mieb_ray, not the one pip installed
        found = subprocess.run([sys.executable, "-c", "import mieb_ray; print(mieb_ray.__file__)"], env=env(tree),
                               cwd=work, capture_output=True, text=True, check=True).stdout.strip()
        if not Path(found).resolve().is_relative_to(tree.resolve()):
            raise SystemExit(f"a demo of {tree} would import {found}")

    def demo(which: str):
        return lambda i: [sys.executable, "-m", "mieb_ray", "demo", "--out", str(work / f"{which}-{i}")]

    includes = "`python -m mieb_ray demo --out DIR`, a fresh process, spawn to exit"
    bench = h.Benchmark("demo", "The demo, the README's first command: process start to exit", [
        h.Contender(args.baseline_rev, f"{includes}, the code at {args.baseline_rev}", argv=demo("old"),
                    env=env(old), cwd=str(work)),
        h.Contender("this checkout", f"{includes}, this checkout", argv=demo("new"), env=env(h.ROOT),
                    cwd=str(work), baseline=args.baseline_rev),
        h.Contender("imports alone", "`python -c \"import mieb_ray.cli, mieb_ray.demo\"`, this checkout",
                    argv=[sys.executable, "-c", "import mieb_ray.cli, mieb_ray.demo"], env=env(h.ROOT),
                    cwd=str(work)),
    ], group="Demo", ratio=("this checkout", args.baseline_rev), repeat=args.repeat)
    record = h.run(bench)
    for i in range(args.repeat):  # the outputs are the same work: each run wrote its own folder
        for which in ("old", "new"):
            shutil.rmtree(work / f"{which}-{i}", ignore_errors=True)
    if args.work is None:  # a scratch folder of this run: its worktree goes with it
        subprocess.run(["git", "-C", str(h.ROOT), "worktree", "remove", "--force", str(old)], check=True)
        shutil.rmtree(work, ignore_errors=True)
    record.finish(notes=[
        "Both demos do the same work (920 rows built; four embed jobs: the table's images and texts, then the eval's; "
        "BioVITA and CIFAR10ZeroShot scored; the run's summary); each run writes a new folder, so none is refused "
        "for an earlier one."])


if __name__ == "__main__":
    main()
