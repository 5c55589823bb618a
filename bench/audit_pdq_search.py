"""The pdq detector's pair search against a plain brute-force numpy popcount, in the same run.

Hashes: random 256-bit PDQ-sized hashes, train x eval, with 1,000 planted eval copies of train hashes 0-31 bits
away (the pairs to find). Every contender finds every pair within 31 bits exactly; their pair sets must be equal.

  1. baseline     numpy brute force: per block of train rows (64 MiB of distances), XOR with every eval hash and
                  np.bitwise_count over the four words, summed: the straightforward vectorised search
  2. brute force  hamming.brute_force (the detector's search before multi-index hashing, and its fallback): the
                  same popcount over cache-sized blocks (64 x 4,096 pairs), the first two words' distance first,
                  the last two only for pairs within the threshold there
  3. mieb-ray     hamming.within: multi-index hashing over 16 chunks of 16 bits, the eval side indexed once
                  (hamming.Index, timed with the search), each candidate verified on the whole hash

The default shape is one pdq task of the full audit: a train batch (about 8,700 rows on 256 cores) against the
eval side of the whole of MIEB (about 1M pictures).

One comparison (hash against hash); the detector makes six per pair of images (matches.PDQ_COMPARED), so its
search costs six of these. Prints pairs/s of each and the ratio, and projects the detector's full-size search.

With --distributions, instead: how many candidates multi-index hashing makes on the PDQ hashes of pictures, of
the full-size rehearsal's 8x8 noise PNGs (bench/full_size.py) and of uniform random bits, as a share of all pairs
(uniform: 272 / 65,536 = 0.0042) and searched both ways: its speed-up depends on it, and at 1/16 of the pairs
(hamming.CANDIDATE_COST) `within` searches by brute force instead.

    .venv/bin/python bench/audit_pdq_search.py [--train 20000] [--eval 1000000] [--distributions]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mieb_ray.audit import hamming, matches  # noqa: E402

THRESHOLD = matches.PDQ_THRESHOLD


def baseline(train: np.ndarray, evals: np.ndarray, threshold: int, block_bytes: int = 64 << 20):
    rows = max(1, block_bytes // (8 * len(evals)))
    out = ([], [])
    for lo in range(0, len(train), rows):
        block = train[lo:lo + rows]
        distance = np.zeros((len(block), len(evals)), np.uint16)
        for w in range(4):
            distance += np.bitwise_count(block[:, w, None] ^ evals[None, :, w])
        i, j = np.nonzero(distance <= threshold)
        out[0].append(i + lo)
        out[1].append(j)
    return np.concatenate(out[0]), np.concatenate(out[1])


def distributions(total: int = 12_000, train_rows: int = 1_500) -> None:
    """Candidates a pair, and each search's CPU time, on three kinds of hashes (see the docstring)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from full_size import noise_png
    from preprocess import KINDS, make_kind, mix_weights

    from mieb_ray.audit.fingerprints import fingerprint

    def words(prints) -> np.ndarray:
        packed = np.frombuffer(b"".join(p.pdq for p in prints if p.pdq), np.uint8).reshape(-1, 32)
        return packed.view(">u8").astype(np.uint64).reshape(-1, 4)

    weights = mix_weights()
    pictures = words([fingerprint(b) for i, kind in enumerate(KINDS)
                      for b in make_kind(kind, max(50, int(total * weights[kind])), seed=200 + i)])
    rng = np.random.default_rng(0)
    kinds = {"pictures: bench/preprocess.py's mix (crops of the fixture pictures at mieb-train's sizes)": pictures,
             "8x8 noise PNGs (the full-size rehearsal's images)": words([fingerprint(noise_png(f"x/{i}"))
                                                                         for i in range(len(pictures))]),
             "uniform random bits": np.frombuffer(rng.bytes(len(pictures) * 32), np.uint64).reshape(-1, 4).copy()}
    probes = hamming._probes(THRESHOLD)
    print(f"### Candidates of multi-index hashing by kind of hash, {train_rows:,} train x "
          f"{len(pictures) - train_rows:,} eval, threshold {THRESHOLD}\n")
    print("| hashes | candidates / pairs | x uniform's | multi-index CPU s | brute force CPU s | pairs found (equal) |")
    print("|---|---|---|---|---|---|")
    for name, hashes in kinds.items():
        order = rng.permutation(len(hashes))
        train, evals = hashes[order[:train_rows]], hashes[order[train_rows:]]
        t0 = time.process_time()
        index = hamming.Index(evals)
        found = hamming._indexed(train, index, THRESHOLD)
        indexed = time.process_time() - t0
        t0 = time.process_time()
        brute = hamming.brute_force(train, evals, THRESHOLD)
        brute_s = time.process_time() - t0
        share = sum(int(hamming._buckets(train, index, c, probes)[1].sum()) for c in range(hamming.CHUNKS))
        share /= len(train) * len(evals)
        same = sorted(zip(*(x.tolist() for x in found))) == sorted(zip(*(x.tolist() for x in brute)))
        print(f"| {name} | {share:.4f} | {share * 65536 / len(probes) / hamming.CHUNKS:.1f} | {indexed:.3f} | "
              f"{brute_s:.3f} | {len(found[0]):,} ({same}) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=20_000)
    ap.add_argument("--eval", type=int, default=1_000_000)
    ap.add_argument("--distributions", action="store_true", help="candidates by kind of hash (the docstring)")
    args = ap.parse_args()
    if args.distributions:
        return distributions()
    rng = np.random.default_rng(0)
    train = np.frombuffer(rng.bytes(args.train * 32), np.uint64).reshape(-1, 4).copy()
    evals = np.frombuffer(rng.bytes(args.eval * 32), np.uint64).reshape(-1, 4).copy()
    planted = rng.choice(args.train, 1_000, replace=False)
    for n, t in enumerate(planted):  # copies 0-31 bits away
        flips = rng.choice(256, rng.integers(0, THRESHOLD + 1), replace=False)
        copy = train[t].copy()
        for f in flips:
            copy[f // 64] ^= np.uint64(1) << np.uint64(f % 64)
        evals[n] = copy
    pairs = args.train * args.eval
    t0 = time.process_time()
    i, j, _ = hamming.within(train, hamming.Index(evals), THRESHOLD)
    ours = time.process_time() - t0
    t0 = time.process_time()
    ci, cj, _ = hamming.brute_force(train, evals, THRESHOLD)
    cache = time.process_time() - t0
    t0 = time.process_time()
    bi, bj = baseline(train, evals, THRESHOLD)
    base = time.process_time() - t0
    want = set(zip(bi.tolist(), bj.tolist()))
    same = set(zip(i.tolist(), j.tolist())) == want == set(zip(ci.tolist(), cj.tolist())) and len(i) == len(want)
    found = {(int(t), n) for n, t in enumerate(planted)} <= want
    print(f"### pdq pair search: {args.train:,} train x {args.eval:,} eval hashes ({pairs:,} pairs), threshold "
          f"{THRESHOLD}\n")
    print("| contender | CPU seconds | pairs/s | x faster than the baseline |\n|---|---|---|---|")
    for name, sec in (("baseline: numpy brute force (64 MiB blocks, four words)", base),
                      ("brute force: hamming.brute_force (cache blocks, two words first)", cache),
                      ("mieb-ray: hamming.within (multi-index hashing, index built in the time)", ours)):
        print(f"| {name} | {sec:.2f} | {pairs / sec / 1e9:.3f} G | {base / sec:.1f} |")
    print(f"\nsame pair sets, each pair once: {same}; every planted copy found: {found}; pairs found: {len(want):,}")
    full = 4_434_196 * 986_207 * len(matches.PDQ_COMPARED)  # mieb-train x the eval splits of its 23 sources
    for name, sec in (("brute force", cache), ("mieb-ray", ours)):
        rate = pairs / sec
        print(f"the full audit's search (4,434,196 train x 986,207 eval, six comparisons) at {name}'s rate: "
              f"{full / rate / 3600:,.1f} core-hours, {full / rate / 256 / 60:,.1f} minutes on 256 cores")
    print(f"CPU: {platform.processor() or platform.machine()}, one core; numpy {np.__version__}")


if __name__ == "__main__":
    main()
