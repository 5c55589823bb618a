"""Read any table of images or texts for the embed job: Parquet files or WebDataset tars, local or S3.

An input is a mieb-train output (its `_manifest.json` lists the shards and their rows), a folder of
Parquet files or tars, or one file. The job cuts each file into units, row ranges [lo, hi) that become one
embedding shard each: the planner needs each file's row count (parquet footers; a tar is counted, and
indexed by the offset of each unit's first sample, by a worker) and a worker reads one unit's rows.
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


def count_parquet_rows(files: list[InputFile]) -> None:
    """Fill in each parquet file's row count from its footer (metadata only, in parallel)."""
    todo = [f for f in files if f.rows is None]
    with ThreadPoolExecutor(16) as pool:
        for f, n in zip(todo, pool.map(_parquet_rows, [f.uri for f in todo])):
            f.rows = n


def index_tar(uri: str, every: int) -> tuple[int, list[int]]:
    """(samples in the tar, byte offset of the first member of sample 0, every, 2*every, ...): a unit of the
    tar then starts reading at its own offset instead of at the top."""
    import tarfile

    samples, offsets, last_key = 0, [], None
    try:
        with storage.open_input(uri) as f, tarfile.open(fileobj=f, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                key = _sample_key(member.name)
                if key != last_key:
                    if samples % every == 0:
                        offsets.append(member.offset)
                    samples, last_key = samples + 1, key
    except (tarfile.TarError, OSError) as exc:
        raise InputError(f"unreadable tar file {storage.display(uri)}: {str(exc).splitlines()[0]}") from exc
    return samples, offsets


def _sample_key(name: str) -> str:
    """webdataset's grouping: the path up to the first dot of the file name."""
    folder, _, base = name.rpartition("/")
    return f"{folder}/{base.split('.', 1)[0]}" if folder else base.split(".", 1)[0]


@dataclass(frozen=True)
class Unit:
    """Rows [lo, hi) of one input file: what one embedding shard holds."""

    uri: str
    rel: str
    lo: int
    hi: int
    whole: bool  # the file is this one unit
    offset: int = 0  # tar: where sample `lo` starts

    @property
    def name(self) -> str:
        """The shard's name, from the input file and the row range: `<file>.arrow` when the file is one unit,
        `<file>.<lo>-<hi>.arrow` when it is cut."""
        stem = re.sub(r"\.(parquet|tar)$", "", self.rel)
        return f"{stem}.arrow" if self.whole else f"{stem}.{self.lo:09d}-{self.hi:09d}.arrow"

    @property
    def identity(self) -> dict:
        """What a progress record keeps of the unit, to be sure a resumed run would read the same rows."""
        return {"uri": storage.display(self.uri), "lo": self.lo, "hi": self.hi}


def plan_units(files: list[InputFile], rows_per_unit: int, offsets: dict[str, list[int]] | None = None) -> list[Unit]:
    """Each file cut into units of `rows_per_unit` rows (the last one shorter); an empty file is one empty unit,
    so that it too has its (empty) shard."""
    units = []
    for f in files:
        starts = range(0, max(f.rows, 1), rows_per_unit)
        at = (offsets or {}).get(f.uri) or [0] * len(starts)
        units += [Unit(f.uri, f.rel, lo, min(lo + rows_per_unit, f.rows), len(starts) == 1, at[i])
                  for i, lo in enumerate(starts)]
    return units


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


def _samples(uri: str, offset: int = 0):
    from webdataset.tariterators import group_by_keys, tar_file_iterator  # slow to import: only here

    with storage.open_input(uri) as f:
        f.seek(offset)  # a sample's first member header: a tar read from there is a tar
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


def read_unit(unit: Unit, columns: Columns, modality: str):
    """The unit's rows in order, as chunks of at most CHUNK_ROWS: dicts of lists, one per column."""
    names = [columns.key, columns.data, *columns.carry]
    if unit.uri.endswith(".parquet"):
        try:
            pf = pq.ParquetFile(storage.open_input(unit.uri))
            first = 0
            for group in range(pf.metadata.num_row_groups):  # only the row groups that hold [lo, hi)
                n = pf.metadata.row_group(group).num_rows
                lo, hi = max(unit.lo - first, 0), min(unit.hi - first, n)
                first += n
                if hi <= lo:
                    continue
                table = pf.read_row_group(group, columns=names).slice(lo, hi - lo)
                for start in range(0, table.num_rows, CHUNK_ROWS):
                    part = table.slice(start, CHUNK_ROWS)
                    data = _image_bytes(part[columns.data]) if modality == "image" else part[columns.data]
                    yield {**{c: part[c].to_pylist() for c in names}, columns.data: data.to_pylist()}
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"unreadable parquet file {storage.display(unit.uri)}: {str(exc).splitlines()[0]}") \
                from exc
        return
    rows, left = {c: [] for c in names}, unit.hi - unit.lo
    for sample in _samples(unit.uri, unit.offset):
        if left == 0:
            break
        for name, value in _wds_row(sample, columns).items():
            rows[name].append(value)
        left -= 1
        if len(rows[columns.key]) == CHUNK_ROWS:
            yield rows
            rows = {c: [] for c in names}
    if rows[columns.key]:
        yield rows
