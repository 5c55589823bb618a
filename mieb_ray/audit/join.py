"""The exact and pixels detectors: a CPU task per join partition reads its row group of every hash file and joins
the rows on each hash (audit/matches.py), or, for `--against self`, links the train rows sharing one
(audit/duplicates.py). A hash value's rows are all in one partition, so no task holds more than its own.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray.audit import duplicates, matches
from mieb_ray.audit.hashes import HashFiles, read_part
from mieb_ray.runtime import tasks


@tasks.remote(num_cpus=1)
def _join_part(train: list[str], against: list[str], part: int) -> tuple[pa.Table, list[dict], pa.Table]:
    left, right = read_part(train, part), read_part(against, part)
    return (*matches.hash_pairs(left, right), pa.concat_tables([matches.error_rows("train", left),
                                                                matches.error_rows("against", right)]))


def pairs(hashed: HashFiles, log) -> tuple[pa.Table, pa.Table, list[dict]]:
    """The exact and pixels pairs, the undecodable images (errors.parquet's rows) and the groups of more than
    matches.GROUP_CAP pairs."""
    train, against = hashed.uris("train"), hashed.uris("against")
    joined = tasks.get([_join_part.remote(train, against, p) for p in range(hashed.partitions)])
    found = pa.concat_tables([j[0] for j in joined])
    groups = [g for j in joined for g in j[1]]  # a hash value's rows are all in one partition
    errors = pa.concat_tables([j[2] for j in joined])
    single = found.filter(pc.is_null(found["group"]))
    counts = {m: pc.sum(pc.equal(single["method"], m)).as_py() or 0 for m in ("exact", "pixels")}
    log(f"[audit] exact: {counts['exact']} pairs, pixels: {counts['pixels']} pairs"
        + (f", {len(groups)} groups of more than {matches.GROUP_CAP:,} pairs each" if groups else "")
        + f"; {errors.num_rows} undecodable images")
    return found, errors, groups


@tasks.remote(num_cpus=1)
def _self_part(train: list[str], part: int) -> tuple[list, pa.Table]:
    rows = read_part(train, part)
    return duplicates.hash_links(rows), matches.error_rows("train", rows)


def links(hashed: HashFiles) -> tuple[list, pa.Table]:
    """`--against self`: the (method, key, key) links between train rows sharing a hash, and the undecodable ones."""
    joined = tasks.get([_self_part.remote(hashed.uris("train"), p) for p in range(hashed.partitions)])
    return [link for j in joined for link in j[0]], pa.concat_tables([j[1] for j in joined])
