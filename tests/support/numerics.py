"""Float comparisons that hold on any x86-64 CPU.

One BLAS product does not give bit-identical results across CPUs, nor across shapes on one CPU: OpenBLAS's
micro-kernel sums a column in an order that depends on where the column falls in its tiles (on an AVX2 kernel
two identical columns of one product can differ in the last bit), and a chunked product differs from the
whole one by up to ~2e-7. So a test asserts exact scores, ranks or tie order only on vectors whose every dot
product is exact in float32 whatever the order (`lattice_vectors`), and compares results on random floats
within a stated tolerance, allowing either order where the reference's own scores are that close
(`assert_topk_close`, `assert_top_pairs_close`). `OPENBLAS_CORETYPE=Haswell` (AVX2) and `=Sandybridge` give
the two behaviours on one machine; the suite passes under both.
"""

from __future__ import annotations

import itertools

import numpy as np

GRID = 256  # entries are multiples of 1/256: a cosine of 16-64 such entries is exact in float32 and float16


def on_grid(vectors: np.ndarray, grid: int, rng: np.random.Generator) -> np.ndarray:
    """Unit vectors moved onto the 1/grid lattice with a squared norm of exactly 1 (sum k^2 = grid^2): random
    roundings of each vector until one has that norm (about 1 in 500 does; each is within 2/grid per axis). A
    short vector has too few roundings (2^dim) to be sure of one: after 8 tries a step of one more per axis."""
    out = np.empty_like(vectors, dtype=np.float32)
    target = grid * grid
    for i, v in enumerate(vectors * grid):
        for tries in itertools.count():
            k = np.floor(v + rng.random((2048, v.size))).astype(np.int64)
            if tries >= 8:
                k += rng.integers(-1, 2, k.shape)
            hit = np.flatnonzero((k * k).sum(1) == target)
            if hit.size:
                out[i] = k[hit[0]] / grid
                break
    return out


def lattice_vectors(rng: np.random.Generator, n: int, dim: int = 16, grid: int = GRID) -> np.ndarray:
    """n random float32 unit vectors on the 1/grid lattice with a squared norm of exactly 1: normalising leaves
    them unchanged and every cosine is a multiple of 1/grid^2 below 1, exact in float32 in any summation order
    (ties are ties on every CPU). Far more distinct scores than a few +-1/2 entries give."""
    v = rng.standard_normal((n, dim))
    return on_grid(v / np.linalg.norm(v, axis=1, keepdims=True), grid, rng)


def group_maxima(queries: np.ndarray, docs: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The float64 reference: (group ids present, (q, groups) max cosine of each group's docs)."""
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    d = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    s = q.astype(np.float64) @ d.astype(np.float64).T
    ids = np.unique(groups)
    return ids, np.stack([s[:, groups == g].max(1) for g in ids], axis=1)


def assert_topk_close(got_scores, got_groups, queries, docs, groups, k: int, atol: float = 1e-6) -> None:
    """A group-max top-k of random floats equals the float64 reference to `atol`: each returned group's score
    is its max cosine, the lists are best first, no group twice, and the set of groups is the reference's top k
    except among groups whose reference scores lie within `atol` of the k-th best (either may be taken, in
    either order)."""
    ids, maxima = group_maxima(queries, docs, groups)
    col = {g: i for i, g in enumerate(ids)}
    got_scores, got_groups = np.asarray(got_scores, np.float64), np.asarray(got_groups)
    assert got_groups.shape == (len(queries), min(k, len(ids)))
    for r in range(len(queries)):
        row, chosen = maxima[r], [col[g] for g in got_groups[r]]
        assert len(set(chosen)) == len(chosen), r
        assert np.allclose(got_scores[r], row[chosen], rtol=0, atol=atol), r
        assert (np.diff(got_scores[r]) <= atol).all(), r  # best first
        kth = np.sort(row)[::-1][len(chosen) - 1]
        must = set(np.flatnonzero(row > kth + atol))
        assert must <= set(chosen) and (row[chosen] >= kth - atol).all(), r


def assert_top_pairs_close(got: dict, scores: np.ndarray, row_keys: list, col_keys: list, k: int, threshold: float,
                           atol: float = 1e-6) -> tuple[int, int]:
    """{(row key, col key): score} of each row's k best columns at score >= threshold, against the reference
    (rows, cols) score matrix: scores within `atol`, every pair that is in by more than `atol` (above the
    threshold and the row's k-th best) found, and nothing found that is not within `atol` of both. Returns
    (pairs that must be found, pairs that may be either way), for the caller to check the test is not vacuous."""
    found: dict = {}
    for (r, c), s in got.items():
        found.setdefault(r, {})[c] = s
    index = {key: j for j, key in enumerate(col_keys)}
    sure = doubt = 0
    for i, r in enumerate(row_keys):
        row, mine = scores[i], found.pop(r, {})
        kth = np.sort(row)[::-1][min(k, len(row)) - 1]
        must = {col_keys[j] for j in np.flatnonzero((row > threshold + atol) & (row > kth + atol))}
        may = np.flatnonzero((row >= threshold - atol) & (row >= kth - atol))
        assert must <= set(mine) and len(mine) <= k, (r, must - set(mine))
        for c, s in mine.items():
            want = row[index[c]]
            assert abs(s - want) <= atol and want >= threshold - atol and want >= kth - atol, (r, c, s, want)
        sure, doubt = sure + len(must), doubt + len(may) - len(must)
    assert not found, f"pairs of unknown rows: {sorted(found)[:3]}"
    return sure, doubt
