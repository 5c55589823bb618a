"""The embed job: the images (or texts) of any table -> CLIP embedding shards, committed by the workers.

plan       driver: the input files and their row counts (parquet footers; tars are counted and indexed by
           worker tasks), cut into units, rows [lo, hi) of one file; the model resolved once; the pools sized
read       a CPU task per unit: its rows, images decoded and resized to uint8      (encode/stages.py)
transform  the encoder actor pool, one model per actor (a GPU each on a cluster)
commit     a CPU task per unit: its shard and error rows, then its progress record  (runtime/output.py)
manifest   driver, last: built from the records (path, rows, bytes, sha256, errors)

`--executor auto` (the default) runs the same three stages in this process, Ray never started, on a machine
alone without a GPU when no pool was asked for (placement_of); a thread then reads and decodes the next unit
while the model encodes this one.

The driver handles units and records, never an image or an embedding, so its memory does not grow with the
rows or the embedding size. A shard is named after its input file and row range (`<file>.arrow`, or
`<file>.<lo>-<hi>.arrow` when the file is cut), so a retried unit rewrites the same names, and `--resume`
skips the units whose record an earlier run committed with the same settings: nothing is encoded twice and
no row is written twice. The keys are the input's, as they are: a key the input repeats is written as often as
the input holds it (eval's readers of row keys, `<dataset>/<index>`, refuse such an output in one line).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass

from mieb_ray import __version__, flags, formats, storage
from mieb_ray.encode import gpu_decode
from mieb_ray.encode.model import describe
from mieb_ray.encode.preprocess import ImageSpec
from mieb_ray.encode.stages import EncodeStage, commit_stage, read_stage
from mieb_ray.errors import UserError
from mieb_ray.io import embeddings, reader, tar
from mieb_ray.runtime import identity, placement, tasks
from mieb_ray.runtime.cluster import RunContext, read_cluster
from mieb_ray.runtime.job import Job
from mieb_ray.runtime.pools import PoolRequest, cpus_option, encoder_pool, gpus_option, workers_option
from mieb_ray.runtime.units import Stage

MODALITIES = ("image", "text")
UNIT_BYTES = 256 << 20  # a unit's decoded pixels: one block in the object store
DECODE_MEMORY = 768 << 20  # a read task's memory hint: a unit's pixels, one chunk of source bytes, headroom
_OURS = re.compile(r"^(?!_progress/).*\.arrow$")  # shards and error files; stale ones are removed at the end


@dataclass(frozen=True)
class EmbedConfig:
    input: str = flags.option(flag="--input", parse=flags.existing, required=True,
                              help="mieb-train output, a folder of Parquet files or WebDataset tars, or one file; "
                                   "local or s3://")
    out: str = flags.option(flag="--out", parse=flags.output, required=True,
                            help="output root for the embedding shards, local or s3://")
    model: str = flags.option(flag="--model", parse=flags.model, required=True,
                              help="a hub name (e.g. openai/clip-vit-base-patch32), a local directory or an s3:// "
                                   "prefix holding what save_pretrained writes: CLIP, SigLIP, SigLIP2 or any "
                                   "transformers model with get_image_features / get_text_features (docs/embed.md); "
                                   "never remote code")
    revision: str | None = flags.option(
        None, flag="--revision", help="hub commit to load (default: the pinned one for openai/clip-vit-base-patch32 "
                                      "and -large-patch14; else the hub's, recorded in the manifest)")
    modality: str = flags.option("image", flag="--modality", choices=MODALITIES,
                                 help="what to embed: the images of --image-column or the texts of --text-column")
    image_column: str = flags.option("image", flag="--image-column",
                                     help="HF Image structs or raw bytes; in tars, the image member")
    text_column: str = flags.option("text", flag="--text-column", help="in tars, the .txt member")
    key_column: str = flags.option("key", flag="--key-column",
                                   help="the input column whose value names each row in the output (eval's readers "
                                        "need it unique); in tars, the sample key")
    carry_columns: tuple[str, ...] = flags.option(
        (), flag="--carry-columns", check=flags.names, cli_default="",
        help="comma-separated input columns to copy beside each embedding (in tars: members or fields of the .json)")
    batch_size: int = flags.option(256, flag="--batch-size", check=flags.count,
                                   help="rows per model call (default: 256)")
    rows_per_shard: int = flags.option(  # at most; image shards hold at most UNIT_BYTES of decoded pixels
        10_000, flag="--rows-per-shard", check=flags.count,
        help="most rows per output shard; an input file with more is cut into row ranges (default: 10000; image "
             "shards hold at most 256 MB of decoded pixels)")
    dtype: str = flags.option("float32", flag="--dtype", choices=tuple(formats.DTYPES),
                              help="stored embedding type (the model runs in bf16 on a GPU, float32 on a CPU)")
    resume: bool = flags.option(False, flag="--resume", action="store_true",
                                help="continue an unfinished run: skip the shards it committed with the same settings "
                                     "(an unfinished output needs --resume or --overwrite)")
    overwrite: bool = flags.option(False, flag="--overwrite", action="store_true",
                                   help="replace complete embeddings already at --out")
    max_error_rate: float = flags.option(0.01, flag="--max-error-rate", check=flags.fraction,
                                         help="fail when more than this fraction of rows cannot be encoded (default: "
                                              "0.01)")
    workers: int | None = workers_option()
    gpus_per_worker: float | None = gpus_option()
    cpus_per_worker: float | None = cpus_option()  # None: the pool decides (runtime/pools.encoder_pool)
    device: str | None = None  # None: the pool decides (cuda with a GPU, else cpu); in this process, cuda if any
    decode: str = flags.option(  # images: cpu (read tasks), gpu (the encoders' device, nvJPEG), auto (gpu where it can)
        "auto", flag="--decode", choices=gpu_decode.MODES,
        help="where images are decoded: cpu (the read tasks), gpu (baseline JPEGs by each encoder on its device with "
             "nvJPEG, other images by the read tasks; needs torchvision) or auto (default): gpu when the encoders "
             "have GPUs, torchvision imports, the model's resize filter runs there and the cluster has under 6 CPUs "
             "per GPU (measured: more decode faster on the CPUs), else cpu (docs/embed.md)")
    raw: bool = flags.option(False, flag="--raw", action="store_true",
                             help="keep the model's own vectors, not L2-normalised (mteb's CLIP wrapper adds an "
                                  "image's and a text's raw vectors for a query of both)")
    exact: bool = flags.option(False, flag="--exact", action="store_true",
                               help="compute as mteb's model wrappers do: JPEGs decoded in full on the CPU (no draft "
                                    "decode, no device decode), the model in float32, a blank text encoded rather "
                                    "than an error row; slower (eval embeds so)")
    compile: bool = flags.option(False, flag="--compile", action="store_true",
                                 help="compile the image tower with torch.compile: 1.2x the images/s on an H200 "
                                      "(ViT-B/32 and L/14, past timm's), after 26 to 45 s of compiling in each "
                                      "encoder; pays off from about half a million images per GPU (docs/embed.md)")
    executor: str = flags.executor_option()  # auto: local on a machine alone without a GPU
    reuse: bool = False  # a complete output of the same identity is kept, one of another replaced (eval --model)

    @property
    def decoding(self) -> str:
        """Where images are decoded: --decode, or the CPU under --exact."""
        return "cpu" if self.exact else self.decode

    @property
    def precision(self) -> str:
        """The encoder's torch dtype: float32 under --exact, else the device's (bf16 on a GPU)."""
        return "float32" if self.exact else "auto"

    @property
    def columns(self) -> reader.TableColumns:
        data = self.image_column if self.modality == "image" else self.text_column
        return reader.TableColumns(self.key_column, data, tuple(self.carry_columns))

    def check(self) -> None:
        flags.check(self)
        if self.exact and self.decode == "gpu":
            raise UserError("--exact decodes images on the CPU, as the model's processor does: drop --decode gpu")
        if self.exact and self.compile:
            raise UserError("--exact runs the model as mteb does, uncompiled: drop --compile")
        if self.decoding == "gpu" and self.modality == "image" and (why := gpu_decode.torchvision_problem()):
            raise UserError(f"--decode gpu needs torchvision: {why}")


@dataclass(frozen=True)
class Plan:
    """What the workers need, decided once by the driver."""

    fmt: str
    units: list[reader.Unit]
    info: object  # ModelInfo
    spec: dict | None
    schema: object  # the shards' Arrow schema, with its metadata
    settings: dict  # what a progress record must match to be reused


def embed(config: EmbedConfig, log=print, ctx: RunContext | None = None) -> dict:
    """Run the embed job on Ray or in this process (placement_of); return the manifest. ctx: the command's Ray
    (None: RunContext())."""
    config.check()
    where = placement_of(config, ctx)
    info, made_by = describe(config.model, config.revision, modality=config.modality)  # a hub name: its commit
    job = Job("embed", config.out, "complete embeddings", _OURS, config.resume, config.overwrite, log,
              identity=_identity(config, info, made_by), reuse=config.reuse, inputs=(config.input,))
    if (reused := job.reusable()) is not None:
        return reused
    with job, tasks.using(where.mode, where.ctx):  # the plan's tar indexing too; the job's hold on its output
        plan = _plan(config, where.mode, info, job.identity)
        job.start()
        results = job.earlier({u.name: u.identity for u in plan.units}, plan.settings)
        todo = [i for i, u in enumerate(plan.units) if u.name not in results]
        files = len({u.pieces[0].uri for u in plan.units})
        log(f"[embed] {len(plan.units)} shards from {files} input files ({plan.fmt}), "
            f"{len(results)} already done, {sum(plan.units[i].hi - plan.units[i].lo for i in todo):,} rows to "
            f"encode with {config.model} ({plan.info.architecture}, dim {plan.info.dim})")
        log(f"[embed] {where.describe()}")
        for i in [i for i in todo if plan.units[i].hi == plan.units[i].lo]:  # an empty file: an empty shard
            results[plan.units[i].name] = embeddings.commit_shard(config.out, plan.units[i].name, plan.schema, {},
                                                                  config.key_column, config.columns.carry)
        todo = [i for i in todo if plan.units[i].hi > plan.units[i].lo]
        stages, on_rows = _ray_stages(config, plan, job, todo, log, where.ctx) if where.mode == "ray" \
            else _local_stages(config, plan, job, todo, log)
        results.update((r["path"], r) for r in job.run(todo, stages, where.mode, on_rows=on_rows, ctx=where.ctx))
        return _manifest(config, plan, [results[n] for n in sorted(results)], job, where.mode, log)


def embed_table(source: str, key: str, target: str, model: str, revision: str | None, modality: str, log=print,
                pool: PoolRequest = PoolRequest(), executor: str = "auto", max_error_rate: float = 0.01,
                raw: bool = False, exact: bool = True, ctx: RunContext | None = None) -> str:
    """Embed `source`'s images or texts (keyed by its `key` column) into `target`; an output complete there of
    the same identity (model, input, settings: runtime/identity.py) is reused, any other replaced. Returns target.
    exact: as mteb's model wrappers compute them (the eval's embeddings: --exact). ctx: the command's Ray."""
    embed(EmbedConfig(source, target, model, revision=revision, modality=modality, key_column=key, reuse=True,
                      executor=executor, max_error_rate=max_error_rate, raw=raw, exact=exact,
                      **dataclasses.asdict(pool)), log=log, ctx=ctx)
    return target


