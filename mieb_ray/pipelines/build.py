"""The build job: the catalog's sources -> the mieb-train table, sharded as Parquet or WebDataset.

`split="eval"` builds each source's MIEB eval split (test; validation for food101) instead, in the same
layout, keyed `<slug>/<split>/<index>`, every row kept; it goes to its own output.

check     driver, before anything is written or Ray works: the cheap part of check-sources (listing, layout,
          columns, class names); a wrong mirror fails in seconds with the table (preflight.py)
plan      driver: file listings, footers and tar headers only; units of at most N rows of one source, each
          within one tar (reader.plan_source)
build     ShardBuilder, one unit per call: read, caption, write and commit its shard, then the unit's progress
          record (shard_builder.py); an actor pool on Ray (each actor holds the class tables once), or in this
          process for a small build (runtime/placement.py)
manifest  driver, last: built from the units' results (runtime/job.py); before it, for WebDataset, a sizes.json
          in each dataset folder (formats.shard_sizes)

`--resume` skips the units whose progress record an earlier run committed with the same settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray import __version__, flags, formats, hubfs, storage
from mieb_ray.captions import class_table
from mieb_ray.errors import UserError
from mieb_ray.io import contamination, reader
from mieb_ray.pipelines import preflight
from mieb_ray.pipelines.shard_builder import ShardBuilder
from mieb_ray.runtime import identity, placement
from mieb_ray.runtime.cluster import RunContext, read_cluster
from mieb_ray.runtime.job import Job
from mieb_ray.runtime.pools import cpu_pool
from mieb_ray.runtime.units import Stage
from mieb_ray.sources import EVAL_TOTAL_ROWS, SOURCES, TOTAL_ROWS, Source, select

FORMATS = ("parquet", "webdataset")
SPLITS = ("train", "eval")  # eval: each source's `eval_split`
LOCAL_ROWS = 100_000  # at most this many rows build in this process under --executor auto (a second or two)


@dataclass(frozen=True)
class BuildConfig:
    sources: str = flags.sources_option()
    out: str = flags.option(flag="--out", parse=flags.output, required=True,
                            help="output root, local path or s3://bucket/prefix")
    datasets: tuple[str, ...] | str | None = flags.option(
        None, flag="--datasets", help=f"comma-separated dataset slugs (default: all {len(SOURCES)}): "
        + ", ".join(s.slug for s in SOURCES))  # None: every source of the catalog
    fmt: str = flags.option("parquet", flag="--format", choices=FORMATS, help="the shards' format (docs/formats.md)")
    rows_per_shard: int = flags.option(
        10_000, flag="--rows-per-shard", check=flags.count,
        help="rows per output shard; shard k of a dataset holds source rows [k*N, (k+1)*N) (default: 10000, as the "
             "WebDataset sources' tars)")
    overwrite: bool = flags.option(False, flag="--overwrite", action="store_true",
                                   help="replace a complete build already at --out")
    resume: bool = flags.option(False, flag="--resume", action="store_true",
                                help="continue an unfinished run: skip the units it built with the same settings (an "
                                     "unfinished output needs --resume or --overwrite)")
    check_counts: bool | None = flags.option(  # None: on for the hub
        None, flag="--check-counts", action=argparse.BooleanOptionalAction,
        help=f"fail unless each dataset has its catalog row count and all {len(SOURCES)} make {TOTAL_ROWS:,} "
             "(default: on for --sources hf)")
    max_error_rate: float = flags.option(
        0.001, flag="--max-error-rate", check=flags.fraction,
        help="fail when more than this fraction of rows cannot be built (default: 0.001); such rows are listed in "
             "OUT/_errors/, never silently dropped")
    workers: int | None = flags.option(
        None, flag="--workers", check=flags.count,
        help="shard builders, a fixed number (default: a pool from the CPUs up now to the CPUs the cluster can grow "
             "to)")
    cpus_per_worker: float = flags.option(1.0, flag="--cpus-per-worker", check=flags.cpus,
                                          help="CPUs per shard builder (default: 1)")
    # no argparse `choices`: a wrong value is then the one-line UserError of check()
    split: str = flags.option(
        "train", flag="--split", metavar="{train,eval}",
        help="train: the train splits, keys <slug>/<index> (default); eval: each task's MIEB eval split (test; "
             "validation for food101), every row kept, keys <slug>/<split>/<index>, to its own --out")
    exclude: str | None = flags.option(  # an audit output: its flagged train rows are left out
        None, flag="--exclude", parse=flags.existing_folder,
        help="an audit output (mieb-ray audit --out): leave out the train rows it flagged; the other rows keep their "
             "keys")
    exclude_detectors: tuple[str, ...] = flags.option(
        formats.BUILD_DETECTORS, flag="--exclude-detectors", check=flags.detectors,
        help=f"with --exclude: the detectors ({', '.join(formats.DETECTORS)}) whose pairs leave a train row out, "
             f"comma-separated (default: {','.join(formats.BUILD_DETECTORS)}; add near to trust the CLIP threshold "
             "too)")
    executor: str = flags.executor_option()  # ray, local (in this process), auto (runtime/placement.py)
    reuse: bool = False  # a complete build of the same identity is kept, one of another replaced (eval's splits)

    def check(self) -> None:
        flags.check(self)
        if self.split not in SPLITS:
            raise UserError(f"unknown split {self.split!r}; valid: {', '.join(SPLITS)}")
        if self.exclude and self.split != "train":
            raise UserError("--exclude applies to the train split only")


def excluded_keys(audit: str, by: tuple[str, ...] = formats.BUILD_DETECTORS) -> pa.Array:
    """The distinct train keys an audit output flagged by any of the detectors `by`."""
    return contamination.flagged_train_keys(audit, by)


def built_rows(source: Source, split: str) -> int:
    """Rows the build writes of the source's split: train, the catalog's rows less those of the classes it drops;
    eval, every row."""
    return source.rows if split == "train" else source.eval_rows


def check_counts(counts: dict[str, int], expected: dict[str, int], total: int = TOTAL_ROWS) -> None:
    """Each dataset's rows must equal the catalog's; all the catalog's sources together must make `total`
    (TOTAL_ROWS for train, EVAL_TOTAL_ROWS for eval)."""
    wrong = [f"{slug}: {counts.get(slug, 0):,} rows, expected {n:,}" for slug, n in expected.items()
             if counts.get(slug, 0) != n]
    if wrong:
        raise UserError("row count mismatch: " + "; ".join(wrong))
    if len(expected) == len(SOURCES) and sum(counts.values()) != total:
        raise UserError(f"the {len(SOURCES)} datasets have {sum(counts.values()):,} rows, expected {total:,}")


def build(config: BuildConfig, log=print, ctx: RunContext | None = None) -> dict:
    """Run the build on Ray or in this process; return the manifest. ctx: the command's Ray (None: RunContext())."""
    config.check()
    selected = select(config.datasets)
    hub = hubfs.requests_so_far() if config.sources == reader.HF else None
    exclude = excluded_keys(config.exclude, config.exclude_detectors) if config.exclude else None
    made_of = _identity(config, selected, _exclusion(config, exclude))
    slugs = "|".join(s.slug for s in selected)
    # shards (tars also by their version 1 names) and error files of these sources (an interrupted run's other shard
    # sizes are stale at the end); sizes.json in any dataset's folder, since each one lists the whole build
    every = "|".join(s.slug for s in SOURCES)
    ours = re.compile(rf"^(?P<slug>{slugs})/((?P=slug)-)?\d{{6}}\.(parquet|tar)$|^_errors/({slugs})/\d{{12}}\.parquet$"
                      rf"|^({every})/{re.escape(formats.SIZES)}$")
    job = Job("build", config.out, "a complete build", ours, config.resume, config.overwrite, log, made_of,
              config.reuse)
    if (reused := job.reusable()) is not None:
        return reused
    check_sources(selected, config.sources, config.split, log)
    with job:  # its hold on the output ends with the run, however it ends
        job.start()
        settings = {"sources": storage.display(config.sources), "datasets": [s.slug for s in selected],
                    "format": config.fmt, "rows_per_shard": config.rows_per_shard, "split": config.split,
                    "version": __version__, "format_version": formats.MIEB_TRAIN.version,
                    "exclude": _exclusion(config, exclude)}

        t0 = time.time()
        units, tables = _plan(selected, config.sources, config.rows_per_shard, config.split)
        # a unit is kept on resume only if its source's files are those it was built from
        units = [dataclasses.replace(u, input=made_of["inputs"][u.source]) for u in units]
        log(f"[build] planned {len(units)} units over {len(selected)} datasets ({config.split}) "
            f"in {time.time() - t0:.1f}s")
        built = job.earlier({u.name: u.identity for u in units}, settings)
        if config.resume:
            log(f"[build] resuming: {len(built)} of {len(units)} units already built")
        if exclude is not None:
            log(f"[build] leaving out the {len(exclude):,} train rows flagged by {storage.display(config.exclude)} "
                f"({', '.join(config.exclude_detectors)})")
        todo = [i for i, u in enumerate(units) if u.name not in built]
        rows = sum(u.hi - u.lo for u in units)
        where = placement.choose(config.executor, f"{rows:,} rows, more than {LOCAL_ROWS:,}" if rows > LOCAL_ROWS
                                 else None, f"about {rows:,} rows", ctx)
        log(f"[build] {where.describe()}")
        stage = Stage(ShardBuilder, dict(units=units, tables=tables, out=config.out, fmt=config.fmt,
                                         progress=job.progress, exclude=_by_dataset(exclude)))
        if where.mode == "ray" and todo:
            pool = cpu_pool(read_cluster(where.ctx), config.cpus_per_worker, config.workers, cap=len(todo),
                            what="shard builders")
            log(f"[build] {pool.why}")
            stage = dataclasses.replace(stage, num_cpus=pool.num_cpus, pool=pool)
        results = list(built.values()) + list(job.run(todo, [stage], where.mode, total=len(units), ctx=where.ctx))
        manifest = _manifest(config, selected, results, job, _exclusion(config, exclude), t0, log)
        if hub is not None:
            log(f"[build] {hubfs.summary(hub)}")
        return manifest


