"""`mieb-ray check-sources`: is every source where the build expects it, in a shape it can read? In minutes.

Per source, from file metadata only: the repo's files at the pinned revision (the layout found: parquet or
WebDataset tars), the columns (parquet footers) or the members of the first sample (the first tar), the class
names the source keeps (parquet ClassLabel metadata, or classnames.txt beside tars) against the catalog's
list, and the rows:

- parquet: exact, the sum of the footers' row counts;
- tars: by keys, without reading the tars through: the first key of every tar (one header each) and the last
  key of the last tar (its tail), so rows = last index + 1 - first index. Missing indices inside a tar are not
  seen; the build's own count (`--check-counts`) is exact.

No Ray: threads over the sources and over each source's files. `check_source` returns one Row; `render`
prints them as one table. The build runs the cheap part (`count=False`: listing, layout, columns, class
names; no per-tar reads) before it starts.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow.parquet as pq

from mieb_ray import storage
from mieb_ray.captions import class_table
from mieb_ray.errors import UserError, described
from mieb_ray.io import parquet, reader, tar
from mieb_ray.sources import PARQUET, Source, expected_names, select
from mieb_ray.sources.catalog import HUB

OK, WARN, FAIL = "OK", "WARN", "FAIL"
SOURCE_THREADS = 8  # sources checked at once
FILE_THREADS = 8  # footers or tar headers read at once per source
CATALOG = -1  # check_source(expected=CATALOG): compare the rows with the catalog's


@dataclass
class Row:
    slug: str
    repo: str
    expected_layout: str
    expected_rows: int | None  # None: not compared
    layout: str | None = None  # found
    files: int = 0
    rows: int | None = None  # found; None: not counted
    fails: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return FAIL if self.fails else WARN if self.warnings else OK

    @property
    def miscounted(self) -> bool:
        """Rows counted and compared, and not the expected number."""
        return self.rows is not None and self.expected_rows is not None and self.rows != self.expected_rows

    @property
    def reason(self) -> str:
        return "; ".join(self.fails + self.warnings + self.notes)


def source_split(source: Source, split: str) -> str:
    """The source's split that build `split` ("train" or "eval") reads."""
    return source.split if split == "train" else source.eval_split


def split_rows(source: Source, split: str) -> int:
    """Rows the source's split holds at its revision (train: before the build's drops), what check-sources
    compares a mirror's counts with."""
    return source.split_rows if split == "train" else source.eval_rows


def _unprefixed(text: str, slug: str) -> str:
    return text[len(slug) + 2:] if text.startswith(f"{slug}: ") else text


def _one_line(exc: BaseException, slug: str) -> str:
    if isinstance(exc, UserError):
        return _unprefixed(str(exc), slug)
    return described(exc)


def _diff(found: list[str], expected: list[str]) -> str | None:
    if len(found) != len(expected):
        return f"{len(found)} class names in the source, {len(expected)} in the catalog"
    i = next((i for i, (a, b) in enumerate(zip(found, expected)) if a != b), None)
    return None if i is None else f"class name {i} is {found[i]!r} in the source, {expected[i]!r} in the catalog"


def check_names(source: Source, found: list[str] | None, row: Row) -> None:
    """The class names the source keeps against the catalog's list: their count always; for a list the build
    captions from (`hub` names) the order too, as a warning (the build captions with the source's own names),
    and whether the catalog's renames, drops and cased list still line up with it (a failure)."""
    expected = expected_names(source)
    if source.names == HUB and found is None:
        row.fails.append("no class names in the source (parquet ClassLabel metadata, or classnames.txt beside "
                         "tars), and the captions need them")
        return
    if found is not None:
        diff = _diff(found, expected)
        if diff and len(found) != len(expected):
            row.fails.append(diff)
            return
        if diff and source.names == HUB:
            row.warnings.append(diff)
    try:
        class_table(source, found if source.names == HUB else None)
    except ValueError as exc:  # the catalog's renames, drops or cased list no longer line up with the names
        row.fails.append(_unprefixed(str(exc), source.slug))


def _check_parquet(source: Source, files: tuple[str, ...], row: Row, count: bool) -> list[str] | None:
    todo = files if count else files[:1]
    with ThreadPoolExecutor(FILE_THREADS) as pool:
        metas: list[pq.FileMetaData] = list(pool.map(parquet.footer, todo))
    wanted = [c for c in (source.image_column, source.label_column, source.caption_column) if c]
    for uri, meta in zip(todo, metas):
        schema = meta.schema.to_arrow_schema()
        missing = [c for c in wanted if c not in schema.names]
        if missing:
            row.fails.append(f"{storage.display(uri).rsplit('/', 1)[-1]} has no column {', '.join(missing)} "
                             f"(columns: {', '.join(schema.names)})")
            return None
        if not parquet.is_image_type(schema.field(source.image_column).type):
            row.fails.append(f"column {source.image_column} is {schema.field(source.image_column).type}, "
                             "not image bytes")
            return None
    if count:
        row.rows = sum(m.num_rows for m in metas)
    return parquet.hub_class_names(metas[0], source.label_column)


