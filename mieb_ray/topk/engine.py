"""The top-k engine on Ray: lay the corpus out once, score query blocks x partitions, merge in a tree.
The same tasks run inline in the driver, Ray never started, under tasks.using("local") (runtime/tasks.py):
what an eval does for a corpus of at most one partition when no cluster was asked for.

    shards ──► map tasks (a contiguous batch of about MAP_BYTES of shards each, every shard opened once:
               normalise, label rows with group and doc ids, split by group % P; `num_returns=P`)
           ──► P partition tasks (concatenate the pieces, sort by (group, doc))           = layout(...)
    query blocks × partitions ──► score tasks (group maxima reduced by TopK or CandidateMax)
           ──► per query block, a tree of merge tasks (fan-in FAN_IN) ──► one ref per block = search(...)

No center in the data path: the driver plans from file sizes and holds ObjectRefs and small statistics;
partitions stay in Ray's object store (which spills to disk), score tasks read them zero-copy. Rows are
labelled from an integer `group_column` of the shards (doc id = shard number << 32 | row; ROWS: each row is
its own group, its doc id) or by a KeyLookup held in the object store (key -> doc id, group id; rows whose key
it lacks are dropped, and the statistics count the keys that matched so the caller can name the missing ones
with missing_keys()).

Memory per task, in bytes (q = query block rows, G = groups in a partition, k, C = candidates per query;
partition bytes ~ corpus float32 bytes / P, P = ceil(corpus file bytes / PARTITION_BYTES) by default):
  map task        ~ 2 x MAP_BYTES for float32 shards: its shards memory-mapped (page cache, shared) + the float32
                  pieces it returns, each vector written once (x 4/itemsize for float16 shards); Ray then copies
                  the pieces into the object store
  partition task  ~ 2 x partition bytes: its pieces read zero-copy + the sorted partition it returns
  score task      ~ partition bytes (read zero-copy from the object store)
                    + 4·q·(CHUNK_ROWS + G) (one chunk's scores + the group maxima) + q·G (TopK's tie check)
                    + for CandidateMax: 8·q·G (best rows) + 10·q·CHUNK_ROWS (a chunk's pool mask and argmax)
                      + 16 x (pool pairs in the partition) + 8 x (rows in the partition)
  merge task      ~ (FAN_IN + 1) partial results of 12·q·k bytes (TopK) or 12·q·C (CandidateMax)
  driver          O(P x (map tasks + query blocks)) refs and small statistics, plus the final per-block results
                  it fetches (Q x k or Q x C)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray import storage
from mieb_ray.io import embeddings
from mieb_ray.runtime import tasks
from mieb_ray.topk.groupmax import normalize
from mieb_ray.topk.kernels import batches, build_partition, split

MAP_BYTES = 512 << 20  # shard bytes one map task reads
PARTITION_BYTES = 256 << 20  # corpus bytes per partition: what one score task holds
FAN_IN = 8  # partial results merged by one merge task
ROWS = "__row__"  # group_column for a corpus whose every row is its own group (group id = doc id)


@dataclass(frozen=True)
class KeyLookup:
    """key -> (doc id, group id), for corpora whose shards carry no group column."""

    keys: pa.Array  # string
    docs: np.ndarray  # int64
    groups: np.ndarray  # int64, >= 0


@dataclass
class Layout:
    """The laid-out corpus: refs to its P partitions, and refs to the map tasks' small statistics."""

    partitions: list
    corpus_bytes: int
    stat_refs: list
    matched_refs: list = field(default_factory=list)
    lookup: object = None
    _stats: dict | None = None

    def stats(self) -> dict:
        """rows (read), partitions, map_tasks, shards, dim, bytes_opened (shard files opened by the map tasks),
        corpus_bytes (the files' total), read_ratio (1.0: every shard opened once) and, with a lookup,
        matched (rows whose key is in it). Waits for the map tasks."""
        if self._stats is None:
            parts = tasks.get(self.stat_refs)
            total = {k: sum(p[k] for p in parts) for k in ("rows", "shards", "bytes_opened", "matched")}
            dims = {p["dim"] for p in parts if p["dim"] is not None}
            self._stats = {**total, "partitions": len(self.partitions), "map_tasks": len(parts),
                           "dim": dims.pop() if len(dims) == 1 else (sorted(dims) or None),
                           "corpus_bytes": self.corpus_bytes,
                           "read_ratio": total["bytes_opened"] / self.corpus_bytes if self.corpus_bytes else 1.0}
        return self._stats


