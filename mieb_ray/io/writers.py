"""Shard writers: mieb-train rows to one Parquet file or one WebDataset tar, streamed, with checksum.

Both write to a local staging file through storage.HashingWriter (so size and sha256 come free
with the write); storage.commit() then makes the shard visible whole.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import webdataset as wds

from mieb_ray.storage import HashingWriter
from mieb_ray.table import SCHEMA

# Image bytes are already compressed: squeezing them again costs CPU for nothing.
_COMPRESSION = {"key": "zstd", "image.bytes": "none", "image.path": "zstd", "text": "zstd", "label": "zstd",
                "class_name": "zstd", "dataset_name": "zstd"}


class ParquetShardWriter:
    suffix = "parquet"

    def __init__(self, path: str, image_ext: str):
        self._file = HashingWriter(path)
        self._writer = pq.ParquetWriter(self._file, SCHEMA, compression=_COMPRESSION)
        self.rows = 0

    def write(self, rows: pa.Table) -> None:
        self._writer.write_table(rows)  # one row group per chunk (<= 1000 rows), like HF's image datasets
        self.rows += rows.num_rows

    def close(self) -> dict:
        self._writer.close()
        self._file.close()
        return {"rows": self.rows, "bytes": self._file.bytes, "sha256": self._file.sha256.hexdigest()}


class WebDatasetShardWriter:
    """Members per sample, in webdataset's sorted order: <key>.cls, <key>.<image_ext>, <key>.json, <key>.txt.

    One image extension per dataset (HF's WebDataset builder needs the same fields in every sample);
    `.cls` is always written; the tar's mtime is fixed so a rebuild is byte-identical.
    """

    suffix = "tar"

    def __init__(self, path: str, image_ext: str):
        self._file = HashingWriter(path)
        self._tar = wds.TarWriter(self._file, encoder=False, mtime=0)
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

    def close(self) -> dict:
        self._tar.close()
        self._file.close()
        return {"rows": self.rows, "bytes": self._file.bytes, "sha256": self._file.sha256.hexdigest()}


WRITERS = {"parquet": ParquetShardWriter, "webdataset": WebDatasetShardWriter}
