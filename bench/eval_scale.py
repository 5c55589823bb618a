"""Eval at scale: group-max top-10 of 10,000 queries over 1,000,000 images in 50,000 groups, against faiss.

Data (seeded, 512-d float32 random vectors, groups assigned at random, about 20 images each): the corpus is
written once as 100 embedding shards (Arrow IPC, the embed job's format, group id in a `label` column); the
queries stay in memory. Not timed.

  1. faiss         faiss-cpu IndexFlatIP brute force: read the shards, L2-normalise, add, search the top K
                   images per query with K = 10 x the largest group (so the top-10 groups are always among
                   them), then group by: each group's best image, top 10 groups per query.
  2. mieb-ray      group_topk(queries, shards=...): Ray partition tasks and query-block x partition score tasks
                   streaming the shards, exact top-k merge (mieb_ray/pipelines/group_search.py).

Prints seconds, peak memory (system-wide rise and the Ray workers' summed RSS, see bench/_baselines.py) and
the time ratio (target: at most 1.5x faiss), and checks that both give the same top-10 groups.

Run from the repository root (faiss-cpu is a benchmark-only dependency):
    .venv/bin/pip install faiss-cpu && .venv/bin/python bench/eval_scale.py
    .venv/bin/python bench/eval_scale.py --images 100000 --queries 1000 --groups 5000   # a quick check
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import _baselines as b  # first: sets RAY_AUTH_MODE before Ray is imported
import numpy as np
import pyarrow as pa

from mieb_ray.io import embeddings
from mieb_ray.pipelines.group_search import _partitions, group_topk
from mieb_ray.retrieval.groupmax import normalize


def write_corpus(folder: Path, images: int, groups: int, dim: int, shards: int, seed: int = 0) -> tuple[list[str], int]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    label = rng.integers(0, groups, size=images)
    schema = embeddings.schema(dim, "float32", pa.schema([("label", pa.int64())]), {"model": {"name": "random"}})
    uris, per = [], -(-images // shards)
    for n, lo in enumerate(range(0, images, per)):
        hi = min(lo + per, images)
        vectors = rng.standard_normal((hi - lo, dim), dtype=np.float32)
        table = embeddings.shard_table(schema, [f"img/{i}" for i in range(lo, hi)], vectors,
                                       {"label": label[lo:hi].tolist()})
        uris.append(str(folder / f"{n:06d}.arrow"))
        embeddings.write_ipc(uris[-1], table)
    return uris, int(np.bincount(label).max())


def faiss_groupby(queries: np.ndarray, uris: list[str], k: int, max_group: int) -> tuple[np.ndarray, np.ndarray]:
    import faiss

    tables = [embeddings.open_shard(u) for u in uris]
    index = faiss.IndexFlatIP(queries.shape[1])
    for t in tables:
        index.add(normalize(embeddings.matrix(t)))
    label = np.concatenate([t["label"].to_numpy() for t in tables])
    scores, ids = index.search(normalize(queries), k * max_group)
    out_s, out_g = np.empty((len(queries), k), np.float32), np.empty((len(queries), k), np.int64)
    for r in range(len(queries)):  # group by: first (best) hit of each group, in score order
        groups = label[ids[r]]
        _, first = np.unique(groups, return_index=True)
        first = np.sort(first)[:k]
        out_s[r], out_g[r] = scores[r, first], groups[first]
    return out_s, out_g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--groups", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--query-block", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=None, help="default: one per 256 MB of corpus")
    ap.add_argument("--work", type=Path, default=Path("bench/_work/eval_scale"))
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    print(f"[setup] {args.images:,} images x {args.dim} in {args.groups:,} groups, as 100 shards ...", flush=True)
    uris, max_group = write_corpus(work / "corpus", args.images, args.groups, args.dim, 100)
    queries = np.random.default_rng(1).standard_normal((args.queries, args.dim), dtype=np.float32)
    b.start_ray(work)

    with b.MemorySampler() as mem_faiss:
        t0 = time.perf_counter()
        f_scores, f_groups = faiss_groupby(queries, uris, args.k, max_group)
        t_faiss = time.perf_counter() - t0
    print(f"[run] faiss IndexFlatIP + group-by (K={args.k * max_group}): {t_faiss:.1f}s", flush=True)

    partitions = args.partitions or _partitions(args.images * args.dim * 4)
    with b.MemorySampler() as mem_ours:
        t0 = time.perf_counter()
        o_scores, o_groups = group_topk(queries, k=args.k, shards=uris, group_column="label",
                                        query_block=args.query_block, partitions=partitions)
        t_ours = time.perf_counter() - t0
    print(f"[run] mieb-ray group_topk: {t_ours:.1f}s", flush=True)

    same = float((o_groups == f_groups).all(axis=1).mean())
    rows = [[f"faiss-cpu IndexFlatIP brute force (K={args.k * max_group}) + group-by", f"{t_faiss:.1f}",
             b.gib(mem_faiss.used_delta), "n/a (one process)", "1.00"],
            [f"mieb-ray group_topk ({partitions} partitions, query blocks of {args.query_block})", f"{t_ours:.1f}",
             b.gib(mem_ours.used_delta), b.gib(mem_ours.ray_rss), f"{t_ours / t_faiss:.2f}"]]
    print("\n" + "=" * 100)
    print(f"### Group-max top-{args.k}: {args.queries:,} queries x {args.images:,} images ({args.dim}-d) in "
          f"{args.groups:,} groups\n")
    print(b.markdown_table(["contender", "seconds", "peak system used (rise)", "peak Ray workers RSS", "x faiss"],
                           rows))
    print(f"\n**mieb-ray / faiss = {t_ours / t_faiss:.2f} (target <= 1.5)**; queries whose top-{args.k} groups "
          f"agree exactly: {same:.1%}\n")
    import faiss

    b.footer("Corpus shards written before timing (not timed); Ray start-up excluded.", b.MemorySampler.METHOD,
             f"faiss {faiss.__version__}")


if __name__ == "__main__":
    main()
