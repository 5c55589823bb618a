"""The rows of a task's splits that the evals which fit a model read (the linear probe, clustering): labels read
from the source splits, and image embeddings gathered by key from embed outputs, each shard read once.

labels    a task per read unit of a split: the (index, label) of its rows, labels as the source holds them
          (mteb's label column: class ids, or names), or their captions; `in_order` lays them out by row index
vectors   a task per batch of image-embedding shards: the rows keyed as a wanted train row (`<slug>/<index>`, as
          mieb-train keys it) or as an eval row (`<slug>/<split>/<index>`) of a chosen task; every other key is
          ignored
gather    a task per task: its wanted train rows and its eval split in order, from every block, each exactly once,
          and a one-line error naming the keys that are missing
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray import storage
from mieb_ray.errors import UserError
from mieb_ray.io import embeddings, reader
from mieb_ray.runtime import tasks
from mieb_ray.sources import by_slug


@tasks.remote(num_cpus=1)
def labels(unit: reader.Unit, column: str = "label") -> tuple[np.ndarray, list]:
    """(index, value) of one read unit's rows: labels as the source holds them (ints, or names); or, for column
    "caption", each row's caption text (a null one is "")."""
    index, values = [], []
    for chunk in reader.read(unit, [reader.source_columns(by_slug(unit.source))[column]]):
        index.append(chunk["index"].to_numpy())
        values += chunk[column].to_pylist()
    if column == "caption":
        values = ["" if v is None else v for v in values]
    return (np.concatenate(index) if index else np.zeros(0, np.int64)), values


@tasks.remote(num_cpus=1, num_returns=2)
def vectors(uris: list[str], wanted: list[tuple[str, str, np.ndarray]]):
    """One batch of shards, each opened once: (vectors, meta) of the rows a chosen task needs. wanted: per task
    (train prefix, eval prefix, the sorted train indices it samples). meta: per row its task, whether it is an eval
    row, and its index; the shards' dims and rows."""
    vectors, task_of, is_eval, index, dims, rows = [], [], [], [], set(), 0
    for uri in uris:
        table = embeddings.open_shard(uri)
        rows += table.num_rows
        if not table.num_rows:
            continue
        dims |= {embeddings.dim(table)} - {None}
        keys = table["key"].combine_chunks()
        matrix = embeddings.matrix(table)
        for t, (train_prefix, eval_prefix, union) in enumerate(wanted):
            for evaluating, prefix in ((False, train_prefix), (True, eval_prefix)):
                rest = pc.utf8_slice_codeunits(keys, len(prefix))
                mine = pc.and_(pc.starts_with(keys, prefix), pc.match_substring_regex(rest, r"^\d+$"))
                mine = mine.to_numpy(zero_copy_only=False)
                if not mine.any():
                    continue
                idx = pc.cast(pc.filter(rest, pa.array(mine)), pa.int64()).to_numpy()
                rows_at = np.flatnonzero(mine)
                if not evaluating:  # of the train rows, only those drawn
                    drawn = np.isin(idx, union)
                    idx, rows_at = idx[drawn], rows_at[drawn]
                vectors.append(matrix[rows_at].astype(np.float32))
                task_of.append(np.full(len(idx), t, np.int32))
                is_eval.append(np.full(len(idx), evaluating))
                index.append(idx)
    d = min(dims) if dims else 0
    meta = {"dims": sorted(dims), "rows": rows,
            "task": np.concatenate(task_of) if task_of else np.zeros(0, np.int32),
            "eval": np.concatenate(is_eval) if is_eval else np.zeros(0, bool),
            "index": np.concatenate(index) if index else np.zeros(0, np.int64)}
    return (np.concatenate(vectors) if vectors else np.zeros((0, d), np.float32)), meta


@tasks.remote(num_cpus=1, num_returns=2)
def gather(t: int, name: str, keys: tuple[str, str], union: np.ndarray, n_eval: int, where: str, *blocks):
    """Task t's drawn train rows (in `union` order) and its eval split (in index order), each row exactly once;
    one line naming the keys that are missing or doubled."""
    metas, vectors = blocks[1::2], blocks[0::2]
    out = []
    for evaluating, wanted in ((False, union), (True, np.arange(n_eval))):
        picks = []  # (block, its rows of this side): copied straight into place, so the task holds one copy
        for meta, block in zip(metas, vectors):
            rows = np.flatnonzero((meta["task"] == t) & (meta["eval"] == evaluating))
            if len(rows):
                picks.append((block, rows, meta["index"][rows]))
        idx = np.concatenate([p[2] for p in picks]) if picks else np.zeros(0, np.int64)
        where_in = np.searchsorted(wanted, idx)
        known = (where_in < len(wanted)) & (wanted[np.minimum(where_in, len(wanted) - 1)] == idx) if len(wanted) \
            else np.zeros(len(idx), bool)
        counts = np.bincount(where_in[known], minlength=len(wanted))
        prefix, what = (keys[1], "eval images") if evaluating else (keys[0], "train rows it samples")
        missing = np.flatnonzero(counts == 0)
        if len(missing):
            shown = ", ".join(repr(f"{prefix}{wanted[i]}") for i in missing[:5])
            raise UserError(f"{name}: {len(missing):,} of the {len(wanted):,} {what} have no embedding in {where} "
                            f"(e.g. {shown})")
        if (counts > 1).any():
            raise UserError(f"{where} holds {int((counts > 1).sum()):,} duplicate {name} keys")
        ordered = np.empty((len(wanted), picks[0][0].shape[1] if picks else 0), np.float32)
        start = 0
        for block, rows, _ in picks:
            place, keep = where_in[start:start + len(rows)], known[start:start + len(rows)]
            ordered[place[keep]] = block[rows[keep]]
            start += len(rows)
        out.append(ordered)
    return out[0], out[1]


def in_order(name: str, split: str, parts: list[tuple[np.ndarray, list]], sources: str) -> list:
    """A split's labels by row index, every row once."""
    index = np.concatenate([i for i, _ in parts]) if parts else np.zeros(0, np.int64)
    labels = [label for _, ls in parts for label in ls]
    n = int(index.max()) + 1 if len(index) else 0
    out: list = [None] * n
    for i, label in zip(index.tolist(), labels):
        out[i] = label
    missing = [i for i, label in enumerate(out) if label is None]
    if len(index) != n or missing:
        raise UserError(f"{name}: rows {', '.join(map(str, missing[:5]))} of the {split} split have no label in "
                        f"{storage.display(sources)}")
    return out
