"""The embed job: images (or texts) of any table -> CLIP embedding shards, one per input file.

read + decode (a CPU task per input file: its rows in chunks, images decoded and resized to uint8 at the
model's size) -> encode (actor pool, one model per actor, a GPU each on a cluster) -> the driver puts each
input file's embeddings back in row order and commits `<input name>.arrow` -> `_manifest.json`.

Shard names come from the input files, so a shard that exists is complete (commits are atomic) and
`--resume` skips its input file: nothing is encoded twice and no key appears twice.
"""

from __future__ import annotations

import json
import os
import re
import time

import numpy as np
import pyarrow as pa
import ray

from mieb_ray import __version__, storage
from mieb_ray.cluster import capacity
from mieb_ray.encode.model import Encoder, load_info, resolve
from mieb_ray.errors import UserError
from mieb_ray.io import embeddings, tables

FORMAT = "mieb-embeddings"
FORMAT_VERSION = 1
MODALITIES = ("image", "text")
DECODE_MEMORY = 512 << 20  # per read+decode task: a chunk of source images plus the decoded block


def shard_name(rel: str) -> str:
    return re.sub(r"\.(parquet|tar)$", "", rel) + ".arrow"


# ---------------------------------------------------------------------------------------------- stages


def read_stage(batch: dict, columns: tables.Columns, modality: str, spec: dict | None, decode_rows: int):
    """One input file per task; yields its rows in chunks, images already decoded (so raw image bytes never
    enter the object store, and a task's blocks stream out as it goes)."""
    for file_no, uri in zip(batch["file"], batch["uri"]):
        for chunk in tables.read_file(int(file_no), str(uri), columns, modality):
            if modality != "image":
                yield chunk
                continue
            for lo in range(0, len(chunk["__row"]), decode_rows):
                yield decode({k: v[lo:lo + decode_rows] for k, v in chunk.items()}, columns.data, spec)


def decode(batch: dict, data_column: str, spec: dict) -> dict:
    """Image bytes -> uint8 pixels at the model's size; a bad image becomes an error, not an exception."""
    from mieb_ray.encode.preprocess import ImageSpec, load_images

    pixels, errors = load_images(list(batch.pop(data_column)), ImageSpec(**spec))
    return {**batch, "pixels": pixels, "__error": np.array([e or "" for e in errors], dtype=object)}


class EncodeStage:
    """Holds one model. Rows already marked as errors pass through with a zero embedding.

    `__error` is "" for a good row: a None would come back from Ray's numpy->Arrow->numpy trip as NaN.
    """

    def __init__(self, model: str, revision: str | None, modality: str, data_column: str, spec: dict | None,
                 device: str | None, threads: int):
        import torch

        torch.set_num_threads(max(1, threads))
        path = resolve(model, revision)  # on this node: a local dir, or the hub's / S3's files cached here
        self.encoder = Encoder(path, load_info(path, model, revision, modality=modality), device=device)
        self.modality, self.data_column, self.spec = modality, data_column, spec

    def __call__(self, batch: dict) -> dict:
        import torch

        n = len(batch["__row"])
        if self.modality == "image":
            from mieb_ray.encode.preprocess import ImageSpec, normalize

            errors = batch.pop("__error")
            pixels = batch.pop("pixels")
        else:
            texts = batch.pop(self.data_column)
            errors = np.array([_text_error(t) for t in texts], object)
        ok = errors == ""
        out = np.zeros((n, self.encoder.info.dim), dtype=np.float32)
        if ok.any():
            if self.modality == "image":
                device_pixels = torch.from_numpy(np.ascontiguousarray(pixels[ok])).to(self.encoder.device)
                values = normalize(device_pixels, ImageSpec(**self.spec), dtype=self.encoder.dtype)
                out[ok] = self.encoder.encode_pixel_values(values)
            else:
                out[ok] = self.encoder.encode_texts([str(t) for t in texts[ok]])
        return {**batch, "__error": errors, "embedding": out}


def _text_error(text) -> str:
    if isinstance(text, bytes):  # a tar member that did not decode
        return "text is not valid UTF-8"
    return "" if isinstance(text, str) and text.strip() else "empty text"


# ---------------------------------------------------------------------------------------------- driver


class _Assembly:
    """The rows of one input file as they come back, in any order, until all have."""

    def __init__(self, rows: int):
        self.seen = np.zeros(rows, dtype=bool)
        self.parts: list[dict] = []

    def add(self, part: dict) -> bool:
        rows = part["__row"]
        if self.seen[rows].any():
            raise RuntimeError(f"rows {rows[self.seen[rows]][:5].tolist()} came back twice")
        self.seen[rows] = True
        self.parts.append(part)
        return bool(self.seen.all())

    def rows(self) -> dict:
        if not self.parts:
            return {}
        merged = {k: np.concatenate([p[k] for p in self.parts]) for k in self.parts[0]}
        order = np.argsort(merged["__row"], kind="stable")
        return {k: v[order] for k, v in merged.items()}


