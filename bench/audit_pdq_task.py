"""One pdq task of the full-size audit, end to end, against the same task searching by brute force.

The full audit (`mieb-ray audit --against mieb` of mieb-train on 256 cores) runs 512 pdq tasks, each a batch of
about 8,661 train hash rows against the eval side of all of MIEB (about 1M pictures). This times one such task on
random hash rows of those shapes (PDQ_HASHES columns, keys, quality 100), one core, CPU time:

  eval side   matches.pdq_side of the 1M eval rows (distinct pictures, their index): once per audit, in the job's
              `_pdq_against` task
  shipped     the eval side pickled (protocol 5) and read back: what each task pays to receive it from the object
              store (Ray pickles it the same way; its numpy and Arrow buffers travel out of band)
  search      matches.pdq_pairs of the train batch against it: the train side made ready, the six comparisons of
              PDQ_COMPARED, the pairs as rows
and the same search with hamming.within replaced by hamming.brute_force (the search before multi-index hashing):
the baseline. The pair tables must be equal. Then the full audit's pdq step projected: 512 x (shipped + search).

    .venv/bin/python bench/audit_pdq_task.py [--eval 1000000] [--train 8661]
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import sys
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mieb_ray.audit import hamming, matches  # noqa: E402

TASKS = 512  # the full audit's pdq tasks on 256 cores (audit/job.py _train_batches: two a CPU)


def table(rng, n: int, prefix: str, task: str) -> pa.Table:
    hashes = {c: pa.array(np.frombuffer(rng.bytes(n * 32), "V32").tolist(), pa.binary(32))
              for c in matches.PDQ_HASHES}
    return pa.table({"key": [f"{prefix}/{i}" for i in range(n)], "eval_task": [task] * n, **hashes,
                     "pdq_quality": pa.array(np.full(n, 100), pa.int16())})


def planted(rng, train: pa.Table, evals: pa.Table, copies: int = 100) -> pa.Table:
    """`train` with its first `copies` pictures copies of eval pictures, 0 to 40 bits away (the pairs to find: those
    within 31 bits)."""
    hashes = np.frombuffer(train["pdq"].combine_chunks().buffers()[1], np.uint8).reshape(-1, 32).copy()
    source = np.frombuffer(evals["pdq"].combine_chunks().buffers()[1], np.uint8).reshape(-1, 32)
    for k in range(min(copies, len(hashes))):
        bits = np.unpackbits(source[rng.integers(len(source))])
        bits[rng.choice(256, k % 41, replace=False)] ^= 1
        hashes[k] = np.packbits(bits)
    column = pa.array([bytes(h) for h in hashes], pa.binary(32))
    return train.set_column(train.schema.get_field_index("pdq"), "pdq", column)


def cpu(fn):
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", type=int, default=1_000_000)
    ap.add_argument("--train", type=int, default=8_661)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    evals, train = table(rng, args.eval, "imagenet1k/test", "ImageNet1k"), table(rng, args.train, "imagenet1k", "")
    train = planted(rng, train, evals)
    built, side = cpu(lambda: matches.pdq_side(evals))
    blob = pickle.dumps(side, protocol=5)
    shipped, side = cpu(lambda: pickle.loads(blob))
    ours, pairs = cpu(lambda: matches.pdq_pairs(train, side))
    within = hamming.within
    hamming.within = lambda t, index, threshold: hamming.brute_force(t, index.words, threshold)
    try:
        base, base_pairs = cpu(lambda: matches.pdq_pairs(train, side))
    finally:
        hamming.within = within
    same = matches.sort_pairs(pairs[0]).equals(matches.sort_pairs(base_pairs[0]))
    comparisons = args.train * args.eval * len(matches.PDQ_COMPARED)
    print(f"### One pdq task of the full audit: {args.train:,} train x {args.eval:,} eval hash rows "
          f"({comparisons:,} hash comparisons), one core\n")
    print("| step | CPU seconds |\n|---|---|")
    print(f"| eval side made ready (once per audit) | {built:.2f} |")
    print(f"| eval side shipped to the task (pickle read, {len(blob) / 2**20:,.0f} MiB) | {shipped:.2f} |")
    print(f"| search, brute force (the baseline) | {base:.2f} |")
    print(f"| search, multi-index hashing (mieb-ray) | {ours:.2f} ({base / ours:.1f}x faster) |")
    print(f"\nsame pairs: {same} ({pairs[0].num_rows:,})")
    print(f"the full audit's pdq step ({TASKS} such tasks): {TASKS * (shipped + ours):,.0f} CPU-s "
          f"({TASKS * (shipped + base):,.0f} by brute force), {TASKS * (shipped + ours) / 256 / 60:.1f} minutes on "
          f"256 cores")
    print(f"CPU: {platform.processor() or platform.machine()}; numpy {np.__version__}, pyarrow {pa.__version__}")


if __name__ == "__main__":
    main()
