"""How a chunk of a source becomes mieb-train rows (their schema and keys: formats.py).

Captions are a look-up per label in the source's ClassTable (pyarrow `take`), never string work per
row; only SciMMIR, whose caption is each row's own text, cleans strings, vectorised.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray.captions import ClassTable, clean_captions
from mieb_ray.formats import TRAIN_ERROR_SCHEMA, TRAIN_SCHEMA, key_prefix
from mieb_ray.sources import Source


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
                           "file": [file] * len(reasons), "error": reasons}, schema=TRAIN_ERROR_SCHEMA)
    else:
        errors = TRAIN_ERROR_SCHEMA.empty_table()

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
    ], schema=TRAIN_SCHEMA)
    return rows, errors, dropped
