"""The one reader: any table of Parquet files or WebDataset tars (a catalog source's split, a mieb-train output,
anyone's table), local, on S3 or on the hub, cut into units and read as Arrow tables.

A Unit is rows [lo, hi) of a table, held by one or more pieces (files). Two planners make them:
  plan_source  a catalog source's split (train, test, validation) from the hub or a mirror: its files and their
               order as `datasets.load_dataset(repo)` reads them (io/datafiles.py), a row's index its index
               there (files in that order, rows in file order); a tar's rows are counted from its sample keys
               (clip_benchmark writes `s0000123`, consecutive), which every read checks; units of rows
               [k*N, (k+1)*N) of a Parquet split, of each tar of a WebDataset split (a tar is read by its units
               alone)
  plan_table   a table's files (input_files: a mieb-train manifest's shards, or a folder's files), each cut into
               units of rows of that file, a row's index its position in the file; a Parquet file's units cut at
               its row groups (a unit that began inside one would read all of it: pyarrow reads whole groups),
               a tar's units start reading at the byte offset of their first sample (index_tar)
and `read(unit, columns)` yields the unit's rows in order as tables of at most CHUNK_ROWS rows (or CHUNK_BYTES of
images), an `index` column first: Parquet row groups straight to Arrow, tar members into column buffers (no row
dicts). A Column says where a column is in either format and how a tar member becomes a value. Planning reads
metadata only: listings, the card, Parquet footers, the first header of each tar and the tail of the last.
"""

from __future__ import annotations

import enum
import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray import formats, storage
from mieb_ray.errors import FormatError, UserError
from mieb_ray.io import datafiles, parquet, tar
from mieb_ray.io.parquet import IMAGE_TYPE
from mieb_ray.io.tar import IMAGE_EXTENSIONS
from mieb_ray.sources import PARQUET, WEBDATASET, Source

CHUNK_ROWS = 1000
CHUNK_BYTES = 64 << 20
HF = "hf"
PARQUET_SUFFIX, TAR_SUFFIX = ".parquet", ".tar"

_BUILDERS = {"parquet": PARQUET, "webdataset": WEBDATASET}  # datasets' builder -> the layout we read


@dataclass(frozen=True)
class Piece:
    uri: str
    first: int  # the index of the file's first row (a tar's: of the first sample read)
    offset: int = 0  # a tar: the byte offset of its first sample to read
    key: int | None = None  # a source's tar: its first sample's key number; the rest follow it one by one
    rows: int | None = None  # a source's tar: the samples it holds, as its keys say


@dataclass(frozen=True)
class Unit:
    """Rows [lo, hi) of a table (hi None: to the end of the last piece): what one worker reads and commits whole."""

    lo: int
    hi: int | None
    pieces: tuple[Piece, ...]
    name: str  # what the unit makes: its shard's name (a table), its rows of a source split (a source)
    source: str | None = None  # a catalog source's slug and split: rows indexed by their place in the split
    split: str | None = None
    shard: int = 0  # a source's unit: its place among the split's units, the number of the one shard it builds
    input: str | None = None  # the identity of what its files held when planned (runtime/identity.py), if known

    @property
    def identity(self) -> dict:
        """What a progress record keeps of the unit, to be sure a resumed run would read the same rows."""
        return {"files": [storage.display(p.uri) for p in self.pieces], "lo": self.lo, "hi": self.hi} | (
            {"input": self.input} if self.input else {})

    def file_of(self, index: int) -> str:
        """The file that holds row `index`."""
        return next((p.uri for p in reversed(self.pieces) if p.first <= index), self.pieces[0].uri)


class Kind(enum.Enum):
    """How a tar member becomes a column's value (Parquet columns come as they are, image columns as HF Image
    structs)."""

    IMAGE = "image"  # an HF Image struct {bytes, path}, the bytes untouched (any image member when none is named)
    LABEL = "label"  # an integer; a member of class names (SciMMIR's `class`) stays text; `cls` anything else: null
    TEXT = "text"  # UTF-8 text, bad bytes replaced
    RAW = "raw"  # the member's bytes as they are (the text to encode: a row not UTF-8 is the caller's error)
    VALUE = "value"  # text, `cls` an integer or null, or the .json field's value
    KEY = "key"  # the sample's key


