"""The top-k engine's pure kernels (mieb_ray/topk/kernels.py, groupmax.py) against brute force, ties included:
partitions, TopK and its merge, CandidateMax over pools, TopRows, mteb's tie order of candidate ranks. Exact
results on lattice vectors (every cosine exact in float32 on any CPU: support/numerics.py)."""

from __future__ import annotations

import numpy as np
import pytest
from support import topk
from support.topk import brute_candidates, brute_topk, csr

from mieb_ray.topk.groupmax import merge_topk, normalize, rank_of, ranked
from mieb_ray.topk.kernels import (
    CandidateMax,
    Candidates,
    PoolMask,
    TopK,
    TopRows,
    batches,
    build_partition,
    group_maxima,
    index_of,
    split,
    top_rows,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def corpus():
    return topk.corpus()


@pytest.fixture(scope="module")
def tied():
    return topk.tied()


def partitions(docs, groups, n):
    """The corpus in n group-aligned partitions, as the engine lays it out (doc id = row)."""
    return [build_partition([piece]) for piece in
            split([(docs, None, np.asarray(groups, np.int64), np.arange(len(docs)))], n)]


def test_split_and_partition_keep_every_row_group_aligned(corpus):
    _, docs, groups = corpus
    doc_ids = np.arange(len(docs))[::-1].copy()  # doc ids count down the rows
    blocks = [(docs[i:i + 700], None, groups[i:i + 700], doc_ids[i:i + 700]) for i in range(0, len(docs), 700)]
    parts = [build_partition([piece]) for piece in split(blocks, 3)]
    assert sum(len(p.docs) for p in parts) == len(docs)
    normalised = normalize(docs)
    for p, part in enumerate(parts):
        assert (part.group_ids % 3 == p).all() and (np.diff(part.group_ids) > 0).all()
        for r, g in enumerate(part.group_ids):
            run = slice(part.bounds[r], part.bounds[r + 1])
            assert (np.diff(part.docs[run]) > 0).all()  # sorted by doc within a group
            source = len(docs) - 1 - part.docs[run]
            assert np.array_equal(part.vectors[run], normalised[source]) and (groups[source] == g).all()
    # a block with a row selection (the key lookup's): only those rows, float16 cast then normalised
    half = docs.astype(np.float16)
    pieces = split([(half, np.array([5, 1, 7]), np.array([4, 4, 3]), np.array([50, 10, 70]))], 2)
    assert [p.doc.tolist() for p in pieces] == [[50, 10], [70]]
    assert np.array_equal(pieces[0].vectors, normalize(half[[5, 1]]))
    assert batches([5, 5, 5, 20, 1, 1], 10) == [(0, 2), (2, 3), (3, 4), (4, 6)] and batches([], 10) == []


def test_top_rows_breaks_ties_by_row():
    maxima = np.array([[0.5, 0.1], [0.7, 0.1], [0.7, 0.2], [0.2, 0.1], [0.7, 0.1]], np.float32)
    values, rows = top_rows(maxima, 2)
    assert rows.tolist() == [[1, 2], [2, 0]] and values.tolist() == [[np.float32(0.7)] * 2, [np.float32(0.2),
                                                                                          np.float32(0.1)]]
    assert top_rows(maxima, 9)[1].tolist() == [[1, 2, 4, 0, 3], [2, 0, 1, 3, 4]]


def test_kernels_match_brute_force_with_ties(tied):
    queries, docs, groups, doc_ids, candidates, pools = tied
    q = normalize(queries)
    halves = [build_partition([piece]) for piece in split([(docs, None, groups, doc_ids)], 2)]
    # TopK: each half's top-k, merged, equals the whole corpus' (ties by group id)
    want_s, want_g = brute_topk(queries, docs, groups, 7)
    got = TopK(7).merge([TopK(7).score(h, q) for h in halves])
    assert np.array_equal(got[1], want_g) and np.array_equal(got[0], want_s)
    # CandidateMax with pools, small chunks so that groups cross chunk ends
    indptr, pool_docs = csr(pools)
    data = Candidates(candidates, indptr, pool_docs)
    got_s, got_d = CandidateMax.merge([CandidateMax().score(h, q, data) for h in halves])
    want_s, want_d = brute_candidates(queries, docs, groups, doc_ids, candidates, pools)
    assert np.array_equal(got_s, want_s) and np.array_equal(got_d, want_d)
    assert (got_d[3] == -1).all() and (got_s[3] == -np.inf).all()  # the empty pool
    # without pools every doc scores
    got_s, got_d = CandidateMax.merge([CandidateMax().score(h, q, Candidates(candidates)) for h in halves])
    want_s, want_d = brute_candidates(queries, docs, groups, doc_ids, candidates, None)
    assert np.array_equal(got_s, want_s) and np.array_equal(got_d, want_d)
    # chunking does not change a bit: chunks of 1 row (every run its own chunk) vs one chunk
    part = build_partition(split([(docs, None, groups, doc_ids)], 1))
    assert all(np.array_equal(a, b) for a, b in zip(group_maxima(part, q, argmax=True, chunk_rows=1),
                                                    group_maxima(part, q, argmax=True, chunk_rows=10 ** 6)))
    # nor with pools: one chunk takes every pool pair unsorted, small chunks take them sorted by row; and doc ids
    # far apart (shard << 32 | row: found by binary search, not a table) find the same pairs
    pool = dict(indptr=indptr, docs=pool_docs)
    want = group_maxima(part, q, PoolMask(part, **pool), argmax=True, chunk_rows=10 ** 6)
    assert all(np.array_equal(a, b) for a, b in zip(
        group_maxima(part, q, PoolMask(part, **pool), argmax=True, chunk_rows=7), want))
    sparse = part._replace(docs=part.docs << 32)
    assert all(np.array_equal(a, b) for a, b in zip(
        group_maxima(sparse, q, PoolMask(sparse, indptr, pool_docs << 32), argmax=True), want))
    # the best rows of the first 3 queries only (the report's gallery): the same there, -1 for the others
    maxima, best = group_maxima(part, q, PoolMask(part, **pool), argmax=3, chunk_rows=7)
    assert np.array_equal(maxima, want[0]) and np.array_equal(best[:, :3], want[1][:, :3])
    assert (best[:, 3:] == -1).all() and (want[1][:, 3:] >= 0).any()


@pytest.mark.parametrize("spread", [1, 1 << 32])  # dense keys (a table) and sparse ones (a binary search)
def test_index_of_finds_each_value_or_minus_one(spread):
    rng = np.random.default_rng(3)
    keys = rng.permutation(50)[:30].astype(np.int64) * spread
    values = np.r_[keys[::-1], -1, -spread, 50 * spread, 10 ** 6 * spread, rng.integers(-5, 60, 200) * spread]
    want = [list(keys).index(v) if v in keys else -1 for v in values]
    assert index_of(keys, values).tolist() == want
    assert index_of(keys[:0], values).tolist() == [-1] * len(values)
    assert index_of(keys, values[:0]).tolist() == []


def test_top_rows_equals_topk_when_every_row_is_its_own_group(tied):
    """TopRows (the audit's reducer) = TopK over one-row groups, ties by row id included, across chunks and
    partitions."""
    queries, docs, _, doc_ids, _, _ = tied
    q = normalize(queries)
    halves = [build_partition([piece]) for piece in split([(docs, None, doc_ids, doc_ids)], 2)]
    want_s, want_g = brute_topk(queries, docs, doc_ids, 9)
    for score_bytes in (1, 1 << 30):  # chunks of 256 rows (two per partition here), or one chunk
        reducer = TopRows(9, score_bytes)
        got_s, got_g = reducer.merge([reducer.score(h, q) for h in halves])
        assert np.array_equal(got_g, want_g) and np.array_equal(got_s, want_s)


def test_block_functions_match_brute_force(corpus):
    queries, docs, groups = corpus
    want_s, want_g = brute_topk(queries, docs, groups, 10)
    (whole,) = partitions(docs, groups, 1)
    got_s, got_g = TopK(10).score(whole, normalize(queries))
    assert np.array_equal(got_g, want_g) and np.array_equal(got_s, want_s)
    # two halves of the groups merge exactly
    parts = [TopK(10).score(part, normalize(queries)) for part in partitions(docs, groups, 2)]
    merged = merge_topk(parts, 10)
    assert np.array_equal(merged[1], want_g) and np.array_equal(merged[0], want_s)


def test_candidate_ranks_follow_mteb_ties():
    best = np.array([[0.5, 0.7, 0.7, -np.inf, 0.7, 0.5]], np.float32)
    assert rank_of(best, np.array([4])).tolist() == [3]  # after the two earlier 0.7s
    assert rank_of(best, np.array([3])).tolist() == [6]  # no photo: last
    assert ranked(best, 6).tolist() == [[1, 2, 4, 0, 5, 3]]
    (part,) = partitions(np.eye(3, dtype=np.float32), [0, 1, 1], 1)
    q = normalize(np.array([[1.0, 1.0, 0.0]], np.float32))
    pool = Candidates(np.array([[2, 1, 0, -1]]), indptr=np.array([0, 2]), docs=np.array([0, 2]))  # docs 0 and 2
    got, _ = CandidateMax().score(part, q, pool)
    assert np.allclose(got, [[-np.inf, 0.0, 0.70710677, -np.inf]])  # doc 1 is outside the pool
