"""The top-k engine's test data and brute-force references (tests/unit/topk/): exact results are asserted on
lattice vectors (every cosine exact in float32 on any CPU: support/numerics.py), random floats within a tolerance.
The corpora are made once per session (the kernels' and the engine's tests share them; nothing changes them)."""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

from mieb_ray import formats
from mieb_ray.io import embeddings
from mieb_ray.topk.groupmax import normalize
from support.numerics import lattice_vectors


def brute_topk(queries, docs, groups, k):
    """Each query's k groups whose best doc scores highest, best first, ties by group id."""
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


@functools.cache
def corpus():
    """(queries, docs, groups) on the lattice: 3,000 docs in 240 of 250 groups, the same vector in many groups
    (exact ties), 5 queries whose best doc is tied in many groups."""
    rng = np.random.default_rng(0)
    docs = lattice_vectors(rng, 3000)
    groups = rng.integers(0, 240, size=3000)  # some of the 250 groups have no docs
    docs[1500:1600] = docs[0]  # the same vector in many groups: exact ties
    queries = lattice_vectors(rng, 70)
    queries[:5] = docs[0]  # a query whose best doc is tied in many groups
    return queries, docs, groups


@functools.cache
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
    """Embedding shards of `per` rows, as the embed job writes them, with the group in a `label` column."""
    schema = formats.embedding_schema(docs.shape[1], dtype, pa.schema([("label", pa.int64())]), {"model": {}})
    keys = keys if keys is not None else [f"d/{i}" for i in range(len(docs))]
    uris = []
    for n, i in enumerate(range(0, len(docs), per)):
        uri = str(folder / f"{n:06d}.arrow")
        embeddings.write_ipc(uri, embeddings.shard_table(schema, keys[i:i + per], docs[i:i + per],
                                                         {"label": groups[i:i + per].tolist()}))
        uris.append(uri)
    return uris
