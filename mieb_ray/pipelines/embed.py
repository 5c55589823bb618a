"""The embed job: the images (or texts) of any table -> CLIP embedding shards, committed by the workers.

plan       driver: the input files and their row counts (parquet footers; tars are counted and indexed by
           worker tasks), cut into units, rows [lo, hi) of one file; the model resolved once; the pools sized
read       a CPU task per unit: its rows, images decoded and resized to uint8      (encode/stages.py)
transform  the encoder actor pool, one model per actor (a GPU each on a cluster)
commit     a CPU task per unit: its shard and error rows, then its progress record  (commit.py)
manifest   driver, last: built from the records (path, rows, bytes, sha256, errors)

`--executor auto` (the default) runs the same three stages in this process, Ray never started, when no cluster
was asked for (--address, RAY_ADDRESS), Ray is not running here (or only the one-node Ray this job brought up
itself, as the demo's build does), no pool was asked for (--workers > 1, --gpus-per-worker > 0, --decode gpu)
and the machine has no GPU: a laptop's CPU encoder waits on its model, so Ray's
parallel decode buys nothing there, while a fresh actor process importing torch and transformers costs seconds.
In-process, a thread reads and decodes the next unit while the model encodes this one.

The driver handles units and records, never an image or an embedding, so its memory does not grow with the
rows or the embedding size. A shard is named after its input file and row range (`<file>.arrow`, or
`<file>.<lo>-<hi>.arrow` when the file is cut), so a retried unit rewrites the same names, and `--resume`
skips the units whose record an earlier run committed with the same settings: nothing is encoded twice and
no key appears twice.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass

from mieb_ray import __version__, commit, connect, storage
from mieb_ray.encode.model import load_info, resolve
from mieb_ray.errors import UserError, find_user_error
from mieb_ray.io import embeddings, tables
from mieb_ray.pools import encoder_pool, read_cluster
from mieb_ray.topk import executor

FORMAT = "mieb-embeddings"
FORMAT_VERSION = 2
MODALITIES = ("image", "text")
UNIT_BYTES = 256 << 20  # a unit's decoded pixels: one block in the object store
DECODE_MEMORY = 768 << 20  # a read task's memory hint: a unit's pixels, one chunk of source bytes, headroom
_OURS = re.compile(r"^(?!_progress/).*\.arrow$")  # shards and error files; stale ones are removed at the end


@dataclass(frozen=True)
class EmbedConfig:
    input: str
    out: str
    model: str
    revision: str | None = None
    modality: str = "image"
    image_column: str = "image"
    text_column: str = "text"
    key_column: str = "key"
    carry_columns: tuple[str, ...] = ()
    batch_size: int = 256  # rows per model call
    rows_per_shard: int = 10_000  # at most; image shards hold at most UNIT_BYTES of decoded pixels
    dtype: str = "float32"
    resume: bool = False
    overwrite: bool = False
    max_error_rate: float = 0.01
    workers: int | None = None
    gpus_per_worker: float | None = None
    cpus_per_worker: float = 1.0
    device: str | None = None
    decode: str = "auto"  # images: cpu (read tasks), gpu (the encoders' device, nvJPEG), auto (gpu where it can)
    executor: str = "auto"  # ray, local (in this process), auto (local on a machine alone without a GPU)

    @property
    def columns(self) -> tables.Columns:
        data = self.image_column if self.modality == "image" else self.text_column
        return tables.Columns(self.key_column, data, tuple(self.carry_columns))

    def check(self) -> None:
        if self.modality not in MODALITIES:
            raise UserError(f"unknown modality {self.modality!r}; valid: {', '.join(MODALITIES)}")
        if self.dtype not in embeddings.DTYPES:
            raise UserError(f"unknown dtype {self.dtype!r}; valid: {', '.join(embeddings.DTYPES)}")
        from mieb_ray.encode.gpu_decode import MODES, device_decode_available

        if self.decode not in MODES:
            raise UserError(f"unknown --decode {self.decode!r}; valid: {', '.join(MODES)}")
        if self.decode == "gpu" and self.modality == "image" and (why := device_decode_available("cpu")):
            raise UserError(f"--decode gpu needs torchvision: {why}")
        if self.executor not in executor.EXECUTORS:
            raise UserError(f"unknown --executor {self.executor!r}; valid: {', '.join(executor.EXECUTORS)}")
        if self.batch_size < 1 or self.rows_per_shard < 1:
            raise UserError("--batch-size and --rows-per-shard must be at least 1")


@dataclass(frozen=True)
class Plan:
    """What the workers need, decided once by the driver."""

    fmt: str
    units: list[tables.Unit]
    info: object  # ModelInfo
    spec: dict | None
    schema: object  # the shards' Arrow schema, with its metadata
    settings: dict  # what a progress record must match to be reused


def embed(config: EmbedConfig, log=print) -> dict:
    """Run the embed job on the connected Ray cluster, or in this process (pick_executor); return the manifest."""
    t0 = time.time()
    config.check()
    which, why = pick_executor(config)
    with executor.using(which):
        return _embed(config, which, why, t0, log)


def pick_executor(config: EmbedConfig) -> tuple[str, str]:
    """("ray" | "local", why): local when asked for, or under auto on a machine alone without a GPU."""
    if config.executor != "auto":
        return config.executor, f"--executor {config.executor}"
    if why := executor.keep_ray(connect.address()):
        return "ray", why
    if (config.workers or 1) > 1 or (config.gpus_per_worker or 0) > 0 or config.decode == "gpu":
        return "ray", "a pool of encoders or GPUs was asked for"
    import torch

    if torch.cuda.is_available():
        return "ray", "this machine has a GPU: CPU tasks decode for it in parallel"
    return "local", "no cluster and no GPU: " + ("not on the one-node Ray this job started"
                                                 if executor.ray_running() else "Ray not started")


def _embed(config: EmbedConfig, which: str, why: str, t0: float, log) -> dict:
    plan = _plan(config)
    progress = commit.Progress(config.out, plan.settings)
    results = _earlier(config, progress, {u.name: u.identity for u in plan.units})
    todo = [i for i, u in enumerate(plan.units) if u.name not in results]
    log(f"[embed] {len(plan.units)} shards from {len({u.uri for u in plan.units})} input files ({plan.fmt}), "
        f"{len(results)} already done, {sum(plan.units[i].hi - plan.units[i].lo for i in todo):,} rows to encode "
        f"with {config.model} ({plan.info.architecture}, dim {plan.info.dim})")
    log(f"[embed] {'in this process' if which == 'local' else 'on Ray'} ({why})")
    for i in [i for i in todo if plan.units[i].hi == plan.units[i].lo]:  # an empty file: an empty shard
        results[plan.units[i].name] = embeddings.commit_shard(config.out, plan.units[i].name, plan.schema, {},
                                                              config.key_column, config.columns.carry)
    todo = [i for i in todo if plan.units[i].hi > plan.units[i].lo]
    if todo:
        results.update((_run if which == "ray" else _run_local)(config, plan, todo, progress, log))
    return _manifest(config, plan, [results[n] for n in sorted(results)], progress, t0, log)


# ---------------------------------------------------------------------------------------------- plan


def _plan(config: EmbedConfig) -> Plan:
    fmt, files = tables.input_files(config.input)
    carry_schema = tables.check_columns(fmt, files[0], config.columns)
    info = load_info(resolve(config.model, config.revision), config.model, config.revision,
                     modality=config.modality)
    spec = _image_spec(info) if config.modality == "image" else None
    commit.prepare(config.out, config.overwrite, "complete embeddings")
    rows = config.rows_per_shard
    if spec is not None:  # a unit's pixels are one block: bound its bytes
        rows = max(1, min(rows, UNIT_BYTES // (spec["height"] * spec["width"] * 3)))
    meta = {"model": info.to_dict(), "modality": config.modality, "dtype": config.dtype, "normalized": True,
            "preprocessing": spec, "package": f"mieb-ray {__version__}"}
    settings = {"version": __version__, "input": storage.display(config.input), "model": info.to_dict(),
                "modality": config.modality, "dtype": config.dtype, "preprocessing": spec, "rows_per_unit": rows,
                "decode": config.decode if spec is not None else None,
                "columns": [config.key_column, config.columns.data, *config.columns.carry]}
    return Plan(fmt, table_units(files, rows), info, spec,
                embeddings.schema(info.dim, config.dtype, carry_schema, meta), settings)


def _image_spec(info) -> dict:
    from mieb_ray.encode.preprocess import ImageSpec

    if not info.image_config:
        raise UserError(f"model {info.name} has no image processor config (preprocessor_config.json)")
    return ImageSpec.from_processor_config(info.image_config).to_dict()


def table_units(files: list[tables.InputFile], rows_per_unit: int) -> list[tables.Unit]:
    """The files cut into units: parquet rows counted from footers, tars counted and indexed (where each unit
    starts) by a read of every tar, in worker tasks."""
    tables.count_parquet_rows([f for f in files if f.uri.endswith(".parquet")])
    tars = [f for f in files if f.uri.endswith(".tar")]
    if tars and executor.mode() == "ray":
        connect.ray_up()
    index = executor.remote(num_cpus=0.5)(tables.index_tar)
    counted = executor.get([index.remote(f.uri, rows_per_unit) for f in tars]) if tars else []
    for f, (rows, _) in zip(tars, counted):
        f.rows = rows
    return tables.plan_units(files, rows_per_unit, {f.uri: offsets for f, (_, offsets) in zip(tars, counted)})


def _earlier(config: EmbedConfig, progress: commit.Progress, units: dict[str, dict]) -> dict[str, dict]:
    """The results of the units an unfinished earlier run committed, when resuming; refuse to start over
    without --resume or --overwrite (hours of encoding could be lost by mistake)."""
    if config.resume:
        return progress.done(units)
    shards = [u for u in storage.list_files(config.out) if _OURS.match(u[len(config.out.rstrip("/")) + 1:])]
    if shards and not config.overwrite:
        raise UserError(f"{storage.display(config.out)} holds {len(shards)} shards of an unfinished run; "
                        "pass --resume to continue it or --overwrite to start again")
    for uri in shards:
        storage.delete(uri)
    progress.clear()
    return {}


# ---------------------------------------------------------------------------------------------- run


@contextmanager
def _data_context():
    """Ray Data settings for this job, restored after it."""
    import ray

    ctx = ray.data.DataContext.get_current()
    ours = {"target_max_block_size": None,  # never sliced: a unit reaches its commit task whole
            "raise_original_map_exception": True,  # a worker's UserError reaches the driver as itself
            "enable_progress_bars": False,  # our own progress lines
            # a read or commit whose hub requests outlasted the local retries runs again, its shard
            # rewritten the same (Ray Data matches "Class: message" of the stage's exception)
            "retried_map_errors": ["TransientStorageError"], "max_map_retries": storage.UNIT_RETRIES}
    saved = {k: getattr(ctx, k) for k in ours}
    for k, v in ours.items():
        setattr(ctx, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(ctx, k, v)


def _stage_args(config: EmbedConfig, plan: Plan, progress: commit.Progress, decode: str, threads: int):
    """The read, encode (constructor) and commit stages' arguments, whichever executor runs them."""
    # a local model path must mean the same directory to every worker
    model = os.path.abspath(config.model) if os.path.isdir(config.model) else config.model
    columns = config.columns
    return (dict(units=plan.units, columns=columns, modality=config.modality, spec=plan.spec, decode=decode),
            dict(model=model, revision=plan.info.revision, modality=config.modality, data_column=columns.data,
                 spec=plan.spec, batch_size=config.batch_size, device=config.device, threads=threads,
                 decode=decode, strict=config.decode == "gpu"),
            dict(units=plan.units, out=config.out, schema=plan.schema, columns=columns, progress=progress))


