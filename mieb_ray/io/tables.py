"""Read any table of images or texts for the embed job: Parquet files or WebDataset tars, local or S3.

An input is a mieb-train output (its `_manifest.json` lists the shards and their rows), a folder of
Parquet files or tars, or one file. Rows are read in chunks that carry, besides the chosen columns,
`__file` (the input file's number) and `__row` (the row's position in that file), so that the
embeddings of each input file can be put back together in order, whatever route they took.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from mieb_ray import storage
from mieb_ray.errors import UserError

CHUNK_ROWS = 1000
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
WDS_NAMES = {"text": "txt", "key": "__key__"}  # mieb-train column names -> WebDataset member names


class InputError(UserError):
    pass


@dataclass
class InputFile:
    uri: str
    rel: str  # path under the input root; the output shard is named after it
    rows: int | None = None


@dataclass(frozen=True)
class Columns:
    key: str
    data: str  # the image or text column
    carry: tuple[str, ...] = ()


def _rel(root: str, uri: str) -> str:
    return uri[len(root.rstrip("/")) + 1:] if uri != root else uri.rsplit("/", 1)[-1]


def input_files(root: str) -> tuple[str, list[InputFile]]:
    """("parquet" | "webdataset", the input files in order). A mieb-train manifest, when present, is trusted."""
    manifest = storage.read_manifest(root) if not root.endswith((".parquet", ".tar")) else None
    if manifest is not None and manifest.get("format") == "mieb-train":
        fmt = manifest["config"]["format"]
        return fmt, [InputFile(storage.join(root, s["path"]), s["path"], s["rows"]) for s in manifest["shards"]]
    if root.endswith((".parquet", ".tar")):
        if not storage.exists(root):
            raise InputError(f"no such input: {storage.display(root)}")
        uris = [root]
    else:
        uris = [u for u in storage.list_files(root)
                if not re.search(r"(^|/)[._]", _rel(root, u))]  # not _errors/, .staging files or hidden folders
    parquet = [u for u in uris if u.endswith(".parquet")]
    tars = [u for u in uris if u.endswith(".tar")]
    if not parquet and not tars:
        raise InputError(f"no .parquet or .tar files under {storage.display(root)}")
    if parquet and tars:
        raise InputError(f"{storage.display(root)} mixes .parquet and .tar files; point --input at one kind")
    return ("parquet" if parquet else "webdataset"), [InputFile(u, _rel(root, u)) for u in (parquet or tars)]


def _parquet_rows(uri: str) -> int:
    try:
        with storage.open_input(uri) as f:
            return pq.read_metadata(f).num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"unreadable parquet file {storage.display(uri)}: {str(exc).splitlines()[0]}") from exc


def count_rows(fmt: str, files: list[InputFile]) -> None:
    """Fill in each file's row count: parquet footers; tars must be read through (in parallel)."""
    todo = [f for f in files if f.rows is None]
    count = _parquet_rows if fmt == "parquet" else (lambda uri: sum(1 for _ in _samples(uri)))
    with ThreadPoolExecutor(16) as pool:
        for f, n in zip(todo, pool.map(count, [f.uri for f in todo])):
            f.rows = n


def check_columns(fmt: str, first: InputFile, columns: Columns) -> pa.Schema:
    """Fail before any work when a column is missing; the schema of the carried columns (for tars, as
    their first sample's values say)."""
    if fmt == "parquet":
        with storage.open_input(first.uri) as f:
            schema = pq.read_schema(f)
        missing = [c for c in (columns.key, columns.data, *columns.carry) if c not in schema.names]
        if missing:
            raise InputError(f"{storage.display(first.uri)} has no column {', '.join(missing)} "
                             f"(columns: {', '.join(schema.names)})")
        return pa.schema([schema.field(c) for c in columns.carry])
    sample = next(_samples(first.uri), None)
    if sample is None:
        raise InputError(f"{storage.display(first.uri)} holds no samples")
    meta = json.loads(sample["json"]) if "json" in sample else {}
    missing = [c for c in (columns.data, *columns.carry) if _member(sample, c) is None and c not in meta]
    if missing:
        raise InputError(f"{storage.display(first.uri)} has no member or json field for {', '.join(missing)} "
                         f"(members: {', '.join(k for k in sample if not k.startswith('__'))})")
    row = _wds_row(sample, columns)
    return pa.schema([(c, pa.array([row[c]]).type if row[c] is not None else pa.string()) for c in columns.carry])