@dataclass(frozen=True)
class Column:
    """A column of the tables read() yields: `field` in a Parquet file; in a tar, the first of `members` (default:
    the field) the sample holds, else its .json member's `field`; `kind` says how its value is made (Kind)."""

    name: str
    field: str
    kind: Kind = Kind.VALUE
    members: tuple[str, ...] = ()

    @property
    def tar_members(self) -> tuple[str, ...]:
        return self.members or (self.field,)


def source_columns(source: Source) -> dict[str, Column]:
    """A source split's columns by name, image, label [, caption], wherever its layout keeps them, in order of
    preference: the catalog's members (its image extension, `cls`), then those of a Parquet source written as
    tars (its column names), then any image extension."""
    columns = {"image": Column("image", source.image_column, Kind.IMAGE,
                               tuple(dict.fromkeys((source.image_ext, source.image_column, *IMAGE_EXTENSIONS)))),
               "label": Column("label", source.label_column, Kind.LABEL, ("cls", source.label_column))}
    if source.caption_column:
        columns["caption"] = Column("caption", source.caption_column, Kind.TEXT, ("txt", "text", source.caption_column))
    return columns


@dataclass(frozen=True)
class TableColumns:
    """A table's key column, its data column (the images, or the texts to encode) and the columns to carry."""

    key: str
    data: str
    carry: tuple[str, ...] = ()

    def read_as(self, modality: str) -> list[Column]:
        """The Columns read() takes (in tars: the key is the sample's, an image any image member, text .txt)."""
        extra = {"image": IMAGE_EXTENSIONS, "text": ("txt",)}
        return [Column(self.key, self.key, Kind.KEY),
                Column(self.data, self.data, Kind.IMAGE if modality == "image" else Kind.RAW,
                       (self.data, *extra.get(self.data, ()))),
                *(Column(c, c, Kind.VALUE, (c, *extra.get(c, ())) if c == "text" else ()) for c in self.carry)]


# ---------------------------------------------------------------------------------------------- sources


def repo_root(source: Source, sources: str) -> str:
    """Where the source's repo lives: the hub at the pinned revision, or ROOT/<repo> in a mirror."""
    if sources == HF:
        return f"hf://datasets/{source.repo}@{source.revision}"
    return storage.join(sources, source.repo)


@dataclass(frozen=True)
class Listing:
    """What a source's split holds at its revision: the layout `datasets` reads it as, its data files in the
    order it reads them, and the repo's classnames.txt (CLIP_benchmark's class list beside tars) if any."""

    layout: str  # PARQUET or WEBDATASET
    files: tuple[str, ...]
    classnames: str | None = None


def detect(source: Source, sources: str, split: str = "train") -> Listing:
    """The split's files as `datasets.load_dataset(repo, revision=...)` finds them (io/datafiles.py)."""
    root = repo_root(source, sources)
    try:
        repo = datafiles.Repo(root)
        found = repo.files()
    except FormatError as exc:
        raise FormatError(f"{source.slug}: {exc}") from None
    layout = _BUILDERS.get(found.builder)
    if layout is None:
        raise FormatError(f"{source.slug}: datasets reads {storage.display(root)} as {found.builder} files, "
                          "not Parquet or WebDataset")
    files = found.split(split, f"{source.slug} ({storage.display(root)})")
    if not files:
        raise FormatError(f"{source.slug}: no {split} .parquet or .tar files under {storage.display(root)}")
    names = sorted((u for r, u in repo.paths.items() if r.rsplit("/", 1)[-1] == "classnames.txt"
                    and not re.search(r"(^|/)\.", r)), key=len)  # not in .cache/ of a `--local-dir` download
    return Listing(layout, files, names[0] if names else None)


def split_files(source: Source, sources: str, split: str = "train") -> list[str]:
    """The files of a split (train, test, validation), in split order, in the layout the repo holds."""
    return list(detect(source, sources, split).files)


def classnames(listing: Listing) -> list[str] | None:
    """The class list a tar repo keeps beside its tars (classnames.txt, one name per line), else None."""
    return storage.read_text(listing.classnames).splitlines() if listing.classnames else None


def unit_name(slug: str, split: str, lo: int) -> str:
    """A source unit's name; an eval split's names its split, so it never meets a train unit's."""
    return f"{slug}/{lo:012d}" if split == "train" else f"{slug}/{split}/{lo:012d}"


