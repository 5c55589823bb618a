"""Parquet files and WebDataset tars, read the one way every job reads them: footers, row-group batches, image
columns, tar members grouped into samples, and the cheap looks at a tar (its first sample, its last member).

The build's sources (readers.py), the embed job's tables (tables.py) and the preflight (preflight.py) all go
through here; they add only what their units and rows mean. Errors are one line naming the file
(FormatError, a UserError); the caller may re-raise them as its own kind.
"""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from mieb_ray import storage
from mieb_ray.errors import UserError

IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # the HF `Image` feature
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
BLOCK = 512  # tar header and data alignment


class FormatError(UserError):
    pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------------------------------------- parquet


def parquet_footer(uri: str) -> pq.FileMetaData:
    """The file's footer: schema (with its `huggingface` metadata), row groups and row counts. One small read."""
    try:
        with storage.open_input(uri) as f:
            return pq.read_metadata(f)
    except (pa.ArrowInvalid, OSError) as exc:
        raise FormatError(f"unreadable parquet file {storage.display(uri)}: {_first_line(exc)}") from exc


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


def row_group_batches(meta: pq.FileMetaData, row_groups: list[int], max_rows: int, max_bytes: int):
    """Consecutive row groups, read together up to max_rows rows or max_bytes (a bigger group alone)."""
    batch, rows, size = [], 0, 0
    for i in row_groups:
        group = meta.row_group(i)
        if batch and (rows + group.num_rows > max_rows or size + group.total_byte_size > max_bytes):
            yield batch
            batch, rows, size = [], 0, 0
        batch.append(i)
        rows, size = rows + group.num_rows, size + group.total_byte_size
    if batch:
        yield batch