def _identity(config: BuildConfig, selected: list[Source], exclusion: dict | None) -> dict:
    """What decides the build's rows (runtime/identity.py): each source's repo at its revision on the hub, or
    its files in a mirror (paths, sizes, times); the datasets, split, format, shard size and exclusion."""
    def one(source: Source) -> str:
        if config.sources == reader.HF:
            return f"{source.repo}@{source.revision}"
        root = reader.repo_root(source, config.sources)
        return identity.of_files(storage.listing(root), root)

    with ThreadPoolExecutor(8) as pool:
        inputs = dict(zip((s.slug for s in selected), pool.map(one, selected)))
    return {"format": formats.MIEB_TRAIN.stamp(), "sources": storage.display(config.sources), "inputs": inputs,
            "split": config.split, "layout": config.fmt, "rows_per_shard": config.rows_per_shard,
            "exclude": exclusion["sha256"] if exclusion else None}


def check_sources(selected: list[Source], sources: str, split: str, log=print) -> None:
    """The cheap part of check-sources, first: every source listed at its revision, its layout found, its
    columns (first footer) or first sample, its class names. The table is printed when a source fails or
    warns (a layout that changed); rows are counted later, by the build itself."""
    t0 = time.time()
    rows = preflight.check_sources(selected, sources, split, count=False)
    if any(r.status != preflight.OK for r in rows):
        log(preflight.render(rows))
    if preflight.failed(rows):
        raise UserError(preflight.error(rows))
    layouts = {lay: sum(r.layout == lay for r in rows) for lay in sorted({r.layout for r in rows})}
    log(f"[build] sources checked in {time.time() - t0:.1f}s: " + ", ".join(f"{n} {k}" for k, n in layouts.items()))


