"""The audit's near-duplicate stage against faiss `IndexFlatIP`, same embeddings, same pairs.

Data: N train and M eval embeddings (512-d float32, random unit vectors) in our shard format, 10,000 rows a
shard; the first `--planted` eval rows are a train row plus noise (cosine about 0.97), so both contenders have
pairs to find. Not timed.

Contenders, one after the other in this process (Ray started before timing; a 2-CPU Ray, both use 2 cores):
  1. faiss   read every shard (embeddings.read_all), normalise, IndexFlatIP.add(train), search(eval, k),
             keep the pairs at cosine >= threshold: what a user would write with faiss on one machine.
  2. mieb-ray  pipelines.audit.near_pairs: the top-k engine lays the train shards out once (each row its own
             group) and scores each eval shard as a query block; workers read the shards, the driver gets
             the pairs.

Prints seconds, pairs/s, the ratio, and whether both found the same pairs (a pair within 1e-5 of the threshold
may fall either side of it: such ties are counted apart). Run from the repository root:
    .venv/bin/python bench/audit_near.py [--train 1000000] [--eval 200000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import _baselines as b  # first: sets RAY_AUTH_MODE before Ray is imported
import numpy as np
from embedding_fixtures import write_embeddings

from mieb_ray.audit.job import NEAR_K, near_pairs
from mieb_ray.io import embeddings

DIM, SHARD_ROWS, THRESHOLD = 512, 10_000, 0.95


def unit_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, DIM), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make(work: Path, n_train: int, n_eval: int, planted: int) -> tuple[str, str]:
    rng = np.random.default_rng(0)
    train = unit_rows(rng, n_train)
    queries = unit_rows(rng, n_eval)
    twins = rng.choice(n_train, planted, replace=False)
    queries[:planted] = train[twins] + 0.25 * unit_rows(rng, planted)  # cosine ~0.97 once normalised
    paths = str(work / "train"), str(work / "eval")
    for path, matrix, prefix in ((paths[0], train, "t"), (paths[1], queries, "e")):
        write_embeddings(path, [f"{prefix}{i}" for i in range(len(matrix))], matrix, "image", "float32",
                         max(1, -(-len(matrix) // SHARD_ROWS)), {"bench": "audit_near"})
    return paths


def faiss_pairs(train_uri: str, eval_uri: str) -> set[tuple[str, str, float]]:
    import faiss

    train_keys, train = embeddings.read_all(train_uri)
    eval_keys, queries = embeddings.read_all(eval_uri)
    faiss.normalize_L2(train)
    faiss.normalize_L2(queries)
    index = faiss.IndexFlatIP(train.shape[1])
    index.add(train)
    scores, rows = index.search(queries, NEAR_K)
    q, k = np.nonzero(scores >= THRESHOLD)
    return {(eval_keys[i], train_keys[rows[i, j]], float(scores[i, j])) for i, j in zip(q, k)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=1_000_000)
    ap.add_argument("--eval", type=int, default=200_000)
    ap.add_argument("--planted", type=int, default=1000)
    ap.add_argument("--work", type=Path, default=Path("bench/_work/audit_near"))
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    train_uri, eval_uri = make(work, args.train, args.eval, args.planted)
    print(f"[setup] {args.train:,} train x {args.eval:,} eval embeddings ({DIM}-d) in "
          f"{time.perf_counter() - t0:.0f}s", flush=True)
    import faiss

    faiss.omp_set_num_threads(b.CORES)
    b.start_ray(work, num_cpus=b.CORES)
    load = os.getloadavg()[0]

    t0 = time.perf_counter()
    theirs = faiss_pairs(train_uri, eval_uri)
    t_faiss = time.perf_counter() - t0
    print(f"[faiss] {len(theirs):,} pairs in {t_faiss:.1f}s", flush=True)
    t0 = time.perf_counter()
    rows, info = near_pairs(train_uri, [eval_uri], THRESHOLD)
    t_ours = time.perf_counter() - t0
    ours = {(e, t, s) for e, t, s in zip(*(rows[c].to_pylist() for c in ("eval_key", "train_key", "score")))}
    print(f"[mieb-ray] {len(ours):,} pairs in {t_ours:.1f}s ({info['partitions']} partitions x "
          f"{info['query_blocks']} query blocks)", flush=True)

    a, c = {p[:2]: p[2] for p in ours}, {p[:2]: p[2] for p in theirs}
    differ = set(a) ^ set(c)
    ties = {p for p in differ if abs(a.get(p, c.get(p)) - THRESHOLD) < 1e-5}
    worst = max((abs(a[p] - c[p]) for p in set(a) & set(c)), default=0.0)
    pairs_per_s = args.train * args.eval
    print("\n" + "=" * 100)
    print(f"### Audit near-duplicate stage: {args.train:,} train x {args.eval:,} eval embeddings, {DIM}-d float32, "
          f"top-{NEAR_K}, cosine >= {THRESHOLD}\n")
    print(b.markdown_table(["contender", "seconds", "comparisons/s", "x faster than faiss"], [
        ["faiss IndexFlatIP (read shards, normalise, add, search, threshold)", f"{t_faiss:.1f}",
         f"{pairs_per_s / t_faiss:.3g}", "1.0"],
        ["mieb-ray audit near stage (top-k engine: layout, score, merge, keys of the pairs)", f"{t_ours:.1f}",
         f"{pairs_per_s / t_ours:.3g}", f"{t_faiss / t_ours:.2f}"]]))
    print(f"\n**mieb-ray {t_ours:.1f}s vs faiss {t_faiss:.1f}s = {t_faiss / t_ours:.2f}x**; pairs found: "
          f"{len(ours):,} vs {len(theirs):,}; differing pairs {len(differ)} (of which {len(ties)} within 1e-5 of the "
          f"threshold); largest score difference on common pairs {worst:.2e}\n")
    b.footer("Ray start-up excluded; both contenders on the same 2 cores (faiss OpenMP threads = cores, Ray CPUs = "
             "cores); shards on local disk, page cache warm from writing them.",
             f"Load average (1 min) before / after: {load:.2f} / {os.getloadavg()[0]:.2f}.")


if __name__ == "__main__":
    main()
