"""The top-k engine (mieb_ray/topk/engine.py) on Ray: every shard read once, exact with many partitions and a deep
merge tree, on float16 shards, with sparse pools, streaming embedding shards as the embed job writes them; the same
engine run inline (tasks.using("local"), no Ray) gives the same bits. Exact results are asserted on lattice vectors
(every cosine exact in float32 on any CPU: support/numerics.py), random floats within a tolerance."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
import ray
from support import topk
from support.numerics import assert_topk_close
from support.topk import brute_candidates, brute_topk, csr, exact_vectors, write_shards

from mieb_ray.runtime import tasks
from mieb_ray.topk import engine
from mieb_ray.topk.kernels import CandidateMax, Candidates, TopK

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def corpus():
    return topk.corpus()


@pytest.fixture(scope="module")
def floats():
    """Random float vectors: results within a tolerance of the float64 reference."""
    rng = np.random.default_rng(2)
    return (rng.normal(size=(70, 16)).astype(np.float32), rng.normal(size=(3000, 16)).astype(np.float32),
            rng.integers(0, 240, size=3000))


@pytest.fixture(scope="module")
def tied():
    return topk.tied()


def group_topk(queries: np.ndarray, k: int = 10, shards: list[str] | None = None, group_column: str | None = None,
               chunks: list[tuple[np.ndarray, np.ndarray]] | None = None, query_block: int = 1024,
               partitions: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The engine as one call: (Q, k) scores and group ids of each query's k groups whose best item scores
    highest, best first, ties by group id. The corpus is embedding `shards` (group ids in their `group_column`)
    or in-memory `chunks` of (vectors, groups)."""
    lay = engine.layout(shards, chunks=chunks, group_column=group_column, partitions=partitions)
    blocks = [queries[lo:lo + query_block] for lo in range(0, len(queries), query_block)]
    merged = tasks.get(engine.search(lay, blocks, TopK(k)))
    return np.concatenate([s for s, _ in merged]), np.concatenate([i for _, i in merged])


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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("partitions,query_block", [(1, 1000), (3, 16), (7, 70)])
def test_distributed_engine_is_exact(ray_local, corpus, partitions, query_block):
    queries, docs, groups = corpus
    want_s, want_g = brute_topk(queries, docs, groups, 10)
    chunks = [(docs[i:i + 700], groups[i:i + 700]) for i in range(0, len(docs), 700)]
    got_s, got_g = group_topk(queries, k=10, chunks=chunks, query_block=query_block,
                              partitions=partitions)
    assert np.array_equal(got_g, want_g) and np.array_equal(got_s, want_s)


@pytest.mark.timeout(300)
def test_engine_streams_embedding_shards(ray_local, corpus, tmp_path):
    queries, docs, groups = corpus
    uris = write_shards(tmp_path, docs, groups, per=1000)
    got_s, got_g = group_topk(queries, k=5, shards=uris, group_column="label", partitions=2,
                              query_block=32)
    want_s, want_g = brute_topk(queries, docs, groups, 5)
    assert np.array_equal(got_g, want_g) and np.array_equal(got_s, want_s)