def plan_source(source: Source, sources: str, rows_per_unit: int,
                split: str = "train") -> tuple[list[Unit], list[str] | None]:
    """Units of at most N rows of the source's split, and the class names it keeps (Parquet: the label column's
    ClassLabel names; tars: classnames.txt), whichever layout the repo holds. Parquet: rows [k*N, (k+1)*N) of the
    split; tars: rows [k*N, (k+1)*N) of each tar (the hub's hold 10,000: a unit per tar, each read once)."""
    listing = detect(source, sources, split)
    files = list(listing.files)
    if listing.layout == PARQUET:
        firsts, ends, names = _parquet_extents(source, files)
        bounds = [(lo, min(lo + rows_per_unit, ends[-1]),
                   [Piece(uri, first) for uri, first, end in zip(files, firsts, ends) if first < lo + rows_per_unit
                    and end > lo]) for lo in range(0, ends[-1], rows_per_unit)]
    else:
        extents, names, first, bounds = tar_extents(files), classnames(listing), 0, []
        for uri, (key, rows) in zip(files, extents):
            piece = Piece(uri, first, key=key, rows=rows)
            bounds += [(lo, min(lo + rows_per_unit, first + rows), [piece])
                       for lo in range(first, first + rows, rows_per_unit)]
            first += rows
    units = [Unit(lo, hi, tuple(held), unit_name(source.slug, split, lo), source.slug, split, shard)
             for shard, (lo, hi, held) in enumerate(bounds)]
    return units, names


def tar_extents(files: list[str]) -> list[tuple[int, int]]:
    """(first key number, samples) of each of a source split's tars, from sample keys alone: every tar's first
    header, and the tail of the one whose keys come last. clip_benchmark numbers a split's samples `s%07d` in
    one run across its tars, so a tar holds the keys from its own first to the next tar's; reads check it."""
    with ThreadPoolExecutor(16) as pool:
        firsts = list(pool.map(_first_index, files))
    order = sorted(range(len(files)), key=firsts.__getitem__)
    for a, b in zip(order, order[1:]):
        if firsts[a] == firsts[b]:
            raise FormatError(f"{storage.display(files[a])} and {storage.display(files[b])} both start at sample "
                              f"key {firsts[a]}")
    rows = {a: firsts[b] - firsts[a] for a, b in zip(order, order[1:])}
    last = files[order[-1]]
    name = tar.last_member(last)
    # a last member too big for the tail read: the tar itself counted
    rows[order[-1]] = sample_index(tar.sample_key(name), last) + 1 - firsts[order[-1]] if name is not None \
        else tar.index_tar(last, 1 << 62)[0]
    return [(firsts[i], rows[i]) for i in range(len(files))]


def _parquet_extents(source: Source, files: list[str]) -> tuple[list[int], list[int], list[str] | None]:
    """Each file's first and end index in the split, from the footers, and the label column's class names."""
    with ThreadPoolExecutor(16) as pool:
        metas = list(pool.map(parquet.footer, files))
    wanted = [c for c in (source.image_column, source.label_column, source.caption_column) if c]
    firsts, first = [], 0
    for uri, meta in zip(files, metas):
        names = meta.schema.to_arrow_schema().names
        missing = [c for c in wanted if c not in names]
        if missing:
            raise FormatError(f"{source.slug}: {storage.display(uri)} has no column {', '.join(missing)} "
                              f"(columns: {', '.join(names)})")
        firsts.append(first)
        first += meta.num_rows
    return firsts, firsts[1:] + [first], parquet.hub_class_names(metas[0], source.label_column)


def sample_index(key: str, uri: str) -> int:
    index = tar.key_index(key)
    if index is None:
        raise FormatError(f"sample key {key!r} in {storage.display(uri)} carries no index (expected s0000123)")
    return index


def _first_index(uri: str) -> int:
    return sample_index(tar.sample_key(tar.first_member(uri)), uri)


# ---------------------------------------------------------------------------------------------- tables


@dataclass
class InputFile:
    uri: str
    rel: str  # path under the input root; the output shard is named after it
    rows: int | None = None
    groups: list[int] | None = None  # a parquet file: its row groups' row counts, from its footer


def _rel(root: str, uri: str) -> str:
    return uri[len(root.rstrip("/")) + 1:] if uri != root else uri.rsplit("/", 1)[-1]


