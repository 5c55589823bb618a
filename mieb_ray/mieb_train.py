"""The mieb-train table: its schema, and how a chunk of a source becomes mieb-train rows.

Captions are a look-up per label in the source's ClassTable (pyarrow `take`), never string work per
row; only SciMMIR, whose caption is each row's own text, cleans strings, vectorised.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray.captions import ClassTable, clean_captions
from mieb_ray.sources import Source

_STRING = {"dtype": "string", "_type": "Value"}
# What `datasets.Features(...).arrow_schema` writes (a test checks it): the `huggingface` metadata makes
# `datasets` decode `image` as an Image. Spelled out so that actors need not import `datasets` (0.6 s each).
HF_FEATURES = {"key": _STRING, "image": {"_type": "Image"}, "text": _STRING,
               "label": {"dtype": "int64", "_type": "Value"},
               "class_name": _STRING, "dataset_name": _STRING}
SCHEMA = pa.schema([("key", pa.string()), ("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                    ("text", pa.string()), ("label", pa.int64()), ("class_name", pa.string()),
                    ("dataset_name", pa.string())],
                   metadata={"huggingface": json.dumps({"info": {"features": HF_FEATURES}})})
ERROR_SCHEMA = pa.schema([("key", pa.string()), ("dataset_name", pa.string()), ("file", pa.string()),
                          ("error", pa.string())])
SIZES = "sizes.json"  # WebDataset builds: every shard's base name -> its rows, in each dataset folder


def shard_path(slug: str, number: int, suffix: str) -> str:
    """Shard `number` of a dataset: `<slug>/000000.parquet` or `<slug>/<slug>-000000.tar`. Tar base names are
    unique across datasets because WebDataset trainers (open_clip) count samples by base name in one sizes.json,
    the one in the folder of the first shard, whatever mix of datasets follows."""
    return f"{slug}/{number:06d}.parquet" if suffix == "parquet" else f"{slug}/{slug}-{number:06d}.{suffix}"


def shard_sizes(shards: list[dict]) -> dict[str, int]:
    """sizes.json of a WebDataset build: {base name: rows} of all its shards (manifest entries)."""
    return dict(sorted((s["path"].rsplit("/", 1)[-1], s["rows"]) for s in shards))


def key_prefix(slug: str, split: str = "train") -> str:
    """Train keys are `<slug>/<index>`; an eval split's `<slug>/<split>/<index>`, so the two never collide."""
    return f"{slug}/" if split == "train" else f"{slug}/{split}/"


def keys(prefix: str, index: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(pa.scalar(prefix), pc.cast(index, pa.string()), "")


def label_ids(source: Source, table: ClassTable, labels: pa.Array) -> pa.Array:
    """Class ids; a label column of class strings (SciMMIR's `class`) is looked up in the class list."""
    if pa.types.is_string(labels.type) or pa.types.is_large_string(labels.type):
        return pc.cast(pc.index_in(labels, value_set=pa.array(table.source_names)), pa.int64())
    return pc.cast(labels, pa.int64())


def _reason(label, image: bytes | None, n_classes: int) -> str:
    if not image:
        return "image missing or empty"
    if label is None:
        return "label missing or not in the class list"
    return f"label {label} outside the {n_classes} classes"


def train_rows(source: Source, table: ClassTable, chunk: pa.Table, file: str,
               split: str = "train") -> tuple[pa.Table, pa.Table, int]:
    """mieb-train rows of `chunk` (columns index, image, label[, caption]) of the source's `split`, the error
    rows (key, dataset_name, file, error), and how many rows the catalog drops (caltech101 background, from
    the train split only: an eval split is kept whole, as mteb scores it)."""
    n = len(table.class_name)
    ids = label_ids(source, table, chunk["label"])
    image_bytes = pc.struct_field(chunk["image"], "bytes")
    ok_label = pc.fill_null(pc.and_(pc.greater_equal(ids, 0), pc.less(ids, n)), False)
    ok_image = pc.fill_null(pc.greater(pc.binary_length(image_bytes), 0), False)
    ok = pc.and_(ok_label, ok_image)

    bad = pc.invert(ok)
    prefix = key_prefix(source.slug, split)
    errors = pa.table({"key": keys(prefix, pc.filter(chunk["index"], bad))}) if pc.any(bad).as_py() else None
    if errors is not None:
        reasons = [_reason(label, image, n) for label, image in
                   zip(pc.filter(chunk["label"], bad).to_pylist(), pc.filter(image_bytes, bad).to_pylist())]
        errors = pa.table({"key": errors["key"], "dataset_name": [source.slug] * len(reasons),
                           "file": [file] * len(reasons), "error": reasons}, schema=ERROR_SCHEMA)
    else:
        errors = ERROR_SCHEMA.empty_table()

    safe_ids = pc.fill_null(pc.if_else(ok, ids, 0), 0)
    keep = pc.and_(ok, pc.take(pa.array(table.keep), safe_ids)) if split == "train" else ok
    dropped = pc.sum(pc.and_(ok, pc.invert(keep))).as_py() or 0
    if not pc.all(keep).as_py():  # filtering copies the image bytes: only when a row goes
        chunk, safe_ids = chunk.filter(keep), pc.filter(safe_ids, keep)

    text = pc.take(pa.array(table.text, pa.string()), safe_ids)
    if source.caption_column:
        own = clean_captions(chunk["caption"])
        text = pc.if_else(pc.fill_null(pc.not_equal(own, ""), False), own, text)
    rows = pa.Table.from_arrays([
        keys(prefix, chunk["index"]),
        chunk["image"],
        text,
        # a source whose caption is its own text has no class list for captions: label -1
        pa.array([-1] * len(chunk), pa.int64()) if source.caption_column else safe_ids,
        pc.take(pa.array(table.class_name, pa.string()), safe_ids),
        pa.array([source.slug] * len(chunk), pa.string()),
    ], schema=SCHEMA)
    return rows, errors, dropped