def placement_of(config: EmbedConfig, ctx: RunContext | None = None) -> placement.Placement:
    """Where the job runs (runtime/placement.py): under auto, in this process on a machine alone without a GPU
    when no pool was asked for; a laptop's CPU encoder waits on its model, so Ray's parallel decode buys
    nothing there, while a fresh actor process importing torch and transformers costs seconds."""
    ctx = ctx or RunContext()  # the same one for keep_ray and the Placement
    needs_ray = None
    if (config.workers or 1) > 1 or (config.gpus_per_worker or 0) > 0 or config.decoding == "gpu":
        needs_ray = "a pool of encoders or GPUs was asked for"
    elif config.executor == "auto" and not placement.keep_ray(ctx):
        import torch

        if torch.cuda.is_available():
            needs_ray = "this machine has a GPU: CPU tasks decode for it in parallel"
    return placement.choose(config.executor, needs_ray, ctx=ctx)


# ---------------------------------------------------------------------------------------------- plan


def _identity(config: EmbedConfig, info, made_by: dict) -> dict:
    """What decides the embeddings (runtime/identity.py): the model (made_by: its identity), the input, and the
    settings that change a row's vector; not the shard size or the pools."""
    return {"format": formats.EMBEDDINGS.stamp(), "model": made_by,
            "input": identity.of_input(config.input), "modality": config.modality,
            "columns": [config.key_column, config.columns.data, *config.columns.carry], "dtype": config.dtype,
            "raw": config.raw, "precision": config.precision,
            "decode": config.decoding if config.modality == "image" else None,
            "preprocessing": _image_spec(info, exact=config.exact) if config.modality == "image" else None}


