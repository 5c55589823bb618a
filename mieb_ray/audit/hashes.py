"""The hash stage, the job's one stage: per unit, each image's sha256, pixel hash and PDQ hashes
(audit/fingerprints.py, audit/matches.py's hash rows), committed as a Parquet file under OUT/_hashes sorted by join
partition (one row group each), then the unit's progress record. The later phases read these files: each
partition's row group (the join), the PDQ columns (the pdq search), the rows of some keys (`locate`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mieb_ray import storage
from mieb_ray.audit import matches
from mieb_ray.audit.plan import BY_ROW, BY_SLUG, HashUnit, Plan, eval_tasks
from mieb_ray.io import parquet, reader
from mieb_ray.runtime import tasks
from mieb_ray.runtime.cluster import RunContext
from mieb_ray.runtime.job import Job
from mieb_ray.runtime.output import Progress
from mieb_ray.runtime.units import Stage

DIR = "_hashes"  # under OUT, removed once the manifest is written


@dataclass(frozen=True)
class HashFiles:
    """The hash stage's output: per side, each unit's record in planned order (path, name, rows, errors, tasks: rows
    per eval task, datasets: rows per train dataset, and the file's statistics), and the join partitions."""

    out: str
    partitions: int
    records: dict[str, list[dict]]  # "train", "against"

    def uris(self, side: str) -> list[str]:
        return [storage.join(self.out, r["path"]) for r in self.records[side]]

    def paths(self) -> set[str]:
        """Every hash file, relative to OUT."""
        return {r["path"] for records in self.records.values() for r in records}


def hash_all(out: str, plan: Plan, job: Job, done: dict, mode: str, ctx: RunContext | None = None) -> HashFiles:
    """Hash the units not `done` (name -> record of an earlier run); every unit's record, by side. ctx: the
    command's Ray."""
    work = list(plan.units)
    todo = [i for i, item in enumerate(work) if item.name not in done]
    stage = Stage(hash_stage, dict(work=work, out=out, partitions=plan.partitions, progress=job.progress))
    found = done | {r["name"]: r for r in job.run(todo, [stage], mode, total=len(work), ctx=ctx)}
    return HashFiles(out, plan.partitions, {side: [found[item.name] for item in plan.of(side)]
                                            for side in ("train", "against")})


def hash_stage(batch: dict, work: list[HashUnit], out: str, partitions: int, progress: Progress) -> dict:
    """Hash each unit's images; commit its hash file (one row group per partition), then its record."""
    return {"unit": batch["unit"], "result": np.array([json.dumps(_hash_unit(out, work[int(i)], partitions, progress))
                                for i in batch["unit"]])}


def _hash_unit(out: str, item: HashUnit, partitions: int, progress: Progress) -> dict:
    """One unit's hash file and record; each row's eval task is its table's (HashUnit.task), or its own."""
    columns, task = item.columns, item.task
    by_slug = eval_tasks() if task == BY_SLUG else None
    chunks, first = [], 0
    for chunk in reader.read(item.unit, columns.read_as("image")):
        keys, images = chunk[columns.key].to_pylist(), parquet.image_bytes(chunk["image"]).to_pylist()
        row_tasks = chunk["eval_task"].to_pylist() if task == BY_ROW else \
            [by_slug.get(matches.dataset_of(k)) for k in keys] if by_slug else [task] * len(keys)
        chunks.append(matches.hash_rows(keys, images, item.number, first, partitions, row_tasks,
                                        lambda row: reader.null_key(columns.key, item.unit, item.unit.lo + row)))
        first += len(keys)
    table = matches.by_partition(pa.concat_tables(chunks) if chunks else matches.HASH_SCHEMA.empty_table())
    bounds = np.flatnonzero(np.diff(table["part"].to_numpy())) + 1

    def write(local: str) -> None:
        with pq.ParquetWriter(local, matches.HASH_SCHEMA) as writer:
            for lo, hi in zip([0, *bounds], [*bounds, table.num_rows]):
                if hi > lo:
                    writer.write_table(table.slice(lo, hi - lo))
    path = f"{DIR}/{item.name}.parquet"
    progress.held(item.name)
    stats = storage.commit_file(storage.join(out, path), write)
    counts = pc.value_counts(pc.fill_null(table["eval_task"], "")).to_pylist() if table.num_rows else []
    result = {"path": path, "name": item.name, "rows": table.num_rows,
              "errors": pc.sum(pc.is_valid(table["error"])).as_py() or 0,
              "tasks": {t["values"]: t["counts"] for t in counts}, "datasets": _dataset_counts(table["key"]), **stats}
    progress.record(item.name, item.unit.identity, result)
    return result


def _dataset_counts(keys: pa.ChunkedArray) -> dict[str, int]:
    """Rows per train dataset (matches.dataset_of of each key)."""
    if not len(keys):
        return {}
    prefix = pc.if_else(pc.match_substring(keys, "/"), pc.replace_substring_regex(keys, r"/.*$", ""), "")
    return {v["values"]: v["counts"] for v in pc.value_counts(prefix).to_pylist()}


def read_part(uris: list[str], part: int) -> pa.Table:
    """Partition `part` of each hash file: its row group only (rows are sorted, one row group per partition), the
    join's columns only (not the PDQ hashes: 1.7 KB a row)."""
    pieces = []
    for uri in uris:
        with storage.open_input(uri) as f:
            pf = pq.ParquetFile(f)
            column = pf.schema_arrow.get_field_index("part")
            for g in range(pf.metadata.num_row_groups):
                stats = pf.metadata.row_group(g).column(column).statistics
                if stats is not None and stats.min == part:
                    pieces.append(pf.read_row_group(g, columns=matches.JOIN_COLUMNS))
    return pa.concat_tables(pieces) if pieces else matches.HASH_SCHEMA.empty_table().select(matches.JOIN_COLUMNS)


def read_columns(uris: list[str], columns: list[str]) -> pa.Table:
    """These columns of some hash files, each read once."""
    tables = []
    for uri in uris:
        with storage.open_input(uri) as f:
            tables.append(pq.read_table(f, columns=columns))
    return pa.concat_tables(tables) if tables else matches.HASH_SCHEMA.empty_table().select(columns)


@tasks.remote(num_cpus=1)
def locate(uris: list[str], keys: pa.Array, columns: list[str]) -> pa.Table:
    """`columns` of the hash rows whose key is in `keys` (key first)."""
    out = []
    for uri in uris:
        with storage.open_input(uri) as f:
            t = pq.read_table(f, columns=["key", *columns])
        out.append(t.filter(pc.is_in(t["key"], value_set=keys)))
    return pa.concat_tables(out)
