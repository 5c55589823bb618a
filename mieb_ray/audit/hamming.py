"""Every pair of 256-bit hashes within a Hamming distance, exactly: the pdq detector's search. Pure numpy.

brute_force  every pair's distance, by popcount over cache-sized blocks: no index, no worst case; about 3 ns a pair
             on one core (bench/audit_pdq_search.py)
Index        one side's hashes indexed by each of their 16 chunks of 16 bits (built once: the eval side serves
             every train batch)
within       multi-index hashing (Norouzi et al., "Fast search in Hamming space with multi-index hashing", 2012):
             a pair within t bits is within t // 16 bits in at least one of the 16 chunks (pigeonhole), so only
             the rows whose chunk is that close to the query's in some chunk are candidates, each verified on the
             whole hash. On uniform hashes at t = 31 that is 17 probes a chunk and 1 row in 241 a candidate;
             hashes whose chunks crowd into few values make more, and once the candidates would cost more than
             every pair (CANDIDATE_COST), brute force does the search instead.
"""

from __future__ import annotations

import numpy as np

CHUNKS = 16  # of 16 bits each: a chunk's value indexes a dense table of 65,536 buckets
CANDIDATE_COST = 16  # a candidate costs about this many brute-force pairs (gathers, not a streamed block)
SLAB = 1 << 21  # candidates expanded at once (a few arrays of this many int64)

Result = tuple[np.ndarray, np.ndarray, np.ndarray]


def brute_force(train: np.ndarray, evals: np.ndarray, threshold: int, train_rows: int = 64,
                eval_rows: int = 4096) -> Result:
    """Every (train row, eval row, distance) whose Hamming distance is at most `threshold` (train, evals: (n, 4)
    uint64 words). Blocks of train_rows x eval_rows pairs stay in the CPU's cache; the first two words' distance
    rules out nearly every pair (random halves differ in about 64 bits), and only pairs within the threshold there
    pay for the other two."""
    found: tuple[list, list, list] = ([], [], [])
    columns = np.ascontiguousarray(evals.T)  # (4, m): one word of every eval hash, contiguous
    for lo in range(0, len(train), train_rows):
        block = train[lo:lo + train_rows]
        for at in range(0, len(evals), eval_rows):
            words = columns[:, at:at + eval_rows]
            half = np.bitwise_count(block[:, 0, None] ^ words[0]) + np.bitwise_count(block[:, 1, None] ^ words[1])
            i, j = np.nonzero(half <= threshold)
            if not len(i):
                continue
            distance = (half[i, j].astype(np.uint16) + np.bitwise_count(block[i, 2] ^ words[2, j])
                        + np.bitwise_count(block[i, 3] ^ words[3, j]))
            keep = distance <= threshold
            found[0].append(i[keep] + lo)
            found[1].append(j[keep] + at)
            found[2].append(distance[keep])
    return _joined(found)


def chunks(words: np.ndarray) -> np.ndarray:
    """(n, 4) uint64 hashes -> their (n, 16) uint16 chunks (any fixed split of the bits will do)."""
    return np.ascontiguousarray(words).view(np.uint16).reshape(len(words), CHUNKS)


class Index:
    """Hashes ((m, 4) uint64 words) and, per chunk, their rows sorted by that chunk's value (`order`, int32) with
    where each value's rows start (`starts`): bucket v of chunk c is order[c, starts[c, v]:starts[c, v + 1]]."""

    def __init__(self, words: np.ndarray):
        self.words = np.ascontiguousarray(words, dtype=np.uint64).reshape(-1, 4)
        values = chunks(self.words)
        self.order = np.empty((CHUNKS, len(self.words)), np.int32)
        self.starts = np.zeros((CHUNKS, (1 << 16) + 1), np.int64)
        for c in range(CHUNKS):
            self.order[c] = np.argsort(values[:, c], kind="stable")
            np.cumsum(np.bincount(values[:, c], minlength=1 << 16), out=self.starts[c, 1:])

    def __len__(self) -> int:
        return len(self.words)


def within(train: np.ndarray, index: Index, threshold: int) -> Result:
    """Every (train row, indexed row, distance) at most `threshold` apart, each once: brute_force's pairs."""
    probes = _probes(threshold)
    # counted here and looked up again chunk by chunk in _indexed (under 1% of the search): holding every chunk's
    # buckets instead would take rows x probes x 256 bytes (430 MB for a batch of 100,000 train rows)
    candidates = sum(int(_buckets(train, index, c, probes)[1].sum()) for c in range(CHUNKS))
    if candidates * CANDIDATE_COST >= len(train) * len(index):
        return brute_force(train, index.words, threshold)
    return _indexed(train, index, threshold)


def _probes(threshold: int) -> np.ndarray:
    """The 16-bit masks of at most threshold // CHUNKS bits: a chunk's value XOR each is a bucket to look in."""
    values = np.arange(1 << 16, dtype=np.uint32)
    return values[np.bitwise_count(values) <= threshold // CHUNKS].astype(np.uint16)


def _buckets(train: np.ndarray, index: Index, c: int, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each train row and probe, where its bucket of chunk c starts in index.order[c] and how many rows it has:
    two (n, probes) arrays."""
    values = (chunks(train)[:, c, None] ^ probes[None, :]).astype(np.int64)
    first = index.starts[c][values]
    return first, index.starts[c][values + 1] - first


def _indexed(train: np.ndarray, index: Index, threshold: int) -> Result:
    """within() by the index alone."""
    radius, probes = threshold // CHUNKS, _probes(threshold)
    ours, theirs = chunks(train), chunks(index.words)
    found: tuple[list, list, list] = ([], [], [])
    for c in range(CHUNKS):
        first, count = _buckets(train, index, c, probes)
        per_row = count.sum(axis=1)
        ends = np.cumsum(per_row)
        lo = 0
        while lo < len(train):  # slabs of train rows with about SLAB candidates
            hi = max(lo + 1, int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + SLAB, side="right")))
            n = count[lo:hi].ravel()
            total = int(n.sum())
            if total:
                i = np.repeat(np.repeat(np.arange(lo, hi), len(probes)), n)
                # position k of the expansion is row (k - where its bucket's run starts) of that bucket
                at = np.arange(total) - np.repeat(np.cumsum(n) - n - first[lo:hi].ravel(), n)
                j = index.order[c][at]
                i, j, d = _verified(train, index.words, i, j, threshold)
                if c and len(i):  # each pair once: at the first chunk that is within the radius
                    first_here = (np.bitwise_count(ours[i, :c] ^ theirs[j, :c]) > radius).all(axis=1)
                    i, j, d = i[first_here], j[first_here], d[first_here]
                found[0].append(i)
                found[1].append(j)
                found[2].append(d)
            lo = hi
    return _joined(found)


def _verified(train: np.ndarray, evals: np.ndarray, i: np.ndarray, j: np.ndarray, threshold: int) -> Result:
    """The candidate pairs (i, j) within the threshold on the whole hash, with their distances: the first two words
    first, as brute_force does."""
    half = np.bitwise_count(train[i, 0] ^ evals[j, 0]) + np.bitwise_count(train[i, 1] ^ evals[j, 1])
    keep = half <= threshold
    i, j, d = i[keep], j[keep], half[keep].astype(np.uint16)
    d += np.bitwise_count(train[i, 2] ^ evals[j, 2]) + np.bitwise_count(train[i, 3] ^ evals[j, 3])
    keep = d <= threshold
    return i[keep], j[keep], d[keep]


def _joined(found: tuple[list, list, list]) -> Result:
    if not found[0]:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint16)
    return tuple(np.concatenate(x) for x in found)
