"""Rows: the build's per-row cost and memory on all 23 sources, at 1/10 of the rows and at full size.

A synthetic mirror of the 23 sources (parquet and WebDataset) with the hub's train rows (hub_rows(), 4,434,196
rows after the build's drops, at scale 1.0; at scale s each source gets max(1, int(rows * s))) and tiny images
(one fixed 80-byte payload), so that per-row costs dominate. For each scale in --scales (default 0.1,1.0):
  1. minimal pipeline        ray.data.read_parquet -> map_batches(pyarrow take, as many actors as the build) -> write_parquet, on the
                             train files of the 15 parquet sources (read_parquet reads only parquet);
  2. build, parquet sources  build(BuildConfig(mirror, out, datasets=<the same 15>)): the like-for-like comparison;
  3. build, all 23 sources   build(BuildConfig(mirror, out)).
Each reports seconds, rows/s (input rows / s) and peak memory, sampled every 0.25 s in a thread: the rise of
system-wide used memory (psutil total - available) over its value just before the run, and the peak RSS sum
of Ray's worker processes (the raylet's children). Memory must not grow with rows: the script prints the ratio
of the all-23 build's peak memory at the largest vs the smallest scale. Ray starts once, untimed.
Mirrors are cached in --work (a marker file holds scale and file count); a full-scale one takes ~130 s to write.

Run from the repository root:
    .venv/bin/python bench/build_rows.py                         # scales 0.1 and 1.0
    .venv/bin/python bench/build_rows.py --scales 0.002,0.02     # a quick check
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import _baselines as b  # first: sets RAY_AUTH_MODE before Ray is imported

from mieb_ray.fixtures.mirror import expected_rows, hub_rows, make_mirror
from mieb_ray.pipelines.build import BuildConfig, build
from mieb_ray.sources import PARQUET, SOURCES

TAR_ROWS = 10_000  # samples per tar, as in the hub's WebDataset repos (CLIP_benchmark --max-count)
TINY = bytes(range(80))  # every image: the build copies image bytes, it never decodes them
PARQUET_SLUGS = [s.slug for s in SOURCES if s.layout == PARQUET]


def ensure_mirror(root: Path, scale: float, files: int) -> dict[str, int]:
    """Write the mirror, or reuse the one a marker file says was written with the same scale and files."""
    rows = {slug: max(1, int(n * scale)) for slug, n in hub_rows().items()}
    marker = root / "bench-mirror.json"
    want = {"scale": scale, "files": files, "tar_rows": TAR_ROWS, "rows": rows}
    if marker.exists() and json.loads(marker.read_text()) == want:
        print(f"[mirror] reusing {root} ({sum(rows.values()):,} rows)")
        return rows
    shutil.rmtree(root, ignore_errors=True)
    print(f"[mirror] writing scale {scale}: {sum(rows.values()):,} rows, {files} parquet files per source, "
          f"tars of {TAR_ROWS:,} rows ...",
          flush=True)
    t0 = time.perf_counter()
    make_mirror(root, rows=rows, files=files, image_bytes=lambda source, index: TINY, tar_rows=TAR_ROWS)
    marker.write_text(json.dumps(want))
    print(f"[mirror] written in {time.perf_counter() - t0:.0f}s")
    return rows


def measure(name: str, fn, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    time.sleep(2)  # let the previous run's workers exit before the memory baseline is taken
    print(f"[run] {name} ...", flush=True)
    with b.MemorySampler() as mem:
        seconds, _ = b.timed(fn, out)
    rows_out = b.parquet_rows(out)  # from the output footers
    shutil.rmtree(out)
    print(f"[run]   {seconds:.2f}s, {rows_out:,} rows out, system used +{b.gib(mem.used_delta)}, "
          f"Ray workers RSS {b.gib(mem.ray_rss)}", flush=True)
    return {"seconds": seconds, "rows_out": rows_out, "used": mem.used_delta, "rss": mem.ray_rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", default="0.1,1.0", help="comma-separated fractions of the hub's rows (default 0.1,1.0)")
    ap.add_argument("--files", type=int, default=4, help="parquet train files per source (default 4)")
    ap.add_argument("--rows-per-shard", type=int, default=10_000, help="the build's shard size (default 10,000)")
    ap.add_argument("--work", type=Path, default=Path(__file__).parent / "_work",
                    help="work folder: mirrors, outputs, Ray session files (default bench/_work, git-ignored)")
    args = ap.parse_args()
    scales = sorted(float(s) for s in args.scales.split(","))
    work = args.work.resolve() / "rows"
    work.mkdir(parents=True, exist_ok=True)

    mirrors = {s: (work / f"mirror-{s:g}", ensure_mirror(work / f"mirror-{s:g}", s, args.files)) for s in scales}
    print("[ray] starting (not timed)", flush=True)
    b.start_ray(work)

    results = []  # (scale, contender, rows in, expected rows out, measurement)
    for scale, (mirror, written) in mirrors.items():
        files = b.train_files(mirror, PARQUET_SLUGS)
        pq_in = sum(written[s] for s in PARQUET_SLUGS)
        pq_expected = sum(expected_rows({s: written[s] for s in PARQUET_SLUGS}).values())

        def run_build(out, datasets=None):
            build(BuildConfig(str(mirror), str(out), datasets=datasets, rows_per_shard=args.rows_per_shard,
                              workers=b.CORES),
                  log=lambda line: print("   ", line, flush=True))

        out = work / "out"
        results.append((scale, "minimal pipeline, parquet sources", pq_in, pq_in,
                        measure(f"scale {scale:g}: minimal pipeline on {len(files)} parquet files",
                                lambda o: b.minimal_pipeline(files, o), out)))
        results.append((scale, "build, parquet sources", pq_in, pq_expected,
                        measure(f"scale {scale:g}: build, {len(PARQUET_SLUGS)} parquet sources",
                                lambda o: run_build(o, PARQUET_SLUGS), out)))
        results.append((scale, "build, all 23 sources", sum(written.values()), sum(expected_rows(written).values()),
                        measure(f"scale {scale:g}: build, all 23 sources", run_build, out)))

    def get(scale, contender):
        return next(m | {"rows_in": n} for s, c, n, _, m in results if s == scale and c == contender)

    bad = [f"{c} at scale {s:g}: {m['rows_out']:,} rows out, expected {e:,}" for s, c, _, e, m in results
           if m["rows_out"] != e]
    table = [[f"{s:g}", c, f"{n:,}", f"{m['seconds']:.2f}", f"{n / m['seconds']:,.0f}", b.gib(m["used"]),
              b.gib(m["rss"])] for s, c, n, _, m in results]

    print("\n" + "=" * 100)
    print(f"### Rows: 23 sources, {args.files} parquet files each, tars of {TAR_ROWS:,} rows, 80-byte images, "
          f"rows_per_shard={args.rows_per_shard:,}\n")
    print(b.markdown_table(["scale", "contender", "rows in", "seconds", "rows/s", "peak system used (rise)",
                            "peak Ray workers RSS"], table))
    print()
    for s in scales:
        minimal, ours = get(s, "minimal pipeline, parquet sources"), get(s, "build, parquet sources")
        print(f"- scale {s:g}, parquet sources: build {ours['rows_in'] / ours['seconds']:,.0f} rows/s vs minimal "
              f"pipeline {minimal['rows_in'] / minimal['seconds']:,.0f} rows/s: "
              f"**build / minimal (rows/s) = {minimal['seconds'] / ours['seconds']:.2f}**")
    lo, hi = get(scales[0], "build, all 23 sources"), get(scales[-1], "build, all 23 sources")
    # a rise under 64 MiB at the smaller scale is sampling noise: no ratio from it
    used_ratio = f"{hi['used'] / lo['used']:.2f}x" if lo["used"] >= 64 << 20 else "n/a (rise < 64 MiB at the smaller scale)"
    print(f"- build, all 23 sources, peak memory at scale {scales[-1]:g} / scale {scales[0]:g} "
          f"({hi['rows_in'] / lo['rows_in']:.1f}x the rows): "
          f"**system used rise {used_ratio}, Ray workers RSS {hi['rss'] / max(lo['rss'], 1):.2f}x**")
    print(f"- rows out: {'as expected in every run (footers of the output files)' if not bad else 'MISMATCH: ' + '; '.join(bad)}")
    print(f"- {b.MemorySampler.METHOD}\n")
    b.footer("Ray start-up excluded from all timings; each run's own actor start-up included; outputs to local disk.")
    if bad:
        raise SystemExit("row counts differ")


if __name__ == "__main__":
    main()
