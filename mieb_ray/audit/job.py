"""The audit job: which train rows duplicate an eval image, by four detectors (exact, pixels, pdq, near: the same
bytes, the same pixels, a perceptual hash, CLIP cosine), each reported apart.

plan     driver: the train table and the eval tables (`mieb`: the MIEB eval splits, built into
         OUT/eval-data by the build job through the same readers, and reused); units of rows of one file
hash     the job's one stage, per unit: each image's sha256, pixel hash and PDQ hashes, committed as a Parquet
         file sorted by join partition (one row group each), then its progress record (audit/fingerprints.py,
         runtime/)
join     a CPU task per partition: its row group of every hash file, joined on each hash (audit/matches.py)
pdq      every train x eval pair within PDQ_THRESHOLD bits, exactly: the eval side's PDQ hashes read once into the
         object store and indexed once (matches.pdq_side: about 630 bytes a row), then a CPU task per batch of
         train hash files, each file read once, searched by multi-index hashing (audit/hamming.py)
near     with embeddings: the top-k engine, the train embeddings as the corpus (every row its own group) and
         each eval embedding shard as a query block, reduced to each eval image's nearest train rows; pairs
         at cosine >= threshold
write    contamination.parquet, summary.json, report.html, errors.parquet, then _manifest.json last

The driver holds units, refs, statistics and the pairs found, never an image, a hash table or an embedding.
`--resume` skips the units whose hash file an earlier run committed with the same settings. The hash, join and
near tasks run on Ray, or in this process for a small audit (runtime/placement.py).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mieb_ray import __version__, formats, storage
from mieb_ray.audit import duplicates, matches, report
from mieb_ray.audit.report import thumbnail
from mieb_ray.errors import UserError
from mieb_ray.evals import biovita_data as biovita
from mieb_ray.evals.zeroshot_tasks import TASKS
from mieb_ray.io import embeddings, parquet, reader
from mieb_ray.pipelines.build import build_eval_splits
from mieb_ray.pipelines.embed import embed_table, table_units
from mieb_ray.runtime import placement, tasks
from mieb_ray.runtime.cluster import read_cluster
from mieb_ray.runtime.job import Job
from mieb_ray.runtime.output import Progress
from mieb_ray.runtime.pools import PoolRequest
from mieb_ray.runtime.units import Stage
from mieb_ray.topk import engine
from mieb_ray.topk.kernels import TopRows

MIEB = "mieb"  # --against mieb: the MIEB eval splits of the sources
SELF = "self"  # --against self: the train table's rows that are copies of each other (audit/duplicates.py)
BY_SLUG = "<by slug>"  # an against table whose rows' eval task follows from their key's slug (mieb)
UNIT_ROWS = 10_000  # rows one hash task reads
PARTITION_ROWS = 2_000_000  # hash rows one join task holds (about 100 bytes each)
NEAR_K = 10  # nearest train rows kept per eval image
DEFAULT_THRESHOLD = 0.95
REPORT_PAIRS = 48  # pairs shown per detector on the page
LOCAL_BYTES = 256 << 20  # at most this many bytes of tables audit in this process under --executor auto
_HASHES = "_hashes"


@dataclass(frozen=True)
class AuditConfig:
    train: str
    against: tuple[str, ...]  # table URIs, or (MIEB,)
    out: str
    sources: str = "hf"  # where --against mieb reads the eval splits: the hub or a mirror root
    model: str | None = None
    revision: str | None = None
    train_embeddings: str | None = None
    against_embeddings: str | None = None
    threshold: float = DEFAULT_THRESHOLD
    allow_mixed_models: bool = False  # with --train-embeddings: compare embeddings of different models
    resume: bool = False
    overwrite: bool = False
    workers: int | None = None
    gpus_per_worker: float | None = None
    cpus_per_worker: float | None = None  # the embed job's encoders (None: their pool decides)
    executor: str = "auto"  # ray, local (in this process), auto (runtime/placement.py)

    def check(self) -> None:
        if not self.against:
            raise UserError("--against needs at least one table URI, or 'mieb'")
        for special in (MIEB, SELF):
            if special in self.against and len(self.against) > 1:
                raise UserError(f"--against {special} cannot be combined with other tables")
        if self.against == (SELF,) and self.near:
            raise UserError("--against self runs the hash detectors (exact, pixels, pdq); near needs an eval side")
        if self.model and (self.train_embeddings or self.against_embeddings):
            raise UserError("give --model or --train-embeddings/--against-embeddings, not both")
        if bool(self.train_embeddings) != bool(self.against_embeddings):
            raise UserError("--train-embeddings and --against-embeddings go together")
        if not -1.0 <= self.threshold <= 1.0:
            raise UserError(f"--threshold {self.threshold} is not a cosine in [-1, 1]")

    @property
    def near(self) -> bool:
        return bool(self.model or self.train_embeddings)


def task_names() -> dict[str, str]:
    """Source slug -> the MIEB task(s) its eval split serves."""
    return {t.slug: t.name for t in TASKS} | {"scimmir": "SciMMIR/SciMMIRI2TRetrieval/SciMMIRT2IRetrieval"}


@dataclass(frozen=True)
class Side:
    """The tables of one side: train (one table) or against (eval_task per table, or per key for mieb)."""

    name: str
    uris: tuple[str, ...]
    tasks: tuple[str | None, ...]  # per table: its eval task, BY_SLUG (mieb), or None (train)
    keys: tuple[str, ...] = ()  # per table: its key column (default "key")

    def columns(self, table: int) -> reader.TableColumns:
        return reader.TableColumns(self.keys[table] if self.keys else "key", "image")

    def plan(self) -> list[tuple[int, reader.Unit]]:
        """(table number, unit) of every table, in order."""
        units = []
        for n, uri in enumerate(self.uris):
            fmt, files = reader.input_files(uri)
            reader.check_columns(fmt, files[0], self.columns(n).read_as("image"))
            planned = table_units(files, UNIT_ROWS)
            if not sum(u.hi - u.lo for u in planned):
                raise UserError(f"{storage.display(uri)} holds no rows: nothing to audit "
                                f"{'in' if self.name == 'train' else 'against'}")
            units += [(n, u) for u in planned]
        return units


def audit(config: AuditConfig, log=print) -> dict:
    """Run the audit on Ray or in this process; return the manifest."""
    config.check()
    if config.train_embeddings:  # before any hashing: embeddings of two models are refused at once
        for note in embeddings.check_inputs({"train": config.train_embeddings, "eval": config.against_embeddings},
                                            config.allow_mixed_models):
            log(f"[audit] warning: {note}")
    train = Side("train", (config.train,), (None,))
    job = Job("audit", config.out, "a complete audit", re.compile(rf"^{_HASHES}/"), config.resume, config.overwrite,
              log)
    job.start()
    alone = config.against == (SELF,)
    against = Side("against", (), ()) if alone else _against(config, log)
    size = sum(_table_bytes(uri) for uri in (*train.uris, *against.uris))
    where = placement.choose(config.executor, f"{size / 2 ** 20:,.0f} MiB of tables, more than "
                             f"{LOCAL_BYTES >> 20} MiB" if size > LOCAL_BYTES else None,
                             f"{size / 2 ** 20:,.1f} MiB of tables")
    log(f"[audit] {where.describe()}")
    with tasks.using(where.mode):
        planned = {side.name: side.plan() for side in (train, against)}
        rows = sum(u.hi - u.lo for units in planned.values() for _, u in units)
        partitions = max(1, -(-rows // PARTITION_ROWS))
        settings = {"version": __version__, "partitions": partitions, "unit_rows": UNIT_ROWS,
                    "train": storage.display(config.train), "against": [storage.display(u) for u in against.uris]}
        work = [(side, n, u, _hash_name(side.name, n, u), i) for side in (train, against)
                for i, (n, u) in enumerate(planned[side.name])]
        done = job.earlier({name: u.identity for _, _, u, name, _ in work}, settings)
        log(f"[audit] {rows:,} rows: {len(planned['train'])} train units, {len(planned['against'])} eval units, "
            f"{partitions} join partitions; {len(done)} units already hashed")
        results = _hash(config, work, partitions, job, done, where.mode)
        if alone:
            return _write_self(config, *_self_links(config, results, partitions, log), results, job, log)
        pairs, errors, groups = _join(config, results, partitions, log)
        similar, more = _pdq(config, results, log)
        pairs, groups = pa.concat_tables([pairs, similar]), groups + more
        near_info = {}
        if config.near:
            near, near_info = _near(config, train, against, results, log)
            pairs = pa.concat_tables([pairs, near])
        pairs = matches.sort_pairs(pairs)
        return _write(config, pairs, groups, errors, results, planned, {"train": train, "against": against}, near_info,
                      job, log)


def _table_bytes(uri: str) -> int:
    _, files = reader.input_files(uri)
    return sum(storage.file_sizes([f.uri for f in files], "input file"))


def _against(config: AuditConfig, log) -> Side:
    if config.against != (MIEB,):
        return Side("against", config.against, tuple(u.rstrip("/").rsplit("/", 1)[-1] for u in config.against))
    train = storage.read_manifest(config.train) or {}  # a mieb-train output: the eval splits of its sources
    settings = train.get("config") if isinstance(train.get("config"), dict) else {}  # another tool's: all of them
    slugs = settings.get("datasets") if formats.MIEB_TRAIN.holds(train) else None
    uris, task_of, keys = [build_eval_splits(config.sources, config.out, log, slugs)], [BY_SLUG], ["key"]
    try:  # and the BioVITA corpus, keyed by photo id
        uris.append(biovita.corpus_files(config.sources, biovita.SUBSETS[0])[0].rsplit("/", 1)[0])
        task_of.append(biovita.TASK)
        keys.append("id")
    except UserError as exc:
        log(f"[audit] warning: no BioVITA corpus to audit against ({exc})")
    return Side("against", tuple(uris), tuple(task_of), tuple(keys))


# ---------------------------------------------------------------------------------------------- hash


def _hash_name(side: str, table: int, unit: reader.Unit) -> str:
    return f"{side}/{table}/{unit.name.removesuffix('.arrow')}"


def hash_stage(batch: dict, work: list[tuple], out: str, partitions: int, progress: Progress) -> dict:
    """Hash each unit's images; commit its hash file (one row group per partition), then its record."""
    return {"unit": batch["unit"], "result": np.array([json.dumps(_hash_unit(out, work[int(i)], partitions, progress))
                                for i in batch["unit"]])}