def _by_dataset(keys: pa.Array | None) -> dict[str, pa.Array]:
    """Train keys `<slug>/<index>` grouped by slug."""
    if keys is None or not len(keys):
        return {}
    slug = pc.replace_substring_regex(keys, r"/.*$", "")
    return {s: keys.filter(pc.equal(slug, s)) for s in pc.unique(slug).to_pylist()}


def _exclusion(config: BuildConfig, exclude: pa.Array | None) -> dict | None:
    if exclude is None:
        return None
    digest = hashlib.sha256("\n".join(sorted(exclude.to_pylist())).encode()).hexdigest()
    return {"audit": storage.display(config.exclude), "detectors": list(config.exclude_detectors),
            "train_keys": len(exclude), "sha256": digest}


def _plan(selected, sources: str, rows_per_shard: int, split: str):
    def one(source):
        units, hub_names = reader.plan_source(source, sources, rows_per_shard, preflight.source_split(source, split))
        try:
            return source, units, class_table(source, hub_names)
        except ValueError as exc:  # the source's class list is not the one the catalog knows
            raise UserError(str(exc)) from exc

    with ThreadPoolExecutor(8) as pool:
        planned = list(pool.map(one, selected))
    return [u for _, units, _ in planned for u in units], {s.slug: t for s, _, t in planned}


