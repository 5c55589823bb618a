"""Group-max top-k over any corpus: for every query, the k groups whose best item scores highest.

corpus shards -> split tasks (normalise; rows to partition group % P, so no group spans two partitions)
-> one merge task per partition (its rows sorted by group: each group one contiguous run) -> score tasks,
one per query block x partition (cosines in chunks cut at group boundaries, one `reduceat` per chunk
gives every group's max, the block's top-k) -> exact top-k merge across partitions.

Memory is bounded by choice, not by the corpus: a score task holds its partition (corpus / P, read
zero-copy from Ray's object store, which spills to disk when full), one chunk of scores and a query
block's group maxima (query_block x n_groups / P floats).
"""

from __future__ import annotations

import numpy as np
import ray

from mieb_ray.io import embeddings
from mieb_ray.retrieval.groupmax import NEG, merge_topk, normalize, topk_of

CHUNK_ROWS = 8192  # corpus rows scored at once (cut at the next group boundary)


def _split(vectors: np.ndarray, groups: np.ndarray, partitions: int) -> list[tuple[np.ndarray, np.ndarray]]:
    vectors = normalize(vectors)
    part = groups % partitions
    return [(vectors[part == p], groups[part == p]) for p in range(partitions)]


@ray.remote(num_cpus=1)
def _split_shard(uri: str, group_column: str, partitions: int):
    table = embeddings.open_shard(uri)
    pieces = _split(embeddings.matrix(table), table[group_column].to_numpy().astype(np.int64), partitions)
    return pieces if partitions > 1 else pieces[0]


@ray.remote(num_cpus=1)
def _split_arrays(vectors: np.ndarray, groups: np.ndarray, partitions: int):
    pieces = _split(vectors, groups, partitions)
    return pieces if partitions > 1 else pieces[0]


@ray.remote(num_cpus=1)
def _merge(*pieces):
    """A partition's rows sorted by group, with the group id and start row of each run."""
    vectors = np.concatenate([v for v, _ in pieces])
    groups = np.concatenate([g for _, g in pieces])
    order = np.argsort(groups, kind="stable")
    vectors, groups = vectors[order], groups[order]
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]]) if len(groups) else np.zeros(0, np.int64)
    return vectors, groups[starts], starts


@ray.remote(num_cpus=1)
def _score(queries: np.ndarray, partition, k: int):
    import torch

    torch.set_num_threads(1)  # one task per CPU: Ray, not torch, spreads the work
    vectors, group_ids, starts = partition
    maxima = np.full((len(group_ids), len(queries)), NEG, dtype=np.float32)  # group x query: rows written whole
    bounds = np.r_[starts, len(vectors)]
    sizes = np.diff(bounds)
    # one scores buffer for every chunk: a fresh 30 MB array per chunk costs page faults, not arithmetic
    buffer = torch.empty((max(CHUNK_ROWS, int(sizes.max()) if len(sizes) else 0), len(queries)))
    q = torch.from_numpy(queries)
    g = 0
    while g < len(group_ids):  # chunks of whole groups, about CHUNK_ROWS rows each
        end = max(g + 1, int(np.searchsorted(bounds, bounds[g] + CHUNK_ROWS, side="right")) - 1)
        lo, hi = bounds[g], bounds[end]
        if hi - lo > len(buffer):  # one group larger than the buffer
            buffer = torch.empty((hi - lo, len(queries)))
        scores = buffer[:hi - lo]
        torch.mm(torch.from_numpy(vectors[lo:hi]), q.T, out=scores)  # (rows, queries) cosines
        np.maximum.reduceat(scores.numpy(), starts[g:end] - lo, axis=0, out=maxima[g:end])
        g = end
    top, local = topk_of(np.ascontiguousarray(maxima.T), k)
    return top, group_ids[local] if len(group_ids) else local


def group_topk(queries: np.ndarray, k: int = 10, shards: list[str] | None = None, group_column: str | None = None,
               chunks: list[tuple[np.ndarray, np.ndarray]] | None = None, query_block: int = 1024,
               partitions: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(Q, k) scores and group ids, best first, ties by group id. Groups are integers.

    The corpus is either embedding shards (`shards` URIs, group ids in their `group_column`) or in-memory
    `chunks` of (vectors, groups)."""
    if shards is not None:
        split = [_split_shard.options(num_returns=partitions).remote(u, group_column, partitions) for u in shards]
    else:
        split = [_split_arrays.options(num_returns=partitions).remote(v, g, partitions) for v, g in chunks]
    parts = [_merge.remote(*[refs[p] if partitions > 1 else refs for refs in split]) for p in range(partitions)]
    queries = normalize(queries)
    results = []
    for lo in range(0, len(queries), query_block):
        block = ray.put(queries[lo:lo + query_block])
        results.append([_score.remote(block, part, k) for part in parts])
    merged = [merge_topk([r for r in ray.get(refs) if r[0].shape[1]], k) for refs in results]
    return np.concatenate([s for s, _ in merged]), np.concatenate([i for _, i in merged])
