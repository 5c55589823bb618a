"""One unit in, its shards out: read the source rows, caption them from the class table, write.

ShardBuilder is the build's one stage (runtime/units.py): a Ray actor pool, each actor holding the class tables
once and streaming units through, or one instance in this process; image bytes go from the source file to the
output shard without crossing the object store. A unit (at most --rows-per-shard rows) makes one shard, named by
the unit's place in its split (formats.shard_path of `unit.shard`), so a retried or repeated unit rewrites the
same shard with the same bytes. Once a unit's shards are committed, its record (`_progress/<slug>/<lo>.json`, or
`_progress/<slug>/<split>/<lo>.json` for an eval split: the unit, the settings and its result) is
committed too: what `--resume` skips.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mieb_ray import storage
from mieb_ray.captions import ClassTable
from mieb_ray.errors import FormatError
from mieb_ray.formats import shard_path
from mieb_ray.io.reader import Unit, read, source_columns
from mieb_ray.io.writers import WRITERS
from mieb_ray.mieb_train import train_rows
from mieb_ray.runtime.output import Progress
from mieb_ray.sources import by_slug


def error_path(slug: str, unit_lo: int) -> str:
    return f"_errors/{slug}/{unit_lo:012d}.parquet"


class ShardBuilder:
    def __init__(self, tables: dict[str, ClassTable], out: str, fmt: str, progress: Progress | None = None,
                 exclude: dict[str, pa.Array] | None = None, units: list[Unit] = ()):
        self.units, self.tables, self.out = units, tables, out
        self.progress = progress
        self.exclude = exclude or {}  # slug -> the train keys an audit flagged: left out
        self.writer_cls = WRITERS[fmt]

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Units in (their numbers), their results out, each after its shards and progress record are committed."""
        results = []
        for number in batch["unit"]:
            unit = self.units[int(number)]
            result = self.build(unit)
            if self.progress is not None:
                self.progress.record(unit.name, unit.identity, result)
            results.append(json.dumps(result))
        return {"unit": batch["unit"], "result": np.array(results)}

    def _open(self, slug: str, shard: int, image_ext: str) -> _OpenShard:
        dest = storage.join(self.out, shard_path(slug, shard, self.writer_cls.suffix))
        local = storage.staging_path(dest)
        return _OpenShard(shard, dest, local, self.writer_cls(local, image_ext))

    def _commit(self, slug: str, shard: _OpenShard) -> dict:
        with storage.writing(shard.dest, shard.local):
            rows = shard.writer.close()
        stats = storage.file_stats(shard.local)
        storage.commit(shard.local, shard.dest)
        return {"path": shard_path(slug, shard.number, self.writer_cls.suffix), "dataset": slug, "rows": rows, **stats}

    def build(self, unit: Unit) -> dict:
        slug = unit.source
        source, table, exclude = by_slug(slug), self.tables[slug], self.exclude.get(slug)
        columns = list(source_columns(source).values())
        errors, dropped, excluded, last = [], 0, 0, -1
        shard: _OpenShard | None = None
        try:
            for chunk in read(unit, columns):
                index = chunk["index"].to_numpy()
                if len(index) == 0:
                    continue
                file = unit.file_of(int(index[0]))
                if index[0] <= last or np.any(np.diff(index) <= 0):
                    raise FormatError(f"{slug}: sample keys out of order or repeated in "
                                      f"{storage.display(file)} near index {int(index[0])}")
                last = int(index[-1])
                shard = shard or self._open(slug, unit.shard, source.image_ext)
                rows, bad, n_dropped = train_rows(source, table, chunk, storage.display(file), unit.split)
                if exclude is not None:
                    flagged = pc.is_in(rows["key"], value_set=exclude)
                    excluded += pc.sum(flagged).as_py() or 0
                    rows = rows.filter(pc.invert(flagged))
                with storage.writing(shard.dest, shard.local):
                    shard.writer.write(rows)
                dropped += n_dropped
                if bad.num_rows:
                    errors.append(bad)
            if self.progress is not None:
                self.progress.held(unit.name)
            shards = [self._commit(slug, shard)] if shard is not None else []
            shard = None
        finally:
            if shard is not None:  # failed mid-shard: never committed
                storage.discard(shard.local)
        error_file = None
        if errors:
            error_file = error_path(slug, unit.lo)
            table = pa.concat_tables(errors)
            storage.commit_file(storage.join(self.out, error_file), lambda local: pq.write_table(table, local))
        return {"slug": slug, "lo": unit.lo, "shards": shards, "rows": sum(s["rows"] for s in shards),
                "errors": sum(e.num_rows for e in errors), "error_file": error_file, "dropped": dropped,
                "excluded": excluded}


@dataclass
class _OpenShard:
    number: int
    dest: str
    local: str
    writer: object
