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

One comparison (hash against hash); the detector makes matches.pdq_comparisons() per pair of images (108: each hash
of one column of matches.PDQ_COMPARED against each of the other, both ways), so its search costs that many of these.
Prints pairs/s of each and the ratio, and projects the detector's full-size search.

Prints the harness table (bench/harness.py; CPU seconds, pairs/s) and writes bench/records/audit_pdq_search.json.
With --distributions, instead the calibration study bench/calibration/audit_pdq_candidates.py (how many candidates
multi-index hashing makes by kind of hash).

    .venv/bin/python bench/audit_pdq_search.py [--train 20000] [--eval 1000000] [--repeat 1]
    .venv/bin/python bench/audit_pdq_search.py --train 2000 --eval 20000 --records /tmp/records    # a smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import harness as h
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=20_000)
    ap.add_argument("--eval", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--distributions", action="store_true",
                    help="instead: bench/calibration/audit_pdq_candidates.py, candidates by kind of hash")
    h.add_records_option(ap)
    args = ap.parse_args()
    if args.distributions:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "calibration"))
        import audit_pdq_candidates

        return audit_pdq_candidates.run()
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
    found = {}

    def timed(name, search):
        def call(i):
            t0 = time.process_time()
            out = search()
            seconds = time.process_time() - t0
            found[name] = set(zip(out[0].tolist(), out[1].tolist())), len(out[0])
            return seconds
        return call

    base = "baseline"
    bench = h.Benchmark(
        "audit_pdq_search", f"pdq pair search: {args.train:,} train x {args.eval:,} eval hashes ({pairs:,} pairs), "
        f"threshold {THRESHOLD}, one core, CPU seconds", [
            h.Contender(base, "numpy brute force: 64 MiB blocks of distances, four words",
                        call=timed(base, lambda: baseline(train, evals, THRESHOLD))),
            h.Contender("brute force", "hamming.brute_force: cache blocks, two words first", baseline=base,
                        call=timed("brute force", lambda: hamming.brute_force(train, evals, THRESHOLD))),
            h.Contender("mieb-ray", "hamming.within: multi-index hashing, the index built in the time", baseline=base,
                        call=timed("mieb-ray", lambda: hamming.within(train, hamming.Index(evals), THRESHOLD)))],
        group="Audit", ratio=("mieb-ray", base), repeat=args.repeat, unit="CPU s",
        columns=[("pairs/s (fastest)", lambda r: f"{pairs / r.fastest / 1e9:.3f} G")])
    record = h.run(bench)
    want = found[base][0]
    same = all(found[n][0] == want and found[n][1] == len(want) for n in found)
    per_pair = matches.pdq_comparisons()
    full = 4_434_196 * 986_207 * per_pair  # mieb-train x the eval splits of its 23 sources
    projected = {}
    for name in ("brute force", "mieb-ray"):
        rate = pairs / record[name].fastest
        projected[name] = f"{full / rate / 3600:,.1f} core-hours, {full / rate / 256 / 60:,.1f} minutes on 256 cores"
    record.finish(figures={
        "same pair sets, each pair once": same,
        "every planted copy found": {(int(t), n) for n, t in enumerate(planted)} <= want,
        "pairs found": len(want),
        f"the full audit's search (4,434,196 train x 986,207 eval, {per_pair} comparisons) at the fastest rate":
        projected},
        notes=[f"One comparison (hash against hash); the detector makes {per_pair} per pair of images "
               "(matches.pdq_comparisons)."])


if __name__ == "__main__":
    main()
