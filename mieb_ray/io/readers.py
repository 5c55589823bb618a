"""Read a source's split (train, or its eval split) from a hub-layout mirror (local or S3) or from the hub itself.

Planning looks at file metadata only (parquet footers, the first tar header) and cuts the split
into units: index ranges [lo, hi) aligned to the output shard size, each with the file pieces that
hold its rows. A unit is read as a stream of small Arrow chunks, so memory is bounded by the chunk,
not by the split. The index of a row is its position in the split: files in natural order, rows in
file order (parquet), or the number in the sample key (WebDataset: clip_benchmark writes
`s%07d % index`).
"""

from __future__ import annotations

import json
import re
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from mieb_ray import storage
from mieb_ray.errors import UserError
from mieb_ray.sources import PARQUET, Source

IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
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


def split_files(source: Source, sources: str, split: str = "train") -> list[str]:
    """The files of a split (train, test, validation), in split order (natural sort: 2.tar before 10.tar)."""
    root = repo_root(source, sources)
    ext = ".parquet" if source.layout == PARQUET else ".tar"
    words = re.compile(rf"(^|/)({_SPLIT_WORDS.get(split, re.escape(split))})([-._ 0-9/]|$)")
    rel = {u: u[len(root):].lstrip("/") for u in storage.list_files(root)}
    # hidden folders (.cache/huggingface/ of a `--local-dir` download) are not the repo's files
    files = [u for u, r in rel.items() if u.endswith(ext) and words.search(r) and not re.search(r"(^|/)\.", r)]
    if not files:
        raise SourceError(f"{source.slug}: no {split} {ext} files under {storage.display(root)}")
    return sorted(files, key=_natural)


def train_files(source: Source, sources: str) -> list[str]:
    """The train split's files (the benchmarks list them)."""
    return split_files(source, sources, "train")


def _footer(uri: str) -> pq.FileMetaData:
    try:
        with storage.open_input(uri) as f:
            return pq.read_metadata(f)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceError(f"unreadable parquet file {storage.display(uri)}: {str(exc).splitlines()[0]}") from exc


def hub_class_names(meta: pq.FileMetaData, column: str) -> list[str] | None:
    """The ClassLabel names of `column` kept by HF `datasets` in the parquet schema metadata."""
    raw = (meta.metadata or {}).get(b"huggingface")
    if raw is None:
        return None
    info = json.loads(raw)
    feature = (info.get("info", {}).get("features") or info.get("features") or {}).get(column, {})
    return feature.get("names") if feature.get("_type") == "ClassLabel" else None


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


def _key_index(key: str, uri: str) -> int:
    digits = re.sub(r"\D", "", key.rsplit("/", 1)[-1])
    if not digits:
        raise SourceError(f"sample key {key!r} in {storage.display(uri)} carries no index (expected s0000123)")
    return int(digits)


def _first_index(uri: str) -> int:
    try:
        with storage.open_input(uri) as f, tarfile.open(fileobj=f, mode="r|") as tar:
            member = tar.next()
    except (tarfile.TarError, OSError) as exc:
        raise SourceError(f"unreadable tar file {storage.display(uri)}: {exc}") from exc
    if member is None:
        raise SourceError(f"empty tar file {storage.display(uri)}")
    return _key_index(member.name.split(".", 1)[0], uri)


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
    """Units of the split's rows and, for parquet, the hub class names of the label column."""
    files = split_files(source, sources, split)
    if source.layout == PARQUET:
        return plan_parquet(source, files, rows_per_shard, split)
    return plan_webdataset(source, files, rows_per_shard, split), None


# ---------------------------------------------------------------------------------------------- reading


