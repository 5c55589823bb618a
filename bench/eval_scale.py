"""Eval at scale: group-max top-10 of 10,000 queries over 1,000,000 images in 50,000 groups, against faiss.

Data (seeded, 512-d float32 random vectors, groups assigned at random, about 20 images each): the corpus is
written once as 100 embedding shards (Arrow IPC, the embed job's format, group id in a `label` column); the
queries stay in memory. Not timed.

  1. faiss         faiss-cpu IndexFlatIP brute force: read the shards, L2-normalise, add, search the top K
                   images per query with K = 10 x the largest group (so the top-10 groups are always among
                   them), then group by: each group's best image, top 10 groups per query.
  2. mieb-ray      the top-k engine (mieb_ray/topk) over the shards (engine.layout, then engine.search): one layout
                   pass (map tasks read each shard once, partition tasks sort P group-aligned partitions), then
                   query-block x partition score tasks and a tree of exact top-k merges.

The harness table (bench/harness.py) has seconds (the layout pass and the whole), CPU seconds, peak memory
(system-wide rise, the Ray workers' summed RSS and the largest single worker's RSS and USS, i.e. per task; see
harness.MemorySampler) and the time ratio against faiss (target: at or below 1.13x, the previous engine's); the
record is bench/records/eval_scale.json, with the bytes of shard files the layout opened over the corpus' bytes
(1.00: every shard read once) and whether both give the same top-10 groups.

Run from the repository root (faiss-cpu is a benchmark-only dependency):
    .venv/bin/pip install faiss-cpu && .venv/bin/python bench/eval_scale.py
    .venv/bin/python bench/eval_scale.py --images 100000 --queries 1000 --groups 5000 --records /tmp/records  # quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import threading
import time
from pathlib import Path

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported
import numpy as np
import pyarrow as pa
import ray

from mieb_ray import formats
from mieb_ray.io import embeddings
from mieb_ray.topk import engine
from mieb_ray.topk.groupmax import normalize
from mieb_ray.topk.kernels import TopK


def write_corpus(folder: Path, images: int, groups: int, dim: int, shards: int, seed: int = 0) -> tuple[list[str], int]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    label = rng.integers(0, groups, size=images)
    schema = formats.embedding_schema(dim, "float32", pa.schema([("label", pa.int64())]), {"model": {"name": "random"}})
    uris, per = [], -(-images // shards)
    for n, lo in enumerate(range(0, images, per)):
        hi = min(lo + per, images)
        vectors = rng.standard_normal((hi - lo, dim), dtype=np.float32)
        table = embeddings.shard_table(schema, [f"img/{i}" for i in range(lo, hi)], vectors,
                                       {"label": label[lo:hi].tolist()})
        uris.append(str(folder / f"{n:06d}.arrow"))
        embeddings.write_ipc(uris[-1], table)
    return uris, int(np.bincount(label).max())


@ray.remote(num_cpus=1)
def _warm_worker() -> int:
    """Start-up, not timed: a worker imports the engine (and torch) once, as faiss was imported before timing."""
    import mieb_ray.topk.engine  # noqa: F401

    time.sleep(2)  # hold this worker, so that each of the concurrent calls lands on its own
    return os.getpid()


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
    ap.add_argument("--partitions", type=int, default=None, help="default: the engine's, one per 256 MB of corpus")
    ap.add_argument("--ray-cpus", type=int, default=4, help="logical CPUs Ray is started with (default: 4)")
    ap.add_argument("--work", type=Path, default=Path("bench/_work/eval_scale"))
    ap.add_argument("--reuse", action="store_true", help="reuse a corpus of the same shape already in --work")
    ap.add_argument("--repeat", type=int, default=1)
    h.add_records_option(ap)
    args = ap.parse_args()
    work = args.work.resolve()
    shape = {"images": args.images, "groups": args.groups, "dim": args.dim, "shards": 100}
    marker = work / "corpus" / "_shape.json"
    if args.reuse and marker.exists() and json.loads(marker.read_text())["shape"] == shape:
        print(f"[setup] reusing the corpus in {work / 'corpus'}", flush=True)
        saved = json.loads(marker.read_text())
        uris, max_group = saved["uris"], saved["max_group"]
    else:
        shutil.rmtree(work, ignore_errors=True)
        print(f"[setup] {args.images:,} images x {args.dim} in {args.groups:,} groups, as 100 shards ...", flush=True)
        uris, max_group = write_corpus(work / "corpus", args.images, args.groups, args.dim, 100)
        marker.write_text(json.dumps({"shape": shape, "uris": uris, "max_group": max_group}))
    shutil.rmtree(work / "ray", ignore_errors=True)
    queries = np.random.default_rng(1).standard_normal((args.queries, args.dim), dtype=np.float32)
    h.start_ray(work, args.ray_cpus)
    import faiss  # imported before timing, as the engine in the Ray workers below

    ray.get([_warm_worker.remote() for _ in range(args.ray_cpus)])
    kept = {}

    def with_faiss(i):
        with h.MemorySampler(uss=True) as mem, h.CpuClock() as cpu:
            t0 = time.perf_counter()
            kept["faiss"] = faiss_groupby(queries, uris, args.k, max_group)
            seconds = time.perf_counter() - t0
        return {"seconds": seconds, "cpu": cpu.seconds, "used": mem.used_delta}

    def ours(i):
        with h.MemorySampler(uss=True) as mem, h.CpuClock() as cpu:
            t0 = time.perf_counter()
            lay = engine.layout(uris, group_column="label", partitions=args.partitions)
            layout_done = threading.Thread(target=ray.wait, args=(lay.partitions,),  # timed aside: no barrier
                                           kwargs={"num_returns": len(lay.partitions), "fetch_local": False})
            layout_done.start()
            blocks = [queries[lo:lo + args.query_block] for lo in range(0, len(queries), args.query_block)]
            refs = engine.search(lay, blocks, TopK(args.k))
            layout_done.join()
            t_layout = time.perf_counter() - t0
            kept["ours"] = tuple(np.concatenate(x) for x in zip(*ray.get(refs)))
            seconds = time.perf_counter() - t0
        kept["stats"] = lay.stats()
        return {"seconds": seconds, "cpu": cpu.seconds, "layout": t_layout, "used": mem.used_delta,
                "ray_rss": mem.ray_rss, "task_rss": mem.task_rss, "task_uss": mem.task_uss}

    def peak(key):
        return lambda r: h.gib(max(r.extra(key))) if r.extra(key) else "n/a"

    bench = h.Benchmark(
        "eval_scale", f"Group-max top-{args.k}: {args.queries:,} queries x {args.images:,} images ({args.dim}-d) in "
        f"{args.groups:,} groups", [
            h.Contender("faiss", f"faiss-cpu IndexFlatIP brute force (K={args.k * max_group}) + group-by, one process: "
                        "read the shards, normalise, add, search", call=with_faiss),
            h.Contender("mieb-ray", f"the top-k engine (query blocks of {args.query_block}): layout pass (map tasks "
                        "read each shard once, partitions sorted by group), score tasks, tree of exact top-k merges",
                        call=ours, baseline="faiss")],
        group="Eval", ratio=("mieb-ray", "faiss"), repeat=args.repeat,
        columns=[("CPU seconds (runs)", lambda r: ", ".join(f"{c:.1f}" for c in r.extra("cpu"))),
                 ("layout done at (s)", lambda r: ", ".join(f"{c:.1f}" for c in r.extra("layout")) or "n/a"),
                 ("peak system used (rise)", peak("used")), ("peak Ray workers RSS (sum)", peak("ray_rss")),
                 ("peak RSS per task (largest worker)", peak("task_rss")),
                 ("peak private (USS) per task", peak("task_uss"))])
    record = h.run(bench)
    stats = kept["stats"]
    cpu_ratio = min(record["mieb-ray"].extra("cpu")) / min(record["faiss"].extra("cpu"))
    agree = (kept["ours"][1] == kept["faiss"][1]).all(axis=1).mean()
    record.finish(figures={
        "target": "mieb-ray / faiss <= 1.13", "mieb-ray / faiss in CPU seconds (least)": round(cpu_ratio, 2),
        "engine": f"{stats['partitions']} partitions, {stats['map_tasks']} map tasks",
        "corpus bytes read / corpus bytes": f"{stats['bytes_opened'] / stats['corpus_bytes']:.2f} "
        f"({stats['bytes_opened']:,} of {stats['corpus_bytes']:,} bytes, {stats['shards']} shards)",
        f"queries whose top-{args.k} groups agree exactly": f"{agree:.1%}",
        "faiss": faiss.__version__}, notes=[
        "Corpus shards written before timing (not timed); Ray start-up excluded (it includes importing the engine "
        "and torch in each Ray worker, as faiss is imported before its run).", h.MemorySampler.METHOD])


if __name__ == "__main__":
    main()