def build_eval_splits(data: str, out: str, log=print, slugs: list[str] | None = None,
                      ctx: RunContext | None = None) -> str:
    """The eval splits of `slugs` (default: every source) built from `data` into OUT/eval-data/<id>, where
    the evals read them; a complete build there of the same identity is reused (runtime/identity.py: the same
    sources' files, datasets and settings), any other replaced. Returns its URI."""
    slugs = list(slugs or [s.slug for s in select(None)])
    ident = hashlib.sha256(f"{storage.display(data)}|{','.join(slugs)}".encode()).hexdigest()[:12]
    target = storage.join(out, "eval-data", ident)
    build(BuildConfig(data, target, datasets=tuple(slugs), split="eval", reuse=True), log=log, ctx=ctx)
    return target


def dataset_card(splits: dict[str, str], fmt: str, exclusion: dict | None = None) -> str:
    """README.md whose `configs` let `datasets.load_dataset(OUT, "<slug>")` (and the hub viewer) read it.
    `splits`: slug -> the split name its rows come from (train, test, validation), in catalog order;
    `exclusion`: what --exclude left out."""
    ext = "parquet" if fmt == "parquet" else "tar"
    by_split: dict[str, list[str]] = {}
    for slug, split in splits.items():
        by_split.setdefault(split, []).append(slug)
    lines = ["---", "configs:"]
    if fmt == "parquet":  # WebDataset shard sets differ in image extension, so they are not mixed
        lines += ["- config_name: all", "  data_files:"]
        for split, slugs in by_split.items():  # eval: food101's validation beside the others' test
            path = f'"*/*.{ext}"' if len(by_split) == 1 else "[" + ", ".join(f"{s}/*.{ext}" for s in slugs) + "]"
            lines += [f"  - split: {split}", f"    path: {path}"]
    for slug, split in splits.items():
        lines += [f"- config_name: {slug}", "  data_files:", f"  - split: {split}", f"    path: {slug}/*.{ext}"]
    title = formats.MIEB_TRAIN.name if set(by_split) == {"train"} else "MIEB eval splits in the mieb-train layout"
    lines += ["---", "", f"# {title} ({fmt})", "",
              f"Built by mieb-ray {__version__}. Rows, shards and checksums: `{storage.MANIFEST}`.", ""]
    if set(by_split) == {"train"}:
        lines += ["**Evaluation warning.** These are the train splits of MIEB's own zero-shot tasks (and of SciMMIR, "
                  "whose test split two MIEB retrieval tasks use). Where a train image is also an eval image, a "
                  "model trained on it has seen that eval image: its MIEB scores on that task are invalid. "
                  "`mieb-ray audit` lists those rows; `mieb-ray build --exclude AUDIT_OUT` leaves them out.", ""]
        if exclusion:
            lines += [f"This build leaves out the {exclusion['train_keys']:,} train rows flagged by the audit at "
                      f"`{exclusion['audit']}` (keys sha256 {exclusion['sha256'][:16]}...).", ""]
    return "\n".join(lines)


