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
The two alternate, --repeat times each. Prints the harness table (bench/harness.py) and writes
bench/records/ray_workers.json.

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

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported

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
    h.add_records_option(ap)
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    from mieb_ray.demo_data.mirror import make_mirror
    from mieb_ray.demo_data.models import make_tiny_clip

    print("[setup] fixture mirror, tiny CLIP, the 137-row train table ...", flush=True)
    make_mirror(str(work / "mirror"), rows=6)
    model = make_tiny_clip(str(work / "clip"))
    env = h.fresh_process_env()
    h.run_process([sys.executable, "-m", "mieb_ray", "build", "--sources", str(work / "mirror"),
                   "--out", str(work / "train"), "--rows-per-shard", "4"], {**env, "RAY_TMPDIR": str(work / "tb")})

    cpus = os.cpu_count() or 1
    limits = {"Ray's default": ({"RAY_num_workers_soft_limit": "-1"}, "-1 (Ray's default)"),
              "mieb-ray": ({}, worker_soft_limit(cpus))}

    def embed(name: str):
        def call(i):
            tag = f"{i}-{'ours' if name == 'mieb-ray' else 'default'}"
            tmp, out = work / f"ray-{tag}", work / f"out-{tag}"
            tmp.mkdir()
            argv = [sys.executable, "-m", "mieb_ray", "embed", "--input", str(work / "train"), "--out", str(out),
                    "--model", model, "--rows-per-shard", "3", "--executor", "ray", "--gpus-per-worker", "0",
                    "--cpus-per-worker", "0.5"]
            seconds = h.run_process(argv, {**env, **limits[name][0], "RAY_TMPDIR": str(tmp)})
            started, idle = workers(tmp)
            return {"seconds": seconds, "started": started, "idle": idle}
        return call

    bench = h.Benchmark(
        "ray_workers", f"Idle Ray workers: `mieb-ray embed --executor ray`, 137 rows in 68 units, one node of {cpus} "
        "CPUs", [h.Contender(name, f"a fresh process, spawn to exit, num_workers_soft_limit {limits[name][1]}: Ray's "
                             "start-up, model load, read, encode and commit of the 68 units, the manifest",
                             call=embed(name), baseline=None if name == "Ray's default" else "Ray's default")
                 for name in limits],
        group="Embed", ratio=("mieb-ray", "Ray's default"), repeat=args.repeat,
        columns=[("worker processes started (runs)", lambda r: ", ".join(map(str, r.extra("started")))),
                 ("of them ended for being idle (runs)", lambda r: ", ".join(map(str, r.extra("idle"))))])
    h.run(bench).finish(notes=["Worker processes started, and those that ended for being idle, counted from each "
                               "run's Ray logs (RAY_TMPDIR per run)."])


if __name__ == "__main__":
    main()