# ---------------------------------------------------------------------------------------------- reading


def _samples(uri: str):
    from webdataset.tariterators import group_by_keys, tar_file_iterator  # slow to import: only here

    with storage.open_input(uri) as f:
        yield from group_by_keys({**m, "__url__": uri} for m in tar_file_iterator(f))


def _member(sample: dict, name: str) -> str | None:
    """The tar member holding column `name`: itself, the image member for "image", txt for "text"."""
    if name in sample:
        return name
    if name == "image":
        return next((e for e in IMAGE_EXTENSIONS if e in sample), None)
    return WDS_NAMES.get(name) if WDS_NAMES.get(name) in sample else None


def _wds_value(member: str, data: bytes, strict: bool):
    if member in IMAGE_EXTENSIONS:
        return data
    try:
        text = data.decode("utf-8", errors="strict" if strict else "replace")
    except UnicodeDecodeError:
        return data  # left as bytes: the encoder makes it an error row, "text is not valid UTF-8"
    if member == "cls":
        return int(text) if text.strip().lstrip("-").isdigit() else None
    return text


def _wds_row(sample: dict, columns: Columns) -> dict:
    """A sample as a row: members by name, else fields of its .json (mieb-train's label, dataset_name...)."""
    meta = json.loads(sample["json"]) if "json" in sample else {}
    row = {columns.key: sample["__key__"]}
    for name in (columns.data, *columns.carry):
        member = _member(sample, name)
        # the text to encode must be valid UTF-8; a carried column is kept with replacement characters
        row[name] = _wds_value(member, sample[member], strict=name == columns.data) if member else meta.get(name)
    return row


def _image_bytes(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """HF Image structs {bytes, path} -> their bytes; raw binary as it is."""
    if pa.types.is_struct(column.type):
        return pa.chunked_array([c.field("bytes") for c in column.chunks], pa.binary())
    return column


def read_file(file_no: int, uri: str, columns: Columns, modality: str):
    """Chunks of one input file: dicts of numpy arrays with the columns, `__file` and `__row`."""
    import numpy as np

    def chunk(rows: dict[str, list], start: int) -> dict:
        n = len(rows[columns.key])
        return {**{k: np.array(v, dtype=object) for k, v in rows.items()},
                "__file": np.full(n, file_no), "__row": np.arange(start, start + n)}

    if uri.endswith(".parquet"):
        try:
            pf = pq.ParquetFile(storage.open_input(uri))
            start = 0
            for batch in pf.iter_batches(batch_size=CHUNK_ROWS, columns=[columns.key, columns.data, *columns.carry]):
                table = pa.Table.from_batches([batch])
                data = _image_bytes(table[columns.data]) if modality == "image" else table[columns.data]
                rows = {columns.key: table[columns.key].to_pylist(), columns.data: data.to_pylist(),
                        **{c: table[c].to_pylist() for c in columns.carry}}
                yield chunk(rows, start)
                start += batch.num_rows
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"unreadable parquet file {storage.display(uri)}: {str(exc).splitlines()[0]}") from exc
        return
    rows, start = {c: [] for c in (columns.key, columns.data, *columns.carry)}, 0
    for sample in _samples(uri):
        for name, value in _wds_row(sample, columns).items():
            rows[name].append(value)
        if len(rows[columns.key]) == CHUNK_ROWS:
            yield chunk(rows, start)
            start += CHUNK_ROWS
            rows = {c: [] for c in rows}
    if rows[columns.key]:
        yield chunk(rows, start)
