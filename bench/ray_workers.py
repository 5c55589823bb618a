"""Ray's idle workers beside an actor pool: the embed job on a one-node Ray, many small units, with Ray's default
limit on the worker processes a node keeps (num_workers_soft_limit -1, documented as "num_cpus") and with
mieb-ray's (runtime.cluster.worker_soft_limit: 2 x CPUs + 4).

  Ray's default  RAY_num_workers_soft_limit=-1 in the environment: Ray's own default, spelled out
                 (runtime.cluster.ray_up leaves a limit the user set as it is)
  mieb-ray       nothing set: runtime.cluster.ray_up starts the local Ray with 2 x CPUs + 4

Each run is a fresh `python -m mieb_ray embed --executor ray` process, timed from spawn to exit: Ray's start-up,
the model load, and 68 units of 2-3 rows (a 137-row table built from the fixture mirror, --rows-per-shard 3)
through read tasks (1 CPU each), one encoder actor (0.5 CPU) and commit tasks (0.25 CPU). The worker processes
Ray started, and those that ended for being idle, are counted from the run's Ray logs (RAY_TMPDIR per run).
The two alternate, --repeat times each.

Run from the repository root:
    .venv/bin/python bench/ray_workers.py --work /tmp/rw
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
from pathlib import Path

import _baselines as b  # first: sets RAY_AUTH_MODE before Ray is imported

from mieb_ray.runtime.cluster import worker_soft_limit


def workers(tmp: Path) -> tuple[int, int]:
    """(worker processes started, worker processes that exited for being idle) in the run's Ray logs."""
    logs = glob.glob(str(tmp / "ray" / "session_2*" / "logs"))
    started = sum(open(f"{d}/raylet.out").read().count("Started worker process") for d in logs)
    idle = sum("idle for a long time" in open(p, errors="replace").read()
               for d in logs for p in glob.glob(f"{d}/python-core-worker-*.log"))
    return started, idle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path(__file__).parent / "_work" / "ray_workers")
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    from mieb_ray.fixtures.mirror import make_mirror
    from mieb_ray.fixtures.models import make_tiny_clip

    print("[setup] fixture mirror, tiny CLIP, the 137-row train table ...", flush=True)
    make_mirror(str(work / "mirror"), rows=6)
    model = make_tiny_clip(str(work / "clip"))
    env = b.fresh_process_env()
    b.run_process([sys.executable, "-m", "mieb_ray", "build", "--sources", str(work / "mirror"),
                   "--out", str(work / "train"), "--rows-per-shard", "4"], {**env, "RAY_TMPDIR": str(work / "tb")})

    cpus = os.cpu_count() or 1
    contenders = {"Ray's default": {"RAY_num_workers_soft_limit": "-1"}, "mieb-ray": {}}
    runs = {name: [] for name in contenders}
    for i in range(args.repeat):
        for name, extra in contenders.items():
            tag = f"{i}-{'ours' if name == 'mieb-ray' else 'default'}"
            tmp, out = work / f"ray-{tag}", work / f"out-{tag}"
            tmp.mkdir()
            argv = [sys.executable, "-m", "mieb_ray", "embed", "--input", str(work / "train"), "--out", str(out),
                    "--model", model, "--rows-per-shard", "3", "--executor", "ray", "--gpus-per-worker", "0",
                    "--cpus-per-worker", "0.5"]
            seconds = b.run_process(argv, {**env, **extra, "RAY_TMPDIR": str(tmp)})
            runs[name].append((seconds, *workers(tmp)))
            print(f"[run {i + 1}] {name}: {seconds:.1f}s, worker processes started / ended idle: "
                  f"{runs[name][-1][1]} / {runs[name][-1][2]}", flush=True)

    best = {name: min(r) for name, r in runs.items()}
    limits = {"Ray's default": "-1 (Ray's default)", "mieb-ray": worker_soft_limit(cpus)}
    rows = [[name, limits[name], f"{s:.1f}", started, idle, f"{best[next(iter(best))][0] / s:.2f}"]
            for name, (s, started, idle) in best.items()]
    print("\n" + "=" * 100)
    print(f"### Idle Ray workers: `mieb-ray embed --executor ray`, 137 rows in 68 units, one node of {cpus} CPUs\n")
    print(b.markdown_table(["worker limit", "workers kept (num_workers_soft_limit)", "seconds (fastest)",
                            "worker processes started", "of them ended for being idle", "speed vs Ray's default"],
                           rows))
    print("\nAll runs (seconds, workers started / ended idle): " + "; ".join(
        f"{n}: " + ", ".join(f"{s:.1f} s ({w} / {d})" for s, w, d in r) for n, r in runs.items()) + "\n")
    b.footer("Each a fresh process from spawn to exit: Ray's start-up, model load, read, encode and commit of the "
             "68 units, the manifest.")


if __name__ == "__main__":
    main()