def _run(config: EmbedConfig, plan: Plan, todo: list[int], progress: commit.Progress, log) -> dict[str, dict]:
    import json

    import ray

    from mieb_ray.encode.stages import EncodeStage, commit_stage, read_stage

    pool = encoder_pool(read_cluster(), config.gpus_per_worker, config.cpus_per_worker, config.workers,
                        cap=len(todo))
    log(f"[embed] {pool.why}")
    decode = "cpu"
    if config.modality == "image":
        from mieb_ray.encode.gpu_decode import resolve as resolve_decode

        decode = resolve_decode(config.decode, pool.num_gpus)
        log(f"[embed] images decoded {'by the encoders, on their device' if decode == 'gpu' else 'by CPU tasks'} "
            f"(--decode {config.decode})")
    read_args, encode_args, commit_args = _stage_args(config, plan, progress, decode, int(max(1, pool.num_cpus)))
    with _data_context():
        ds = ray.data.from_items([{"unit": i} for i in todo], override_num_blocks=len(todo))
        # one task per unit; the memory hint also keeps it from being fused into the encoder actors
        ds = ds.map_batches(read_stage, fn_kwargs=read_args, batch_size=1, batch_format="numpy", num_cpus=1,
                            memory=DECODE_MEMORY)
        ds = ds.map_batches(  # batch_size=None: a whole block, that is a whole unit, per call
            EncodeStage, fn_constructor_kwargs=encode_args, batch_size=None, batch_format="numpy",
            num_cpus=pool.num_cpus, num_gpus=pool.num_gpus, compute=pool.strategy())
        ds = ds.map_batches(commit_stage, fn_kwargs=commit_args, batch_size=None, batch_format="numpy", num_cpus=0.25)
        results = _gather((json.loads(row["result"]) for row in _user_errors(ds.iter_rows())), len(todo), log)
    return _complete(plan, todo, results)


