"""Group-max retrieval rules, as pure functions: cosines, exact top-k of group maxima and their merge, and
BioVITA's ranking of candidates (mteb's ties). The scoring kernels that use them: mieb_ray/topk/kernels.py.

A group's score for a query is the max cosine over the group's items (a taxon's photos). Scores are
float32 cosines computed the way mteb's `cos_sim` does (L2-normalise with torch, then a matrix product).
Per-partition top-k lists merge exactly as long as no group spans two partitions.
"""

from __future__ import annotations

import warnings

import numpy as np

NEG = np.float32(-np.inf)
# memory-mapped shards and Ray objects are read-only; torch only reads them here
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def normalize(x: np.ndarray) -> np.ndarray:
    """float32 rows of unit length: torch.nn.functional.normalize(p=2, dim=1), as mteb's cos_sim."""
    import torch  # here, not at the top: a Ray task that only reads metadata skips torch's 1.3 s import

    return torch.nn.functional.normalize(torch.as_tensor(np.asarray(x), dtype=torch.float32), p=2, dim=1).numpy()


def cosines(queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """(q, d) float32 cosines of already normalised rows."""
    import torch

    return torch.mm(torch.from_numpy(queries), torch.from_numpy(docs).T).numpy()


def rank_of(best: np.ndarray, position: np.ndarray) -> np.ndarray:
    """1-based rank of candidate `position` per row, best score first, ties by candidate order
    (mteb: sorted(taxa, key=(-best, candidate index))); -inf candidates come last, in order."""
    mine = np.take_along_axis(best, position[:, None], axis=1)
    earlier = np.arange(best.shape[1])[None, :] < position[:, None]
    return 1 + (best > mine).sum(1) + ((best == mine) & earlier).sum(1)


def ranked(best: np.ndarray, k: int) -> np.ndarray:
    """(q, k) candidate positions of each row's top k, ties by candidate order."""
    order = np.lexsort((np.broadcast_to(np.arange(best.shape[1]), best.shape), -best), axis=1)
    return order[:, :k]


def topk_of(maxima: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(q, k) best values of each row and their column ids, ties by column id: only the columns at or
    above the row's k-th value are sorted, so this costs a partition, not a sort of every group."""
    k = min(k, maxima.shape[1])
    kth = -np.partition(-maxima, k - 1, axis=1)[:, k - 1:k]
    rows, cols = np.nonzero(maxima >= kth)  # row-major: columns ascending within a row
    cuts = np.searchsorted(rows, np.arange(1, len(maxima)))
    out_scores = np.empty((len(maxima), k), np.float32)
    out_ids = np.empty((len(maxima), k), np.int64)
    for r, ids in enumerate(np.split(cols, cuts)):
        values = maxima[r, ids]
        order = np.lexsort((ids, -values))[:k]
        out_scores[r], out_ids[r] = values[order], ids[order]
    return out_scores, out_ids


def merge_topk(parts: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of the union of per-block top-k lists (blocks hold disjoint groups)."""
    scores = np.concatenate([s for s, _ in parts], axis=1)
    ids = np.concatenate([i for _, i in parts], axis=1)
    return _sorted(scores, ids, min(k, scores.shape[1]))


def _sorted(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((ids, -scores), axis=1)[:, :k]  # score descending, then group id ascending
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
