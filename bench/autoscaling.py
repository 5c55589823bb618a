"""Every job on Ray's own autoscaler, from zero worker nodes, against the same cluster with every node up from the
start; under autoscaler v1 and v2 (issue 38).

The cluster is tests/support/autoscaling.py's, on this machine: a head that takes no work, a CPU worker type and a
GPU worker type (declared GPUs; the encoders run on the CPU, support.fake_cuda), Ray's fake multi-node provider
starting real raylets. Contenders, one cluster each:

  v1 from zero   autoscaler v1, every node type at min_workers 0; before each job, every worker node gone
                 (the idle timeout), so each job starts from zero workers
  v2 from zero   the same under autoscaler v2
  v1 all up      autoscaler v1, every node type's min_workers its max_workers: all nodes up before the first
                 job and kept (the cluster a user would size by hand)
  v2 all up      the same under autoscaler v2

The jobs, in order, each `ray job submit -- mieb-ray ...` timed from submit to the end of `ray job submit` (which
follows the job's log to its end): build (Parquet), build (WebDataset), embed (the Parquet build's images), eval
(CIFAR10ZeroShot on the mirror, --model) and audit (the Parquet build against MIEB's eval splits, with the near
detector's embeddings). Per job: the time to its first committed unit (the first data file under its output),
and the job's own log line on what the cluster did (nodes added and removed, each pool's actors against its
maximum). A contender's seconds: the five jobs' sum, the waits for idle nodes between them not included.

Run from the repository root:
    .venv/bin/python bench/autoscaling.py --work /tmp/as-bench
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported

h.use_test_fixtures()
from support import autoscaling  # noqa: E402

IDLE_TIMEOUT = 6.0
DATA_SUFFIXES = (".parquet", ".tar", ".arrow")
CONTENDERS = {"v1 from zero": (False, False), "v2 from zero": (True, False), "v1 all up": (False, True),
              "v2 all up": (True, True)}


def jobs(work: Path, model: str, tag: str) -> dict[str, list[str]]:
    mirror, out = str(work / "mirror"), work / f"out-{tag}"
    return {"build parquet": ["build", "--sources", mirror, "--out", str(out / "train"), "--rows-per-shard", "8"],
            "build webdataset": ["build", "--sources", mirror, "--out", str(out / "train-wds"), "--format",
                                 "webdataset", "--rows-per-shard", "8"],
            "embed": ["embed", "--input", str(out / "train"), "--out", str(out / "emb"), "--model", model,
                      "--rows-per-shard", "8", "--batch-size", "8", "--decode", "cpu"],
            "eval": ["eval", "--tasks", "CIFAR10ZeroShot", "--sources", mirror, "--model", model, "--out",
                     str(out / "eval")],
            "audit": ["audit", "--train", str(out / "train"), "--against", "mieb", "--sources", mirror, "--out",
                      str(out / "audit"), "--model", model]}


def out_of(args: list[str]) -> str:
    return args[args.index("--out") + 1]


def first_data_file(root: str, stop: threading.Event, found: dict) -> None:
    """found["t"]: when the first data file (a committed unit's shard) appeared under root."""
    while not stop.is_set():
        for _, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith((".", "_progress"))]
            if any(f.endswith(DATA_SUFFIXES) and not f.startswith(".") for f in files):
                found["t"] = time.time()
                return
        time.sleep(0.1)


def run_job(cluster, name: str, args: list[str]) -> dict:
    stop, found = threading.Event(), {}
    watcher = threading.Thread(target=first_data_file, args=(out_of(args), stop, found), daemon=True)
    t0 = time.time()
    watcher.start()
    job = cluster.submit(*args)
    output, _ = job.communicate(timeout=900)
    seconds = time.time() - t0
    stop.set()
    watcher.join()
    if job.returncode:
        sys.exit(f"{name} failed:\n{output[-4000:]}\n{cluster.log()}")
    cluster_lines = [line for line in output.splitlines() if "cluster during the job" in line]
    return {"seconds": round(seconds, 2), "first unit": round(found["t"] - t0, 2) if "t" in found else None,
            "cluster": cluster_lines, "pools": [line for line in output.splitlines()
                                                if re.match(r"\[\w+\] (shard builders|encoders|actors)", line)]}


