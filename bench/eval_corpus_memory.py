"""Memory while a large retrieval corpus is scored through mteb's own evaluator (issue 37): the eval job's driver
against the user's alternative, `mteb.evaluate` in one process, as the corpus grows.

Task: SketchyI2IRetrieval in its hub layout (mteb/sketchy: query, corpus and qrels configs; tests/support/hub_tasks)
with Q sketches as queries and N distinct 8 x 8 photos as its corpus, 4 relevant each; raw 32-d embeddings of every
image, keyed as the eval keys them (sha256 of the stored bytes), made once and given to both contenders:
  1. mieb-ray   `mieb-ray eval --tasks SketchyI2IRetrieval --image-embeddings E --executor ray`, a fresh process
                joining a local Ray started once beforehand: the task is scored by a Ray worker (mteb's loader and
                evaluator), its corpus searched on the top-k engine from 50,000 documents; the driver's peak RSS is
                its own VmHWM at exit, the workers' sampled beside it (harness.MemorySampler: the largest one)
  2. mteb       `mteb.evaluate` of the same task in one process with an encoder serving the same vectors
                (bench/contenders/mteb_served_call.py): its peak RSS, VmHWM at exit
Both TaskResults are compared (every metric, within 1e-6) before anything is reported.

    .venv/bin/python bench/eval_corpus_memory.py [--sizes 25000,100000] [--queries 200] [--records DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported

HF_HOME = tempfile.mkdtemp(prefix="bench-hf-")  # a fresh `datasets` cache: one mirror's rows never serve another's
os.environ.update(HF_HOME=HF_HOME, HF_HUB_OFFLINE="1")
h.use_test_fixtures()
import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from support.embedding_fixtures import write_embeddings  # noqa: E402
from support.hub_tasks.retrieval import V1, pic, q  # noqa: E402
from support.mteb_tasks import assert_same_scores  # noqa: E402

TASK, DIM = "SketchyI2IRetrieval", 32
SERVED = h.CONTENDERS / "mteb_served_call.py"


def mirror(root: Path, n: int, queries: int) -> None:
    """mteb/sketchy with `queries` sketches and n photos, each sketch's relevant photos four of them."""
    V1("mteb/sketchy", [q(f"sketch_{s}", image=pic("sketch", s, "png", size=(8, 8))) for s in range(queries)],
       [q(f"photo_{i}", image=pic("photo", i, "png", size=(8, 8))) for i in range(n)],
       [(f"sketch_{s}", f"photo_{(s * 4 + j) % n}", 1) for s in range(queries) for j in range(4)],
       corpus_shards=max(1, n // 50_000)).write(str(root))


def embed(root: Path, out: Path) -> str:
    """Random raw vectors for every image of the repo, keyed sha256:<hex of its bytes> (mieb-ray's key)."""
    keys = sorted({"sha256:" + hashlib.sha256(v["bytes"]).hexdigest() for path in root.rglob("*.parquet")
                   if "image" in pq.read_schema(path).names for v in pq.read_table(path, columns=["image"])["image"]
                   .to_pylist()})
    matrix = np.random.default_rng(0).standard_normal((len(keys), DIM)).astype(np.float32)
    write_embeddings(str(out), keys, matrix, "image", "float32", max(1, len(keys) // 50_000), {}, normalized=False)
    return str(out)


def peak_of(argv: list[str], env: dict) -> tuple[float, int, str]:
    """(seconds, the process's own peak RSS in bytes as it reports it on its last line, its stdout)."""
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"failed: {' '.join(argv)}\n{done.stderr[-3000:]}")
    return time.perf_counter() - t0, int(done.stdout.strip().splitlines()[-1].split()[-1]), done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="25000,100000", help="corpus sizes, comma-separated")
    parser.add_argument("--queries", type=int, default=200)
    h.add_records_option(parser)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="corpus-memory-"))
    env = h.fresh_process_env()
    h.start_ray(work)  # one Ray the drivers join (--address), so that its workers can be sampled
    import ray

    address = ray.get_runtime_context().gcs_address
    rows, seconds, extras = [], {"mieb-ray": [], "mteb 2.26.24": []}, {"mieb-ray": [], "mteb 2.26.24": []}
    try:
        for n in [int(s) for s in args.sizes.split(",")]:
            root = work / f"mirror-{n}"
            mirror(root, n, args.queries)
            vectors = embed(root / "mteb/sketchy", work / f"emb-{n}")
            out = work / f"out-{n}"
            driver = [sys.executable, "-c", "import sys; from mieb_ray.cli import main; code = main(sys.argv[1:]); "
                      "print('peak', [int(l.split()[1]) * 1024 for l in open('/proc/self/status') "
                      "if l.startswith('VmHWM')][0]); sys.exit(code)", "eval", "--tasks", TASK, "--sources", str(root),
                      "--image-embeddings", vectors, "--executor", "ray", "--address", address, "--out", str(out)]
            with h.MemorySampler() as sampled:
                ours_s, ours_rss, _ = peak_of(driver, env)
            theirs_s, theirs_rss, _ = peak_of([sys.executable, str(SERVED), TASK, str(root), vectors,
                                               str(work / f"theirs-{n}.json")], env)
            assert_same_scores(json.loads((out / f"{TASK}.json").read_text()),
                               json.loads((work / f"theirs-{n}.json").read_text()))
            seconds["mieb-ray"].append(ours_s)
            seconds["mteb 2.26.24"].append(theirs_s)
            extras["mieb-ray"].append({"corpus": n, "driver_peak_rss_mib": ours_rss >> 20,
                                       "largest_worker_rss_mib": sampled.task_rss >> 20})
            extras["mteb 2.26.24"].append({"corpus": n, "peak_rss_mib": theirs_rss >> 20})
            rows.append([f"{n:,}", f"{ours_rss >> 20:,}", f"{sampled.task_rss >> 20:,}", f"{theirs_rss >> 20:,}",
                         f"{ours_s:.1f}", f"{theirs_s:.1f}"])
            print(f"[corpus_memory] {n:,} docs: driver {ours_rss >> 20:,} MiB, largest worker "
                  f"{sampled.task_rss >> 20:,} MiB, mteb's process {theirs_rss >> 20:,} MiB; scores equal", flush=True)
        bench = h.Benchmark("eval_corpus_memory", f"{TASK} with a corpus of {args.sizes} synthetic photos, "
                            f"{args.queries} queries: memory", [
                                h.Contender("mteb 2.26.24", "mteb.evaluate in one process, an encoder serving the "
                                            "same vectors; process start to exit"),
                                h.Contender("mieb-ray", "`mieb-ray eval --executor ray` from the same vectors, a "
                                            "fresh process joining a Ray up beforehand, the task scored by a worker; "
                                            "process start to exit", baseline="mteb 2.26.24")],
                            group="Eval", ratio=("mieb-ray", "mteb 2.26.24"))
        h.measured(bench, seconds, extras).finish(figures={"memory (MiB)": h.markdown_table(
            ["corpus docs", "mieb-ray driver peak RSS", "largest Ray worker RSS", "mteb's process peak RSS",
             "mieb-ray s", "mteb s"], rows)}, records=args.records, notes=[
            "Peak RSS is each process's own VmHWM (/proc/self/status; not ru_maxrss, which Linux carries over "
            "from the parent across fork and exec); the workers' is sampled every 0.25 s (harness.MemorySampler).",
            "Every TaskResult compared with mteb's, every metric (within 1e-6), before this was written."])
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(HF_HOME, ignore_errors=True)


if __name__ == "__main__":
    main()
