"""The near detector, with embeddings (made by the embed job with --model, or given): the top-k engine, the train
embeddings as the corpus (every row its own group) and each eval embedding shard as a query block, reduced to each
eval image's NEAR_K nearest train rows; pairs at cosine >= the threshold, each eval image's task read from the
hash files.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray import storage
from mieb_ray.audit import matches
from mieb_ray.audit.config import AuditConfig
from mieb_ray.audit.hashes import HashFiles, locate
from mieb_ray.audit.plan import Plan
from mieb_ray.errors import UserError
from mieb_ray.io import embeddings
from mieb_ray.pipelines.embed import embed_table
from mieb_ray.runtime import tasks
from mieb_ray.runtime.cluster import RunContext
from mieb_ray.runtime.pools import PoolRequest
from mieb_ray.topk import engine
from mieb_ray.topk.kernels import TopRows

NEAR_K = 10  # nearest train rows kept per eval image


def _embeddings(config: AuditConfig, plan: Plan, log, ctx: RunContext | None = None) -> tuple[str, list[str]]:
    if config.train_embeddings:
        return config.train_embeddings, [config.against_embeddings]
    # images that do not decode are the audit's error rows already: they must not stop the embedding
    pool = PoolRequest(config.workers, config.gpus_per_worker, config.cpus_per_worker)
    root = storage.join(config.out, "embeddings")
    train_out = embed_table(plan.train.uris[0], plan.train.columns(0).key, storage.join(root, "train"), config.model,
                            config.revision, "image", log, pool, config.executor, max_error_rate=1.0, ctx=ctx)
    # each table keyed as the hashing keyed it: BioVITA's corpus by its photo ids
    return train_out, [embed_table(uri, plan.against.columns(n).key, storage.join(root, f"against-{n}"), config.model,
                                   config.revision, "image", log, pool, config.executor, max_error_rate=1.0, ctx=ctx)
                       for n, uri in enumerate(plan.against.uris)]


@tasks.remote(num_cpus=1, num_returns=3)
def _query_block(uri: str):
    """An eval shard's vectors, keys and dim (None: an empty shard whose type gives none)."""
    table = embeddings.open_shard(uri)
    return embeddings.matrix(table).astype(np.float32), table["key"].combine_chunks(), embeddings.dim(table)


@tasks.remote(num_cpus=1)
def _near_rows(result, keys: pa.Array, threshold: float) -> pa.Table:
    scores, docs = result
    return matches.near_rows(scores, docs, keys, threshold)


@tasks.remote(num_cpus=1)
def _doc_keys(uri: str, rows: np.ndarray) -> list[str]:
    return embeddings.open_shard(uri)["key"].take(pa.array(rows)).to_pylist()


def _check_dims(train_uri: str, lay: engine.Layout, eval_dims: list[int | None]) -> None:
    """One dim on both sides, read from the shards (a manifest's `dim` may be missing or wrong)."""
    tasks.get(lay.stat_refs)  # a train shard's one-line error, raised as itself
    train = lay.stats()["dim"]
    if isinstance(train, list):
        raise storage.StorageError(f"{storage.display(train_uri)} mixes embedding dimensions {train}")
    dims = sorted({d for d in [train, *eval_dims] if d is not None})
    if len(dims) > 1:
        raise UserError(f"train and eval embeddings differ in dim ({dims})")


def near_pairs(train_uri: str, against_uris: list[str], threshold: float, k: int = NEAR_K) -> tuple[pa.Table, dict]:
    """(train_key, eval_key, score) of each eval embedding's k nearest train embeddings at cosine >= threshold,
    on the top-k engine: the train shards laid out once (every row its own group), each eval shard one query
    block. And the search's statistics."""
    shards = embeddings.shard_uris(train_uri)
    query_shards = [s for u in against_uris for s in embeddings.shard_uris(u)]
    lay = engine.layout(shards, group_column=engine.ROWS)
    parts = len(lay.partitions)
    blocks = [_query_block.remote(u) for u in query_shards]
    dims = tasks.get([b[2] for b in blocks])
    _check_dims(train_uri, lay, dims)
    blocks = [b for b, d in zip(blocks, dims) if d is not None]  # empty shards of no dim: nothing to query
    found = engine.search(lay, [b[0] for b in blocks], TopRows(k))
    rows = pa.concat_tables(tasks.get([_near_rows.remote(r, b[1], threshold) for r, b in zip(found, blocks)]))
    docs = rows["doc"].to_numpy()
    shard_of, row_of = docs >> 32, docs & 0xFFFFFFFF
    keys = np.empty(len(docs), object)
    wanted = np.unique(shard_of)
    for s, got in zip(wanted, tasks.get([_doc_keys.remote(shards[s], row_of[shard_of == s]) for s in wanted])):
        keys[shard_of == s] = got
    stats = lay.stats()
    counts = pc.value_counts(rows["eval_key"]).field("counts") if rows.num_rows else None
    info = {"corpus_rows": stats["rows"], "partitions": parts, "query_blocks": len(blocks),
            "read_ratio": stats["read_ratio"], "k": k,
            "saturated": int(pc.sum(pc.equal(counts, k)).as_py() or 0) if counts is not None else 0,
            "model": embeddings.manifest_model(storage.read_manifest(train_uri)).get("name")}
    return pa.table({"train_key": pa.array(list(keys), pa.string()), "eval_key": rows["eval_key"],
                     "score": rows["score"]}), info


def pairs(config: AuditConfig, plan: Plan, hashed: HashFiles, log,
          ctx: RunContext | None = None) -> tuple[pa.Table, dict]:
    """The near pairs (matches.PAIR_SCHEMA), and what summary.json says of the search. ctx: the command's Ray."""
    train_uri, against_uris = _embeddings(config, plan, log, ctx)
    t0 = time.time()
    rows, info = near_pairs(train_uri, against_uris, config.threshold)
    located = tasks.get(locate.remote(hashed.uris("against"), pc.unique(rows["eval_key"]), ["eval_task"]))
    task_of = dict(zip(located["key"].to_pylist(), located["eval_task"].to_pylist()))
    n = rows.num_rows
    found = pa.table({"train_key": rows["train_key"],
                      "eval_task": pa.array([task_of.get(k) for k in rows["eval_key"].to_pylist()], pa.string()),
                      "eval_key": rows["eval_key"], "method": pa.array(["near"] * n, pa.string()),
                      "score": rows["score"], "group": pa.nulls(n, pa.int64())}, schema=matches.PAIR_SCHEMA)
    info = {"train_embeddings": storage.display(train_uri),
            "against_embeddings": [storage.display(u) for u in against_uris], "threshold": config.threshold,
            **info, "seconds": round(time.time() - t0, 3)}
    log(f"[audit] near (cosine >= {config.threshold}): {n} pairs from {info['query_blocks']} query blocks x "
        f"{info['partitions']} partitions of {info['corpus_rows']:,} train embeddings in {info['seconds']:.1f}s")
    if info["saturated"]:
        log(f"[audit] warning: {info['saturated']} eval images have {NEAR_K} train rows at or above the threshold; "
            "there may be more")
    return found, info