def contender(work: Path, model: str, name: str):
    v2, all_up = CONTENDERS[name]

    def call(i: int) -> dict:
        tmp = tempfile.mkdtemp(prefix="mieb-asb-", dir="/tmp")  # short: Ray's socket paths have a length limit
        cluster = autoscaling.start(tmp, {}, cpu_nodes=2, gpu_nodes=2, idle_timeout_s=IDLE_TIMEOUT, v2=v2,
                                    all_up=all_up)
        try:
            up = cluster.wait_for_workers(4) if all_up else 0.0
            ran = {}
            for job, args in jobs(work, model, f"{name.replace(' ', '-')}-{i}").items():
                if not all_up:
                    cluster.wait_until_no_workers(timeout=IDLE_TIMEOUT + 90)
                ran[job] = run_job(cluster, job, args)
                print(f"  [{name}] {job}: {ran[job]['seconds']:.1f}s, first unit {ran[job]['first unit']}s; "
                      + " | ".join(ran[job]["cluster"]), flush=True)
            return {"seconds": sum(r["seconds"] for r in ran.values()), "jobs": ran, "nodes up": round(up, 1)}
        finally:
            cluster.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    return call


def job_cell(job: str):
    def cell(result: h.Result) -> str:
        runs = result.extra("jobs")
        return ", ".join(f"{r[job]['seconds']:.1f} ({r[job]['first unit']})" for r in runs)
    return cell


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--rows", type=int, default=24, help="train rows per source in the fixture mirror")
    ap.add_argument("--work", type=Path, default=Path(__file__).parent / "_work" / "autoscaling")
    h.add_records_option(ap)
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    from mieb_ray.demo_data.mirror import make_mirror
    from mieb_ray.demo_data.models import make_tiny_clip

    written = make_mirror(str(work / "mirror"), rows=args.rows, eval_rows={"cifar10": 50})
    model = make_tiny_clip(str(work / "clip"))
    print(f"[setup] fixture mirror: {sum(written.values())} train rows of {len(written)} sources; tiny CLIP",
          flush=True)

    names = list(CONTENDERS)
    bench = h.Benchmark(
        "autoscaling", f"Every job through `ray job submit` on Ray's autoscaler (fake multi-node provider, this "
        f"machine): head with no CPU, 2 CPU nodes (2 CPUs) and 2 GPU nodes (2 CPUs, 1 declared GPU) at most; "
        f"{sum(written.values())} mirror rows, tiny CLIP",
        [h.Contender(name, "the five jobs' submit-to-end seconds, summed" + (
            "; each job from zero worker nodes (nodes added on demand)" if not CONTENDERS[name][1]
            else "; every node up before the first job"), call=contender(work, model, name),
            baseline=None if CONTENDERS[name][1] else name.replace("from zero", "all up")) for name in names],
        group="Autoscaling", ratio=("v1 from zero", "v1 all up"), repeat=args.repeat,
        columns=[(f"{job} s (first unit s)", job_cell(job)) for job in jobs(work, model, "x")])
    record = h.run(bench)
    # each job's own lines on its cluster, per contender (the first run's): a job of several stages has several
    first = {name: record[name].extra("jobs")[0] for name in names}
    rows = [[job, *(" / ".join(line.split("cluster during the job: ")[1] for line in first[name][job]["cluster"])
                    for name in names)] for job in first[names[0]]]
    record.finish(figures={"tables": [{"title": "Each job's own line on what its cluster did (runtime/watch.py; a job "
                                                "of several stages has one per stage), first run",
                                       "header": ["job", *names], "rows": rows}]}, notes=[
        "Each job is timed from `ray job submit` to its end (the CLI follows the job's log); the first unit is the "
        "first data file under the job's output (a Parquet or WebDataset shard, an embedding shard, a cache shard, "
        "a hash file).",
        "From zero: before each job the autoscaler has removed every worker node (idle timeout 6 s); that wait is "
        "not in the figures. All up: min_workers = max_workers for both node types, every node up before the first "
        "job.",
        "The cluster lines are each job's own (runtime/watch.py): nodes added and removed while it ran, and each "
        "pool's actors started against its maximum."])


if __name__ == "__main__":
    main()