def _plan(config: EmbedConfig, mode: str, info, made_of: dict) -> Plan:
    fmt, files = reader.input_files(config.input)
    carry_schema = reader.check_columns(fmt, files[0], config.columns.read_as(config.modality))
    spec = made_of["preprocessing"]
    rows, raw_bytes = unit_rows(config.rows_per_shard, spec), None
    if spec is not None:
        if config.decoding == "gpu":
            gpu_decode.resolve("gpu", 1, ImageSpec(**spec))  # a filter the device lacks: one line, now
        if config.decoding != "cpu" and mode == "ray":  # the JPEGs may travel undecoded: bound their bytes too
            raw_bytes = UNIT_BYTES
    meta = {"model": info.to_dict(), "modality": config.modality, "dtype": config.dtype, "normalized": not config.raw,
            "preprocessing": spec, "package": f"mieb-ray {__version__}"}
    # a resumed run must be of the same input and model content too, not only the same names
    settings = {"version": __version__, "input": storage.display(config.input), "model": info.to_dict(),
                "identity": identity.digest(made_of), "modality": config.modality, "dtype": config.dtype,
                "preprocessing": spec, "rows_per_unit": rows, "decode": config.decoding if spec is not None else None,
                "unit_bytes": raw_bytes, "columns": [config.key_column, config.columns.data, *config.columns.carry]}
    return Plan(fmt, table_units(files, rows, raw_bytes), info, spec,
                formats.embedding_schema(info.dim, config.dtype, carry_schema, meta), settings)


