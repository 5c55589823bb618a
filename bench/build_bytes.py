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
Prints seconds, GB/s (input bytes / s), rows and the ratio to the copy floor, checks that the three outputs hold
the same rows, and ends with a Markdown block for bench/RESULTS.md. The mirror is cached in --work.

Run from the repository root:
    .venv/bin/python bench/build_bytes.py                 # full size: ~4 GB mirror, ~100k rows
    .venv/bin/python bench/build_bytes.py --gb 0.2        # a quick check
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
import zlib
from pathlib import Path

import _baselines as b  # first: sets RAY_AUTH_MODE before Ray is imported
import numpy as np

from mieb_ray.fixtures.mirror import hub_rows, make_mirror
from mieb_ray.pipelines.build import BuildConfig, build

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
    ap.add_argument("--repeat", type=int, default=1, help="runs of each contender; the fastest is reported")
    ap.add_argument("--work", type=Path, default=Path(__file__).parent / "_work",
                    help="work folder: mirror, outputs, Ray session files (default bench/_work, git-ignored)")
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
    b.start_ray(work)

    def run_build(files: list[str], out: Path) -> int:  # the build finds the same train files itself
        manifest = build(BuildConfig(str(mirror), str(out), datasets=SLUGS, rows_per_shard=10_000, workers=b.CORES),
                         log=lambda line: print("   ", line, flush=True))
        return manifest["counts"]["total"]

    contenders = [("copy floor (pyarrow read_table + write_table, 1 process)", b.copy_floor),
                  ("minimal Ray Data pipeline (read_parquet -> take in as many actors as the build -> write_parquet)",
                   b.minimal_pipeline),
                  ("mieb-ray build (parquet, rows_per_shard=10,000)", run_build)]
    times = {name: [] for name, _ in contenders}
    rows_out = {}
    for k in range(args.repeat):  # rounds, so that no contender always runs on a warmer machine
        for name, fn in contenders:
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            print(f"[run] {name}, run {k + 1}/{args.repeat} ...", flush=True)
            seconds, _ = b.timed(fn, files, out)
            rows_out[name] = b.parquet_rows(out)  # rows actually in the output files, from their footers
            shutil.rmtree(out)
            times[name].append(seconds)
            print(f"[run]   {seconds:.2f}s, {in_bytes / seconds / 1e9:.3f} GB/s, {rows_out[name]:,} rows out",
                  flush=True)
    results = {name: (min(times[name]), rows_out[name], times[name]) for name, _ in contenders}

    floor = results[contenders[0][0]][0]
    table = [[name, f"{s:.2f}", f"{in_bytes / s / 1e9:.3f}", f"{rows:,}", f"{s / floor:.2f}"]
             for name, (s, rows, _) in results.items()]
    row_counts = {rows for _, rows, _ in results.values()}
    same = len(row_counts) == 1 and row_counts == {in_rows}
    build_ratio = results[contenders[2][0]][0] / floor
    minimal_ratio = results[contenders[1][0]][0] / floor

    print("\n" + "=" * 100)
    print(f"### Bytes: {in_bytes / 1e9:.2f} GB of parquet ({len(files)} train files of "
          f"{', '.join(SLUGS)}; {in_rows:,} rows, images 10-70 KB random bytes)\n")
    print(b.markdown_table(["contender", "seconds", "GB/s (input)", "rows out", "x copy floor"], table))
    print()
    if args.repeat > 1:
        print(f"Fastest of {args.repeat} runs each; all runs: " + "; ".join(
            f"{name.split(' (')[0]}: {', '.join(f'{t:.2f}' for t in ts)} s (median {statistics.median(ts):.2f})"
            for name, (_, _, ts) in results.items()) + "\n")
    print(f"Row counts: all three outputs hold the {in_rows:,} input rows.\n" if same else
          f"Row counts: MISMATCH, {sorted(row_counts)} vs {in_rows:,} input rows.\n")
    print(f"**build / copy = {build_ratio:.2f} (target <= 1.5); "
          f"minimal Ray Data pipeline / copy = {minimal_ratio:.2f}**\n")
    b.footer("Ray start-up excluded from all timings; each contender's own actor start-up included; "
             "outputs to local disk, page cache not dropped.")
    if not same:
        raise SystemExit("row counts differ")


if __name__ == "__main__":
    main()