class _ShardWriter:
    def __init__(self, out: str, schema, columns: tables.Columns):
        self.out, self.schema, self.columns = out, schema, columns

    def write(self, rel: str, rows: dict) -> dict:
        errors = rows.get("__error", np.array([], dtype=object))
        bad = errors != ""
        good = ~bad
        name = shard_name(rel)
        result = {"path": name, "input": rel, "errors": int(bad.sum()), "error_file": None}
        if bad.any():  # errors first: the shard's existence says the input file is done
            result["error_file"] = f"_errors/{name}"
            table = pa.table({"key": [str(k) for k in rows[self.columns.key][bad]],
                                         "error": [str(e) for e in errors[bad]]}, schema=embeddings.ERROR_SCHEMA)
            self._commit(result["error_file"], table)
        keys = [str(k) for k in rows[self.columns.key][good]] if rows else []
        dim = self.schema.field("embedding").type.list_size
        matrix = rows["embedding"][good] if rows else np.zeros((0, dim), np.float32)
        carry = {c: list(rows[c][good]) if rows else [] for c in self.columns.carry}
        table = embeddings.shard_table(self.schema, keys, matrix, carry)
        return {**result, "rows": table.num_rows, **self._commit(name, table)}

    def _commit(self, name: str, table) -> dict:
        dest = storage.join(self.out, name)
        local = storage.staging_path(dest)
        embeddings.write_ipc(local, table)
        stats = storage.file_stats(local)
        storage.commit(local, dest)
        return stats


def _committed(out: str) -> dict[str, str]:
    """Shards an earlier, unfinished run committed: name -> uri."""
    files = storage.list_files(out)
    root = out.rstrip("/") + "/"
    return {u[len(root):]: u for u in files if u.endswith(".arrow") and not u[len(root):].startswith("_")}


def _shard_stats(out: str, name: str) -> dict:
    """The manifest entry of a shard an earlier run committed."""
    uri, err = storage.join(out, name), storage.join(out, f"_errors/{name}")
    errors = embeddings.open_shard(err).num_rows if storage.exists(err) else 0
    return {"path": name, "rows": embeddings.open_shard(uri).num_rows, **storage.file_stats(uri),
            "errors": errors, "error_file": f"_errors/{name}" if errors else None}


def _prepare_output(out: str, overwrite: bool, resume: bool) -> dict[str, str]:
    storage.check_output(out)
    storage.remove_staging(out)
    old = storage.read_manifest(out)
    if old is not None and not overwrite:
        raise UserError(f"{storage.display(out)} already holds complete embeddings ({storage.MANIFEST}); "
                        "pass --overwrite to replace them")
    committed = _committed(out)
    if overwrite:
        storage.delete(storage.join(out, storage.MANIFEST))
        for uri in storage.list_files(out):
            if uri.endswith(".arrow"):
                storage.delete(uri)
        return {}
    if committed and not resume:
        raise UserError(f"{storage.display(out)} holds {len(committed)} shards of an unfinished run; "
                        "pass --resume to continue it or --overwrite to start again")
    return committed