def _run_local(config: EmbedConfig, plan: Plan, todo: list[int], progress: commit.Progress, log) -> dict[str, dict]:
    """The same stages in this process: a thread reads and decodes unit i + 1 (the first while the model loads)
    while the model encodes unit i; each unit is committed before the next is encoded."""
    import functools
    import json
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from mieb_ray.encode.gpu_decode import resolve as resolve_decode
    from mieb_ray.encode.stages import EncodeStage, commit_stage, read_stage

    decode = resolve_decode(config.decode, 0) if config.modality == "image" else "cpu"
    threads = torch.get_num_threads()
    log(f"[embed] one encoder in this process, {threads} torch threads; a thread beside it reads "
        f"{'and decodes ' if config.modality == 'image' else ''}the next unit")
    read_args, encode_args, commit_args = _stage_args(config, plan, progress, decode, threads)
    read = functools.partial(_retried, read_stage, **read_args)
    commit_unit = functools.partial(_retried, commit_stage, **commit_args)

    encoded = {"rows": 0, "units": 0, "t0": time.time(), "logged": time.time()}

    def tick(rows: int) -> None:  # a CPU encoder may spend minutes on one unit: a line every 5 s within it too
        encoded["rows"] += rows
        if time.time() - encoded["logged"] > 5:
            encoded["logged"] = time.time()
            log(f"[embed] encoding shard {encoded['units'] + 1}/{len(todo)}: {encoded['rows']:,} rows encoded, "
                f"{encoded['rows'] / max(time.time() - encoded['t0'], 1e-9):,.0f} rows/s")

    def units():
        with ThreadPoolExecutor(1, thread_name_prefix="mieb-read") as reader:
            ahead = reader.submit(read, {"unit": [todo[0]]})
            encode = EncodeStage(**encode_args)
            encode.on_rows = tick
            for i in todo[1:] + [None]:
                block = ahead.result()
                if i is not None:
                    ahead = reader.submit(read, {"unit": [i]})
                done = commit_unit(encode(block))
                encoded["units"] += 1
                yield from (json.loads(r) for r in done["result"])

    return _complete(plan, todo, _gather(units(), len(todo), log))


