"""Parquet files, read the one way every job reads them: the footer (schema, the `huggingface` metadata, row
groups), row-group batches of bounded size, and image columns as HF Image structs or bytes. A file that is not a
Parquet file is one line naming it (FormatError)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from mieb_ray import storage
from mieb_ray.errors import FormatError, first_line

IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # the HF `Image` feature



def footer(uri: str) -> pq.FileMetaData:
    """The file's footer: schema (with its `huggingface` metadata), row groups and row counts. One small read."""
    try:
        with storage.open_input(uri) as f:
            return pq.read_metadata(f)
    except (pa.ArrowInvalid, OSError) as exc:
        raise FormatError(f"unreadable parquet file {storage.display(uri)}: {first_line(exc)}") from exc


def read_table(uri: str, columns: list[str] | None = None) -> pa.Table:
    """A whole (small) file, or its `columns`: a table of keys, an item table."""
    fs, path = storage.filesystem(uri)
    try:
        return pq.read_table(path, filesystem=fs, columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise FormatError(f"unreadable parquet file {storage.display(uri)}: {first_line(exc)}") from exc


def hub_class_names(meta: pq.FileMetaData, column: str) -> list[str] | None:
    """The ClassLabel names of `column` kept by HF `datasets` in the parquet schema metadata."""
    raw = (meta.metadata or {}).get(b"huggingface")
    if raw is None:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    feature = (info.get("info", {}).get("features") or info.get("features") or {}).get(column, {})
    return feature.get("names") if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" else None


def packed(rows: list[int], max_rows: int, sizes: list[int] | None = None, max_bytes: int = 0) -> list[list[int]]:
    """The places of consecutive row groups (their row counts, and byte sizes when given) taken together up to
    max_rows rows and max_bytes bytes; a group over either bound alone."""
    batches, total, size = [], 0, 0
    for i, n in enumerate(rows):
        b = sizes[i] if sizes is not None else 0
        if not batches or total + n > max_rows or (sizes is not None and size + b > max_bytes):
            batches.append([])
            total, size = 0, 0
        batches[-1].append(i)
        total, size = total + n, size + b
    return batches


def read_range(uri: str, columns: list[str], lo: int = 0, hi: int | None = None, max_rows: int = 0,
               max_bytes: int = 0) -> Iterator[tuple[int, pa.Table]]:
    """Rows [lo, hi) of the file (hi None: to its end) in order, as (the file row of the table's first row,
    table): only the row groups that hold them are read, a batch of groups (max_rows, max_bytes; 0: one group)
    at a time."""
    try:
        pf = pq.ParquetFile(storage.open_input(uri))
        meta = pf.metadata
        groups, starts, first = [], {}, 0
        for group in range(meta.num_row_groups):
            n = meta.row_group(group).num_rows
            if (hi is None or first < hi) and first + n > lo:
                groups.append(group)
                starts[group] = first
            first += n
        held = [meta.row_group(g) for g in groups]
        for places in packed([g.num_rows for g in held], max_rows, [g.total_byte_size for g in held], max_bytes):
            batch = [groups[i] for i in places]
            table, at = pf.read_row_groups(batch, columns=columns), starts[batch[0]]
            start, end = max(lo - at, 0), table.num_rows if hi is None else min(hi - at, table.num_rows)
            yield at + start, table.slice(start, end - start)
    except (pa.ArrowInvalid, OSError) as exc:
        raise FormatError(f"unreadable parquet file {storage.display(uri)}: {first_line(exc)}") from exc


def image_struct(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """An image column as HF Image structs {bytes, path}: structs pass through untouched; raw binary becomes
    {bytes, path: null}; strings are paths, {bytes: null, path} (a table of image files)."""
    if pa.types.is_struct(col.type):
        return col if col.type == IMAGE_TYPE else col.cast(IMAGE_TYPE)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return pa.chunked_array([pa.StructArray.from_arrays([pa.nulls(len(c), pa.binary()), c.cast(pa.string())],
                                                            fields=list(IMAGE_TYPE)) for c in col.chunks], IMAGE_TYPE)
    return pa.chunked_array([pa.StructArray.from_arrays([c.cast(pa.binary()), pa.nulls(len(c), pa.string())],
                                                        fields=list(IMAGE_TYPE)) for c in col.chunks], IMAGE_TYPE)


def image_bytes(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """An image column as its bytes: HF Image structs {bytes, path} -> bytes; raw binary as it is."""
    if pa.types.is_struct(col.type):
        return pa.chunked_array([c.field("bytes") for c in col.chunks], pa.binary())
    return col


def is_image_type(type_: pa.DataType) -> bool:
    """A column that holds image bytes: binary, or a struct with a binary `bytes` field (HF Image)."""
    if pa.types.is_struct(type_):
        index = type_.get_field_index("bytes")
        return index >= 0 and (pa.types.is_binary(type_.field(index).type)
                               or pa.types.is_large_binary(type_.field(index).type))
    return pa.types.is_binary(type_) or pa.types.is_large_binary(type_)