def _hash_unit(out: str, item: tuple, partitions: int, progress: Progress) -> dict:
    """item: (side, table number, unit, name, the unit's number in its side); the side's task per table is the
    eval task of every row, BY_SLUG (the task its key's slug serves), or None (train)."""
    side, table_number, unit, name, number = item
    columns, task = side.columns(table_number), side.tasks[table_number]
    by_slug = task_names() if task == BY_SLUG else None
    chunks, first = [], 0
    for chunk in reader.read(unit, columns.read_as("image")):
        keys, images = chunk[columns.key].to_pylist(), parquet.image_bytes(chunk["image"]).to_pylist()
        row_tasks = [by_slug.get(matches.dataset_of(k)) for k in keys] if by_slug else [task] * len(keys)
        chunks.append(matches.hash_rows(keys, images, number, first, partitions, row_tasks))
        first += len(keys)
    table = matches.by_partition(pa.concat_tables(chunks) if chunks else matches.HASH_SCHEMA.empty_table())
    bounds = np.flatnonzero(np.diff(table["part"].to_numpy())) + 1

    def write(local: str) -> None:
        with pq.ParquetWriter(local, matches.HASH_SCHEMA) as writer:
            for lo, hi in zip([0, *bounds], [*bounds, table.num_rows]):
                if hi > lo:
                    writer.write_table(table.slice(lo, hi - lo))
    path = f"{_HASHES}/{name}.parquet"
    stats = storage.commit_file(storage.join(out, path), write)
    counts = pc.value_counts(pc.fill_null(table["eval_task"], "")).to_pylist() if table.num_rows else []
    result = {"path": path, "name": name, "rows": table.num_rows,
              "errors": pc.sum(pc.is_valid(table["error"])).as_py() or 0,
              "tasks": {t["values"]: t["counts"] for t in counts}, "datasets": _dataset_counts(table["key"]), **stats}
    progress.record(name, unit.identity, result)
    return result