def input_files(root: str) -> tuple[str, list[InputFile]]:
    """("parquet" | "webdataset", the table's files in order). A mieb-train build's manifest, when present, is
    trusted; anything else (another tool's, a broken one) is not, and the folder's files are listed."""
    if root.endswith((PARQUET_SUFFIX, TAR_SUFFIX)):
        if not storage.exists(root):
            raise UserError(f"no such input: {storage.display(root)}")
        uris = [root]
    elif theirs := formats.other_command(manifest := storage.read_manifest(root), "build"):
        raise UserError(f"{storage.display(root)} holds the output of {theirs}, not a table of images or texts (a "
                        "build's output, or Parquet files or WebDataset tars)")
    elif built := _built(manifest or {}):
        fmt, shards = built
        return fmt, [InputFile(storage.join(root, s["path"]), s["path"], s["rows"]) for s in shards]
    else:
        uris = storage.list_files(root)
        if nested := _nested_output(root, uris):
            raise UserError(f"{storage.display(storage.join(root, nested[0]))} inside the input "
                            f"{storage.display(root)} is an output of mieb-ray (it holds {nested[1]}), not part of "
                            "the table: point --input at the table's own files, and --out outside them")
        uris = [u for u in uris if not re.search(r"(^|/)[._]", _rel(root, u))]  # not _errors/, .staging files
    parquets = [u for u in uris if u.endswith(PARQUET_SUFFIX)]
    tars = [u for u in uris if u.endswith(TAR_SUFFIX)]
    if not parquets and not tars:
        saved = any(u.endswith(".arrow") for u in uris) and storage.exists(storage.join(root, "state.json"))
        raise UserError(f"no .parquet or .tar files under {storage.display(root)}" + (
            " (it is a `datasets` save_to_disk folder: write the dataset with Dataset.to_parquet to read it)"
            if saved else ""))
    if parquets and tars:
        raise UserError(f"{storage.display(root)} mixes .parquet and .tar files; point --input at one kind")
    return (PARQUET if parquets else WEBDATASET), [InputFile(u, _rel(root, u)) for u in (parquets or tars)]


def _nested_output(root: str, uris: list[str]) -> tuple[str, str] | None:
    """(its folder, the file that says so) of an output of ours inside the input folder `root`, if any: its shards
    and result tables would be read as rows of the table (an --out inside the --input, a run ago or now)."""
    for uri in uris:
        parts = _rel(root, uri).split("/")
        for i, part in enumerate(parts[1:], start=1):
            if part == storage.PROGRESS or i == len(parts) - 1 and part in (storage.MANIFEST, storage.LEASE):
                return "/".join(parts[:i]), part
    return None


def _built(manifest: dict) -> tuple[str, list[dict]] | None:
    """(format, shards) of a mieb-train build's manifest; None for any other."""
    config, shards = manifest.get("config"), manifest.get("shards")
    if not formats.MIEB_TRAIN.holds(manifest) or not isinstance(config, dict) or not isinstance(shards, list) \
            or config.get("format") not in (PARQUET, WEBDATASET):
        return None
    if not all(isinstance(s, dict) and isinstance(s.get("path"), str) and isinstance(s.get("rows"), int)
               for s in shards):
        return None
    return config["format"], shards