def read_row_groups(uri: str, row_groups: list[int] | None, columns: list[str], max_rows: int,
                    max_bytes: int) -> Iterator[pa.Table]:
    """The file's row groups (all of them when None), in order, as tables of at most a batch of groups."""
    try:
        pf = pq.ParquetFile(storage.open_input(uri))
        groups = range(pf.metadata.num_row_groups) if row_groups is None else row_groups
        for batch in row_group_batches(pf.metadata, groups, max_rows, max_bytes):
            yield pf.read_row_groups(batch, columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise FormatError(f"unreadable parquet file {storage.display(uri)}: {_first_line(exc)}") from exc


def read_rows(uri: str, lo: int, hi: int, columns: list[str], max_rows: int = 0,
              max_bytes: int = 0) -> Iterator[pa.Table]:
    """Rows [lo, hi) of the file in order: only the row groups that hold them are read, a batch of groups
    (max_rows, max_bytes; 0: one group) at a time."""
    try:
        pf = pq.ParquetFile(storage.open_input(uri))
        groups, first, at = [], 0, None
        for group in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(group).num_rows
            if first < hi and first + n > lo:
                groups.append(group)
                at = first if at is None else at
            first += n
        for batch in row_group_batches(pf.metadata, groups, max_rows, max_bytes):
            table = pf.read_row_groups(batch, columns=columns)
            start, end = max(lo - at, 0), min(hi - at, table.num_rows)
            at += table.num_rows
            yield table.slice(start, end - start)
    except (pa.ArrowInvalid, OSError) as exc:
        raise FormatError(f"unreadable parquet file {storage.display(uri)}: {_first_line(exc)}") from exc


def image_struct(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """An image column as HF Image structs {bytes, path}: structs pass through untouched; raw binary becomes
    {bytes, path: null}."""
    if pa.types.is_struct(col.type):
        return col if col.type == IMAGE_TYPE else col.cast(IMAGE_TYPE)
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


# ---------------------------------------------------------------------------------------------- tar


def sample_key(name: str) -> str:
    """webdataset's grouping of members into samples: the path up to the first dot of the file name."""
    folder, _, base = name.rpartition("/")
    return f"{folder}/{base.split('.', 1)[0]}" if folder else base.split(".", 1)[0]


def key_index(key: str) -> int | None:
    """The row index a sample key carries (clip_benchmark writes `s%07d % index`): its file name's digits."""
    digits = re.sub(r"\D", "", key.rsplit("/", 1)[-1])
    return int(digits) if digits else None


def _tar_error(uri: str, exc: BaseException) -> FormatError:
    return FormatError(f"unreadable tar file {storage.display(uri)}: {_first_line(exc)}")


def samples(uri: str, offset: int = 0) -> Iterator[dict]:
    """The tar's samples in order, as webdataset groups them: {"__key__", "__url__", <ext>: bytes, ...}.
    `offset`: where a sample's first member header starts (a tar read from there is a tar)."""
    from webdataset.tariterators import group_by_keys, tar_file_iterator  # slow to import: only here

    try:
        with storage.open_input(uri) as f:
            if offset:
                f.seek(offset)
            yield from group_by_keys({**m, "__url__": uri} for m in tar_file_iterator(f))
    except (tarfile.TarError, OSError, ValueError) as exc:
        if isinstance(exc, UserError):
            raise
        raise _tar_error(uri, exc) from exc


def first_member(uri: str) -> str:
    """The name of the tar's first member: one header read."""
    try:
        with storage.open_input(uri) as f, tarfile.open(fileobj=f, mode="r|") as tar:
            member = tar.next()
    except (tarfile.TarError, OSError) as exc:
        raise _tar_error(uri, exc) from exc
    if member is None:
        raise FormatError(f"empty tar file {storage.display(uri)}")
    return member.name


def first_sample(uri: str, max_members: int = 64) -> dict[str, bytes]:
    """The tar's first sample, {"__key__": key, <ext>: bytes, ...}, read from the top without the rest."""
    sample: dict = {}
    try:
        with storage.open_input(uri) as f, tarfile.open(fileobj=f, mode="r|") as tar:
            for n, member in enumerate(tar):
                if not member.isfile():
                    continue
                key = sample_key(member.name)
                if sample and key != sample["__key__"] or n >= max_members:
                    break
                sample["__key__"] = key
                sample[member.name[len(key) + 1:].lower()] = tar.extractfile(member).read()
    except (tarfile.TarError, OSError) as exc:
        raise _tar_error(uri, exc) from exc
    if not sample:
        raise FormatError(f"empty tar file {storage.display(uri)}")
    return sample


def last_member(uri: str, max_tail: int = 64 << 20) -> str | None:
    """The name of the tar's last file member, from the end of the file: headers are 512-byte aligned and
    checksummed, so the last valid one in the tail is found without reading the tar from the top. Reads
    1 MB of tail, then 8x more up to max_tail; None when no header is there (a last member bigger than that)."""
    try:
        with storage.open_input(uri) as f:
            size, tail = f.size(), 1 << 20
            while True:
                start = max(size - tail, 0)
                start -= start % BLOCK
                f.seek(start)
                buf = f.read(size - start)
                for at in range(len(buf) - len(buf) % BLOCK - BLOCK, -1, -BLOCK):
                    block = buf[at:at + BLOCK]
                    if block[257:262] != b"ustar":
                        continue
                    try:
                        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
                    except tarfile.HeaderError:
                        continue
                    if info.isfile():
                        return info.name
                if start == 0 or tail >= max_tail:
                    return None
                tail *= 8
    except OSError as exc:
        raise _tar_error(uri, exc) from exc


def index_tar(uri: str, every: int) -> tuple[int, list[int]]:
    """(samples in the tar, byte offset of the first member of sample 0, every, 2*every, ...), so that a unit of
    the tar can start reading at its own offset instead of at the top."""
    count, offsets, last_key = 0, [], None
    try:
        with storage.open_input(uri) as f, tarfile.open(fileobj=f, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                key = sample_key(member.name)
                if key != last_key:
                    if count % every == 0:
                        offsets.append(member.offset)
                    count, last_key = count + 1, key
    except (tarfile.TarError, OSError) as exc:
        raise _tar_error(uri, exc) from exc
    return count, offsets