def _check_tars(source: Source, listing: reader.Listing, row: Row, count: bool) -> list[str] | None:
    files = listing.files
    sample = tar.first_sample(files[0])
    columns = reader.source_columns(source)
    images, labels = columns["image"].tar_members, columns["label"].tar_members
    captions = columns["caption"].tar_members if "caption" in columns else ()
    members = sorted(k for k in sample if not k.startswith("__"))
    if not any(e in sample for e in images):
        row.fails.append(f"first sample {sample['__key__']} has no image member ({', '.join(images[:2])}; "
                         f"members: {', '.join(members)})")
    if not any(m in sample for m in labels):
        row.fails.append(f"first sample {sample['__key__']} has no label member ({', '.join(labels)}; "
                         f"members: {', '.join(members)})")
    if captions and not any(m in sample for m in captions):
        row.notes.append(f"no caption member ({', '.join(captions)}): captions from the class list")
    if row.fails:
        return None
    if count:
        row.rows = sum(rows for _, rows in reader.tar_extents(list(files)))
        row.notes.append("rows by keys")
    return reader.classnames(listing)


def check_source(source: Source, sources: str, split: str = "train", count: bool = True,
                 expected: int | None = CATALOG) -> Row:
    """One source's row. `count`: count rows (all footers, every tar's first header and the last tar's tail);
    `expected`: the rows to compare with (default: the catalog's; None: shown, not compared). Never raises
    for what it finds: an unreadable source is a FAIL row with the reason."""
    row = Row(source.slug, source.repo, source.layout,
              split_rows(source, split) if expected == CATALOG else expected)
    try:
        listing = reader.detect(source, sources, source_split(source, split))
        row.layout, row.files = listing.layout, len(listing.files)
        if listing.layout != source.layout:
            row.warnings.append(f"layout changed: expected {source.layout}, found {listing.layout}")
        if listing.layout == PARQUET:
            names = _check_parquet(source, listing.files, row, count)
        else:
            names = _check_tars(source, listing, row, count)
        if not row.fails:
            check_names(source, names, row)
    except Exception as exc:  # a preflight reports, it does not crash: the reason goes in the table
        row.fails.append(_one_line(exc, source.slug))
    if row.miscounted:
        row.fails.append(f"{row.rows:,} rows, expected {row.expected_rows:,}")
    return row


def check_sources(selected: list[Source], sources: str, split: str = "train", count: bool = True,
                  expected: dict[str, int | None] | None = None) -> list[Row]:
    """Rows for the selected sources, in catalog order; `expected` overrides the catalog's rows by slug."""
    expected = expected or {}
    with ThreadPoolExecutor(SOURCE_THREADS) as pool:
        return list(pool.map(lambda s: check_source(s, sources, split, count, expected.get(s.slug, CATALOG)),
                             selected))


def failed(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.status == FAIL]


def _rows_cell(row: Row) -> str:
    found = "-" if row.rows is None else f"{row.rows:,}"
    return found if row.expected_rows is None else f"{found} / {row.expected_rows:,}"


def render(rows: list[Row]) -> str:
    """One table: source, layout found, rows found/expected, OK or the reason."""
    head = ("source", "repo", "layout", "files", "rows found / expected", "status", "reason")
    cells = [(r.slug, r.repo, r.layout or "-", str(r.files) if r.layout else "-", _rows_cell(r), r.status,
              r.reason) for r in rows]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head) - 1)]
    lines = ["  ".join(c.ljust(w) if i != 4 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
             + "  " + line[-1] for line in [head, *cells]]
    counts = {s: sum(r.status == s for r in rows) for s in (OK, WARN, FAIL)}
    summary = f"{len(rows)} sources: {counts[OK]} OK, {counts[WARN]} WARN, {counts[FAIL]} FAIL"
    return "\n".join([lines[0], "-" * len(lines[0].rstrip()), *lines[1:], summary]).rstrip()


def error(rows: list[Row]) -> str:
    """The one-line error of a failed check: the first failure other than a row count, and how many more. Rows
    that differ from the catalog's are what a mirror of samples shows: the line names --no-check-counts, and is
    only that when the counts are all that failed."""
    bad = failed(rows)
    miscounted = [r for r in rows if r.miscounted]
    sources = f"{len(miscounted)} source{'s have' if len(miscounted) > 1 else ' has'}"
    others = [r for r in bad if not (r.miscounted and len(r.fails) == 1)]
    if not others:
        sample = " a mirror of samples?" if all(r.rows < r.expected_rows for r in miscounted) else ""
        return f"{sources} other row counts than the catalog's:{sample} --no-check-counts checks everything else"
    first = others[0].fails[0]
    text = first if first.startswith(("cannot ", "unreadable ", "empty ")) else f"{others[0].slug}: {first}"
    text += f" (and {len(bad) - 1} more sources failed, see the table)" if len(bad) > 1 else ""
    return text + (f"; {sources} other row counts than the catalog's (--no-check-counts skips that check)"
                   if miscounted else "")


def run(sources: str, datasets: str | list[str] | None = None, split: str = "train", count: bool = True,
        check_counts: bool = True, log=print) -> list[Row]:
    """check-sources: print the table; a UserError (exit 1) when any source fails."""
    selected = select(datasets)
    rows = check_sources(selected, sources, split, count, None if check_counts else {s.slug: None for s in selected})
    log(render(rows))
    if failed(rows):
        raise UserError(error(rows))
    return rows
