"""The shard writers (mieb_ray/io/writers.py): a WebDataset shard is the tar webdataset's own TarWriter writes, and
writing one does not import torch (every shard builder of a `--format webdataset` build would carry it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import webdataset as wds
from support.pictures import encode, picture

from mieb_ray.formats import TRAIN_SCHEMA
from mieb_ray.io.writers import WebDatasetShardWriter


def _rows() -> pa.Table:
    photo = encode(picture("coffee.jpg").resize((40, 30)), "JPEG")
    keys = ["cifar10/0", "food101/validation/3", "sun397/" + "a" * 120 + "/7", "dtd/test/0"]  # one past ustar's 100
    texts = ["a photo of a cat.", "a photo of crème brûlée, a type of food.", "x" * 300, ""]
    return pa.table({"key": keys, "image": [{"bytes": photo, "path": None}] * 4, "text": texts,
                     "label": [3, 0, 396, 46], "class_name": ["cat", "crème brûlée", "abbey", "zigzagged"],
                     "dataset_name": ["cifar10", "food101", "sun397", "dtd"]}, schema=TRAIN_SCHEMA)


def test_a_webdataset_shard_is_the_tar_webdatasets_writer_writes(tmp_path):
    rows = _rows()
    ours = WebDatasetShardWriter(str(tmp_path / "ours.tar"), "jpg")
    ours.write(rows.slice(0, 3))
    ours.write(rows.slice(3))
    assert ours.close() == 4
    with wds.TarWriter(str(tmp_path / "theirs.tar"), encoder=False, mtime=0) as theirs:
        for row in rows.to_pylist():
            meta = {k: row[k] for k in ("key", "label", "class_name", "dataset_name")}
            theirs.write({"__key__": row["key"], "jpg": row["image"]["bytes"], "cls": str(row["label"]).encode(),
                          "txt": row["text"].encode(), "json": json.dumps(meta, ensure_ascii=False).encode()})
    assert (tmp_path / "ours.tar").read_bytes() == (tmp_path / "theirs.tar").read_bytes()
    samples = list(wds.WebDataset(str(tmp_path / "ours.tar"), shardshuffle=False))
    assert [s["__key__"] for s in samples] == rows["key"].to_pylist()
    assert [s["txt"].decode() for s in samples] == rows["text"].to_pylist()


def test_writing_a_webdataset_shard_imports_no_torch(tmp_path):
    code = ("import sys, pyarrow as pa; from mieb_ray.formats import TRAIN_SCHEMA; "
            "from mieb_ray.io.writers import WebDatasetShardWriter; "
            "w = WebDatasetShardWriter(sys.argv[1], 'png'); "
            "w.write(pa.table({'key': ['a/0'], 'image': [{'bytes': b'x', 'path': None}], 'text': ['t'], 'label': [0], "
            "'class_name': ['c'], 'dataset_name': ['a']}, schema=TRAIN_SCHEMA)); w.close(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'webdataset'}))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a.tar")], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
