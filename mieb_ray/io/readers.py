"""Read a source's split (train, or its eval split) from a hub-layout mirror (local or S3) or from the hub itself.

Planning looks at file metadata only (parquet footers, the first tar header) and cuts the split
into units: index ranges [lo, hi) aligned to the output shard size, each with the file pieces that
hold its rows. A unit is read as a stream of small Arrow chunks, so memory is bounded by the chunk,
not by the split. The index of a row is its position in the split: files in natural order, rows in
file order (parquet), or the number in the sample key (WebDataset: clip_benchmark writes
`s%07d % index`).

The layout is detected, not assumed: a repo is read as parquet or as WebDataset tars by the files its split
holds (`detect`); the catalog's layout only breaks a tie. The file formats themselves are formats.py's.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mieb_ray import storage
from mieb_ray.errors import UserError
from mieb_ray.io import formats
from mieb_ray.io.formats import IMAGE_EXTENSIONS, IMAGE_TYPE, hub_class_names
from mieb_ray.sources import PARQUET, WEBDATASET, Source

CHUNK_ROWS = 1000
CHUNK_BYTES = 64 << 20
HF = "hf"

# the words a split's files or folders go by: data/train-00000-of-00002.parquet, test/0.tar, val/...
_SPLIT_WORDS = {"train": "train|training", "test": "test|testing", "validation": "validation|valid|val"}


class SourceError(UserError):
    pass


@dataclass
class Piece:
    uri: str
    first: int  # split index of the piece's first row (parquet: of its first row group)
    row_groups: list[int] = field(default_factory=list)  # parquet: the row groups to read


@dataclass
class Unit:
    slug: str
    lo: int
    hi: int | None  # None: to the end of the last file
    pieces: list[Piece]
    split: str = "train"  # the source's split the rows come from

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> Unit:
        d = json.loads(text)
        return Unit(d["slug"], d["lo"], d["hi"], [Piece(**p) for p in d["pieces"]], d.get("split", "train"))


def repo_root(source: Source, sources: str) -> str:
    """Where the source's repo lives: the hub at the pinned revision, or ROOT/<repo> in a mirror."""
    if sources == HF:
        return f"hf://datasets/{source.repo}@{source.revision}"
    return storage.join(sources, source.repo)


