"""The pdq detector's exact search (mieb_ray/audit/hamming.py): multi-index hashing finds what brute force finds."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("threshold", [0, 15, 16, 31, 40, 47])
def test_the_indexed_pdq_search_finds_what_brute_force_finds(threshold, monkeypatch):
    """Multi-index hashing (within() taking its index whatever the cost) against every pair's distance
    (hamming.brute_force): the same (train, eval, distance) triples, each once, on random hashes, copies planted at
    every distance up to the threshold and just past it, repeated rows, and hashes whose chunks crowd into a few
    values (for which within() itself searches by brute force: its result is the same)."""
    from mieb_ray.audit import hamming

    brute_force = hamming.brute_force
    rng = np.random.default_rng(threshold)

    def words(n):
        return rng.integers(0, 2**63, (n, 4), dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, (n, 4),
                                                                                             dtype=np.uint64)

    def flipped(row, bits):
        out = row.copy()
        for b in rng.choice(256, bits, replace=False):
            out[b // 64] ^= np.uint64(1) << np.uint64(b % 64)
        return out

    train, evals = words(300), words(700)
    for k, bits in enumerate(range(threshold + 3)):  # planted copies, 0 to threshold + 2 bits away
        evals[k] = flipped(train[k], bits)
    evals[600:610] = evals[0]  # one eval picture many times
    train[290:300] = train[5]
    crowded = train.copy(), evals.copy()
    for side in crowded:  # half of every hash the same on both sides: all pairs are candidates in 8 chunks
        side[:, :2] = np.uint64(0x0123_4567_89AB_CDEF)

    def triples(found):
        return sorted(zip(*(x.tolist() for x in found)))

    brute = []
    monkeypatch.setattr(hamming, "brute_force", lambda *a: brute.append(a) or brute_force(*a))
    for ours, theirs in ((train, evals), crowded):
        want = triples(brute_force(ours, theirs, threshold))
        index = hamming.Index(theirs)
        with monkeypatch.context() as index_only:
            index_only.setattr(hamming, "CANDIDATE_COST", 0)  # the index, however many candidates it meets
            got = triples(hamming.within(ours, index, threshold))
        assert got == want and len(set((i, j) for i, j, _ in got)) == len(got)
        assert triples(hamming.within(ours, index, threshold)) == want
        assert len(brute) == (ours is not train)  # the index for random hashes, brute force for crowded ones
        # the planted copies within the threshold, and the repeated rows' pairs
        assert {(k, k) for k in range(threshold + 1)} <= {(i, j) for i, j, _ in want} and (0, 609, 0) in want
        assert (295, 5) in {(i, j) for i, j, _ in want} or threshold < 5
    assert triples(hamming.within(train[:0], hamming.Index(evals), threshold)) == []
    assert triples(hamming.within(train, hamming.Index(evals[:0]), threshold)) == []