def _retried(stage, batch: dict, **kwargs) -> dict:
    """stage(batch, **kwargs), run again on storage.TransientStorageError as Ray Data's retries do (_data_context)."""
    for retries_left in range(storage.UNIT_RETRIES, -1, -1):
        try:
            return stage(batch, **kwargs)
        except storage.TransientStorageError:
            if not retries_left:
                raise


def _gather(results_in, total: int, log) -> dict[str, dict]:
    """The units' results by shard path, with a progress line every 5 s."""
    results, rows, t_run, t_log = {}, 0, time.time(), 0.0
    for result in results_in:
        results[result["path"]] = result  # a unit redone after a lost block: same name, same rows
        rows += result["rows"] + result["errors"]
        if time.time() - t_log > 5 or len(results) == total:
            t_log, elapsed = time.time(), time.time() - t_run
            log(f"[embed] {len(results)}/{total} shards, {rows:,} rows, {rows / max(elapsed, 1e-9):,.0f} rows/s")
    return results


def _complete(plan: Plan, todo: list[int], results: dict[str, dict]) -> dict[str, dict]:
    missing = [plan.units[i].name for i in todo if plan.units[i].name not in results]
    if missing:
        raise RuntimeError(f"{len(missing)} units did not come back (e.g. {missing[0]})")
    return results


def _user_errors(rows):
    """A worker's UserError (a corrupt input file, an unreachable bucket) as itself, not in Ray's wrappers."""
    try:
        yield from rows
    except Exception as exc:
        user = find_user_error(exc)
        if user is None:
            raise
        raise user from None


# ---------------------------------------------------------------------------------------------- manifest


def _manifest(config: EmbedConfig, plan: Plan, results: list[dict], progress: commit.Progress, t0: float,
              log) -> dict:
    rows = sum(r["rows"] for r in results)
    n_errors = sum(r["errors"] for r in results)
    if n_errors > config.max_error_rate * (rows + n_errors):
        raise UserError(f"{n_errors:,} of {rows + n_errors:,} rows could not be encoded, more than --max-error-rate "
                        f"{config.max_error_rate}; see {storage.display(storage.join(config.out, '_errors'))}")
    error_files = [r["error_file"] for r in results if r["error_file"]]
    commit.remove_stale(config.out, {r["path"] for r in results} | set(error_files), _OURS)
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("out", "resume", "overwrite")}
    manifest = commit.finish(config.out, {
        "format": FORMAT, "format_version": FORMAT_VERSION, "package": "mieb-ray", "version": __version__,
        "config": {**settings, "input": storage.display(config.input), "input_format": plan.fmt,
                   "data_column": config.columns.data, "rows_per_unit": plan.settings["rows_per_unit"]},
        "model": plan.info.to_dict(), "dim": plan.info.dim, "preprocessing": plan.spec,
        "counts": {"total": rows, "errors": n_errors}, "executor": executor.mode(),
        "shards": [{k: r[k] for k in ("path", "rows", "bytes", "sha256")} for r in results],
        "error_files": error_files,
    }, progress)
    log(f"[embed] done: {rows:,} embeddings in {len(results)} shards, {n_errors:,} errors, "
        f"{time.time() - t0:.1f}s -> {storage.display(config.out)}")
    return manifest
