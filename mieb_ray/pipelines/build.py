"""The build job: the 23 sources -> the mieb-train table, sharded as Parquet or WebDataset.

plan (driver: file listings and footers only) -> ShardBuilder actor pool (Ray Data; one unit of
rows per call: read, caption, write) -> manifest (driver, written last). `--resume` skips the units
whose progress record an earlier run committed.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import ray

from mieb_ray import __version__, storage
from mieb_ray.captions import class_table
from mieb_ray.cluster import capacity
from mieb_ray.errors import UserError
from mieb_ray.io import readers
from mieb_ray.shard_builder import PROGRESS, ShardBuilder, progress_path, unit_record
from mieb_ray.sources import TOTAL_ROWS, select

FORMAT = "mieb-train"
FORMAT_VERSION = 1
FORMATS = ("parquet", "webdataset")
_SHARD = re.compile(r"^(?P<slug>[a-z0-9_]+)/\d{6}\.(parquet|tar)$|^_errors/(?P<err>[a-z0-9_]+)/\d{12}\.parquet$")


def check_counts(counts: dict[str, int], expected: dict[str, int]) -> None:
    """Each dataset's rows must equal the catalog's; all 23 together must make TOTAL_ROWS."""
    wrong = [f"{slug}: {counts.get(slug, 0):,} rows, expected {n:,}" for slug, n in expected.items()
             if counts.get(slug, 0) != n]
    if wrong:
        raise UserError("row count mismatch: " + "; ".join(wrong))
    if len(expected) == 23 and sum(counts.values()) != TOTAL_ROWS:
        raise UserError(f"mieb-train has {sum(counts.values()):,} rows, expected {TOTAL_ROWS:,}")


def _plan(selected, sources: str, rows_per_shard: int):
    def one(source):
        units, hub_names = readers.plan(source, sources, rows_per_shard)
        try:
            return source, units, class_table(source, hub_names)
        except ValueError as exc:  # the source's class list is not the one the catalog knows
            raise UserError(str(exc)) from exc

    with ThreadPoolExecutor(8) as pool:
        planned = list(pool.map(one, selected))
    return [u for _, units, _ in planned for u in units], {s.slug: t for s, _, t in planned}


def _replace_old(out: str, overwrite: bool) -> None:
    old = storage.read_manifest(out)
    if old is None:
        return
    if not overwrite:
        raise UserError(f"{storage.display(out)} already holds a complete build ({storage.MANIFEST}); "
                        "pass --overwrite to replace it")
    storage.delete(storage.join(out, storage.MANIFEST))  # from here on the output reads as incomplete
    for path in [s["path"] for s in old.get("shards", [])] + old.get("error_files", []):
        storage.delete(storage.join(out, path))


def _built_units(out: str, units, fmt: str, rows_per_shard: int) -> dict[str, dict]:
    """{unit json: result} for the planned units whose record, with the same settings, an earlier run committed."""
    wanted = {storage.join(out, progress_path(u.slug, u.lo)): u for u in units}
    found = [uri for uri in storage.list_files(storage.join(out, PROGRESS)) if uri in wanted]
    with ThreadPoolExecutor(16) as pool:
        records = list(pool.map(lambda uri: json.loads(storage.read_text(uri)), found))
    built = {}
    for uri, record in zip(found, records):
        unit = wanted[uri]
        if record == unit_record(unit, fmt, rows_per_shard, record.get("result")):
            built[unit.to_json()] = record["result"]
    return built


def _remove_stale(out: str, slugs: list[str], keep: set[str]) -> None:
    """Shards an interrupted earlier run left (e.g. with another --rows-per-shard) are not ours now."""
    for slug in slugs:
        for folder in (slug, f"_errors/{slug}"):
            base = storage.join(out, folder)
            for uri in storage.list_files(base):
                rel = uri[len(out.rstrip("/")) + 1:]
                if _SHARD.match(rel) and rel not in keep:
                    storage.delete(uri)


def dataset_card(slugs: list[str], fmt: str) -> str:
    """README.md whose `configs` let `datasets.load_dataset(OUT, "<slug>")` (and the hub viewer) read it."""
    ext = "parquet" if fmt == "parquet" else "tar"
    lines = ["---", "configs:"]
    if fmt == "parquet":  # WebDataset shard sets differ in image extension, so they are not mixed
        lines += ["- config_name: all", "  data_files:", "  - split: train", f'    path: "*/*.{ext}"']
    for slug in slugs:
        lines += [f"- config_name: {slug}", "  data_files:", "  - split: train", f"    path: {slug}/*.{ext}"]
    lines += ["---", "", f"# mieb-train ({fmt})", "",
              f"Built by mieb-ray {__version__}. Rows, shards and checksums: `{storage.MANIFEST}`.", ""]
    return "\n".join(lines)


def _run_units(todo, tables, out: str, fmt: str, rows_per_shard: int, workers: int | None, cpus_per_worker: float):
    """Build `todo` in a ShardBuilder actor pool; yield each unit's result as it comes."""
    if not todo:
        return
    if workers is None:
        workers = max(1, int(capacity()["CPU"] // cpus_per_worker))
    workers = max(1, min(workers, len(todo)))
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # our own progress lines
    ds = ray.data.from_items([{"unit": u.to_json()} for u in todo], override_num_blocks=len(todo))
    ds = ds.map_batches(
        ShardBuilder,
        fn_constructor_kwargs=dict(tables=tables, out=out, fmt=fmt, rows_per_shard=rows_per_shard),
        batch_size=1, batch_format="numpy", num_cpus=cpus_per_worker,
        compute=ray.data.ActorPoolStrategy(size=workers),  # all at once: a pool that grows one by one idles
    )
    for row in ds.iter_rows():
        result = json.loads(row["result"])
        if "user_error" in result:
            raise UserError(result["user_error"])
        yield result


def build(sources: str, out: str, datasets: str | list[str] | None = None, fmt: str = "parquet",
          rows_per_shard: int = 10_000, overwrite: bool = False, resume: bool = False,
          verify_counts: bool | None = None, max_error_rate: float = 0.001, workers: int | None = None,
          cpus_per_worker: float = 1.0, log=print) -> dict:
    """Run the build on the connected Ray cluster; return the manifest."""
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
    if rows_per_shard < 1:
        raise UserError("--rows-per-shard must be at least 1")
    selected = select(datasets)
    verify_counts = (sources == readers.HF) if verify_counts is None else verify_counts
    expected = {s.slug: s.rows for s in selected}
    storage.check_output(out)
    _replace_old(out, overwrite)
    storage.remove_staging(out)

    t0 = time.time()
    units, tables = _plan(selected, sources, rows_per_shard)
    log(f"[build] planned {len(units)} units over {len(selected)} datasets in {time.time() - t0:.1f}s")
    built = _built_units(out, units, fmt, rows_per_shard) if resume else {}
    if resume:
        log(f"[build] resuming: {len(built)} of {len(units)} units already built")
    results = list(built.values())
    todo = [u for u in units if u.to_json() not in built]
    rows, new_rows, t_run, t_log = sum(r["rows"] for r in results), 0, time.time(), 0.0
    for result in _run_units(todo, tables, out, fmt, rows_per_shard, workers, cpus_per_worker):
        results.append(result)
        rows += result["rows"]
        new_rows += result["rows"]
        if time.time() - t_log > 5 or len(results) == len(units):
            t_log, elapsed = time.time(), time.time() - t_run
            log(f"[build] {len(results)}/{len(units)} units, {rows:,} rows, "
                f"{new_rows / max(elapsed, 1e-9):,.0f} rows/s")

    counts = {s.slug: 0 for s in selected}
    errors = {s.slug: 0 for s in selected}
    dropped = {s.slug: 0 for s in selected}
    for r in results:
        counts[r["slug"]] += r["rows"]
        errors[r["slug"]] += r["errors"]
        dropped[r["slug"]] += r["dropped"]
    shards = sorted((s for r in results for s in r["shards"]), key=lambda s: s["path"])
    error_files = sorted(r["error_file"] for r in results if r["error_file"])
    _remove_stale(out, [s.slug for s in selected], {s["path"] for s in shards} | set(error_files))

    n_errors = sum(errors.values())
    if n_errors > max_error_rate * (rows + n_errors):
        worst = ", ".join(f"{k}: {v:,}" for k, v in errors.items() if v)
        raise UserError(f"{n_errors:,} rows could not be built ({worst}), more than --max-error-rate "
                        f"{max_error_rate}; see {storage.display(storage.join(out, '_errors'))}")
    if verify_counts:
        check_counts(counts, expected)

    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "package": "mieb-ray", "version": __version__,
        "config": {"sources": storage.display(sources), "datasets": [s.slug for s in selected], "format": fmt,
                   "rows_per_shard": rows_per_shard, "counts_verified": verify_counts},
        "sources": {s.slug: {"repo": s.repo, "revision": s.revision, "split": s.split} for s in selected},
        "counts": {"total": rows, "datasets": counts, "errors": errors, "dropped": dropped,
                   "expected": expected},
        "shards": shards,
        "error_files": error_files,
    }
    storage.write_bytes(storage.join(out, "README.md"), dataset_card([s.slug for s in selected], fmt).encode())
    storage.write_manifest(out, manifest)
    storage.delete_tree(storage.join(out, PROGRESS))  # the manifest now says what the records said
    log(f"[build] done: {rows:,} rows in {len(shards)} shards, {n_errors:,} errors, "
        f"{time.time() - t0:.1f}s -> {storage.display(out)}")
    return manifest
