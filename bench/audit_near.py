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

Prints the harness table (bench/harness.py: seconds, comparisons/s, the ratio), writes
bench/records/audit_near.json, and says whether both found the same pairs (a pair within 1e-5 of the threshold
may fall either side of it: such ties are counted apart). Run from the repository root:
    .venv/bin/python bench/audit_near.py [--train 1000000] [--eval 200000]
    .venv/bin/python bench/audit_near.py --train 20000 --eval 2000 --records /tmp/records    # a smoke run
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported
import numpy as np

h.use_test_fixtures()
from support.embedding_fixtures import write_embeddings  # noqa: E402

from mieb_ray.audit.job import NEAR_K, near_pairs  # noqa: E402
from mieb_ray.io import embeddings  # noqa: E402

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
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path("bench/_work/audit_near"))
    h.add_records_option(ap)
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    train_uri, eval_uri = make(work, args.train, args.eval, args.planted)
    print(f"[setup] {args.train:,} train x {args.eval:,} eval embeddings ({DIM}-d) in "
          f"{time.perf_counter() - t0:.0f}s", flush=True)
    import faiss

    faiss.omp_set_num_threads(h.CORES)
    h.start_ray(work, num_cpus=h.CORES)
    found = {}

    def with_faiss(i):
        found["faiss"] = faiss_pairs(train_uri, eval_uri)

    def ours(i):
        rows, info = near_pairs(train_uri, [eval_uri], THRESHOLD)
        found["ours"] = {(e, t, s) for e, t, s in zip(*(rows[c].to_pylist() for c in ("eval_key", "train_key",
                                                                                       "score")))}
        return {"partitions": info["partitions"], "query_blocks": info["query_blocks"]}

    comparisons = args.train * args.eval
    bench = h.Benchmark(
        "audit_near", f"Audit near-duplicate stage: {args.train:,} train x {args.eval:,} eval embeddings, {DIM}-d "
        f"float32, top-{NEAR_K}, cosine >= {THRESHOLD}", [
            h.Contender("faiss", "faiss IndexFlatIP: read shards, normalise, add, search, threshold", call=with_faiss),
            h.Contender("mieb-ray", "the audit's near stage (top-k engine: layout, score, merge, keys of the pairs)",
                        call=ours, baseline="faiss")],
        group="Audit", ratio=("mieb-ray", "faiss"), repeat=args.repeat,
        columns=[("comparisons/s (fastest)", lambda r: f"{comparisons / r.fastest:.3g}")])
    record = h.run(bench)
    a, c = {p[:2]: p[2] for p in found["ours"]}, {p[:2]: p[2] for p in found["faiss"]}
    differ = set(a) ^ set(c)
    ties = {p for p in differ if abs(a.get(p, c.get(p)) - THRESHOLD) < 1e-5}
    worst = max((abs(a[p] - c[p]) for p in set(a) & set(c)), default=0.0)
    record.finish(figures={
        "pairs found (mieb-ray, faiss)": [len(a), len(c)],
        "differing pairs": len(differ), "of them within 1e-5 of the threshold": len(ties),
        "largest score difference on common pairs": f"{worst:.2e}",
        "engine layout (last run)": record["mieb-ray"].extras[-1]}, notes=[
        "Ray start-up excluded; both contenders on the same cores (faiss OpenMP threads = cores, Ray CPUs = cores); "
        "shards on local disk, page cache warm from writing them."])


if __name__ == "__main__":
    main()