def _natural(uri: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", uri)]


@dataclass(frozen=True)
class Listing:
    """What a source's split holds at its revision: the layout found, its data files in split order, and the
    repo's classnames.txt (CLIP_benchmark's class list beside tars) when there is one."""

    layout: str  # PARQUET or WEBDATASET
    files: tuple[str, ...]
    classnames: str | None = None


_EXTENSIONS = {PARQUET: ".parquet", WEBDATASET: ".tar"}


def detect(source: Source, sources: str, split: str = "train") -> Listing:
    """List the repo once and find the split's files: parquet or tars, whichever it holds (both: the catalog's
    layout). Natural sort: 2.tar before 10.tar."""
    root = repo_root(source, sources)
    words = re.compile(rf"(^|/)({_SPLIT_WORDS.get(split, re.escape(split))})([-._ 0-9/]|$)")
    rel = {u: u[len(root):].lstrip("/") for u in storage.list_files(root)}
    # hidden folders (.cache/huggingface/ of a `--local-dir` download) are not the repo's files
    rel = {u: r for u, r in rel.items() if not re.search(r"(^|/)\.", r)}
    found = {layout: sorted((u for u, r in rel.items() if u.endswith(ext) and words.search(r)), key=_natural)
             for layout, ext in _EXTENSIONS.items()}
    layout = next((k for k in (source.layout, *found) if found[k]), None)
    if layout is None:
        raise SourceError(f"{source.slug}: no {split} .parquet or .tar files under {storage.display(root)}")
    names = sorted((u for u, r in rel.items() if r.rsplit("/", 1)[-1] == "classnames.txt"), key=len)
    return Listing(layout, tuple(found[layout]), names[0] if names else None)


def split_files(source: Source, sources: str, split: str = "train") -> list[str]:
    """The files of a split (train, test, validation), in split order, in the layout the repo holds."""
    return list(detect(source, sources, split).files)


def train_files(source: Source, sources: str) -> list[str]:
    """The train split's files (the benchmarks list them)."""
    return split_files(source, sources, "train")


def classnames(listing: Listing) -> list[str] | None:
    """The class list a tar repo keeps beside its tars (classnames.txt, one name per line), else None."""
    return storage.read_text(listing.classnames).splitlines() if listing.classnames else None


def _footer(uri: str) -> pq.FileMetaData:
    try:
        return formats.parquet_footer(uri)
    except formats.FormatError as exc:
        raise SourceError(str(exc)) from exc


def _parquet_columns(source: Source) -> list[str]:
    return [c for c in (source.image_column, source.label_column, source.caption_column) if c]


def plan_parquet(source: Source, files: list[str], rows_per_shard: int,
                 split: str = "train") -> tuple[list[Unit], list[str] | None]:
    """Units of `rows_per_shard` rows from the footers, and the hub class names of the label column."""
    with ThreadPoolExecutor(16) as pool:
        metas = list(pool.map(_footer, files))
    first, pieces_at = 0, []
    for uri, meta in zip(files, metas):
        names = meta.schema.to_arrow_schema().names
        missing = [c for c in _parquet_columns(source) if c not in names]
        if missing:
            raise SourceError(f"{source.slug}: {storage.display(uri)} has no column {', '.join(missing)} "
                              f"(columns: {', '.join(names)})")
        pieces_at.append((uri, first, [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]))
        first += meta.num_rows
    units: dict[int, Unit] = {}
    for uri, start, group_rows in pieces_at:  # each row group goes to every unit it overlaps
        for i, n in enumerate(group_rows):
            for k in range(start // rows_per_shard, (start + n - 1) // rows_per_shard + 1):
                lo = k * rows_per_shard
                unit = units.setdefault(k, Unit(source.slug, lo, min(lo + rows_per_shard, first), [], split))
                if not unit.pieces or unit.pieces[-1].uri != uri:
                    unit.pieces.append(Piece(uri, start))
                unit.pieces[-1].row_groups.append(i)
            start += n
    return [units[k] for k in sorted(units)], hub_class_names(metas[0], source.label_column)


def sample_index(key: str, uri: str) -> int:
    index = formats.key_index(key)
    if index is None:
        raise SourceError(f"sample key {key!r} in {storage.display(uri)} carries no index (expected s0000123)")
    return index


def _first_index(uri: str) -> int:
    try:
        name = formats.first_member(uri)
    except formats.FormatError as exc:
        raise SourceError(str(exc)) from exc
    return sample_index(formats.sample_key(name), uri)


def plan_webdataset(source: Source, files: list[str], rows_per_shard: int, split: str = "train") -> list[Unit]:
    """Units from the first key of each tar: tar t holds indices [first[t], first[t+1]).

    Tars that start on shard boundaries (the hub's hold 10,000 samples each) are one unit apiece and
    read once. Otherwise a unit is one shard's index range and skips the rows of its tars that are not
    its own, so a tar spanning several shards is read once per shard.
    """
    with ThreadPoolExecutor(16) as pool:
        firsts = list(pool.map(_first_index, files))
    for a, b, uri in zip(firsts, firsts[1:], files[1:]):
        if b <= a:
            raise SourceError(f"{source.slug}: {storage.display(uri)} starts at index {b}, not after {a}")
    ends = firsts[1:] + [None]  # the last tar's size is known only by reading it
    if all(first % rows_per_shard == 0 for first in firsts):
        return [Unit(source.slug, first, end, [Piece(uri, first)], split)
                for uri, first, end in zip(files, firsts, ends)]
    units = []
    last_lo = firsts[-1] - firsts[-1] % rows_per_shard
    for lo in range(0, last_lo + 1, rows_per_shard):
        hi = lo + rows_per_shard if lo < last_lo else None
        pieces = [Piece(uri, first) for uri, first, end in zip(files, firsts, ends)
                  if (hi is None or first < hi) and (end is None or end > lo)]
        if pieces:
            units.append(Unit(source.slug, lo, hi, pieces, split))
    return units


def plan(source: Source, sources: str, rows_per_shard: int,
         split: str = "train") -> tuple[list[Unit], list[str] | None]:
    """Units of the split's rows and the class names the source keeps (parquet: the label column's
    ClassLabel names; tars: classnames.txt), whichever layout the repo holds."""
    listing = detect(source, sources, split)
    if listing.layout == PARQUET:
        return plan_parquet(source, list(listing.files), rows_per_shard, split)
    return plan_webdataset(source, list(listing.files), rows_per_shard, split), classnames(listing)


# ---------------------------------------------------------------------------------------------- reading


def _read_parquet(source: Source, unit: Unit, piece: Piece):
    try:
        index = piece.first
        for table in formats.read_row_groups(piece.uri, piece.row_groups, _parquet_columns(source), CHUNK_ROWS,
                                             CHUNK_BYTES):
            n = table.num_rows
            lo, hi = max(unit.lo - index, 0), n if unit.hi is None else min(unit.hi - index, n)
            if hi > lo:
                yield piece.uri, pa.table({
                    "index": pa.array(range(index, index + n), pa.int64()),
                    "image": formats.image_struct(table[source.image_column]),
                    "label": table[source.label_column],
                    **({"caption": table[source.caption_column]} if source.caption_column else {}),
                }).slice(lo, hi - lo)
            index += n
    except formats.FormatError as exc:
        raise SourceError(str(exc)) from exc


def tar_members(source: Source) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The members that may hold a sample's image, label and caption, in order of preference: the catalog's
    own (a WebDataset source's image extension and `cls`), then those of a parquet source written as tars
    (its image format, its column names), then any image extension."""
    image = dict.fromkeys((source.image_ext, source.image_column, *IMAGE_EXTENSIONS))
    label = dict.fromkeys(("cls", source.label_column))
    caption = dict.fromkeys(("txt", "text", source.caption_column)) if source.caption_column else {}
    return tuple(image), tuple(label), tuple(caption)


def _label(raw: bytes | None, strict: bool = True) -> int | str | None:
    """A label member as an integer; anything else is None for a `cls` member (`strict`), else its text."""
    try:
        text = raw.decode("ascii" if strict else "utf-8")
        return int(text.strip())
    except (AttributeError, UnicodeDecodeError):
        return None
    except ValueError:
        return None if strict else text


def _sample_index(key: str, uri: str) -> int:
    """sample_index, with clip_benchmark's `s%07d` keys read without a regular expression."""
    digits = key[1:]
    if key[:1] == "s" and digits.isdigit() and digits.isascii():
        return int(digits)
    return sample_index(key, uri)


def _read_tar(source: Source, unit: Unit, piece: Piece):
    """The piece's rows in [unit.lo, unit.hi) as chunks of CHUNK_ROWS rows (or CHUNK_BYTES of images): the
    members' bytes go from the read ranges into each chunk's Arrow buffers in one copy, no row dicts."""
    images, labels, captions = tar_members(source)
    lo, hi = unit.lo, unit.hi
    rows = _TarRows(bool(captions))
    size, ext, label, parsed = 0, None, None, {}
    try:
        for key, sample in formats.tar_samples(piece.uri):
            index = _sample_index(key, piece.uri)
            if index < lo or (hi is not None and index >= hi):
                continue
            if ext not in sample:  # the members are looked for once, and again only in a sample that lacks them
                ext = next((e for e in images if e in sample), images[0])
            if label not in sample:
                label = next((m for m in labels if m in sample), "cls")
                known = parsed.setdefault(label, {})  # label member bytes -> label: labels repeat
            data = sample.get(ext)
            raw = sample.get(label)
            if raw is None:
                value = None
            else:
                value = known.get(raw, _MISSING)
                if value is _MISSING:
                    raw = bytes(raw)
                    value = _label(raw, strict=label == "cls")
                    if len(known) < 100_000:
                        known[raw] = value
            rows.index.append(index)
            rows.data.append(data)
            rows.path.append(f"{key}.{ext}" if data else None)
            rows.label.append(value)
            if captions:
                text = next((sample[m] for m in captions if m in sample), None)
                rows.caption.append(None if text is None else str(text, "utf-8", "replace"))
            if data is not None:
                size += len(data)
            if len(rows.index) >= CHUNK_ROWS or size >= CHUNK_BYTES:
                yield piece.uri, rows.table()
                rows, size = _TarRows(bool(captions)), 0
    except formats.FormatError as exc:
        raise SourceError(str(exc)) from exc
    if rows.index:
        yield piece.uri, rows.table()


_MISSING = object()


class _TarRows:
    """One chunk's rows from tar samples, column by column."""

    def __init__(self, captions: bool):
        self.index, self.data, self.path, self.label = [], [], [], []
        self.caption = [] if captions else None

    def table(self) -> pa.Table:
        labels = self.label
        # integers as int64; a label member of class names (SciMMIR's `class`) stays text, looked up by name
        label = (pa.array([None if v is None else str(v) for v in labels], pa.string())
                 if any(isinstance(v, str) for v in labels) else pa.array(labels, pa.int64()))
        image = pa.StructArray.from_arrays([_binary(self.data), pa.array(self.path, pa.string())],
                                           fields=list(IMAGE_TYPE))
        return pa.table({"index": pa.array(self.index, pa.int64()), "image": image, "label": label,
                         **({"caption": pa.array(self.caption, pa.string())} if self.caption is not None else {})})


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


def read_unit(source: Source, unit: Unit):
    """(file uri, chunk) pairs of the unit's rows in index order; chunk columns: index, image, label
    [, caption]. A label that is missing or not an integer is null; a missing image is null. Each file is
    read as what it is (.parquet or a tar), whatever the catalog's layout."""
    for piece in unit.pieces:
        reader = _read_parquet if piece.uri.endswith(".parquet") else _read_tar
        yield from reader(source, unit, piece)
