"""Read any table of images or texts for the embed job: Parquet files or WebDataset tars, local or S3.

An input is a mieb-train output (its `_manifest.json` lists the shards and their rows), a folder of
Parquet files or tars, or one file. The job cuts each file into units, row ranges [lo, hi) that become one
embedding shard each: the planner needs each file's row count (parquet footers; a tar is counted, and
indexed by the offset of each unit's first sample, by a worker) and a worker reads one unit's rows.
The file formats themselves (footers, row groups, tar samples) are formats.py's, shared with the build.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from mieb_ray import storage
from mieb_ray.errors import UserError
from mieb_ray.io import formats
from mieb_ray.io.formats import IMAGE_EXTENSIONS

CHUNK_ROWS = 1000
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
    """("parquet" | "webdataset", the input files in order). A mieb-train build's manifest, when present, is
    trusted; anything else (another tool's, a broken one) is not, and the folder's files are listed."""
    if root.endswith((".parquet", ".tar")):
        if not storage.exists(root):
            raise InputError(f"no such input: {storage.display(root)}")
        uris = [root]
    elif built := _built(storage.read_manifest(root) or {}):
        fmt, shards = built
        return fmt, [InputFile(storage.join(root, s["path"]), s["path"], s["rows"]) for s in shards]
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


def _built(manifest: dict) -> tuple[str, list[dict]] | None:
    """(format, shards) of a mieb-train build's manifest; None for any other."""
    config, shards = manifest.get("config"), manifest.get("shards")
    if manifest.get("format") != "mieb-train" or not isinstance(config, dict) or not isinstance(shards, list) \
            or config.get("format") not in ("parquet", "webdataset"):
        return None
    if not all(isinstance(s, dict) and isinstance(s.get("path"), str) and isinstance(s.get("rows"), int)
               for s in shards):
        return None
    return config["format"], shards


def _parquet_rows(uri: str) -> int:
    try:
        return formats.parquet_footer(uri).num_rows
    except formats.FormatError as exc:
        raise InputError(str(exc)) from exc


def count_parquet_rows(files: list[InputFile]) -> None:
    """Fill in each parquet file's row count from its footer (metadata only, in parallel)."""
    todo = [f for f in files if f.rows is None]
    with ThreadPoolExecutor(16) as pool:
        for f, n in zip(todo, pool.map(_parquet_rows, [f.uri for f in todo])):
            f.rows = n


def index_tar(uri: str, every: int) -> tuple[int, list[int]]:
    """(samples in the tar, byte offset of the first member of sample 0, every, 2*every, ...): a unit of the
    tar then starts reading at its own offset instead of at the top."""
    try:
        return formats.index_tar(uri, every)
    except formats.FormatError as exc:
        raise InputError(str(exc)) from exc


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
        try:
            schema = formats.parquet_footer(first.uri).schema.to_arrow_schema()
        except formats.FormatError as exc:
            raise InputError(str(exc)) from exc
        missing = [c for c in (columns.key, columns.data, *columns.carry) if c not in schema.names]
        if missing:
            raise InputError(f"{storage.display(first.uri)} has no column {', '.join(missing)} "
                             f"(columns: {', '.join(schema.names)})")
        return pa.schema([schema.field(c) for c in columns.carry])
    sample = next(_samples(first.uri), None)
    if sample is None:
        raise InputError(f"{storage.display(first.uri)} holds no samples")
    meta = _meta(sample, first.uri)
    missing = [c for c in (columns.data, *columns.carry) if _member(sample, c) is None and c not in meta]
    if missing:
        raise InputError(f"{storage.display(first.uri)} has no member or json field for {', '.join(missing)} "
                         f"(members: {', '.join(k for k in sample if not k.startswith('__'))})")
    row = _wds_row(sample, columns, first.uri)
    return pa.schema([(c, pa.array([row[c]]).type if row[c] is not None else pa.string()) for c in columns.carry])


# ---------------------------------------------------------------------------------------------- reading


def _samples(uri: str, offset: int = 0):
    try:
        yield from formats.samples(uri, offset)
    except formats.FormatError as exc:
        raise InputError(str(exc)) from exc


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


def _meta(sample: dict, uri: str) -> dict:
    """A sample's .json member (mieb-train's label, dataset_name...), {} when it has none."""
    if "json" not in sample:
        return {}
    try:
        meta = json.loads(sample["json"])
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        raise InputError(f"{storage.display(uri)}: sample {sample['__key__']} has a .json member that is not a JSON "
                         "object")
    return meta


def _wds_row(sample: dict, columns: Columns, uri: str) -> dict:
    """A sample as a row: members by name, else fields of its .json."""
    meta = _meta(sample, uri)
    row = {columns.key: sample["__key__"]}
    for name in (columns.data, *columns.carry):
        member = _member(sample, name)
        # the text to encode must be valid UTF-8; a carried column is kept with replacement characters
        row[name] = _wds_value(member, sample[member], strict=name == columns.data) if member else meta.get(name)
    return row


def read_unit(unit: Unit, columns: Columns, modality: str):
    """The unit's rows in order, as chunks of at most CHUNK_ROWS: dicts of lists, one per column."""
    names = [columns.key, columns.data, *columns.carry]
    if unit.uri.endswith(".parquet"):
        try:
            for table in formats.read_rows(unit.uri, unit.lo, unit.hi, names):  # one row group at a time
                for start in range(0, table.num_rows, CHUNK_ROWS):
                    part = table.slice(start, CHUNK_ROWS)
                    data = formats.image_bytes(part[columns.data]) if modality == "image" else part[columns.data]
                    yield {**{c: part[c].to_pylist() for c in names}, columns.data: data.to_pylist()}
        except formats.FormatError as exc:
            raise InputError(str(exc)) from exc
        return
    rows, left = {c: [] for c in names}, unit.hi - unit.lo
    for sample in _samples(unit.uri, unit.offset):
        if left == 0:
            break
        for name, value in _wds_row(sample, columns, unit.uri).items():
            rows[name].append(value)
        left -= 1
        if len(rows[columns.key]) == CHUNK_ROWS:
            yield rows
            rows = {c: [] for c in names}
    if rows[columns.key]:
        yield rows