def write_sizes(out: str, shards: list[dict]) -> list[str]:
    """The same sizes.json (every shard of the build) in each folder holding shards: a WebDataset trainer reads the
    one beside the first shard it is given (open_clip: get_dataset_size). Returns their paths."""
    body = json.dumps(formats.shard_sizes(shards), indent=0).encode()
    paths = sorted({f"{s['path'].rsplit('/', 1)[0]}/{formats.SIZES}" for s in shards})
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda path: storage.write_bytes(storage.join(out, path), body), paths))
    return paths


def _manifest(config: BuildConfig, selected, results: list[dict], job: Job, exclusion: dict | None, t0: float,
              log) -> dict:
    slugs = [s.slug for s in selected]
    counts, errors, dropped, excluded = ({slug: 0 for slug in slugs} for _ in range(4))
    for r in results:
        counts[r["slug"]] += r["rows"]
        errors[r["slug"]] += r["errors"]
        dropped[r["slug"]] += r["dropped"]
        excluded[r["slug"]] += r.get("excluded", 0)
    shards = sorted((s for r in results for s in r["shards"]), key=lambda s: s["path"])
    error_files = sorted(r["error_file"] for r in results if r["error_file"])
    rows, n_errors = sum(counts.values()), sum(errors.values())
    job.check_errors(n_errors, rows, config.max_error_rate, "built", ", ".join(f"{k}: {v:,}" for k, v in errors.items()
                                                                              if v))
    expected = {s.slug: built_rows(s, config.split) for s in selected}
    verify = (config.sources == reader.HF) if config.check_counts is None else config.check_counts
    if verify:
        # the rows left out by --exclude were read: the source still has its catalog count
        check_counts({k: counts[k] + excluded[k] for k in counts}, expected,
                     TOTAL_ROWS if config.split == "train" else EVAL_TOTAL_ROWS)
    splits = {s.slug: preflight.source_split(s, config.split) for s in selected}
    sizes = write_sizes(config.out, shards) if config.fmt == "webdataset" else []
    storage.write_bytes(storage.join(config.out, formats.CARD), dataset_card(splits, config.fmt, exclusion).encode())
    manifest = job.finish({
        **formats.MIEB_TRAIN.stamp(), "package": "mieb-ray", "version": __version__,
        "config": {"sources": storage.display(config.sources), "datasets": slugs, "format": config.fmt,
                   "rows_per_shard": config.rows_per_shard, "split": config.split, "check_counts": verify,
                   "exclude": exclusion},
        "sources": {s.slug: {"repo": s.repo, "revision": s.revision, "split": splits[s.slug]} for s in selected},
        "counts": {"total": rows, "datasets": counts, "errors": errors, "dropped": dropped, "excluded": excluded,
                   "expected": expected},
        "shards": shards,
        "error_files": error_files,
    }, {s["path"] for s in shards} | set(error_files) | set(sizes))
    log(f"[build] done: {rows:,} rows in {len(shards)} shards, {n_errors:,} errors, "
        f"{time.time() - t0:.1f}s -> {storage.display(config.out)}")
    return manifest