def _dataset_counts(keys: pa.ChunkedArray) -> dict[str, int]:
    """Rows per train dataset (matches.dataset_of of each key)."""
    if not len(keys):
        return {}
    prefix = pc.if_else(pc.match_substring(keys, "/"), pc.replace_substring_regex(keys, r"/.*$", ""), "")
    return {v["values"]: v["counts"] for v in pc.value_counts(prefix).to_pylist()}


def _hash(config, work: list[tuple], partitions: int, job: Job, done: dict, mode: str) -> dict[str, list[dict]]:
    """Every unit's hash result, by side, in planned order (the hash files' unit numbers are their positions)."""
    todo = [i for i, (_, _, _, name, _) in enumerate(work) if name not in done]
    stage = Stage(hash_stage, dict(work=work, out=config.out, partitions=partitions, progress=job.progress))
    found = done | {r["name"]: r for r in job.run(todo, [stage], mode, total=len(work))}
    results = {"train": [], "against": []}
    for side, _, _, name, _ in work:
        results[side.name].append(found[name])
    return results


# ---------------------------------------------------------------------------------------------- join


def _read_part(uris: list[str], part: int) -> pa.Table:
    """Partition `part` of each hash file: its row group only (rows are sorted, one row group per partition)."""
    pieces = []
    for uri in uris:
        with storage.open_input(uri) as f:
            pf = pq.ParquetFile(f)
            column = pf.schema_arrow.get_field_index("part")
            for g in range(pf.metadata.num_row_groups):
                stats = pf.metadata.row_group(g).column(column).statistics
                if stats is not None and stats.min == part:
                    pieces.append(pf.read_row_group(g))
    return pa.concat_tables(pieces) if pieces else matches.HASH_SCHEMA.empty_table()


