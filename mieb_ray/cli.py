"""`mieb-ray build | demo`: parse flags, connect to Ray, call a pipeline. No logic of its own."""

from __future__ import annotations

import argparse
import os
import sys

from mieb_ray.errors import find_user_error


def add_build_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sources", default="hf",
                   help="mirror root (local path or s3://bucket/prefix) holding <org>/<repo>/ folders, or 'hf' for "
                        "the Hugging Face hub at the pinned revisions (default: hf)")
    p.add_argument("--out", required=True, help="output root, local path or s3://bucket/prefix")
    p.add_argument("--datasets", default=None, help="comma-separated dataset names (default: all 23)")
    p.add_argument("--format", default="parquet", choices=["parquet", "webdataset"])
    p.add_argument("--rows-per-shard", type=int, default=10_000,
                   help="rows per output shard; shard k of a dataset holds source rows [k*N, (k+1)*N) (default: 10000)")
    p.add_argument("--overwrite", action="store_true", help="replace a complete build already at --out")
    p.add_argument("--check-counts", dest="verify_counts", action=argparse.BooleanOptionalAction, default=None,
                   help="fail unless each dataset has its catalog row count (default: on for --sources hf)")
    p.add_argument("--max-error-rate", type=float, default=0.001,
                   help="fail when more than this fraction of rows cannot be built (default: 0.001)")
    p.add_argument("--workers", type=int, default=None, help="actor pool size (default: the cluster's CPUs)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0)


def init_ray(address: str | None = None) -> None:
    """Join the cluster a job was submitted to (RAY_ADDRESS), or start a local one."""
    import logging

    import ray

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # our pipelines print their own progress
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS"), log_to_driver=True,
                 logging_level="WARNING")


def run_build(args: argparse.Namespace) -> None:
    from mieb_ray.pipelines.build import build
    from mieb_ray.sources import select

    select(args.datasets)  # an unknown name fails here, before Ray starts
    init_ray(args.address)
    build(args.sources, args.out, datasets=args.datasets, fmt=args.format, rows_per_shard=args.rows_per_shard,
          overwrite=args.overwrite, verify_counts=args.verify_counts, max_error_rate=args.max_error_rate,
          workers=args.workers, cpus_per_worker=args.cpus_per_worker)


def run_demo(args: argparse.Namespace) -> None:
    from mieb_ray.demo import demo

    init_ray(args.address)
    demo(args.out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mieb-ray", description=__doc__)
    p.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the mieb-train table from the 23 sources")
    add_build_flags(b)
    b.set_defaults(run=run_build)
    d = sub.add_parser("demo", help="build a small mieb-train from a fixture mirror, on a local Ray")
    d.add_argument("--out", default="mieb-demo", help="output folder (default: ./mieb-demo)")
    d.set_defaults(run=run_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        args.run(args)
    except KeyboardInterrupt:
        print("mieb-ray: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a user's mistake is one line; anything else keeps its traceback
        user = find_user_error(exc)
        if user is None:
            raise
        print(f"mieb-ray: error: {user}", file=sys.stderr)
        return 1
    return 0