def read_parquet_layouts(files: list[InputFile]) -> None:
    """Fill in each parquet file's row count and row groups from its footer (metadata only, in parallel; a
    manifest's count too, as the footer is what a read goes by)."""
    todo = [f for f in files if f.groups is None and f.uri.endswith(PARQUET_SUFFIX)]
    with ThreadPoolExecutor(16) as pool:
        for f, meta in zip(todo, pool.map(parquet.footer, [f.uri for f in todo])):
            f.rows, f.groups = meta.num_rows, [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def shard_name(rel: str, lo: int, hi: int, whole: bool) -> str:
    """A table unit's shard: `<file>.arrow` when the file is one unit, `<file>.<lo>-<hi>.arrow` when it is cut."""
    stem = re.sub(r"\.(parquet|tar)$", "", rel)
    return f"{stem}.arrow" if whole else f"{stem}.{lo:09d}-{hi:09d}.arrow"


def group_cuts(groups: list[int], step: int) -> list[tuple[int, int]]:
    """A parquet file's rows in [lo, hi) ranges of at most `step` rows that begin and end at row-group boundaries:
    consecutive groups together while they fit (parquet.packed, the rule its reads batch groups by); a group of
    more than `step` rows in even pieces (each reads the whole group, as any cut of it would). No rows: one empty
    range."""
    cuts, at = [], 0
    for batch in parquet.packed(groups, step):
        n = sum(groups[i] for i in batch)
        parts = max(1, -(-n // step))  # more than one: a group alone, over the step
        cuts += [(at + n * k // parts, at + n * (k + 1) // parts) for k in range(parts)]
        at += n
    return [c for c in cuts if c[1] > c[0]] or [(0, 0)]


def null_key(column: str, unit: Unit, index: int) -> str:
    """The error of row `index` of a unit's table whose key is null: no output could name it, so say where it is."""
    return f"null key (column {column}): row {index:,} of {storage.display(unit.file_of(index))}"


def plan_table(files: list[InputFile], rows_per_unit: int | dict[str, int],
               offsets: dict[str, list[int]] | None = None) -> list[Unit]:
    """Each file (its rows counted) cut into units of at most `rows_per_unit` rows (a dict: per file uri): a
    parquet file whose row groups are known at them (group_cuts), anything else every `rows_per_unit` rows; an
    empty file is one empty unit, so that it too has its (empty) shard. offsets: per tar, where sample 0, N, 2N,
    ... start."""
    units = []
    for f in files:
        step = rows_per_unit[f.uri] if isinstance(rows_per_unit, dict) else rows_per_unit
        cuts = group_cuts(f.groups, step) if f.groups is not None else \
            [(lo, min(lo + step, f.rows)) for lo in range(0, max(f.rows, 1), step)]
        at = (offsets or {}).get(f.uri) or [0] * len(cuts)
        for i, (lo, hi) in enumerate(cuts):
            units.append(Unit(lo, hi, (Piece(f.uri, lo if f.uri.endswith(TAR_SUFFIX) else 0, at[i]),),
                              shard_name(f.rel, lo, hi, len(cuts) == 1)))
    return units


def check_columns(fmt: str, first: InputFile, columns: list[Column]) -> pa.Schema:
    """Fail before any work when a column is missing; the schema of the `value` columns (for tars, as their first
    sample's values say)."""
    if fmt == PARQUET:
        schema = parquet.footer(first.uri).schema.to_arrow_schema()
        missing = [c.field for c in columns if c.field not in schema.names]
        if missing:
            raise FormatError(f"{storage.display(first.uri)} has no column {', '.join(missing)} "
                              f"(columns: {', '.join(schema.names)})")
        return pa.schema([schema.field(c.field).with_name(c.name) for c in columns if c.kind is Kind.VALUE])
    key, sample = next(tar.tar_samples(first.uri), (None, None))
    if sample is None:
        raise FormatError(f"{storage.display(first.uri)} holds no samples")
    meta = _meta(sample, key, first.uri)
    missing = [c.field for c in columns
               if c.kind is not Kind.KEY and _member(sample, c) is None and c.field not in meta]
    if missing:
        raise FormatError(f"{storage.display(first.uri)} has no member or json field for {', '.join(missing)} "
                          f"(members: {', '.join(sample)})")
    values = [c for c in columns if c.kind is Kind.VALUE]
    row = {c.name: _value(c, sample, meta, key) for c in values}
    return pa.schema([(c.name, pa.array([row[c.name]]).type if row[c.name] is not None else pa.string())
                      for c in values])


# ---------------------------------------------------------------------------------------------- reading


def read(unit: Unit, columns: list[Column]):
    """The unit's rows in index order, as tables of an `index` column and `columns`, at most CHUNK_ROWS rows (or
    CHUNK_BYTES of images) each. A missing value is null."""
    for piece in unit.pieces:
        yield from (_parquet if piece.uri.endswith(PARQUET_SUFFIX) else _tar)(unit, piece, columns)


def _parquet(unit: Unit, piece: Piece, columns: list[Column]):
    lo, hi = max(unit.lo - piece.first, 0), None if unit.hi is None else unit.hi - piece.first
    if hi is not None and hi <= lo:
        return
    for start, table in parquet.read_range(piece.uri, [c.field for c in columns], lo, hi, CHUNK_ROWS, CHUNK_BYTES):
        first = piece.first + start
        data = {"index": pa.array(np.arange(first, first + table.num_rows), pa.int64())}
        for c in columns:
            col = table[c.field]
            data[c.name] = parquet.image_struct(col) if c.kind is Kind.IMAGE else col
        chunk = pa.table(data)
        images = [c.name for c in columns if c.kind is Kind.IMAGE and len(_by_path(chunk[c.name]))]
        if not images:
            yield chunk
            continue
        for lo in range(0, chunk.num_rows, FILE_ROWS):  # the files' bytes, a few at a time
            part = chunk.slice(lo, FILE_ROWS)
            for name in images:
                part = part.set_column(part.schema.get_field_index(name), name, _with_files(part[name], piece.uri))
            yield part


FILE_ROWS = 64  # rows a chunk of a table of image files holds: their bytes are not the table's


def _by_path(images: pa.ChunkedArray) -> np.ndarray:
    """The rows whose image has no bytes but a path (chunk by chunk: the images' bytes are never copied)."""
    masks = [pc.and_(pc.is_null(c.field("bytes")), pc.is_valid(c.field("path"))).to_numpy(zero_copy_only=False)
             if c.field("bytes").null_count else np.zeros(len(c), bool) for c in images.chunks]
    return np.flatnonzero(np.concatenate(masks)) if masks else np.zeros(0, np.int64)


def _with_files(images: pa.ChunkedArray, table: str) -> pa.ChunkedArray:
    """Image structs whose bytes are null but whose path is set (a `datasets` table saved with to_parquet keeps
    its local images by path; a column of paths) with the bytes of that file, as `datasets` decodes them: an
    absolute path or URI as it is, a relative one from the table's folder. One that cannot be read stays null:
    an error row naming its file."""
    todo = _by_path(images)
    flat = images.combine_chunks()
    data, paths = flat.field("bytes"), flat.field("path")
    folder = table.rsplit("/", 1)[0] if "/" in table else "."
    uris = [p if "://" in p or p.startswith("/") else storage.join(folder, p) for p in paths.take(todo).to_pylist()]

    def read_file(uri: str) -> bytes | None:
        try:
            with storage.open_input(uri) as f:
                return f.read()
        except storage.StorageError as exc:  # not there: an error row; a store failing: the job's error
            if isinstance(exc.__cause__, FileNotFoundError):
                return None
            raise
        except OSError:  # a local file this process may not read, a folder
            return None

    with ThreadPoolExecutor(min(16, len(uris))) as pool:  # an object store: one request per image
        got = list(pool.map(read_file, uris))
    filled = data.to_pylist()
    for i, b in zip(todo, got):
        filled[i] = b
    return pa.chunked_array([pa.StructArray.from_arrays([pa.array(filled, pa.binary()), paths],
                                                        fields=list(IMAGE_TYPE))])


def _tar(unit: Unit, piece: Piece, columns: list[Column]):
    """Samples to column buffers: a column's member is looked for once, again only in a sample that lacks it, and
    a label's bytes are parsed once per distinct value; a chunk's binary columns are built from one join. A row's
    index is its place in the tar after `piece.first`; a source's tar has its keys checked against that (they
    counted its rows)."""
    lo, hi = unit.lo, unit.hi
    member = {c.name: None for c in columns}
    parsed: dict[str, dict] = {c.name: {} for c in columns if c.kind is Kind.LABEL}
    index, values, size, read = [], {c.name: [] for c in columns}, 0, 0
    for key, sample in tar.tar_samples(piece.uri, piece.offset):
        at, read = piece.first + read, read + 1
        if piece.key is not None and _key_number(key, piece.uri) != piece.key + read - 1:
            raise FormatError(f"{storage.display(piece.uri)}: sample {key} is number {read - 1} of the tar, whose "
                              f"keys start at {piece.key}: keys that skip or repeat cannot count its rows")
        if at < lo:
            continue
        if hi is not None and at >= hi:
            if piece.rows is not None and read > piece.rows:
                _miscounted(piece, "more than")
            break
        meta = None
        for c in columns:
            if c.kind is Kind.KEY:
                values[c.name].append(key)
                continue
            if member[c.name] not in sample:
                member[c.name] = _member(sample, c)
            name = member[c.name]
            raw = sample.get(name) if name is not None else None
            if c.kind is Kind.IMAGE:
                values[c.name].append((raw, f"{key}.{name}" if raw is not None else None))
                size += len(raw) if raw is not None else 0
            elif c.kind is Kind.LABEL:
                known = parsed[c.name]
                value = None if raw is None else known.get(raw, _MISSING)
                if value is _MISSING:
                    raw = bytes(raw)
                    value = _label(raw, strict=name == "cls")
                    if len(known) < 100_000:
                        known[raw] = value
                values[c.name].append(value)
            elif raw is not None:
                values[c.name].append(bytes(raw) if c.kind is Kind.RAW else _decoded(name, raw))
            else:
                meta = _meta(sample, key, piece.uri) if meta is None else meta
                values[c.name].append(meta.get(c.field) if c.kind is not Kind.IMAGE else None)
        index.append(at)
        if len(index) >= CHUNK_ROWS or size >= CHUNK_BYTES:
            yield _chunk(index, values, columns)
            index, values, size = [], {c.name: [] for c in columns}, 0
    else:
        if piece.rows is not None and read != piece.rows:
            _miscounted(piece, f"{read}, not")
    if index:
        yield _chunk(index, values, columns)


def _miscounted(piece: Piece, held: str):
    raise FormatError(f"{storage.display(piece.uri)} holds {held} the {piece.rows} samples its keys say (from "
                      f"{piece.key} to the next tar's first, {piece.key + piece.rows})")


_MISSING = object()


def _member(sample: dict, column: Column) -> str | None:
    """The tar member holding `column`: the first of its members the sample has."""
    return next((m for m in column.tar_members if m in sample), None)


def _key_number(key: str, uri: str) -> int:
    """sample_index, with clip_benchmark's `s%07d` keys read without a regular expression."""
    digits = key[1:]
    if key[:1] == "s" and digits.isdigit() and digits.isascii():
        return int(digits)
    return sample_index(key, uri)


def _label(raw: bytes, strict: bool) -> int | str | None:
    """A label member as an integer; anything else is None for a `cls` member (`strict`), else its text."""
    try:
        text = raw.decode("ascii" if strict else "utf-8")
        return int(text.strip())
    except UnicodeDecodeError:
        return None
    except ValueError:
        return None if strict else text


def _decoded(member: str, raw) -> object:
    """A `text` or `value` member: `cls` an integer (or None), anything else UTF-8 text, bad bytes replaced."""
    text = str(raw, "utf-8", "replace")
    if member == "cls":
        return int(text) if text.strip().lstrip("-").isdigit() else None
    return text


def _meta(sample: dict, key: str, uri: str) -> dict:
    """A sample's .json member (mieb-train's label, dataset_name...), {} when it has none."""
    if "json" not in sample:
        return {}
    try:
        meta = json.loads(bytes(sample["json"]))
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        raise FormatError(f"{storage.display(uri)}: sample {key} has a .json member that is not a JSON object")
    return meta


def _value(column: Column, sample: dict, meta: dict, key: str):
    name = _member(sample, column)
    return _decoded(name, sample[name]) if name is not None else meta.get(column.field)


def _chunk(index: list[int], values: dict[str, list], columns: list[Column]) -> pa.Table:
    return pa.table({"index": pa.array(index, pa.int64()), **{c.name: _ARROW[c.kind](values[c.name]) for c in columns}})


def _image_array(v: list) -> pa.Array:
    return pa.StructArray.from_arrays([_binary([b for b, _ in v]), pa.array([p for _, p in v], pa.string())],
                                      fields=list(IMAGE_TYPE))


def _label_array(v: list) -> pa.Array:
    # integers as int64; a label member of class names (SciMMIR's `class`) stays text, looked up by name
    if any(isinstance(x, str) for x in v):
        return pa.array([None if x is None else str(x) for x in v], pa.string())
    return pa.array(v, pa.int64())


def _raw_array(v: list) -> pa.Array:
    return _binary(v) if all(x is None or isinstance(x, (bytes, memoryview)) for x in v) else pa.array(v)


# a chunk's column of each Kind from its values
_ARROW = {Kind.IMAGE: _image_array, Kind.LABEL: _label_array, Kind.RAW: _raw_array,
          Kind.TEXT: lambda v: pa.array(v, pa.string()), Kind.KEY: lambda v: pa.array(v, pa.string()),
          Kind.VALUE: pa.array}


def _binary(values: list) -> pa.Array:
    """A binary array of bytes-likes (None: null), built from one join of them rather than one object each."""
    n = len(values)
    lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int64, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 1 << 31:  # past binary's 32-bit offsets: pyarrow says so, as it did before
        return pa.array([None if v is None else bytes(v) for v in values], pa.binary())
    valid = np.fromiter((v is not None for v in values), np.bool_, n)
    nulls = n - int(valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    data = b"".join(v for v in values if v is not None)
    return pa.Array.from_buffers(pa.binary(), n, [bitmap, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
                                 null_count=nulls)
