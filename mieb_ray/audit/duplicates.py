"""`audit --against self`: the groups of train rows that are copies of each other, by detector (exact, pixels,
pdq): pure functions on Arrow tables, no Ray. NeMo Curator's semantic dedup finds such groups with embeddings;
these detectors need none.

A group is a connected set of rows: the rows sharing one byte or pixel hash, or the rows linked by pdq pairs
(within the threshold, transitively). `duplicates.parquet` lists every row in a group: key, method, group (the
smallest key of the group, so it is stable across runs), keep (true for that row). `build --exclude` of a self
audit keeps one row per group of the chosen detectors together (their groups merged where they share a row) and
leaves the others out.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray import formats
from mieb_ray.io.contamination import Components, left_out

SCHEMA = pa.schema([("key", pa.string()), ("method", pa.string()), ("group", pa.string()), ("keep", pa.bool_())])


def hash_links(rows: pa.Table) -> list[tuple[str, str, str]]:
    """(method, key, key) linking each row to the first row of its byte hash and of its pixel hash, where another
    row shares it (the rows of one join partition: a hash value's rows are all there)."""
    links = []
    for method, column in (("exact", "sha"), ("pixels", "pix")):
        first: dict[bytes, str] = {}
        for key, value in zip(rows["key"].to_pylist(), rows[column].to_pylist()):
            if value is not None:
                links.append((method, first.setdefault(value, key), key))
    return [link for link in links if link[1] != link[2]]


def pdq_links(pairs: pa.Table) -> list[tuple[str, str, str]]:
    """("pdq", key, key) of pdq pairs of the table with itself (matches.pdq_pairs), a row's pair with itself left
    out; a group of matches.linked_rows links its members to each other."""
    links = []
    single = pairs.filter(pc.is_null(pairs["group"]))
    for a, b in zip(single["train_key"].to_pylist(), single["eval_key"].to_pylist()):
        if a != b:
            links.append(("pdq", a, b))
    grouped = pairs.filter(pc.is_valid(pairs["group"]))
    first: dict[int, str] = {}
    for group, a, b in zip(*(grouped[c].to_pylist() for c in ("group", "train_key", "eval_key"))):
        key = a if a is not None else b
        links.append(("pdq", first.setdefault(group, key), key))
    return [link for link in links if link[1] != link[2]]


def table(links: list[tuple[str, str, str]]) -> pa.Table:
    """duplicates.parquet's rows: per method, every row of every group."""
    rows = []
    for method in formats.HASH_DETECTORS:
        found = Components()
        for m, a, b in links:
            if m == method:
                found.union(a, b)
        for root, keys in sorted(found.groups().items()):
            rows += [(k, method, root, k == root) for k in keys]
    return pa.table(dict(zip(SCHEMA.names, map(list, zip(*rows))) if rows else {n: [] for n in SCHEMA.names}),
                    schema=SCHEMA)


def summary(duplicates: pa.Table, rows: int) -> dict:
    """Per detector: its groups, the rows in them and the rows build --exclude would leave out."""
    out = {"train_rows": rows}
    for method in formats.HASH_DETECTORS:
        mine = duplicates.filter(pc.equal(duplicates["method"], method))
        groups = pc.sum(mine["keep"]).as_py() or 0
        out[method] = {"groups": groups, "rows_in_groups": mine.num_rows, "left_out": mine.num_rows - groups}
    out["left_out_by_default"] = len(left_out(duplicates, formats.HASH_DETECTORS))
    return out
