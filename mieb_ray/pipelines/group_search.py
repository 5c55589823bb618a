"""Group-max top-k over any corpus: for every query, the k groups whose best item scores highest.

The top-k engine (mieb_ray/topk) does the work: the corpus laid out once in group-aligned partitions, score
tasks per query block x partition, partial top-k lists merged exactly in a tree of merge tasks. Memory per
task: see mieb_ray/topk/engine.py.
"""

from __future__ import annotations

import numpy as np
import ray

from mieb_ray.topk import engine
from mieb_ray.topk.kernels import TopK


def group_topk(queries: np.ndarray, k: int = 10, shards: list[str] | None = None, group_column: str | None = None,
               chunks: list[tuple[np.ndarray, np.ndarray]] | None = None, query_block: int = 1024,
               partitions: int | None = None, stats: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(Q, k) scores and group ids, best first, ties by group id. Groups are non-negative integers.

    The corpus is either embedding shards (`shards` URIs, group ids in their `group_column`) or in-memory
    `chunks` of (vectors, groups). partitions: default one per engine.PARTITION_BYTES of corpus.
    stats: a dict to fill with the layout's statistics (rows, bytes read, ...)."""
    lay = engine.layout(shards, chunks=chunks, group_column=group_column, partitions=partitions)
    blocks = [queries[lo:lo + query_block] for lo in range(0, len(queries), query_block)]
    merged = ray.get(engine.search(lay, blocks, TopK(k)))
    if stats is not None:
        stats.update(lay.stats())
    if not merged:
        return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
    return np.concatenate([s for s, _ in merged]), np.concatenate([i for _, i in merged])