def embed(input: str, out: str, model: str, revision: str | None = None, modality: str = "image",
          image_column: str = "image", text_column: str = "text", key_column: str = "key",
          carry_columns: list[str] | None = None, batch_size: int = 256, dtype: str = "float32",
          resume: bool = False, overwrite: bool = False, max_error_rate: float = 0.01,
          workers: int | None = None, gpus_per_worker: float | None = None, cpus_per_worker: float = 1.0,
          decode_batch_size: int = 256, device: str | None = None, log=print) -> dict:
    """Run the embed job on the connected Ray cluster; return the manifest."""
    if modality not in MODALITIES:
        raise UserError(f"unknown modality {modality!r}; valid: {', '.join(MODALITIES)}")
    if dtype not in embeddings.DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; valid: {', '.join(embeddings.DTYPES)}")
    t0 = time.time()
    columns = tables.Columns(key_column, image_column if modality == "image" else text_column,
                             tuple(carry_columns or ()))
    fmt, files = tables.input_files(input)
    carry_schema = tables.check_columns(fmt, files[0], columns)
    model_path = resolve(model, revision)
    info = load_info(model_path, model, revision, modality=modality)
    spec = _image_spec(info) if modality == "image" else None
    committed = _prepare_output(out, overwrite, resume)

    todo = [(i, f) for i, f in enumerate(files) if shard_name(f.rel) not in committed]
    tables.count_rows(fmt, [f for _, f in todo])
    meta = {"model": info.to_dict(), "modality": modality, "dtype": dtype, "normalized": True,
            "preprocessing": spec, "package": f"mieb-ray {__version__}"}
    schema = embeddings.schema(info.dim, dtype, carry_schema, meta)
    writer = _ShardWriter(out, schema, columns)
    log(f"[embed] {len(files)} input files ({fmt}), {len(files) - len(todo)} already done, "
        f"{sum(f.rows for _, f in todo):,} rows to encode with {model} ({info.architecture}, dim {info.dim})")

    results = [_shard_stats(out, name) for name in sorted(committed)] if committed else []
    pending = {i: _Assembly(f.rows) for i, f in todo}
    for i, f in todo:
        if f.rows == 0:
            results.append(writer.write(f.rel, {}))
            del pending[i]
    if pending:
        # the actors load the commit the driver resolved, even when the user named none
        results += _run(pending, {i: f for i, f in todo}, columns, modality, spec, model, info.revision, info, writer,
                        batch_size, decode_batch_size, workers, gpus_per_worker, cpus_per_worker, device, log)

    rows = sum(r["rows"] for r in results)
    n_errors = sum(r["errors"] for r in results)
    if n_errors > max_error_rate * (rows + n_errors):
        raise UserError(f"{n_errors:,} of {rows + n_errors:,} rows could not be encoded, more than "
                        f"--max-error-rate {max_error_rate}; see {storage.display(storage.join(out, '_errors'))}")
    results.sort(key=lambda r: r["path"])
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "package": "mieb-ray", "version": __version__,
        "config": {"input": storage.display(input), "input_format": fmt, "modality": modality,
                   "key_column": key_column, "data_column": columns.data, "carry_columns": list(columns.carry),
                   "dtype": dtype, "batch_size": batch_size},
        "model": info.to_dict(), "dim": info.dim, "preprocessing": spec,
        "counts": {"total": rows, "errors": n_errors},
        "shards": [{k: r[k] for k in ("path", "rows", "bytes", "sha256")} for r in results],
        "error_files": [r["error_file"] for r in results if r["error_file"]],
    }
    manifest = json.loads(json.dumps(manifest))  # as a reader will see it (tuples become lists)
    storage.write_manifest(out, manifest)
    elapsed = time.time() - t0
    log(f"[embed] done: {rows:,} embeddings in {len(results)} shards, {n_errors:,} errors, {elapsed:.1f}s "
        f"-> {storage.display(out)}")
    return manifest


def _image_spec(info) -> dict:
    from mieb_ray.encode.preprocess import ImageSpec

    if not info.image_config:
        raise UserError(f"model {info.name} has no image processor config (preprocessor_config.json)")
    return ImageSpec.from_processor_config(info.image_config).to_dict()


def _run(pending, files, columns, modality, spec, model, revision, info, writer, batch_size, decode_batch_size,
         workers, gpus_per_worker, cpus_per_worker, device, log) -> list[dict]:
    resources = capacity()  # an autoscaling cluster's GPUs count before their nodes are up
    if gpus_per_worker is None:
        gpus_per_worker = 1.0 if resources["GPU"] > 0 else 0.0
    if workers is None:
        workers = int(resources["GPU"] // gpus_per_worker) if gpus_per_worker else max(1, int(resources["CPU"]) // 4)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    # a local model path must mean the same directory to every worker
    model = os.path.abspath(model) if os.path.isdir(model) else model

    ds = ray.data.from_items([{"file": i, "uri": files[i].uri} for i in pending], override_num_blocks=len(pending))
    # one CPU task per input file (batch_size=1: a fused stage with a larger batch would bundle every file into
    # one task); the memory hint also keeps it apart from the encoder actors on a CPU-only run
    ds = ds.map_batches(read_stage, fn_kwargs={"columns": columns, "modality": modality, "spec": spec,
                                               "decode_rows": decode_batch_size},
                        batch_size=1, batch_format="numpy", num_cpus=1, memory=DECODE_MEMORY)
    ds = ds.map_batches(
        EncodeStage, fn_constructor_kwargs=dict(model=model, revision=revision, modality=modality,
                                                data_column=columns.data, spec=spec, device=device,
                                                threads=int(cpus_per_worker)),
        batch_size=batch_size, batch_format="numpy", num_cpus=cpus_per_worker, num_gpus=gpus_per_worker,
        compute=ray.data.ActorPoolStrategy(size=workers))

    results, total = [], len(pending)
    done_rows, t_run, t_log = 0, time.time(), 0.0
    for batch in ds.iter_batches(batch_format="numpy", batch_size=None):  # each block as it comes
        for file_no in np.unique(batch["__file"]):
            mask = batch["__file"] == file_no
            part = {k: v[mask] for k, v in batch.items()}
            done_rows += int(mask.sum())
            if pending[int(file_no)].add(part):
                results.append(writer.write(files[int(file_no)].rel, pending.pop(int(file_no)).rows()))
        if time.time() - t_log > 5 or not pending:
            t_log, elapsed = time.time(), time.time() - t_run
            log(f"[embed] {total - len(pending)}/{total} files, {done_rows:,} rows, "
                f"{done_rows / max(elapsed, 1e-9):,.0f} rows/s")
    if pending:
        raise RuntimeError(f"{len(pending)} input files did not come back whole")
    return results