def default_partitions(corpus_bytes: int) -> int:
    return max(1, -(-corpus_bytes // PARTITION_BYTES))


def layout(shards: list[str] | None = None, *, chunks: list | None = None, group_column: str | None = None,
           lookup: KeyLookup | object | None = None, partitions: int | None = None,
           map_bytes: int = MAP_BYTES) -> Layout:
    """Lay out embedding `shards` (labelled by `group_column` or `lookup`), or in-memory `chunks` of
    (vectors, groups) (refs or tuples), in P group-aligned partitions. Returns at once."""
    if (shards is None) == (chunks is None) or (shards is not None and (group_column is None) == (lookup is None)):
        raise ValueError("give shards with group_column or lookup, or chunks")
    if shards is not None:
        sizes = storage.file_sizes(shards) if shards else []
        corpus_bytes = sum(sizes)
        partitions = partitions or default_partitions(corpus_bytes)
        if lookup is not None and not tasks.is_ref(lookup):
            lookup = tasks.put(lookup)
        mapper = _map_shards.options(num_returns=partitions + 2)
        outs = [mapper.remote(shards[a:b], a, partitions, group_column, lookup)
                for a, b in batches(sizes, map_bytes)]
    else:
        corpus_bytes = 0
        partitions = partitions or default_partitions(sum(c[0].nbytes for c in chunks if isinstance(c, tuple)))
        mapper = _map_chunk.options(num_returns=partitions + 2)
        outs = [mapper.remote(_ref(c), n, partitions)
                for n, c in enumerate(chunks)]
    parts = [_partition.remote(*(out[2 + p] for out in outs)) for p in range(partitions)]
    return Layout(parts, corpus_bytes, [out[0] for out in outs], [out[1] for out in outs] if lookup is not None
                  else [], lookup)


def missing_keys(lay: Layout, limit: int = 5) -> tuple[int, list[str], int]:
    """For a lookup layout: how many lookup keys no shard holds, the first `limit` of them (in doc order),
    and how many keys more than one row holds."""
    return tasks.get(_missing.remote(lay.lookup, limit, *lay.matched_refs))


def search(lay: Layout, query_blocks: list, reducer, block_data: list | None = None, fan_in: int = FAN_IN) -> list:
    """One ref per query block to its reduced result over the whole corpus. query_blocks: (q, d) float arrays
    or refs to them (normalised in the score tasks); block_data: per block, the reducer's data (e.g.
    kernels.Candidates) or a ref to it."""
    out = []
    for i, block in enumerate(query_blocks):
        block = _ref(block)
        data = None if block_data is None else _ref(block_data[i])
        parts = [_score.remote(part, block, reducer, data) for part in lay.partitions]
        while len(parts) > 1:  # a tree: no task holds more than fan_in partial results
            parts = [_merge.remote(reducer, *parts[a:a + fan_in]) if len(parts[a:a + fan_in]) > 1 else parts[a]
                     for a in range(0, len(parts), fan_in)]
        out.append(parts[0])
    return out


def _ref(x):
    return x if tasks.is_ref(x) else tasks.put(x)


# ---------------------------------------------------------------------------------------------- tasks


def _stats(rows: int, shards: int, bytes_opened: int, dim: int | None, matched: int = 0) -> dict:
    return {"rows": rows, "shards": shards, "bytes_opened": bytes_opened, "dim": dim, "matched": matched}


@tasks.remote(num_cpus=1, torch_threads=1)
def _map_shards(uris: list[str], first: int, partitions: int, group_column: str | None, lookup: KeyLookup | None):
    """Shards first, first + 1, ... each opened once: its rows normalised, labelled, split by group % P."""
    tables = [embeddings.open_shard(u) for u in uris]
    dim = embeddings.common_dim(tables, storage.display(uris[0].rsplit("/", 1)[0])) if tables else None
    opened = sum(storage.file_sizes(uris))
    if lookup is not None:  # one hash of the lookup for the whole batch
        at = pc.fill_null(pc.index_in(pa.chunked_array([c for t in tables for c in t["key"].chunks],
                                                       pa.string()), value_set=lookup.keys), -1).to_numpy()
        cuts = np.cumsum([t.num_rows for t in tables])[:-1]
        at = np.split(at.astype(np.int64), cuts)
    blocks, matched = [], []
    for n, table in enumerate(tables):
        if lookup is None:
            docs = ((first + n) << 32) | np.arange(table.num_rows, dtype=np.int64)
            group = docs if group_column == ROWS else table[group_column].to_numpy().astype(np.int64)
            blocks.append((embeddings.matrix(table, dim), None, group, docs))
        else:
            keep = np.flatnonzero(at[n] >= 0)
            matched.append(at[n][keep])
            blocks.append((embeddings.matrix(table, dim), keep, lookup.groups[at[n][keep]],
                           lookup.docs[at[n][keep]]))
    matched = np.concatenate(matched) if matched else np.zeros(0, np.int64)
    stats = _stats(sum(t.num_rows for t in tables), len(uris), opened, dim, len(matched))
    return [stats, matched if lookup is not None else None, *split(blocks, partitions)]


@tasks.remote(num_cpus=1, torch_threads=1)
def _map_chunk(chunk: tuple[np.ndarray, np.ndarray], number: int, partitions: int):
    vectors, groups = chunk
    groups = np.asarray(groups, np.int64)
    blocks = [(np.asarray(vectors), None, groups, (number << 32) | np.arange(len(groups), dtype=np.int64))]
    return [_stats(len(groups), 0, 0, vectors.shape[1]), None, *split(blocks, partitions)]


@tasks.remote(num_cpus=1)
def _partition(*pieces):
    return build_partition(list(pieces))


@tasks.remote(num_cpus=1, torch_threads=1)
def _score(part, queries: np.ndarray, reducer, data):
    return reducer.score(part, normalize(queries), data)


@tasks.remote(num_cpus=1)
def _merge(reducer, *parts):
    return reducer.merge(list(parts))


@tasks.remote(num_cpus=1)
def _missing(lookup: KeyLookup, limit: int, *matched):
    counts = np.bincount(np.concatenate(matched) if matched else np.zeros(0, np.int64), minlength=len(lookup.docs))
    gone = np.flatnonzero(counts == 0)
    gone = gone[np.argsort(lookup.docs[gone], kind="stable")]
    return len(gone), lookup.keys.take(pa.array(gone[:limit])).to_pylist(), int((counts > 1).sum())
