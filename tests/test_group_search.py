"""Group-max top-k: the engine's kernels and the distributed engine against a brute-force reference,
ties included (on lattice vectors: every cosine exact on any CPU, tests/numerics.py); the engine reads embedding
shards as the embed job writes them."""

from __future__ import annotations

import numpy as np
import pytest
from numerics import lattice_vectors

from mieb_ray import formats
from mieb_ray.io import embeddings
from mieb_ray.topk.engine import group_topk
from mieb_ray.topk.groupmax import merge_topk, normalize, rank_of, ranked
from mieb_ray.topk.kernels import CandidateMax, Candidates, TopK, build_partition, split


def partitions(docs, groups, n):
    """The corpus in n group-aligned partitions, as the engine lays it out (doc id = row)."""
    return [build_partition([piece]) for piece in
            split([(docs, None, np.asarray(groups, np.int64), np.arange(len(docs)))], n)]


def brute_force(queries, docs, groups, n_groups, k):
    s = normalize(queries) @ normalize(docs).T
    out_s, out_g = [], []
    for row in s:
        best = {g: max(row[groups == g]) for g in np.unique(groups)}
        order = sorted(best, key=lambda g: (-best[g], g))[:k]
        out_s.append([best[g] for g in order])
        out_g.append(order)
    return np.array(out_s, np.float32), np.array(out_g)


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(0)
    docs = lattice_vectors(rng, 3000)
    groups = rng.integers(0, 240, size=3000)  # some of the 250 groups have no docs
    docs[1500:1600] = docs[0]  # exact ties between groups
    queries = lattice_vectors(rng, 70)
    queries[:5] = docs[0]  # a query whose best doc is tied in many groups
    return queries, docs, groups, 250


def test_block_functions_match_brute_force(corpus):
    queries, docs, groups, n_groups = corpus
    want_s, want_g = brute_force(queries, docs, groups, n_groups, 10)
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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("partitions,query_block", [(1, 1000), (3, 16), (7, 70)])
def test_distributed_engine_is_exact(ray_local, corpus, partitions, query_block):
    queries, docs, groups, n_groups = corpus
    want_s, want_g = brute_force(queries, docs, groups, n_groups, 10)
    chunks = [(docs[i:i + 700], groups[i:i + 700]) for i in range(0, len(docs), 700)]
    got_s, got_g = group_topk(queries, k=10, chunks=chunks, query_block=query_block,
                              partitions=partitions)
    assert np.array_equal(got_g, want_g) and np.array_equal(got_s, want_s)


@pytest.mark.timeout(300)
def test_engine_streams_embedding_shards(ray_local, corpus, tmp_path):
    queries, docs, groups, n_groups = corpus
    import pyarrow as pa

    schema = formats.embedding_schema(16, "float32", pa.schema([("label", pa.int64())]), {"model": {}})
    uris = []
    for n, i in enumerate(range(0, len(docs), 1000)):
        uri = str(tmp_path / f"{n:06d}.arrow")
        table = embeddings.shard_table(schema, [f"d/{j}" for j in range(i, i + 1000)], docs[i:i + 1000],
                                       {"label": groups[i:i + 1000].tolist()})
        embeddings.write_ipc(uri, table)
        uris.append(uri)
    got_s, got_g = group_topk(queries, k=5, shards=uris, group_column="label", partitions=2,
                              query_block=32)
    want_s, want_g = brute_force(queries, docs, groups, n_groups, 5)
    assert np.array_equal(got_g, want_g) and np.array_equal(got_s, want_s)
