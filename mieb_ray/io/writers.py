"""Shard writers: mieb-train rows, streamed to one local Parquet file or one WebDataset tar.

They write to a staging file; storage.commit() then makes the shard visible whole.
"""

from __future__ import annotations

import io
import json
import tarfile

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

    The bytes are those of `webdataset.TarWriter(path, encoder=False, mtime=0)` (tests/unit/io/test_writers.py
    compares them), written with tarfile alone: importing webdataset imports torch, 1.5 s and 180 MiB more in every
    shard builder that writes tars.
    """

    suffix = "tar"

    def __init__(self, path: str, image_ext: str):
        self._tar = tarfile.open(path, "w")  # tarfile's default format, as webdataset's
        self._ext = image_ext
        self.rows = 0

    def write(self, rows: pa.Table) -> None:
        for row in rows.to_pylist():
            meta = {k: row[k] for k in ("key", "label", "class_name", "dataset_name")}
            members = {self._ext: row["image"]["bytes"], "cls": str(row["label"]).encode(), "txt": row["text"].encode(),
                       "json": json.dumps(meta, ensure_ascii=False).encode()}
            for ext in sorted(members):
                info = tarfile.TarInfo(f"{row['key']}.{ext}")
                info.size, info.mtime, info.mode = len(members[ext]), 0, 0o444
                info.uname = info.gname = "bigdata"  # webdataset.TarWriter's user and group
                self._tar.addfile(info, io.BytesIO(members[ext]))
        self.rows += rows.num_rows

    def close(self) -> int:
        self._tar.close()
        return self.rows


WRITERS = {"parquet": ParquetShardWriter, "webdataset": WebDatasetShardWriter}
