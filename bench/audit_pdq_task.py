"""One pdq task of the full-size audit, end to end, against the same task searching by brute force.

The full audit (`mieb-ray audit --against mieb` of mieb-train on 256 cores) runs 512 pdq tasks, each a batch of
about 8,661 train hash rows against the eval side of all of MIEB (about 1M pictures). This times one such task on
random hash rows of those shapes (PDQ_HASHES columns, keys, quality 100), one core, CPU time:

  eval side   matches.pdq_index of the 1M eval rows (distinct pictures, their index): once per audit, in the job's
              `_pdq_against` task
  shipped     the eval side pickled (protocol 5) and read back: what each task pays to receive it from the object
              store (Ray pickles it the same way; its numpy and Arrow buffers travel out of band)
  search      matches.pdq_train_pairs of the train batch against it: the train side made ready, the comparisons of
              PDQ_FROM_TRAIN, the pairs as rows
and the same search with hamming.within replaced by hamming.brute_force (the search before multi-index hashing):
the baseline. The pair tables must be equal. And the other way (matches.PDQ_FROM_EVAL: a train picture cropped
from an eval one off a side or a corner), 512 tasks more:
  train side  matches.pdq_index of mieb-train's 4,434,196 rows' own hashes: once per audit
  other way   matches.pdq_eval_pairs of an eval batch (1M / 512 rows) searching with its 48 side windows in it
Then the full audit's pdq step projected: 512 x (shipped + search + other way).
Prints the harness table (bench/harness.py; CPU seconds) and writes bench/records/audit_pdq_task.json.

    .venv/bin/python bench/audit_pdq_task.py [--eval 1000000] [--train 8661] [--repeat 1]
    .venv/bin/python bench/audit_pdq_task.py --eval 20000 --train 500 --records /tmp/records    # a smoke run
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time

import harness as h
import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mieb_ray.audit import hamming, matches  # noqa: E402

TASKS = 512  # the full audit's pdq tasks on 256 cores (audit/pdq.py batches: two a CPU)


def table(rng, n: int, prefix: str, task: str) -> pa.Table:
    types = {c: matches.HASH_SCHEMA.field(c).type for c in matches.PDQ_HASHES}  # one hash a row, or several
    hashes = {c: pa.array(np.frombuffer(rng.bytes(n * t.byte_width), f"V{t.byte_width}").tolist(), t)
              for c, t in types.items()}
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
    ap.add_argument("--train-total", type=int, default=4_434_196, help="rows of the train side's index")
    ap.add_argument("--repeat", type=int, default=1)
    h.add_records_option(ap)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    evals, train = table(rng, args.eval, "imagenet1k/test", "ImageNet1k"), table(rng, args.train, "imagenet1k", "")
    train = planted(rng, train, evals)
    n = args.train_total  # the train side's own hashes alone: 55 hashes a row of 4.4M rows would be 7.8 GB
    whole = pa.table({"key": [f"imagenet1k/{i}" for i in range(n)], "eval_task": pa.nulls(n, pa.string()),
                      "pdq": pa.array(np.frombuffer(rng.bytes(32 * n), "V32").tolist(), pa.binary(32)),
                      "pdq_quality": pa.array(np.full(n, 100), pa.int16())})
    evals_batch = evals.slice(0, max(1, args.eval // TASKS))
    kept = {}

    def eval_side(i):
        seconds, kept["side"] = cpu(lambda: matches.pdq_index(evals))
        kept["blob"] = pickle.dumps(kept["side"], protocol=5)
        return seconds

    def shipped(i):
        seconds, kept["side"] = cpu(lambda: pickle.loads(kept["blob"]))
        return seconds

    def search(i):
        seconds, kept["pairs"] = cpu(lambda: matches.pdq_train_pairs(train, kept["side"]))
        return seconds

    def train_side(i):
        seconds, kept["train"] = cpu(lambda: matches.pdq_index(whole, matches.PDQ_FROM_EVAL, side=0))
        return seconds

    def other_way(i):
        seconds, kept["back"] = cpu(lambda: matches.pdq_eval_pairs(evals_batch, kept["train"]))
        return seconds

    def brute_force(i):
        within = hamming.within
        hamming.within = lambda t, index, threshold: hamming.brute_force(t, index.words, threshold)
        try:
            seconds, kept["base"] = cpu(lambda: matches.pdq_train_pairs(train, kept["side"]))
        finally:
            hamming.within = within
        return seconds

    comparisons = args.train * args.eval * matches.pdq_comparisons(matches.PDQ_FROM_TRAIN)
    base = "search, brute force"
    bench = h.Benchmark(
        "audit_pdq_task", f"One pdq task of the full audit: {args.train:,} train x {args.eval:,} eval hash rows "
        f"({comparisons:,} hash comparisons), one core, CPU seconds", [
            h.Contender("eval side made ready", "matches.pdq_index of the eval rows: once per audit", call=eval_side),
            h.Contender("eval side shipped", "its pickle (protocol 5) read back: what each task pays to receive it",
                        call=shipped),
            h.Contender(base, "matches.pdq_pairs with hamming.brute_force (the search before multi-index hashing): "
                        "the baseline", call=brute_force),
            h.Contender("search, multi-index hashing", "matches.pdq_train_pairs: the train side made ready, the "
                        "comparisons of PDQ_FROM_TRAIN, the pairs as rows", call=search, baseline=base),
            h.Contender("train side made ready", f"matches.pdq_index of {n:,} train rows' own hashes (PDQ_FROM_EVAL): "
                        "once per audit", call=train_side),
            h.Contender("other way", f"matches.pdq_eval_pairs of {evals_batch.num_rows:,} eval rows' side windows in "
                        "the train side's index: one of the other way's tasks", call=other_way)],
        group="Audit", ratio=("search, multi-index hashing", base), repeat=args.repeat, unit="CPU s")
    record = h.run(bench)
    ship, ours, brute, back = (record[c].median for c in ("eval side shipped", "search, multi-index hashing", base,
                                                          "other way"))
    same = matches.sort_pairs(kept["pairs"][0]).equals(matches.sort_pairs(kept["base"][0]))
    record.finish(figures={
        "same pairs": f"{same} ({kept['pairs'][0].num_rows:,})",
        "eval side pickled (MiB)": round(len(kept["blob"]) / 2**20),
        "train side pickled (MiB)": round(len(pickle.dumps(kept["train"], protocol=5)) / 2**20),
        f"the full audit's pdq step ({TASKS} such tasks each way)": f"{TASKS * (ship + ours + back):,.0f} CPU-s, "
        f"{TASKS * back:,.0f} of it the other way ({TASKS * (ship + brute):,.0f} one way by brute force), "
        f"{TASKS * (ship + ours + back) / 256 / 60:.1f} minutes on 256 cores"})


if __name__ == "__main__":
    main()
