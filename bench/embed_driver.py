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
process: Ray's start-up included, which is the same for both) and its peak RSS (ru_maxrss). The harness table
(bench/harness.py) has every run of each, --repeat alternating runs, with rows/s, driver CPU seconds per million
rows and driver peak RSS at each table size; the record is bench/records/embed_driver.json.

Run from the repository root:
    .venv/bin/python bench/embed_driver.py                        # 20,000 and 300,000 rows
    .venv/bin/python bench/embed_driver.py --rows 20000 --repeat 1 --records /tmp/records    # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import harness as h
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
    from mieb_ray.demo_data.models import save_clip

    tower = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
    return save_clip(str(path), tower, dict(tower, image_size=64, patch_size=16), 1024, seed=0)


def make_table(path: Path, rows: int) -> str:
    texts = [f"a photo of a thing number {i}, the {i % 97}th kind." for i in range(rows)]
    pq.write_table(pa.table({"key": [f"t/{i}" for i in range(rows)], "text": texts}), path)
    return str(path)


def run(code_root: Path, table: str, out: Path, model: str, new: bool, work: Path) -> dict:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(h.BENCH / "instant"), str(code_root)])}
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", RUN, table, str(out), model, "1" if new else "0",
                           str(work / "ray")], env=env, capture_output=True, text=True, timeout=3600, cwd=code_root)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[20_000, 300_000])
    ap.add_argument("--repeat", type=int, default=2, help="runs per contender, alternating")
    ap.add_argument("--work", type=Path, default=Path("bench/_work/embed_driver"))
    h.add_records_option(ap)
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    before = work / "before"
    subprocess.run(["git", "worktree", "add", "--detach", "-f", str(before), BEFORE], cwd=REPO, check=True,
                   capture_output=True)
    try:
        model = make_model(work / "clip-1024")
        contenders = []
        for n in args.rows:
            table = make_table(work / f"table-{n}.parquet", n)
            print(f"[setup] one Parquet file of {n:,} text rows", flush=True)
            for name, root, new in (("before", before, False), ("after", REPO, True)):
                def call(i, root=root, new=new, name=name, table=table):
                    return run(root, table, work / f"out-{name}", model, new, work)

                contenders.append(h.Contender(
                    f"{name} [{n:,} rows]", f"the embed call of {BEFORE if name == 'before' else 'this checkout'} "
                    "in a fresh process with its own local Ray (start-up not timed)", call=call,
                    baseline=f"before [{n:,} rows]" if name == "after" else None))
        big, small = max(args.rows), min(args.rows)
        bench = h.Benchmark(
            "embed_driver", "Embed pipeline ceiling, instant encoder (1024-d), one Parquet file of text rows",
            contenders, group="Embed", repeat=args.repeat, ratio=(f"after [{big:,} rows]", f"before [{big:,} rows]"),
            columns=[("shards", lambda r: str(r.extra("shards")[0])),
                     ("rows/s (fastest)", lambda r: f"{r.extra('rows')[0] / r.fastest:,.0f}"),
                     ("driver CPU s per 1M rows (least)",
                      lambda r: f"{min(r.extra('cpu')) / r.extra('rows')[0] * 1e6:,.1f}"),
                     ("driver peak RSS (least)", lambda r: h.gib(min(r.extra("peak_rss"))))])
        record = h.run(bench)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=REPO, capture_output=True)
    a, z = record[f"before [{big:,} rows]"], record[f"after [{big:,} rows]"]
    figures = {f"at {big:,} rows, after / before": {
        "rows/s (fastest)": f"{a.fastest / z.fastest:.2f}x",
        "driver CPU (least)": f"{min(z.extra('cpu')) / min(a.extra('cpu')):.2f}x",
        "driver peak RSS (least)": f"{min(z.extra('peak_rss')) / min(a.extra('peak_rss')):.2f}x"}}
    if len(args.rows) > 1:
        for name in ("before", "after"):
            grow = min(record[f"{name} [{big:,} rows]"].extra("peak_rss")) - min(
                record[f"{name} [{small:,} rows]"].extra("peak_rss"))
            figures[f"{name}: driver peak RSS growth from {small:,} to {big:,} rows"] = h.gib(grow)
    record.finish(figures=figures, notes=[
        "Instant encoder: bench/instant/sitecustomize.py. Each run: a fresh process, its own local Ray (num_cpus=4), "
        "not in the embed call's time; driver CPU is the whole driver process (Ray start-up included, alike for "
        "both)."])


if __name__ == "__main__":
    main()
