"""The top-k engine: the pure kernels against brute force (ties included), and the Ray engine reading every
shard once, exact with many partitions and a deep merge tree, on float16 shards, with sparse pools; the same
engine run inline (tasks.using("local"), no Ray) gives the same bits. Exact results are asserted on lattice vectors
(every cosine exact in float32 on any CPU: tests/numerics.py), random floats within a tolerance."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
import ray
from numerics import assert_topk_close, lattice_vectors

from mieb_ray import formats
from mieb_ray.io import embeddings
from mieb_ray.runtime import tasks
from mieb_ray.topk import engine
from mieb_ray.topk.groupmax import normalize
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


def brute_topk(queries, docs, groups, k):
    s = normalize(queries) @ normalize(docs).T
    out_s, out_g = [], []
    for row in s:
        best = {g: row[groups == g].max() for g in np.unique(groups)}
        order = sorted(best, key=lambda g: (-best[g], g))[:k]
        out_s.append([best[g] for g in order])
        out_g.append(order)
    return np.array(out_s, np.float32), np.array(out_g)


def brute_candidates(queries, docs, groups, doc_ids, candidates, pools):
    """Per (query, candidate): max cosine over the group's docs in the query's pool, the smallest doc on ties."""
    s = normalize(queries) @ normalize(docs).T
    scores = np.full(candidates.shape, -np.inf, np.float32)
    best = np.full(candidates.shape, -1, np.int64)
    for i, row in enumerate(candidates):
        for j, g in enumerate(row):
            rows = [r for r in np.flatnonzero(groups == g) if pools is None or doc_ids[r] in pools[i]]
            if g < 0 or not rows:
                continue
            top = max(s[i, r] for r in rows)
            scores[i, j] = top
            best[i, j] = min(doc_ids[r] for r in rows if s[i, r] == top)
    return scores, best


def exact_vectors(rng, n, dim=16):
    """Unit vectors with four entries of +-1/2: every cosine is a multiple of 1/4, exact in float32, so ties
    are ties in any summation order."""
    out = np.zeros((n, dim), np.float32)
    for row in out:
        row[rng.choice(dim, 4, replace=False)] = rng.choice([-0.5, 0.5], 4)
    return out


def csr(pools: list[set[int]]):
    docs = [np.array(sorted(p), np.int64) for p in pools]
    return np.r_[0, np.cumsum([len(d) for d in docs])].astype(np.int64), np.concatenate(docs)


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(0)
    docs = lattice_vectors(rng, 3000)
    groups = rng.integers(0, 240, size=3000)
    docs[1500:1600] = docs[0]  # the same vector in many groups: exact ties
    queries = lattice_vectors(rng, 70)
    queries[:5] = docs[0]
    return queries, docs, groups


@pytest.fixture(scope="module")
def floats():
    """Random float vectors: results within a tolerance of the float64 reference."""
    rng = np.random.default_rng(2)
    return (rng.normal(size=(70, 16)).astype(np.float32), rng.normal(size=(3000, 16)).astype(np.float32),
            rng.integers(0, 240, size=3000))


@pytest.fixture(scope="module")
def tied():
    """A corpus where most scores tie: docs ids not in row order, pools, candidates with absent groups."""
    rng = np.random.default_rng(1)
    docs = exact_vectors(rng, 600)
    groups = rng.integers(0, 50, size=600)
    doc_ids = rng.permutation(600) * 3 + 7
    queries = exact_vectors(rng, 40)
    candidates = rng.integers(-1, 55, size=(40, 12))  # -1 and groups 50..54: no docs
    pools = [set(rng.choice(doc_ids, size=rng.integers(0, 400), replace=False).tolist()) for _ in range(40)]
    pools[3] = set()  # a query with an empty pool
    return queries, docs, groups, doc_ids, candidates, pools


def write_shards(folder, docs, groups, per, dtype="float32", keys=None):
    schema = formats.embedding_schema(docs.shape[1], dtype, pa.schema([("label", pa.int64())]), {"model": {}})
    keys = keys if keys is not None else [f"d/{i}" for i in range(len(docs))]
    uris = []
    for n, i in enumerate(range(0, len(docs), per)):
        uri = str(folder / f"{n:06d}.arrow")
        embeddings.write_ipc(uri, embeddings.shard_table(schema, keys[i:i + per], docs[i:i + per],
                                                         {"label": groups[i:i + per].tolist()}))
        uris.append(uri)
    return uris


# ---------------------------------------------------------------------------------------------- kernels


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


# ---------------------------------------------------------------------------------------------- engine


def test_every_shard_is_opened_once(ray_local, corpus, tmp_path):
    queries, docs, groups = corpus
    uris = write_shards(tmp_path, docs, groups, per=250)  # 12 shards
    sizes = [os.path.getsize(u) for u in uris]
    lay = engine.layout(uris, group_column="label", partitions=5, map_bytes=3 * max(sizes))  # 4 map tasks
    stats = lay.stats()
    assert stats["map_tasks"] == 4 and stats["partitions"] == 5 and stats["shards"] == 12
    assert stats["bytes_opened"] == stats["corpus_bytes"] == sum(sizes) and stats["read_ratio"] == 1.0
    assert stats["rows"] == len(docs) and stats["dim"] == 16
    got = ray.get(engine.search(lay, [queries], TopK(10)))[0]
    want = brute_topk(queries, docs, groups, 10)
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])


@pytest.mark.parametrize("where", ["ray", "local"])
def test_many_partitions_and_a_deep_merge_tree_are_exact(ray_local, corpus, where):
    queries, docs, groups = corpus
    chunks = [(docs[i:i + 500], groups[i:i + 500]) for i in range(0, len(docs), 500)]
    with tasks.using(where):
        lay = engine.layout(chunks=chunks, partitions=20)
        # 20 partials per block, fan-in 3: merged 20 -> 7 -> 3 -> 1, a tree of depth 3
        refs = engine.search(lay, [queries[:30], tasks.put(queries[30:])], TopK(10), fan_in=3)
        got = [np.concatenate(a) for a in zip(*tasks.get(refs))]
    want = brute_topk(queries, docs, groups, 10)
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])


def test_float16_shards(ray_local, floats, tmp_path):
    queries, docs, groups = floats
    uris = write_shards(tmp_path, docs, groups, per=1000, dtype="float16")
    lay = engine.layout(uris, group_column="label", partitions=3)
    got = ray.get(engine.search(lay, [queries], TopK(5)))[0]
    assert_topk_close(*got, queries, docs.astype(np.float16).astype(np.float32), groups, 5, atol=1e-6)
    assert lay.stats()["read_ratio"] == 1.0


@pytest.mark.parametrize("where", ["ray", "local"])
def test_candidate_max_over_a_key_lookup_with_pools(ray_local, tied, tmp_path, where):
    with tasks.using(where):
        _candidate_max_over_a_key_lookup_with_pools(tied, tmp_path)


def _candidate_max_over_a_key_lookup_with_pools(tied, tmp_path):
    queries, docs, groups, doc_ids, candidates, pools = tied
    keys = [f"photo-{d}" for d in doc_ids]
    # shards hold every doc but two, plus a row that is not in the corpus (dropped)
    present = [i for i in range(len(docs)) if i not in (10, 20)]
    extra = exact_vectors(np.random.default_rng(5), 1)
    uris = write_shards(tmp_path, np.concatenate([docs[present], extra]), np.zeros(len(present) + 1, np.int64),
                        per=150, keys=[keys[i] for i in present] + ["stranger"])
    lookup = engine.KeyLookup(pa.array(keys), doc_ids.astype(np.int64), groups.astype(np.int64))
    lay = engine.layout(uris, lookup=lookup, partitions=4, map_bytes=1)  # one map task per shard
    assert lay.stats()["matched"] == len(present) and lay.stats()["read_ratio"] == 1.0
    n, sample, dups = engine.missing_keys(lay)
    assert n == 2 and sorted(sample) == sorted([keys[10], keys[20]]) and dups == 0
    assert sample == sorted(sample, key=lambda k: int(k.split("-")[1]))  # in doc order
    indptr, pool_docs = csr(pools)
    blocks = [(0, 13), (13, 40)]
    refs = engine.search(lay, [queries[a:b] for a, b in blocks], CandidateMax(),
                         [Candidates(candidates[a:b], indptr[a:b + 1] - indptr[a], pool_docs[indptr[a]:indptr[b]])
                          for a, b in blocks], fan_in=2)
    got_s, got_d = (np.concatenate(x) for x in zip(*tasks.get(refs)))
    keep = np.array(present)
    want_s, want_d = brute_candidates(queries, docs[keep], groups[keep], doc_ids[keep], candidates, pools)
    assert np.array_equal(got_s, want_s) and np.array_equal(got_d, want_d)
