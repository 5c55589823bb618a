"""Bytes: how close the build comes to the cost of copying its parquet input, byte for byte.

A synthetic mirror of about --gb GB (default 4.0; times --scale) of four parquet sources (ucf101, sun397, food101,
birdsnap; rows in proportion to the hub's), each image 10-70 KB of random bytes (incompressible, like JPEG;
deterministic per (slug, index)), train files of about 375 MB like the hub's. On the same train files, each
writing to a fresh output folder (deleted after it is measured), in this order:
  1. copy floor        one process, no Ray: pq.read_table + pq.write_table of each file, unchanged;
  2. minimal pipeline  ray.data.read_parquet -> map_batches(pyarrow take of a caption, CORES actors) -> write_parquet
                       (the baseline named in the issue);
  3. mieb-ray build    build(BuildConfig(mirror, out, datasets=..., rows_per_shard=10_000)), parquet output.
Ray starts once before any timing (its start-up is excluded); each contender's own actor start-up is included.
Prints the harness table (bench/harness.py: seconds of every run, GB/s (input bytes / s), rows out, the ratio
to the copy floor), writes bench/records/build_bytes.json, and checks that the three outputs hold the same rows.
The mirror is cached in --work.

Run from the repository root:
    .venv/bin/python bench/build_bytes.py --repeat 3      # full size: ~4 GB mirror, ~100k rows
    .venv/bin/python bench/build_bytes.py --gb 0.2 --records /tmp/records    # a quick check
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import zlib
from pathlib import Path

import _baselines as b
import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported
import numpy as np

h.use_test_fixtures()
from support.mirror import hub_rows  # noqa: E402

from mieb_ray.demo_data.mirror import make_mirror  # noqa: E402
from mieb_ray.pipelines.build import BuildConfig, build  # noqa: E402

SLUGS = ["ucf101", "sun397", "food101", "birdsnap"]
IMAGE_MIN, IMAGE_MAX = 10_000, 70_000  # bytes; mean 40 KB
FILE_BYTES = 375e6  # the hub's parquet files are 250-500 MB


def random_image(source, index: int) -> bytes:
    """10-70 KB of random bytes, the same for the same (slug, index)."""
    rng = np.random.default_rng([zlib.crc32(source.slug.encode()), index])
    return rng.bytes(int(rng.integers(IMAGE_MIN, IMAGE_MAX + 1)))


def plan_rows(gb: float) -> dict[str, int]:
    total = gb * 1e9 / ((IMAGE_MIN + IMAGE_MAX) / 2)
    hub = hub_rows()
    weight = sum(hub[s] for s in SLUGS)
    return {s: max(1, round(total * hub[s] / weight)) for s in SLUGS}


def ensure_mirror(root: Path, gb: float) -> dict[str, int]:
    """Write the mirror, or reuse the one a marker file says was written with the same size."""
    rows = plan_rows(gb)
    marker = root / "bench-mirror.json"
    want = {"gb": gb, "rows": rows, "images": [IMAGE_MIN, IMAGE_MAX]}
    if marker.exists() and json.loads(marker.read_text()) == want:
        print(f"[mirror] reusing {root} ({sum(rows.values()):,} rows)")
        return rows
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    for slug, n in rows.items():  # one call per source: each gets its own file count
        files = max(1, round(n * (IMAGE_MIN + IMAGE_MAX) / 2 / FILE_BYTES))
        print(f"[mirror] {slug}: {n:,} rows in {files} train file(s) ...", flush=True)
        make_mirror(root, rows={slug: n}, datasets=[slug], files=files, image_bytes=random_image)
    marker.write_text(json.dumps(want))
    print(f"[mirror] written in {time.perf_counter() - t0:.0f}s")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=4.0, help="mirror size in GB at --scale 1.0 (default 4.0)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies --gb (default 1.0)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each contender, interleaved")
    ap.add_argument("--work", type=Path, default=Path(__file__).parent / "_work",
                    help="work folder: mirror, outputs, Ray session files (default bench/_work, git-ignored)")
    h.add_records_option(ap)
    args = ap.parse_args()
    gb = args.gb * args.scale
    work = args.work.resolve() / "bytes"
    work.mkdir(parents=True, exist_ok=True)

    mirror = work / "mirror"
    written = ensure_mirror(mirror, gb)
    files = b.train_files(mirror, SLUGS)
    in_bytes = sum(Path(f).stat().st_size for f in files)
    in_rows = sum(written.values())
    print(f"[input] {len(files)} train files, {in_bytes / 1e9:.2f} GB, {in_rows:,} rows")

    print("[ray] starting (not timed)", flush=True)
    h.start_ray(work)

    def run_build(files: list[str], out: Path) -> int:  # the build finds the same train files itself
        manifest = build(BuildConfig(str(mirror), str(out), datasets=SLUGS, rows_per_shard=10_000, workers=b.CORES),
                         log=lambda line: print("   ", line, flush=True))
        return manifest["counts"]["total"]

    def timed(fn):
        def call(i):
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            seconds, _ = h.timed(fn, files, out)
            rows_out = b.parquet_rows(out)  # rows actually in the output files, from their footers
            shutil.rmtree(out)
            return {"seconds": seconds, "rows_out": rows_out}
        return call

    floor = "copy floor"
    bench = h.Benchmark(
        "build_bytes", f"{in_bytes / 1e9:.2f} GB of parquet ({len(files)} train files of {', '.join(SLUGS)}; "
        f"{in_rows:,} rows, images 10-70 KB random bytes)", [
            h.Contender(floor, "pyarrow read_table + write_table of each file, unchanged, 1 process",
                        call=timed(b.copy_floor)),
            h.Contender("minimal Ray Data pipeline", "read_parquet -> pyarrow take in as many actors as the build -> "
                        "write_parquet; its actors' start-up", call=timed(b.minimal_pipeline), baseline=floor),
            h.Contender("mieb-ray build", "build(BuildConfig(..., rows_per_shard=10,000)), parquet output, sha256 of "
                        "every shard, manifest; its actors' start-up", call=timed(run_build), baseline=floor)],
        group="Build", ratio=("mieb-ray build", floor), repeat=args.repeat,
        columns=[("GB/s (input, fastest)", lambda r: f"{in_bytes / r.fastest / 1e9:.3f}"),
                 ("rows out", lambda r: f"{r.extra('rows_out')[-1]:,}")])
    record = h.run(bench)
    row_counts = {n for r in record.results.values() for n in r.extra("rows_out")}
    same = row_counts == {in_rows}
    record.finish(figures={
        "row counts": f"every output holds the {in_rows:,} input rows" if same else
                      f"MISMATCH: {sorted(row_counts)} vs {in_rows:,} input rows",
        "target": "build / copy <= 1.5"}, notes=[
        "Ray start-up excluded from all timings; each contender's own actor start-up included; outputs to local "
        "disk, page cache not dropped; contenders interleaved, round by round."])
    if not same:
        raise SystemExit("row counts differ")


if __name__ == "__main__":
    main()
