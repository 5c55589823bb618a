"""The embed pipeline's ceiling and its driver's cost, with an instant encoder: before and after the workers commit.

An instant encoder is a stand-in for the model, used only here: `bench/instant/sitecustomize.py` makes
`Encoder.encode_texts` return a fixed unit vector per row, in the driver and in every Ray worker (they share
the driver's PYTHONPATH). The model is a tiny CLIP with 1024-d embeddings (loaded, never run), the input one
Parquet file of text rows, as in the issue's measurement. What is left is the pipeline: reading, moving rows
between stages, writing and committing shards, and the driver's own work.

  before   mieb-ray at commit 9c4e120 (a git worktree of it): every embedding comes back to the driver
           (iter_batches), which reassembles each input file and writes its shard
  after    this checkout: the workers commit the shards; the driver gets one small record per shard

Each contender runs in a fresh Python process that starts a local Ray (num_cpus=4; not timed) and embeds the
same table; the process reports the embed call's wall time, its own CPU seconds (user + system, the whole
process: Ray's start-up included, which is the same for both) and its peak RSS (ru_maxrss). Printed, for the
fastest of --repeat alternating runs of each: rows/s, driver CPU seconds per million rows and driver peak RSS,
at each table size, and after / before.

Run from the repository root:
    .venv/bin/python bench/embed_driver.py                        # 20,000 and 300,000 rows
    .venv/bin/python bench/embed_driver.py --rows 20000           # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import _baselines as b
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
BEFORE = "9c4e120"  # the last commit before the workers commit the shards

RUN = r"""
import json, os, resource, sys, time
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
import ray
table, out, model, new, tmp = sys.argv[1:6]
ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", _temp_dir=tmp)
ray.data.DataContext.get_current().enable_progress_bars = False
t0 = time.perf_counter()
if new == "1":
    from mieb_ray.pipelines.embed import EmbedConfig, embed
    manifest = embed(EmbedConfig(table, out, model, modality="text", batch_size=1024), log=lambda _: None)
else:
    from mieb_ray.pipelines.embed import embed
    manifest = embed(table, out, model, modality="text", batch_size=1024, log=lambda _: None)
seconds = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": seconds, "rows": manifest["counts"]["total"], "shards": len(manifest["shards"]),
                  "cpu": usage.ru_utime + usage.ru_stime, "peak_rss": usage.ru_maxrss * 1024}))
ray.shutdown()
"""


def make_model(path: Path) -> str:
    from mieb_ray.fixtures.models import _save_clip

    tower = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
    return _save_clip(str(path), tower, dict(tower, image_size=64, patch_size=16), 1024, seed=0)


def make_table(path: Path, rows: int) -> str:
    texts = [f"a photo of a thing number {i}, the {i % 97}th kind." for i in range(rows)]
    pq.write_table(pa.table({"key": [f"t/{i}" for i in range(rows)], "text": texts}), path)
    return str(path)


def run(code_root: Path, table: str, out: Path, model: str, new: bool, work: Path) -> dict:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(b.BENCH / "instant"), str(code_root)])}
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", RUN, table, str(out), model, "1" if new else "0",
                           str(work / "ray")], env=env, capture_output=True, text=True, timeout=3600, cwd=code_root)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[20_000, 300_000])
    ap.add_argument("--repeat", type=int, default=2, help="runs per contender, alternating; the fastest is kept")
    ap.add_argument("--work", type=Path, default=Path("bench/_work/embed_driver"))
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    before = work / "before"
    subprocess.run(["git", "worktree", "add", "--detach", "-f", str(before), BEFORE], cwd=REPO, check=True,
                   capture_output=True)
    try:
        model = make_model(work / "clip-1024")
        rows_out, results = [], {}
        for n in args.rows:
            table = make_table(work / f"table-{n}.parquet", n)
            print(f"[setup] one Parquet file of {n:,} text rows", flush=True)
            for _ in range(args.repeat):  # alternating, so that a slow spell of this VM hits both
                for name, root, new in (("before", before, False), ("after", REPO, True)):
                    r = run(root, table, work / f"out-{name}", model, new, work)
                    print(f"[run] {name}, {n:,} rows: {r}", flush=True)
                    if (name, n) not in results or r["seconds"] < results[name, n]["seconds"]:
                        results[name, n] = r
            for name in ("before", "after"):
                r = results[name, n]
                rows_out.append([f"{name} ({BEFORE if name == 'before' else 'this checkout'})", f"{n:,}",
                                 f"{r['shards']}", f"{r['seconds']:.2f}", f"{n / r['seconds']:,.0f}",
                                 f"{r['cpu'] / n * 1e6:,.1f}", b.gib(r["peak_rss"])])
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=REPO, capture_output=True)
    print("\n" + "=" * 100)
    print("### Embed pipeline ceiling, instant encoder (1024-d), one Parquet file of text rows\n")
    print(b.markdown_table(["contender", "rows", "shards", "embed call s", "rows/s", "driver CPU s per 1M rows",
                            "driver peak RSS"], rows_out))
    big = max(args.rows)
    a, z = results["before", big], results["after", big]
    print(f"\n**at {big:,} rows: after / before: rows/s {(big / z['seconds']) / (big / a['seconds']):.2f}x, "
          f"driver CPU {z['cpu'] / a['cpu']:.2f}x, driver peak RSS {z['peak_rss'] / a['peak_rss']:.2f}x**")
    if len(args.rows) > 1:
        small = min(args.rows)
        for name in ("before", "after"):
            grow = results[name, big]["peak_rss"] - results[name, small]["peak_rss"]
            print(f"- {name}: driver peak RSS grows by {b.gib(grow)} from {small:,} to {big:,} rows")
    b.footer("Instant encoder: bench/instant/sitecustomize.py. Each run: a fresh process, its own local Ray "
             "(num_cpus=4), not in the embed call's time; driver CPU is the whole driver process (Ray start-up "
             "included, alike for both). The fastest of the alternating runs of each contender.")


if __name__ == "__main__":
    main()