@tasks.remote(num_cpus=1)
def _join_part(train: list[str], against: list[str], part: int) -> tuple[pa.Table, list[dict], pa.Table]:
    left, right = _read_part(train, part), _read_part(against, part)
    return (*matches.hash_pairs(left, right), pa.concat_tables([matches.error_rows("train", left),
                                                                matches.error_rows("against", right)]))


def _join(config, results, partitions, log) -> tuple[pa.Table, pa.Table, list[dict]]:
    uris = {side: [storage.join(config.out, r["path"]) for r in rs] for side, rs in results.items()}
    joined = tasks.get([_join_part.remote(uris["train"], uris["against"], p) for p in range(partitions)])
    pairs = pa.concat_tables([j[0] for j in joined])
    groups = [g for j in joined for g in j[1]]  # a hash value's rows are all in one partition
    errors = pa.concat_tables([j[2] for j in joined])
    single = pairs.filter(pc.is_null(pairs["group"]))
    counts = {m: pc.sum(pc.equal(single["method"], m)).as_py() or 0 for m in ("exact", "pixels")}
    log(f"[audit] exact: {counts['exact']} pairs, pixels: {counts['pixels']} pairs"
        + (f", {len(groups)} groups of more than {matches.GROUP_CAP:,} pairs each" if groups else "")
        + f"; {errors.num_rows} undecodable images")
    return pairs, errors, groups


# ---------------------------------------------------------------------------------------------- pdq

PDQ_COLUMNS = ["key", "eval_task", *matches.PDQ_HASHES, "pdq_quality"]
PDQ_BATCH_ROWS = 100_000  # train hash rows one pdq task reads


def _read_pdq(uris: list[str]) -> pa.Table:
    """The PDQ columns of some hash files, each read once."""
    tables = []
    for uri in uris:
        with storage.open_input(uri) as f:
            tables.append(pq.read_table(f, columns=PDQ_COLUMNS))
    return pa.concat_tables(tables) if tables else matches.HASH_SCHEMA.empty_table().select(PDQ_COLUMNS)


@tasks.remote(num_cpus=1)
def _pdq_against(uris: list[str]) -> matches.PdqSide:
    """The side every train batch is searched against, read and made ready once."""
    return matches.pdq_side(_read_pdq(uris))


@tasks.remote(num_cpus=1)
def _pdq_batch(uris: list[str], against: matches.PdqSide) -> tuple[pa.Table, list[dict]]:
    return matches.pdq_pairs(_read_pdq(uris), against)


