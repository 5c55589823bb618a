"""Rows: the build's per-row cost and memory on all 23 sources, at 1/10 of the rows and at full size.

A synthetic mirror of the 23 sources (parquet and WebDataset) with the hub's train rows (hub_rows(), 4,434,196
rows after the build's drops, at scale 1.0; at scale s each source gets max(1, int(rows * s))) and tiny images
(one fixed 80-byte payload), so that per-row costs dominate. For each scale in --scales (default 0.1,1.0):
  1. minimal pipeline        ray.data.read_parquet -> map_batches(pyarrow take, as many actors as the build)
                             -> write_parquet, on the train files of the 15 parquet sources (read_parquet reads
                             only parquet);
  2. build, parquet sources  build(BuildConfig(mirror, out, datasets=<the same 15>)): the like-for-like comparison;
  3. build, all 23 sources   build(BuildConfig(mirror, out)).
Each reports seconds, rows/s (input rows / s) and peak memory, sampled every 0.25 s in a thread: the rise of
system-wide used memory (psutil total - available) over its value just before the run, and the peak RSS sum
of Ray's worker processes (the raylet's children). Memory must not grow with rows: the script prints the ratio
of the all-23 build's peak memory at the largest vs the smallest scale. Ray starts once, untimed.
Mirrors are cached in --work (a marker file holds scale and file count); a full-scale one takes ~130 s to write.

With --baseline-rev REV it measures instead the all-23 build of the code at git revision REV (a `git worktree`
in --work) against this checkout's, on the same mirror, one after the other (--repeat times, alternating), each
in a fresh process that starts its own Ray (untimed) and imports mieb_ray from its own tree; it prints seconds,
CPU seconds (the process and Ray's workers: steadier than wall time on a shared machine), peak memory, and
the ratios old / new.

Either way: the harness table (bench/harness.py) and a record, bench/records/build_rows.json, or
bench/records/build_old_vs_new.json with --baseline-rev.

Run from the repository root:
    .venv/bin/python bench/build_rows.py                         # scales 0.1 and 1.0
    .venv/bin/python bench/build_rows.py --scales 0.002,0.02 --records /tmp/records    # a quick check
    .venv/bin/python bench/build_rows.py --scales 1.0 --baseline-rev 259a486   # the full build, old vs new
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import _baselines as b
import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported
import ray  # noqa: E402  after harness, which sets RAY_AUTH_MODE

h.use_test_fixtures()
from support.mirror import hub_rows, kept_rows  # noqa: E402

from mieb_ray.demo_data.mirror import make_mirror  # noqa: E402
from mieb_ray.pipelines.build import BuildConfig, build  # noqa: E402
from mieb_ray.sources import PARQUET, SOURCES  # noqa: E402

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
    """One timed run with its memory: the seconds, the rows in the output, the peak memory (not timed: the wait for
    the previous run's workers to exit, counting the rows)."""
    shutil.rmtree(out, ignore_errors=True)
    time.sleep(2)  # let the previous run's workers exit before the memory baseline is taken
    print(f"[run] {name} ...", flush=True)
    with h.MemorySampler() as mem:
        seconds, _ = h.timed(fn, out)
    rows_out = b.parquet_rows(out)  # from the output footers
    shutil.rmtree(out)
    print(f"[run]   {seconds:.2f}s, {rows_out:,} rows out, system used +{h.gib(mem.used_delta)}, "
          f"Ray workers RSS {h.gib(mem.ray_rss)}", flush=True)
    return {"seconds": seconds, "rows_out": rows_out, "used": mem.used_delta, "rss": mem.ray_rss}


# ---------------------------------------------------------------------------------------------- old vs new


def _child(args) -> None:
    """One timed all-23 build in this process (its own Ray); the result as one JSON line on stdout."""
    import mieb_ray

    mirror, out = Path(args.child_mirror), Path(args.child_out)
    h.start_ray(Path(args.child_ray))

    @ray.remote
    def workers_code() -> str:
        import mieb_ray

        return str(Path(mieb_ray.__file__).parent.parent)

    code = str(Path(mieb_ray.__file__).parent.parent)
    if ray.get(workers_code.remote()) != code:  # e.g. a mieb_ray/ in the working folder, first on their path
        raise SystemExit(f"Ray's workers import mieb_ray from {ray.get(workers_code.remote())}, not {code}")

    def run_build(o):
        build(BuildConfig(str(mirror), str(o), rows_per_shard=args.rows_per_shard, workers=b.CORES),
              log=lambda line: print("   ", line, file=sys.stderr, flush=True))

    shutil.rmtree(out, ignore_errors=True)
    time.sleep(2)
    with h.MemorySampler() as mem, h.CpuClock() as cpu:
        seconds, _ = h.timed(run_build, out)
    rows_out = b.parquet_rows(out)
    shutil.rmtree(out)
    print(json.dumps({"seconds": seconds, "cpu": cpu.seconds, "rows_out": rows_out, "used": mem.used_delta,
                      "rss": mem.ray_rss, "code": code, "num_cpus": int(ray.cluster_resources().get("CPU", 0))}),
          flush=True)


def compare(args, work: Path, scales: list[float]) -> None:
    """--baseline-rev: the all-23 build, old code vs this checkout's, each in a fresh process, alternating."""
    old_tree, new_tree = h.worktree(work, args.baseline_rev), h.ROOT
    label = {"old": f"{args.baseline_rev} (old)", "new": "this checkout (new)"}
    runs = []  # (scale, which, measurement)
    for scale in scales:
        mirror = work / f"mirror-{scale:g}"
        written = ensure_mirror(mirror, scale, args.files)
        expected = sum(kept_rows(written).values())
        for k in range(args.repeat):
            for which in (("old", "new") if k % 2 == 0 else ("new", "old")):
                tree = old_tree if which == "old" else new_tree
                print(f"[run] scale {scale:g}: build, all 23 sources, {label[which]} ({k + 1}/{args.repeat}) ...",
                      flush=True)
                env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                    p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)}
                env.pop("RAY_ADDRESS", None)
                done = subprocess.run(
                    [sys.executable, __file__, "--child-mirror", str(mirror), "--child-out", str(work / "out"),
                     "--child-ray", str(work / f"ray-{which}"), "--rows-per-shard", str(args.rows_per_shard)],
                    env=env, stdout=subprocess.PIPE, text=True, cwd=work)  # not the repository: its mieb_ray/
                if done.returncode:
                    raise SystemExit(f"the {which} build failed ({done.returncode})")
                m = json.loads(done.stdout.strip().splitlines()[-1])
                if Path(m["code"]).resolve() != tree.resolve():
                    raise SystemExit(f"the {which} build ran the code in {m['code']}, not {tree}")
                m |= {"rows_in": sum(written.values()), "expected": expected}
                print(f"[run]   {m['seconds']:.2f}s, CPU {m['cpu']:.1f}s, {m['rows_out']:,} rows out, "
                      f"system used +{h.gib(m['used'])}, Ray workers RSS {h.gib(m['rss'])}", flush=True)
                runs.append((scale, which, m))

    bad = [f"{label[w]} at scale {s:g}: {m['rows_out']:,} rows out, expected {m['expected']:,}" for s, w, m in runs
           if m["rows_out"] != m["expected"]]
    name = {(s, w): f"{label[w]} [scale {s:g}]" for s in scales for w in label}
    contenders = []
    for s in scales:
        contenders += [h.Contender(name[s, "old"], f"the all-23 build of {args.baseline_rev}, a fresh process with its "
                                   "own Ray (start-up excluded), its actors' start-up"),
                       h.Contender(name[s, "new"], "the same of this checkout", baseline=name[s, "old"])]
    bench = h.Benchmark(
        "build_old_vs_new", f"Build, all 23 sources: {args.baseline_rev} vs this checkout ({args.files} parquet files "
        f"per source, tars of {TAR_ROWS:,} rows, 80-byte images, rows_per_shard={args.rows_per_shard:,})",
        contenders, group="Build", repeat=args.repeat, ratio=(name[scales[-1], "new"], name[scales[-1], "old"]),
        columns=[("rows in", lambda r: f"{r.extra('rows_in')[0]:,}"),
                 ("rows/s (fastest)", lambda r: f"{r.extra('rows_in')[0] / r.fastest:,.0f}"),
                 ("CPU seconds (runs)", lambda r: ", ".join(f"{c:.1f}" for c in r.extra("cpu"))),
                 ("peak system used (rise)", lambda r: h.gib(max(r.extra("used")))),
                 ("peak Ray workers RSS", lambda r: h.gib(max(r.extra("rss"))))])
    record = h.measured(bench, {name[s, w]: [m["seconds"] for s2, w2, m in runs if (s2, w2) == (s, w)]
                                for s in scales for w in label},
                        {name[s, w]: [m for s2, w2, m in runs if (s2, w2) == (s, w)] for s in scales for w in label})

    def best(scale, which, key):
        return min(m[key] for s, w, m in runs if s == scale and w == which)

    record.finish(figures={
        **{f"scale {s:g}": {"old / new seconds (fastest)": round(best(s, "old", "seconds") / best(s, "new", "seconds"),
                                                                 2),
                            "old / new CPU seconds (least)": round(best(s, "old", "cpu") / best(s, "new", "cpu"), 2)}
           for s in scales},
        "rows out": "as expected in every run" if not bad else "MISMATCH: " + "; ".join(bad)}, notes=[
        "Each build in a fresh process, outside the repository, with its own Ray (start-up excluded; num_cpus="
        f"{runs[0][2]['num_cpus']}) importing the mieb_ray of its own tree (checked); its actors' start-up "
        "included; outputs to local disk; old and new alternate run by run.",
        "CPU seconds: user + system of the driver and of Ray's worker processes during the build.",
        h.MemorySampler.METHOD])
    if bad:
        raise SystemExit("row counts differ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", default="0.1,1.0", help="comma-separated fractions of the hub's rows (default 0.1,1.0)")
    ap.add_argument("--files", type=int, default=4, help="parquet train files per source (default 4)")
    ap.add_argument("--rows-per-shard", type=int, default=10_000, help="the build's shard size (default 10,000)")
    ap.add_argument("--work", type=Path, default=Path(__file__).parent / "_work",
                    help="work folder: mirrors, outputs, Ray session files (default bench/_work, git-ignored)")
    ap.add_argument("--baseline-rev", metavar="REV",
                    help="measure the all-23 build of git revision REV against this checkout's instead (e.g. 259a486)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each contender, interleaved (with --baseline-rev: alternating) (default 1)")
    h.add_records_option(ap)
    for hidden in ("--child-mirror", "--child-out", "--child-ray"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_mirror:
        _child(args)
        return
    scales = sorted(float(s) for s in args.scales.split(","))
    work = args.work.resolve() / "rows"
    work.mkdir(parents=True, exist_ok=True)
    if args.baseline_rev:
        compare(args, work, scales)
        return

    mirrors = {s: (work / f"mirror-{s:g}", ensure_mirror(work / f"mirror-{s:g}", s, args.files)) for s in scales}
    print("[ray] starting (not timed)", flush=True)
    h.start_ray(work)

    out = work / "out"
    contenders, expected = [], {}
    for scale, (mirror, written) in mirrors.items():
        files = b.train_files(mirror, PARQUET_SLUGS)
        pq_in = sum(written[s] for s in PARQUET_SLUGS)
        pq_expected = sum(kept_rows({s: written[s] for s in PARQUET_SLUGS}).values())

        def run_build(out, datasets=None, mirror=mirror):
            build(BuildConfig(str(mirror), str(out), datasets=datasets, rows_per_shard=args.rows_per_shard,
                              workers=b.CORES),
                  log=lambda line: print("   ", line, flush=True))

        def timed(label, fn, rows_in):
            return lambda i: {**measure(label, fn, out), "rows_in": rows_in}

        minimal, ours, every = (f"{c} [scale {scale:g}]" for c in ("minimal pipeline, parquet sources",
                                                                    "build, parquet sources", "build, all 23 sources"))
        expected |= {minimal: pq_in, ours: pq_expected, every: sum(kept_rows(written).values())}
        contenders += [
            h.Contender(minimal, f"read_parquet -> pyarrow take in {b.CORES} actors -> write_parquet, on the "
                        f"{len(files)} train files of the {len(PARQUET_SLUGS)} parquet sources; its actors' start-up",
                        call=timed(minimal, lambda o, files=files: b.minimal_pipeline(files, o), pq_in)),
            h.Contender(ours, f"build(BuildConfig(mirror, out, datasets=<the same {len(PARQUET_SLUGS)}>)); its "
                        "actors' start-up", call=timed(ours, lambda o, rb=run_build: rb(o, PARQUET_SLUGS), pq_in),
                        baseline=minimal),
            h.Contender(every, "build(BuildConfig(mirror, out)): all 23 sources, WebDataset tars too",
                        call=timed(every, run_build, sum(written.values())))]
    bench = h.Benchmark(
        "build_rows", f"Rows: 23 sources, {args.files} parquet files each, tars of {TAR_ROWS:,} rows, 80-byte images, "
        f"rows_per_shard={args.rows_per_shard:,}, at scales {', '.join(f'{s:g}' for s in scales)} of the hub's rows",
        contenders, group="Build", repeat=args.repeat,
        ratio=(f"build, parquet sources [scale {scales[-1]:g}]", f"minimal pipeline, parquet sources [scale "
                                                                 f"{scales[-1]:g}]"),
        columns=[("rows in", lambda r: f"{r.extra('rows_in')[0]:,}"),
                 ("rows/s (fastest)", lambda r: f"{r.extra('rows_in')[0] / r.fastest:,.0f}"),
                 ("peak system used (rise)", lambda r: h.gib(max(r.extra("used")))),
                 ("peak Ray workers RSS", lambda r: h.gib(max(r.extra("rss"))))])
    record = h.run(bench)
    bad = [f"{name}: {n:,} rows out, expected {expected[name]:,}" for name, r in record.results.items()
           for n in r.extra("rows_out") if n != expected[name]]
    lo, hi = (record[f"build, all 23 sources [scale {s:g}]"].extras for s in (scales[0], scales[-1]))
    used_lo, used_hi = max(e["used"] for e in lo), max(e["used"] for e in hi)
    # a rise under 64 MiB at the smaller scale is sampling noise: no ratio from it
    record.finish(figures={
        f"build, all 23 sources, peak memory at scale {scales[-1]:g} / scale {scales[0]:g} "
        f"({hi[0]['rows_in'] / lo[0]['rows_in']:.1f}x the rows)": {
            "system used rise": f"{used_hi / used_lo:.2f}x" if used_lo >= 64 << 20 else
                                "n/a (rise < 64 MiB at the smaller scale)",
            "Ray workers RSS": f"{max(e['rss'] for e in hi) / max(max(e['rss'] for e in lo), 1):.2f}x"},
        "rows out": "as expected in every run (footers of the output files)" if not bad else
                    "MISMATCH: " + "; ".join(bad)}, notes=[
        "Ray start-up excluded from all timings; each run's own actor start-up included; outputs to local disk.",
        h.MemorySampler.METHOD])
    if bad:
        raise SystemExit("row counts differ")


if __name__ == "__main__":
    main()
