"""Group-max top-k over any corpus: for every query, the k groups whose best item scores highest.

corpus shards -> one task per partition reads every shard memory-mapped and keeps the rows with
group % P == p (so no group spans two partitions), normalised and sorted by group (each group one
contiguous run) -> score tasks,
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
PARTITION_BYTES = 256 << 20  # a partition's vectors: what one task holds (twice, while sorting it)


def _sorted_partition(pieces) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows (already normalised) sorted by group, with the group id and start row of each run."""
    vectors = np.concatenate([v for v, _ in pieces]) if pieces else np.zeros((0, 0), np.float32)
    groups = np.concatenate([g for _, g in pieces]) if pieces else np.zeros(0, np.int64)
    order = np.argsort(groups, kind="stable")
    vectors, groups = vectors[order], groups[order]
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]]) if len(groups) else np.zeros(0, np.int64)
    return vectors, groups[starts], starts


def _mine(vectors: np.ndarray, groups: np.ndarray, partition: int, partitions: int):
    rows = groups % partitions == partition
    return normalize(vectors[rows]), groups[rows]


@ray.remote(num_cpus=1)
def _partition_from_shards(uris: list[str], group_column: str, partition: int, partitions: int):
    """Partition p of the corpus, read shard by shard (memory-mapped) keeping rows with group % P == p."""
    pieces = []
    for uri in uris:
        table = embeddings.open_shard(uri)
        groups = table[group_column].to_numpy().astype(np.int64)
        pieces.append(_mine(embeddings.matrix(table), groups, partition, partitions))
    return _sorted_partition(pieces)


@ray.remote(num_cpus=1)
def _partition_from_chunks(chunk_refs: list, partition: int, partitions: int):
    return _sorted_partition([_mine(*ray.get(ref), partition, partitions) for ref in chunk_refs])


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
    row_group = torch.from_numpy(np.repeat(np.arange(len(group_ids)), sizes))  # each row's run number
    g = 0
    while g < len(group_ids):  # chunks of whole groups, about CHUNK_ROWS rows each
        end = max(g + 1, int(np.searchsorted(bounds, bounds[g] + CHUNK_ROWS, side="right")) - 1)
        lo, hi = bounds[g], bounds[end]
        if hi - lo > len(buffer):  # one group larger than the buffer
            buffer = torch.empty((hi - lo, len(queries)))
        scores = buffer[:hi - lo]
        torch.mm(torch.from_numpy(vectors[lo:hi]), q.T, out=scores)  # (rows, queries) cosines
        # each run of rows (one group) into its row of maxima: scatter_reduce is ~10x numpy's reduceat here
        index = (row_group[lo:hi] - g).unsqueeze(1).expand(-1, len(queries))
        torch.from_numpy(maxima[g:end]).scatter_reduce_(0, index, scores, "amax")
        g = end
    top, local = topk_of(np.ascontiguousarray(maxima.T), k)
    return top, group_ids[local] if len(group_ids) else local


def group_topk(queries: np.ndarray, k: int = 10, shards: list[str] | None = None, group_column: str | None = None,
               chunks: list[tuple[np.ndarray, np.ndarray]] | None = None, query_block: int = 1024,
               partitions: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(Q, k) scores and group ids, best first, ties by group id. Groups are integers.

    The corpus is either embedding shards (`shards` URIs, group ids in their `group_column`) or in-memory
    `chunks` of (vectors, groups). partitions: default one per PARTITION_BYTES of corpus."""
    if shards is not None:
        if partitions is None:
            partitions = _partitions(embeddings.open_shard(shards[0])["embedding"].nbytes * len(shards))  # estimate
        parts = [_partition_from_shards.remote(shards, group_column, p, partitions) for p in range(partitions)]
    else:
        if partitions is None:
            partitions = _partitions(sum(v.nbytes for v, _ in chunks))
        refs = [ray.put(chunk) for chunk in chunks]
        parts = [_partition_from_chunks.remote(refs, p, partitions) for p in range(partitions)]
    queries = normalize(queries)
    results = []
    for lo in range(0, len(queries), query_block):
        block = ray.put(queries[lo:lo + query_block])
        results.append([_score.remote(block, part, k) for part in parts])
    merged = [merge_topk([r for r in ray.get(refs) if r[0].shape[1]], k) for refs in results]
    return np.concatenate([s for s, _ in merged]), np.concatenate([i for _, i in merged])


def _partitions(corpus_bytes: int) -> int:
    return max(1, -(-corpus_bytes // PARTITION_BYTES))
