"""Shard writers: mieb-train rows, streamed to one local Parquet file or one WebDataset tar.

They write to a staging file; storage.commit() then makes the shard visible whole.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from mieb_ray.formats import TRAIN_SCHEMA as SCHEMA

# Image bytes are already compressed: squeezing them again, dictionary-encoding them or keeping their
# min/max costs CPU for nothing. The small columns get all three.
_SMALL = ["key", "image.path", "text", "label", "class_name", "dataset_name"]
_PARQUET_OPTIONS = dict(compression={**{c: "zstd" for c in _SMALL}, "image.bytes": "none"},
                        use_dictionary=_SMALL, write_statistics=_SMALL)


class ParquetShardWriter:
    suffix = "parquet"

    def __init__(self, path: str, image_ext: str):
        self._writer = pq.ParquetWriter(path, SCHEMA, **_PARQUET_OPTIONS)  # native writes: no GIL per page
        self.rows = 0

    def write(self, rows: pa.Table) -> None:
        self._writer.write_table(rows)  # one row group per chunk (<= 1000 rows), like HF's image datasets
        self.rows += rows.num_rows

    def close(self) -> int:
        self._writer.close()
        return self.rows


class WebDatasetShardWriter:
    """Members per sample, in webdataset's sorted order: <key>.cls, <key>.<image_ext>, <key>.json, <key>.txt.

    One image extension per dataset (HF's WebDataset builder needs the same fields in every sample), each one of
    jpg, png, webp: with `.txt` what open_clip's trainer takes (`rename(image="jpg;png;jpeg;webp", text="txt")`).
    A key (`cifar10/12`, `food101/validation/3`) has no dot: webdataset cuts a member name at the first dot after
    its last `/`, so every member of a sample groups under its key. `.cls` is always written; the tar's mtime is
    fixed so a rebuild is byte-identical.
    """

    suffix = "tar"

    def __init__(self, path: str, image_ext: str):
        import webdataset as wds  # here, not at the top: it takes a second to import (it imports torch)

        self._tar = wds.TarWriter(path, encoder=False, mtime=0)
        self._ext = image_ext
        self.rows = 0

    def write(self, rows: pa.Table) -> None:
        for row in rows.to_pylist():
            meta = {k: row[k] for k in ("key", "label", "class_name", "dataset_name")}
            self._tar.write({
                "__key__": row["key"],
                self._ext: row["image"]["bytes"],
                "cls": str(row["label"]).encode(),
                "txt": row["text"].encode(),
                "json": json.dumps(meta, ensure_ascii=False).encode(),
            })
        self.rows += rows.num_rows

    def close(self) -> int:
        self._tar.close()
        return self.rows


WRITERS = {"parquet": ParquetShardWriter, "webdataset": WebDatasetShardWriter}