def _as_image(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """HF Image structs pass through untouched; a raw binary column becomes {bytes, path: null}."""
    if pa.types.is_struct(col.type):
        return col if col.type == IMAGE_TYPE else col.cast(IMAGE_TYPE)
    return pa.chunked_array([pa.StructArray.from_arrays([c.cast(pa.binary()), pa.nulls(len(c), pa.string())],
                                                        fields=list(IMAGE_TYPE)) for c in col.chunks], IMAGE_TYPE)


def _row_group_batches(meta: pq.FileMetaData, row_groups: list[int]):
    """Consecutive row groups, read together up to CHUNK_ROWS rows or CHUNK_BYTES (a bigger group alone)."""
    batch, rows, size = [], 0, 0
    for i in row_groups:
        group = meta.row_group(i)
        if batch and (rows + group.num_rows > CHUNK_ROWS or size + group.total_byte_size > CHUNK_BYTES):
            yield batch
            batch, rows, size = [], 0, 0
        batch.append(i)
        rows, size = rows + group.num_rows, size + group.total_byte_size
    if batch:
        yield batch


def _read_parquet(source: Source, unit: Unit, piece: Piece):
    try:
        pf = pq.ParquetFile(storage.open_input(piece.uri))
        index = piece.first
        for groups in _row_group_batches(pf.metadata, piece.row_groups):
            table = pf.read_row_groups(groups, columns=_parquet_columns(source))
            n = table.num_rows
            lo, hi = max(unit.lo - index, 0), n if unit.hi is None else min(unit.hi - index, n)
            if hi > lo:
                yield piece.uri, pa.table({
                    "index": pa.array(range(index, index + n), pa.int64()),
                    "image": _as_image(table[source.image_column]),
                    "label": table[source.label_column],
                    **({"caption": table[source.caption_column]} if source.caption_column else {}),
                }).slice(lo, hi - lo)
            index += n
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceError(f"unreadable parquet file {storage.display(piece.uri)}: {exc}") from exc


def _label(raw: bytes | None) -> int | None:
    try:
        return int(raw.decode("ascii").strip())
    except (AttributeError, UnicodeDecodeError, ValueError):
        return None


def _read_tar(source: Source, unit: Unit, piece: Piece):
    from webdataset.tariterators import group_by_keys, tar_file_iterator  # a slow import: only where used

    ext = source.image_column
    rows: dict[str, list] = {"index": [], "image": [], "label": []}
    size = 0
    try:
        with storage.open_input(piece.uri) as f:
            members = ({**m, "__url__": piece.uri} for m in tar_file_iterator(f))
            for sample in group_by_keys(members):
                index = _key_index(sample["__key__"], piece.uri)
                if index < unit.lo or (unit.hi is not None and index >= unit.hi):
                    continue
                data = sample.get(ext)
                rows["index"].append(index)
                rows["image"].append({"bytes": data, "path": f"{sample['__key__']}.{ext}" if data else None})
                rows["label"].append(_label(sample.get("cls")))
                size += len(data or b"")
                if len(rows["index"]) >= CHUNK_ROWS or size >= CHUNK_BYTES:
                    yield piece.uri, _tar_chunk(rows)
                    rows, size = {k: [] for k in rows}, 0
    except (tarfile.TarError, OSError, ValueError) as exc:
        if isinstance(exc, UserError):
            raise
        raise SourceError(f"unreadable tar file {storage.display(piece.uri)}: {exc}") from exc
    if rows["index"]:
        yield piece.uri, _tar_chunk(rows)


def _tar_chunk(rows: dict[str, list]) -> pa.Table:
    return pa.table({"index": pa.array(rows["index"], pa.int64()), "image": pa.array(rows["image"], IMAGE_TYPE),
                     "label": pa.array(rows["label"], pa.int64())})


def read_unit(source: Source, unit: Unit):
    """(file uri, chunk) pairs of the unit's rows in index order; chunk columns: index, image, label
    [, caption]. A label that is missing or not an integer is null; a missing image is null."""
    reader = _read_parquet if source.layout == PARQUET else _read_tar
    for piece in unit.pieces:
        yield from reader(source, unit, piece)