def _train_batches(config, results) -> list[list[str]]:
    """The train hash files in batches (each file read once): at most PDQ_BATCH_ROWS rows, and at least two batches
    a CPU of the cluster at its largest, so that the search, the audit's longest step, spreads over all of them
    (the full audit's 4.4M train rows in 100,000-row batches were 45 tasks of 40 minutes each, whatever the
    cluster: bench/full_size.py)."""
    cpus = read_cluster().max_cpus if tasks.mode() == "ray" else os.cpu_count() or 1
    total = sum(r["rows"] for r in results["train"])
    size = max(1, min(PDQ_BATCH_ROWS, -(-total // max(1, int(2 * cpus)))))
    batches, batch, rows = [], [], 0
    for r in results["train"]:
        batch.append(storage.join(config.out, r["path"]))
        rows += r["rows"]
        if rows >= size:
            batches.append(batch)
            batch, rows = [], 0
    return batches + ([batch] if batch else [])


def _pdq(config, results, log) -> tuple[pa.Table, list[dict]]:
    t0 = time.time()
    against = _pdq_against.remote([storage.join(config.out, r["path"]) for r in results["against"]])
    batches = _train_batches(config, results)
    found = tasks.get([_pdq_batch.remote(b, against) for b in batches])
    pairs = pa.concat_tables([f[0] for f in found] or [matches.PAIR_SCHEMA.empty_table()])
    groups = _merged([g for f in found for g in f[1]])
    single = pc.sum(pc.is_null(pairs["group"])).as_py() or 0
    log(f"[audit] pdq (Hamming distance <= {matches.PDQ_THRESHOLD} of 256 bits): {single} pairs"
        + (f" and {len(groups)} groups" if groups else "") + f" from {len(batches)} train batches in "
        f"{time.time() - t0:.1f}s")
    return pairs, groups


def _merged(groups: list[dict]) -> list[dict]:
    """One entry per group id: a group found by several train batches (its rows in each) counted once."""
    out: dict[int, dict] = {}
    for g in groups:
        if g["group"] in out:
            seen = out[g["group"]]
            seen["train_rows"] += g["train_rows"]
            seen["pairs"] = seen["train_rows"] * seen["eval_images"]
            seen["train_sample"] = (seen["train_sample"] + g["train_sample"])[:matches.GROUP_SAMPLE]
        else:
            out[g["group"]] = dict(g)
    return list(out.values())


# ---------------------------------------------------------------------------------------------- self


@tasks.remote(num_cpus=1)
def _self_part(train: list[str], part: int) -> tuple[list, pa.Table]:
    rows = _read_part(train, part)
    return duplicates.hash_links(rows), matches.error_rows("train", rows)


@tasks.remote(num_cpus=1)
def _self_pdq(uris: list[str], every: matches.PdqSide) -> list:
    return duplicates.pdq_links(matches.pdq_pairs(_read_pdq(uris), every)[0])


def _self_links(config, results, partitions, log) -> tuple[list, pa.Table]:
    """Links between train rows by each detector: the hash partitions, then pdq of every batch against all."""
    t0 = time.time()
    uris = [storage.join(config.out, r["path"]) for r in results["train"]]
    joined = tasks.get([_self_part.remote(uris, p) for p in range(partitions)])
    every = _pdq_against.remote(uris)
    links = [link for j in joined for link in j[0]]
    links += [link for found in tasks.get([_self_pdq.remote(b, every) for b in _train_batches(config, results)])
              for link in found]
    log(f"[audit] {len(links):,} links between copies in {time.time() - t0:.1f}s")
    return links, pa.concat_tables([j[1] for j in joined])


def _write_self(config, links: list, errors: pa.Table, results, job: Job, log) -> dict:
    found = duplicates.table(links)
    rows = sum(r["rows"] for r in results["train"])
    for name, table in ((formats.DUPLICATES, found), (formats.AUDIT_ERRORS, errors)):
        storage.commit_file(storage.join(config.out, name), lambda local, t=table: pq.write_table(t, local))
    summary = duplicates.summary(found, rows)
    storage.write_bytes(storage.join(config.out, formats.SUMMARY), (json.dumps(summary, indent=2) + "\n").encode())
    manifest = job.finish({
        **formats.AUDIT.stamp(), "version": __version__,
        "config": {"train": storage.display(config.train), "against": [SELF], "pdq_threshold": matches.PDQ_THRESHOLD,
                   "detectors": list(formats.HASH_DETECTORS)},
        "files": [formats.DUPLICATES, formats.AUDIT_ERRORS, formats.SUMMARY],
        "counts": {"train_rows": rows, "errors": errors.num_rows,
                   **{m: summary[m] for m in formats.HASH_DETECTORS}},
        "seconds": round(time.time() - job.t0, 3)}, {r["path"] for r in results["train"]})
    storage.delete_tree(storage.join(config.out, _HASHES))
    log("[audit] groups of copies: " + ", ".join(f"{summary[m]['groups']:,} {m} ({summary[m]['rows_in_groups']:,} "
                                                  f"rows)" for m in formats.HASH_DETECTORS))
    log(f"[audit] done: build --exclude would leave out {summary['left_out_by_default']:,} of {rows:,} rows, one "
        f"kept per group; {time.time() - job.t0:.1f}s -> {storage.display(config.out)}")
    return manifest


# ---------------------------------------------------------------------------------------------- near


def _embeddings(config: AuditConfig, train: Side, against: Side, log) -> tuple[str, list[str]]:
    if config.train_embeddings:
        return config.train_embeddings, [config.against_embeddings]
    # images that do not decode are the audit's error rows already: they must not stop the embedding
    pool = PoolRequest(config.workers, config.gpus_per_worker, config.cpus_per_worker)
    root = storage.join(config.out, "embeddings")
    train_out = embed_table(train.uris[0], "key", storage.join(root, "train"), config.model, config.revision,
                            "image", log, pool, config.executor, max_error_rate=1.0)
    return train_out, [embed_table(uri, "key", storage.join(root, f"against-{n}"), config.model, config.revision,
                                   "image", log, pool, config.executor, max_error_rate=1.0)
                       for n, uri in enumerate(against.uris)]


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


def _near(config: AuditConfig, train: Side, against: Side, results, log) -> tuple[pa.Table, dict]:
    train_uri, against_uris = _embeddings(config, train, against, log)
    t0 = time.time()
    rows, info = near_pairs(train_uri, against_uris, config.threshold)
    hashes = [storage.join(config.out, r["path"]) for r in results["against"]]
    located = tasks.get(_locate.remote(hashes, pc.unique(rows["eval_key"]), ["eval_task"]))
    task_of = dict(zip(located["key"].to_pylist(), located["eval_task"].to_pylist()))
    n = rows.num_rows
    pairs = pa.table({"train_key": rows["train_key"],
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
    return pairs, info


# ---------------------------------------------------------------------------------------------- write


def _write(config, pairs, groups, errors, results, planned, sides, near_info, job: Job, log) -> dict:
    eval_rows, train_rows = {}, {}
    for r in results["against"]:
        for task, n in r["tasks"].items():
            eval_rows[task or "?"] = eval_rows.get(task or "?", 0) + n
    for r in results["train"]:
        for dataset, n in r["datasets"].items():
            train_rows[dataset] = train_rows.get(dataset, 0) + n
    summary = matches.summary(pairs, eval_rows, train_rows, groups)
    files = {formats.PAIRS: pairs, formats.AUDIT_ERRORS: errors}
    for name, table in files.items():
        storage.commit_file(storage.join(config.out, name), lambda local, t=table: pq.write_table(t, local))
    summary = {**summary, "pdq_threshold": matches.PDQ_THRESHOLD,
               "threshold": config.threshold if config.near else None, "near": near_info or None}
    storage.write_bytes(storage.join(config.out, formats.SUMMARY), (json.dumps(summary, indent=2) + "\n").encode())
    page = report.render(summary, _gallery(config, pairs, results, planned, sides))
    storage.write_bytes(storage.join(config.out, formats.REPORT), page.encode())
    manifest = job.finish({
        **formats.AUDIT.stamp(), "version": __version__,
        "config": {"train": storage.display(config.train), "against": list(config.against),
                   "sources": storage.display(config.sources) if config.against == (MIEB,) else None,
                   "model": config.model, "threshold": config.threshold if config.near else None,
                   "pdq_threshold": matches.PDQ_THRESHOLD,
                   "detectors": list(formats.DETECTORS if config.near else formats.HASH_DETECTORS)},
        "files": [formats.PAIRS, formats.AUDIT_ERRORS, formats.SUMMARY, formats.REPORT],
        "counts": {"train_rows": sum(train_rows.values()), "eval_rows": sum(eval_rows.values()),
                   "pairs": summary["totals"]["pairs"], "groups": summary["totals"]["groups"],
                   "train_rows_flagged": summary["totals"]["train_rows_flagged"],
                   "errors": errors.num_rows},
        "seconds": round(time.time() - job.t0, 3)}, {r["path"] for rs in results.values() for r in rs})
    storage.delete_tree(storage.join(config.out, _HASHES))  # after the manifest: a resume may still need them
    totals = summary["totals"]
    counts = [f"{totals['pairs'][m]:,} {m}" if m in report.ran(summary) else f"{m} not run" for m in formats.DETECTORS]
    groups = sum(totals["groups"].values())
    log(f"[audit] pairs: {', '.join(counts)}" + (f"; {groups} groups of more than {matches.GROUP_CAP:,} pairs, listed "
                                                  "once each (summary.json)" if groups else ""))
    log(f"[audit] done: {totals['train_rows_flagged']:,} train rows flagged of {sum(train_rows.values()):,}, "
        f"{totals['eval_images_affected']:,} eval images affected; {time.time() - job.t0:.1f}s -> "
        f"{storage.display(config.out)}")
    return manifest


@tasks.remote(num_cpus=1)
def _thumbnails(unit: reader.Unit, columns: reader.TableColumns, rows: list[int]) -> dict[int, str | None]:
    """Thumbnails of the unit's rows at these positions."""
    want, out = set(rows), {}
    for chunk in reader.read(unit, columns.read_as("image")):
        for index, image in zip(chunk["index"].to_pylist(), parquet.image_bytes(chunk["image"]).to_pylist()):
            if index - unit.lo in want:
                out[index - unit.lo] = thumbnail(image)
    return out


def _gallery(config, pairs: pa.Table, results, planned, sides: dict[str, Side]) -> list[dict]:
    """The first REPORT_PAIRS pairs of each detector, with both images as thumbnails."""
    single = pairs.filter(pc.is_null(pairs["group"]))
    shown = [r for m in formats.DETECTORS for r in single.filter(pc.equal(single["method"], m)).slice(0, REPORT_PAIRS)
             .to_pylist()]
    if not shown:
        return []
    where = {}
    for side, key_field in (("train", "train_key"), ("against", "eval_key")):
        keys = pa.array(sorted({r[key_field] for r in shown}), pa.string())
        uris = [storage.join(config.out, r["path"]) for r in results[side]]
        located = tasks.get(_locate.remote(uris, keys, ["unit", "row"]))
        for k, u, row in zip(*(located[c].to_pylist() for c in ("key", "unit", "row"))):
            where.setdefault((side, k), (u, row))
    by_unit = {}
    for (side, _), (u, row) in where.items():
        by_unit.setdefault((side, u), set()).add(row)
    fetched = tasks.get([_thumbnails.remote(planned[side][u][1], sides[side].columns(planned[side][u][0]), sorted(rows))
                    for (side, u), rows in by_unit.items()])
    thumbs = {(side, u, row): uri for ((side, u), _), got in zip(by_unit.items(), fetched) for row, uri in got.items()}
    for r in shown:
        for side, key_field in (("train", "train_key"), ("against", "eval_key")):
            u, row = where.get((side, r[key_field]), (None, None))
            r[f"{side}_image"] = thumbs.get((side, u, row))
    return shown


@tasks.remote(num_cpus=1)
def _locate(uris: list[str], keys: pa.Array, columns: list[str]) -> pa.Table:
    """`columns` of the hash rows whose key is in `keys` (key first)."""
    out = []
    for uri in uris:
        with storage.open_input(uri) as f:
            t = pq.read_table(f, columns=["key", *columns])
        out.append(t.filter(pc.is_in(t["key"], value_set=keys)))
    return pa.concat_tables(out)
