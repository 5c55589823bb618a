"""The build's baselines, shared by bench/build_bytes.py, bench/build_rows.py and bench/full_size.py (not a
benchmark itself):
  copy_floor(files, out)        one process, no Ray: pq.read_table + pq.write_table of each file, unchanged;
  minimal_pipeline(files, out)  ray.data.read_parquet -> map_batches(CaptionTake, CORES actors, pyarrow) ->
                                write_parquet: as many actors as the build's pool gets.
and train_files(), parquet_rows(). Ray's workers import CaptionTake by its module name, `_baselines`:
harness.start_ray() puts bench/ on their PYTHONPATH. The harness (timing, memory, records) is bench/harness.py.
"""

from __future__ import annotations

from pathlib import Path

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray

CORES = h.CORES

# the label column of each parquet source (scimmir's `class` holds strings: its class codes)
LABEL_COLUMNS = ("label", "fine_label", "common", "class")


def copy_floor(files: list[str], out: Path) -> int:
    """The floor: read each parquet file whole and write it back unchanged, one process. Returns rows."""
    out.mkdir(parents=True, exist_ok=True)
    rows = 0
    for k, path in enumerate(files):
        table = pq.read_table(path)
        pq.write_table(table, out / f"{k:05d}.parquet")  # same schema (metadata too), default settings
        rows += table.num_rows
    return rows


class CaptionTake:
    """The minimal pipeline's transform: caption = take(a small class-name array, label)."""

    def __init__(self):
        self.names = pa.array([f"a photo of class {i}." for i in range(1000)])  # birdsnap has 500 classes

    def __call__(self, batch: pa.Table) -> pa.Table:
        label = batch[next(c for c in LABEL_COLUMNS if c in batch.column_names)]
        if not pa.types.is_integer(label.type):  # scimmir: class code strings -> their index
            label = pc.index_in(label, value_set=pc.unique(label))
        return batch.append_column("caption", pc.take(self.names, label))


def minimal_pipeline(files: list[str], out: Path) -> int:
    """read_parquet -> pyarrow take in CORES actors, the build's pool size -> write_parquet. Returns rows written."""
    ds = ray.data.read_parquet(files)
    ds = ds.map_batches(CaptionTake, compute=ray.data.ActorPoolStrategy(size=CORES), batch_format="pyarrow")
    ds.write_parquet(str(out))
    return parquet_rows(out)


def train_files(mirror: Path, slugs: list[str]) -> list[str]:
    """The train split files of the sources, as the build itself finds them."""
    from mieb_ray.io import reader
    from mieb_ray.sources import by_slug

    return [f for slug in slugs for f in reader.split_files(by_slug(slug), str(mirror), "train")]


def parquet_rows(folder: Path) -> int:
    """Rows in the parquet files under folder, from their footers (cheap); the build's _errors/ not counted."""
    return sum(pq.read_metadata(p).num_rows for p in Path(folder).rglob("*.parquet")
               if not p.name.startswith(".") and "_errors" not in p.relative_to(folder).parts)
