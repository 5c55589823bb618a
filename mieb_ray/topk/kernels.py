"""The top-k engine's rules as pure functions on numpy arrays (torch for the arithmetic; no Ray).

A corpus row is (normalised float32 vector, int64 group id, int64 doc id). Rows split into P partitions by
`group % P`, so a group lives in one partition whole; a partition is sorted by (group, doc), each group one
contiguous run. Scoring a block of queries against a partition gives every group's max cosine, reduced to:

  TopK(k)        each query's k best groups (ties by group id); partitions merge exactly by merge_topk.
  TopRows(k)     the same where every row is its own group, without the group maxima pass.
  CandidateMax   each query's max over its own C candidate groups, only over the docs of its pool, with the doc
                 achieving it (ties: smallest doc); partitions merge by elementwise max.

Cosines are float32 dot products of rows L2-normalised by groupmax.normalize (mteb's cos_sim), one torch.mm
per chunk of whole groups. torch is imported by the functions that use it: a Ray task that only moves rows
(a partition task, the eval's metadata tasks) skips its 1.3 s import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from mieb_ray.topk.groupmax import NEG, merge_topk, topk_of

if TYPE_CHECKING:
    import torch

CHUNK_ROWS = 8192  # corpus rows scored at once (cut at the next group boundary)


class Rows(NamedTuple):
    """Rows of the corpus: vectors (n, d) float32 normalised, group (n,) int64, doc (n,) int64."""

    vectors: np.ndarray
    group: np.ndarray
    doc: np.ndarray


class Partition(NamedTuple):
    """Rows sorted by (group, doc); group run r is rows bounds[r]:bounds[r + 1] of group group_ids[r]."""

    vectors: np.ndarray  # (n, d) float32
    docs: np.ndarray  # (n,) int64
    group_ids: np.ndarray  # (g,) int64, ascending
    bounds: np.ndarray  # (g + 1,) int64


def normalize_(vectors: np.ndarray) -> np.ndarray:
    """L2-normalise float32 rows in place, bit-equal to groupmax.normalize (torch's F.normalize: the same norm,
    clamped, then one division)."""
    import torch

    v = torch.from_numpy(vectors)
    v.div_(v.norm(2, 1, keepdim=True).clamp_min(1e-12))
    return vectors


def split(blocks: list[tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]], partitions: int) -> list[Rows]:
    """The rows of some blocks split into P pieces by group % P, normalised float32, in block then row order.

    A block is (vectors (n, d) float16|float32, rows: the row of `vectors` of each labelled row or None for all
    of them, group, doc). Each vector is written once, straight into its piece, then normalised in place."""
    parts = [group % partitions for _, _, group, _ in blocks]
    counts = sum((np.bincount(p, minlength=partitions) for p in parts), np.zeros(partitions, np.int64))
    dim = blocks[0][0].shape[1] if blocks else 0
    out = [Rows(np.empty((c, dim), np.float32), np.empty(c, np.int64), np.empty(c, np.int64)) for c in counts]
    filled = np.zeros(partitions, np.int64)
    for (vectors, rows, group, doc), part in zip(blocks, parts):
        order = np.argsort(part, kind="stable")
        for p, idx in enumerate(np.split(order, np.cumsum(np.bincount(part, minlength=partitions))[:-1])):
            a, b = filled[p], filled[p] + len(idx)
            source = idx if rows is None else rows[idx]
            if vectors.dtype == np.float32:
                np.take(vectors, source, axis=0, out=out[p].vectors[a:b])
            else:
                out[p].vectors[a:b] = vectors[source]
            out[p].group[a:b], out[p].doc[a:b] = group[idx], doc[idx]
            filled[p] = b
    for piece in out:
        normalize_(piece.vectors)
    return out


def build_partition(pieces: list[Rows]) -> Partition:
    """One partition from its pieces, sorted by (group, doc). The vectors are written once, each piece
    straight to its sorted place (pieces may be read-only views of Ray's object store)."""
    if not pieces:  # a corpus without shards
        empty = np.zeros(0, np.int64)
        return Partition(np.zeros((0, 0), np.float32), empty, empty, np.zeros(1, np.int64))
    group = np.concatenate([p.group for p in pieces])
    doc = np.concatenate([p.doc for p in pieces])
    order = np.lexsort((doc, group))
    place = np.empty_like(order)
    place[order] = np.arange(len(order))
    vectors = np.empty((len(order), pieces[0].vectors.shape[1]), np.float32)
    offset = 0
    for p in pieces:
        vectors[place[offset:offset + len(p.doc)]] = p.vectors
        offset += len(p.doc)
    group = group[order]
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if len(group) else np.zeros(0, np.int64)
    return Partition(vectors, doc[order], group[starts], np.r_[starts, len(group)].astype(np.int64))


# ---------------------------------------------------------------------------------------------- scoring


def _chunks(bounds: np.ndarray, chunk_rows: int):
    """(first run, end run) of consecutive group runs holding about chunk_rows rows (at least one run)."""
    g, n_runs = 0, len(bounds) - 1
    while g < n_runs:
        end = max(g + 1, int(np.searchsorted(bounds, bounds[g] + chunk_rows, side="right")) - 1)
        yield g, end
        g = end


def index_of(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Position of each value in `keys` (distinct int64), -1 where absent. Dense non-negative keys (BioVITA's
    corpus positions, taxon ids) use a table, one gather; others (shard << 32 | row) a binary search, ~15x
    slower for a small partition."""
    if not len(keys) or not len(values):
        return np.full(len(values), -1, np.int64)
    top = int(keys.max())
    if keys.min() >= 0 and top < 4 * len(keys) + 4096:
        table = np.full(top + 2, -1, np.int64)  # the last entry answers every value out of range
        table[keys] = np.arange(len(keys))
        if values.min() < 0 or values.max() > top:
            values = np.clip(values, -1, top + 1)
        return table[values]
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    at = np.minimum(np.searchsorted(ordered, values), len(keys) - 1)
    return np.where(ordered[at] == values, order[at], -1)


class PoolMask:
    """The (row, query) pairs a query may score: its pool docs found in this partition."""

    def __init__(self, part: Partition, indptr: np.ndarray, docs: np.ndarray):
        self.n_queries, self.n_rows, self._by_row = len(indptr) - 1, len(part.docs), False
        self.query = np.repeat(np.arange(self.n_queries, dtype=np.int64), np.diff(indptr))
        self.rows = index_of(part.docs, docs)
        found = self.rows >= 0
        if not found.all():  # a pool doc in another partition
            self.rows, self.query = self.rows[found], self.query[found]

    def blocked(self, lo: int, hi: int) -> torch.Tensor | None:
        """(hi - lo, queries) bool of rows lo:hi, True where the query may not score the row; None when no
        pair falls there. (A float32 mask of 0 and -inf to add is 3x faster to apply, but 4x the fresh
        memory, and page faults make it slower to build than it saves.)"""
        import torch

        if lo == 0 and hi >= self.n_rows:  # the whole partition in one chunk: every pair, no sort
            rows, query = self.rows, self.query
        else:
            if not self._by_row:  # sorted by row once, then each chunk's pairs are one slice
                order = np.argsort(self.rows, kind="stable")
                self.rows, self.query, self._by_row = self.rows[order], self.query[order], True
            a, b = np.searchsorted(self.rows, [lo, hi])
            rows, query = self.rows[a:b] - lo, self.query[a:b]
        if not len(rows):
            return None
        mask = np.ones((hi - lo, self.n_queries), bool)
        mask.reshape(-1)[rows * self.n_queries + query] = False  # numpy's flat scatter: 2x torch's index_put
        return torch.from_numpy(mask)


def group_maxima(part: Partition, queries: np.ndarray, pool: PoolMask | None = None, argmax: bool | int = False,
                 chunk_rows: int = CHUNK_ROWS) -> tuple[np.ndarray, np.ndarray | None]:
    """(groups, q) max cosine of every group run for every query (-inf: no row may score), and with
    `argmax` the row achieving it (the first, i.e. the smallest doc, on ties; -1 where -inf): for every query
    (True), or for the first `argmax` queries (an int; the others -1), a fifth of the work when few are wanted."""
    import torch

    n_groups, q = len(part.group_ids), len(queries)
    m = q if argmax is True else min(int(argmax), q)
    maxima = torch.full((n_groups, q), float("-inf"))  # group x query: a chunk's runs are rows of it
    best_row = torch.full((n_groups, q), -1, dtype=torch.int64) if argmax else None
    bounds = part.bounds
    sizes = np.diff(bounds)
    # one scores buffer for every chunk: a fresh 30 MB array per chunk costs page faults, not arithmetic
    buffer = torch.empty((max(chunk_rows, int(sizes.max()) if len(sizes) else 0), q))
    qt = torch.from_numpy(queries).T
    run_of_row = torch.from_numpy(np.repeat(np.arange(n_groups), sizes))
    for g, end in _chunks(bounds, chunk_rows):
        lo, hi = int(bounds[g]), int(bounds[end])
        blocked = pool.blocked(lo, hi) if pool is not None else None
        if pool is not None and blocked is None:
            continue  # no query's pool reaches these rows
        scores = buffer[:hi - lo]
        torch.mm(torch.from_numpy(part.vectors[lo:hi]), qt, out=scores)  # (rows, queries) cosines
        if blocked is not None:
            scores.masked_fill_(blocked, float("-inf"))
        # each run of rows (one group) into its row of maxima: scatter_reduce is ~10x numpy's reduceat here
        index = (run_of_row[lo:hi] - g).unsqueeze(1).expand(-1, q)
        maxima[g:end].scatter_reduce_(0, index, scores, "amax")
        if m:  # the first row of its run equal to the run's max: runs are sorted by doc
            hit = scores[:, :m] == maxima[g:end, :m].gather(0, index[:, :m])
            rows = torch.arange(lo, hi).unsqueeze(1).expand(-1, m)
            best = torch.full((end - g, m), hi, dtype=torch.int64)
            best.scatter_reduce_(0, index[:, :m], torch.where(hit, rows, hi), "amin")
            best_row[g:end, :m] = best
    maxima = maxima.numpy()
    if best_row is not None:
        best_row = best_row.numpy()
        best_row[maxima == NEG] = -1
    return maxima, best_row


def top_rows(maxima: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per column of (groups, q) maxima, the k best values and their row ids, ties by row id: (q, k) each.
    torch.topk finds them; a column with a tie at its k-th value (where topk's choice is arbitrary) is
    redone by groupmax.topk_of."""
    import torch

    k = min(k, maxima.shape[0])
    m = torch.from_numpy(maxima)
    values, rows = torch.topk(m, k, dim=0)
    values, rows = values.T.numpy(), rows.T.numpy()
    order = np.lexsort((rows, -values), axis=1)  # ties inside the top k: by row id
    values, rows = np.take_along_axis(values, order, 1), np.take_along_axis(rows, order, 1)
    tied = np.flatnonzero((m >= torch.from_numpy(values[:, -1])).sum(0).numpy() > k) if k else []
    if len(tied):
        values[tied], rows[tied] = topk_of(np.ascontiguousarray(maxima[:, tied].T), k)
    return values, rows


# ---------------------------------------------------------------------------------------------- reducers


@dataclass(frozen=True)
class TopK:
    """Each query's k best groups: (q, k') scores and group ids, best first, ties by group id
    (k' = min(k, groups seen))."""

    k: int

    def score(self, part: Partition, queries: np.ndarray, data=None) -> tuple[np.ndarray, np.ndarray]:
        if not len(part.group_ids):
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        maxima, _ = group_maxima(part, queries)
        top, local = top_rows(maxima, self.k)
        return top, part.group_ids[local]

    def merge(self, parts: list) -> tuple[np.ndarray, np.ndarray]:
        return merge_topk(parts, self.k)


@dataclass(frozen=True)
class TopRows:
    """TopK(k) for a corpus whose every row is its own group (engine.ROWS): each query's k best rows, scored
    chunk by chunk as (q, rows) products and cut to k at once, without TopK's (groups x q) maxima."""

    k: int
    score_bytes: int = 256 << 20  # one chunk's (q, rows) float32 scores

    def score(self, part: Partition, queries: np.ndarray, data=None) -> tuple[np.ndarray, np.ndarray]:
        import torch

        n = len(part.docs)
        if not n:
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        q = torch.from_numpy(queries)
        chunk = min(n, max(256, self.score_bytes // (4 * max(len(queries), 1))))
        buffer = torch.empty(len(queries) * chunk)  # reused: a fresh array per chunk costs page faults
        parts = []
        for lo in range(0, n, chunk):
            rows = torch.from_numpy(part.vectors[lo:lo + chunk])
            scores = buffer[:len(queries) * len(rows)].view(len(queries), len(rows))
            torch.mm(q, rows.T, out=scores)  # (q, rows)
            values, cols = row_topk(scores, self.k)
            parts.append((values, part.group_ids[lo + cols]))  # one row per group: run r is row r
        return merge_topk(parts, self.k)

    def merge(self, parts: list) -> tuple[np.ndarray, np.ndarray]:
        return merge_topk(parts, self.k)


def row_topk(scores: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of (q, n) scores, the k best values and their column ids, ties by column id. torch.topk finds
    k + 1; a row whose k-th and (k+1)-th values tie (where topk's choice is arbitrary) is redone by topk_of."""
    import torch

    k = min(k, scores.shape[1])
    values, cols = torch.topk(scores, min(k + 1, scores.shape[1]), dim=1)
    values, cols = values.numpy(), cols.numpy()
    tied = np.flatnonzero(values[:, k - 1] == values[:, k]) if values.shape[1] > k and k else []
    values, cols = values[:, :k], cols[:, :k]
    order = np.lexsort((cols, -values), axis=1)  # ties inside the top k: by column id
    values, cols = np.take_along_axis(values, order, 1), np.take_along_axis(cols, order, 1)
    if len(tied):
        values[tied], cols[tied] = topk_of(scores[torch.from_numpy(tied)].numpy(), k)
    return values, cols


@dataclass(frozen=True)
class Candidates:
    """A query block's CandidateMax data: candidates (q, C) group ids (-1: a group with no docs); an
    optional pool per query as CSR (indptr (q + 1,), docs: each query's doc ids, ascending)."""

    candidates: np.ndarray
    indptr: np.ndarray | None = None
    docs: np.ndarray | None = None
    best_docs: int | None = None  # find the best doc for the first this many queries only (None: all)


@dataclass(frozen=True)
class CandidateMax:
    """Per query, the max score over each of its candidate groups ((q, C) float32, -inf where no doc scores)
    and the doc achieving it ((q, C) int64, smallest doc on ties, -1 where -inf)."""

    def score(self, part: Partition, queries: np.ndarray, data: Candidates) -> tuple[np.ndarray, np.ndarray]:
        cand = data.candidates
        scores, docs = np.full(cand.shape, NEG, np.float32), np.full(cand.shape, -1, np.int64)
        if not len(part.group_ids):
            return scores, docs
        pool = PoolMask(part, data.indptr, data.docs) if data.indptr is not None else None
        maxima, best_row = group_maxima(part, queries, pool,
                                        argmax=True if data.best_docs is None else data.best_docs)
        run = index_of(part.group_ids, cand.reshape(-1)).reshape(cand.shape)
        here = run >= 0
        query = np.broadcast_to(np.arange(len(cand))[:, None], cand.shape)
        scores[here] = maxima[run[here], query[here]]
        if best_row is not None:  # None: no query of this block wants its best doc
            rows = best_row[run[here], query[here]]
            docs[here] = np.where(rows >= 0, part.docs[rows], -1)
        return scores, docs

    @staticmethod
    def merge(parts: list) -> tuple[np.ndarray, np.ndarray]:
        scores, docs = parts[0]
        for s, d in parts[1:]:
            take = (s > scores) | ((s == scores) & (d >= 0) & ((docs < 0) | (d < docs)))
            scores, docs = np.where(take, s, scores), np.where(take, d, docs)
        return scores, docs


def batches(sizes: list[int], limit: int) -> list[tuple[int, int]]:
    """[start, end) runs of consecutive items of about `limit` total size each (at least one item each)."""
    out, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > limit:
            out.append((start, i))
            start, total = i, 0
        total += size
    return out + [(start, len(sizes))] if start < len(sizes) else out