def unit_rows(rows_per_shard: int, spec: dict | None) -> int:
    """Rows per unit: --rows-per-shard, and for images no more than UNIT_BYTES of decoded pixels (a unit's pixels
    are one block in the object store)."""
    if spec is None:
        return rows_per_shard
    return max(1, min(rows_per_shard, UNIT_BYTES // (spec["height"] * spec["width"] * 3)))


def _image_spec(info, exact: bool = False) -> dict:
    if not info.image_config:
        raise UserError(f"model {info.name} has no image processor config (preprocessor_config.json)")
    return dataclasses.replace(ImageSpec.from_processor_config(info.image_config), exact=exact).to_dict()


_index_tar = tasks.remote(num_cpus=0.5)(tar.index_tar)


def table_units(files: list[reader.InputFile], rows_per_unit: int, unit_bytes: int | None = None) -> list[reader.Unit]:
    """The files cut into units: parquet files at their row groups (from their footers), tars counted and indexed
    (where each unit starts) by a read of every tar, in tasks. unit_bytes: also no more of a file per unit than this
    many bytes, by its average row (units whose images travel undecoded, --decode gpu); a tar cut finer is indexed
    again."""
    reader.read_parquet_layouts(files)
    tars = [f for f in files if f.uri.endswith(".tar")]
    counted = tasks.get([_index_tar.remote(f.uri, rows_per_unit) for f in tars]) if tars else []
    for f, (rows, _) in zip(tars, counted):
        f.rows = rows
    offsets = {f.uri: at for f, (_, at) in zip(tars, counted)}
    steps = {f.uri: rows_per_unit for f in files}
    if unit_bytes:
        for f, size in zip(files, storage.file_sizes([f.uri for f in files], "input file")):
            steps[f.uri] = max(1, min(rows_per_unit, unit_bytes * f.rows // max(size, 1)))
        finer = [f for f in tars if steps[f.uri] < rows_per_unit]
        indexed = tasks.get([_index_tar.remote(f.uri, steps[f.uri]) for f in finer]) if finer else []
        offsets.update((f.uri, at) for f, (_, at) in zip(finer, indexed))
    return reader.plan_table(files, steps, offsets)


# ---------------------------------------------------------------------------------------------- run


def _stage_args(config: EmbedConfig, plan: Plan, job: Job, decode: str, threads: int, device: str | None):
    """The read, encode (constructor) and commit stages' arguments, whichever executor runs them."""
    # a local model path must mean the same directory to every worker
    model = os.path.abspath(config.model) if os.path.isdir(config.model) else config.model
    columns = config.columns
    return (dict(units=plan.units, columns=columns, modality=config.modality, spec=plan.spec, decode=decode,
                 blank_texts=config.exact),
            dict(model=model, revision=plan.info.revision, modality=config.modality, data_column=columns.data,
                 spec=plan.spec, batch_size=config.batch_size, device=device, threads=threads,
                 decode=decode, strict=config.decoding == "gpu", raw=config.raw, precision=config.precision,
                 compile=config.compile and config.modality == "image"),
            dict(units=plan.units, out=config.out, schema=plan.schema, columns=columns, progress=job.progress))


def _ray_stages(config: EmbedConfig, plan: Plan, job: Job, todo: list[int], log, ctx: RunContext | None = None):
    """A read task per unit, the encoder actor pool, a commit task per unit; sized to ctx's cluster."""
    if not todo:
        return [], None
    spec = ImageSpec(**plan.spec) if plan.spec else None
    cluster = read_cluster(ctx)
    per_gpu = cluster.max_cpus / cluster.max_gpus if cluster.max_gpus else None  # what auto weighs (gpu_decode)
    device_decode = spec is not None and gpu_decode.resolve(config.decoding, 1, spec, per_gpu)[0] == "gpu"
    pool = encoder_pool(cluster, config.gpus_per_worker, config.cpus_per_worker, config.workers,
                        cap=len(todo), device_decode=device_decode)
    log(f"[embed] {pool.why}")
    decode = "cpu"
    if spec is not None:
        decode, why = gpu_decode.resolve(config.decoding, pool.num_gpus, spec, per_gpu)
        where = "baseline JPEGs by the encoders on their GPUs, the rest by CPU tasks" if decode == "gpu" \
            else "by CPU tasks"
        log(f"[embed] images decoded {where} ({why})")
    # the pool decides the device: an encoder given no GPU runs on its CPU whatever CUDA_VISIBLE_DEVICES says
    device = config.device or ("cuda" if pool.num_gpus > 0 else "cpu")
    read, encode, commit = _stage_args(config, plan, job, decode, int(max(1, pool.num_cpus)), device)
    return [Stage(read_stage, read, num_cpus=1, memory=DECODE_MEMORY),
            Stage(EncodeStage, encode, num_cpus=pool.num_cpus, num_gpus=pool.num_gpus, pool=pool,
                  batch_rows=max(plan.units[i].hi - plan.units[i].lo for i in todo)),
            Stage.commit(commit_stage, commit, pool, len(todo))], None


def _local_stages(config: EmbedConfig, plan: Plan, job: Job, todo: list[int], log):
    """The same stages in this process: a thread reads and decodes unit i + 1 (the first while the model loads)
    while the model encodes unit i; a progress line every 5 s within a unit too (a CPU encoder may spend minutes
    on one)."""
    import torch

    decode = gpu_decode.resolve(config.decoding, 0, ImageSpec(**plan.spec))[0] if plan.spec else "cpu"
    threads = torch.get_num_threads()
    log(f"[embed] one encoder in this process, {threads} torch threads; a thread beside it reads "
        f"{'and decodes ' if config.modality == 'image' else ''}the next unit")
    read, encode, commit = _stage_args(config, plan, job, decode, threads, config.device)
    encoded = {"rows": 0, "t0": time.time(), "logged": time.time()}

    def on_rows(rows: int) -> None:
        encoded["rows"] += rows
        if time.time() - encoded["logged"] > 5:
            encoded["logged"] = time.time()
            log(f"[embed] encoding: {encoded['rows']:,} rows encoded, "
                f"{encoded['rows'] / max(time.time() - encoded['t0'], 1e-9):,.0f} rows/s")

    return [Stage(read_stage, read), Stage(EncodeStage, encode), Stage(commit_stage, commit)], on_rows


# ---------------------------------------------------------------------------------------------- manifest


def _manifest(config: EmbedConfig, plan: Plan, results: list[dict], job: Job, mode: str, log) -> dict:
    rows = sum(r["rows"] for r in results)
    n_errors = sum(r["errors"] for r in results)
    job.check_errors(n_errors, rows, config.max_error_rate, "encoded")
    error_files = [r["error_file"] for r in results if r["error_file"]]
    settings = {k: v for k, v in dataclasses.asdict(config).items()
                if k not in ("out", "resume", "overwrite", "reuse")}
    manifest = job.finish({
        **formats.EMBEDDINGS.stamp(), "package": "mieb-ray", "version": __version__,
        "config": {**settings, "input": storage.display(config.input), "input_format": plan.fmt,
                   "data_column": config.columns.data, "rows_per_unit": plan.settings["rows_per_unit"]},
        "model": plan.info.to_dict(), "dim": plan.info.dim, "preprocessing": plan.spec,
        "counts": {"total": rows, "errors": n_errors, **_decoded(results)}, "executor": mode,
        "precision": _precision(results, config.precision),
        "shards": [{k: r[k] for k in ("path", "rows", "bytes", "sha256")} for r in results],
        "error_files": error_files,
    }, {r["path"] for r in results} | set(error_files))
    log(f"[embed] done: {rows:,} embeddings in {len(results)} shards, {n_errors:,} errors, "
        f"{time.time() - job.t0:.1f}s -> {storage.display(config.out)}")
    if decoded := _decoded(results):
        log(f"[embed] images decoded: {decoded['decoded_on_device']:,} on the encoders' devices, "
            f"{decoded['decoded_on_cpu']:,} on CPUs (--decode {config.decoding})")
    return manifest


def _precision(results: list[dict], setting: str) -> dict[str, int]:
    """{torch dtype the encoders ran in: embeddings}: what the precision setting ("auto": the device's) became on
    each encoder (a unit resumed from a record without it counts under the setting)."""
    rows = {}
    for r in [r for r in results if r["rows"]]:
        rows[r.get("precision", setting)] = rows.get(r.get("precision", setting), 0) + r["rows"]
    return dict(sorted(rows.items()))


def _decoded(results: list[dict]) -> dict:
    """With the decode on the encoders' devices: how many good images each path decoded (a resumed unit without
    the count counts as the CPU's: it cannot be known); else {}."""
    if not any("decoded" in r for r in results):
        return {}
    on_device = sum(r.get("decoded", {}).get("device", 0) for r in results)
    return {"decoded_on_device": on_device, "decoded_on_cpu": sum(r["rows"] for r in results) - on_device}
