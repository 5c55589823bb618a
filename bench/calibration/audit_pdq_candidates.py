"""How many candidates the pdq search's multi-index hashing makes, by kind of hash: a calibration study.

On the PDQ hashes of pictures (bench/preprocess.py's mix of mieb-train's kinds), of the full-size rehearsal's
noise PNGs (bench/full_size.py) and of uniform random bits: the candidates as a share of all pairs (uniform:
272 / 65,536 = 0.0042), and both searches' CPU time. The speed-up of `hamming.within` depends on it, and at 1/16
of the pairs (hamming.CANDIDATE_COST) it searches by brute force instead. Run through the harness (wrapped): the
table it prints becomes bench/records/audit_pdq_candidates.json.

    .venv/bin/python bench/calibration/audit_pdq_candidates.py [--records DIR]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness, preprocess, full_size

import harness as h  # noqa: E402
import numpy as np  # noqa: E402

from mieb_ray.audit import hamming, matches  # noqa: E402

THRESHOLD = matches.PDQ_THRESHOLD


def distributions(total: int = 12_000, train_rows: int = 1_500) -> None:
    """Candidates a pair, and each search's CPU time, on three kinds of hashes (see the docstring)."""
    from full_size import NOISE_SIDE, noise_png
    from preprocess import KINDS, make_kind, mix_weights

    from mieb_ray.audit.fingerprints import fingerprint

    def words(prints) -> np.ndarray:
        packed = np.frombuffer(b"".join(p.pdq for p in prints if p.pdq), np.uint8).reshape(-1, 32)
        return packed.view(">u8").astype(np.uint64).reshape(-1, 4)

    weights = mix_weights()
    pictures = words([fingerprint(b) for i, kind in enumerate(KINDS)
                      for b in make_kind(kind, max(50, int(total * weights[kind])), seed=200 + i)])
    rng = np.random.default_rng(0)
    noise = words([fingerprint(noise_png(f"x/{i}")) for i in range(len(pictures))])
    kinds = {"pictures: bench/preprocess.py's mix (crops of the fixture pictures at mieb-train's sizes)": pictures,
             f"{NOISE_SIDE}x{NOISE_SIDE} noise PNGs (the full-size rehearsal's images)": noise,
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


def run() -> None:
    h.wrap(distributions, "audit_pdq_candidates", "Candidates of multi-index hashing by kind of hash",
           kind="calibration", group="Audit")


if __name__ == "__main__":
    run()
