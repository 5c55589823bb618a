"""The embed job's three stages, as Ray Data runs them. Each block is one unit (rows [lo, hi) of one input
file) from the read to the commit, so the worker that commits it has all of its rows:

read_stage    a CPU task per unit: its rows read, images decoded and resized to uint8 at the model's size
              (raw image bytes never enter the object store); with --decode gpu, the images' bytes as they are
EncodeStage   an actor holding one model (a GPU each on a cluster): the unit's embeddings, model call by call;
              with --decode gpu it decodes the unit's images first, on its device (encode/gpu_decode.py)
commit_stage  a CPU task: the unit's shard and error rows committed, then its progress record; what comes back
              to the driver is that record's result (path, rows, bytes, sha256, errors), never an embedding

`__error` is "" for a good row (a None would come back from Ray's numpy -> Arrow -> numpy trip as NaN).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from mieb_ray import storage
from mieb_ray.encode.gpu_decode import DeviceDecoder
from mieb_ray.encode.model import Encoder, load_info, resolve
from mieb_ray.encode.preprocess import ImageSpec, load_images, normalize
from mieb_ray.errors import FormatError
from mieb_ray.io import embeddings, parquet, reader
from mieb_ray.io.reader import TableColumns, Unit
from mieb_ray.runtime.output import Progress


def read_stage(batch: dict, units: list[Unit], columns: TableColumns, modality: str,
               spec: dict | None, decode: str = "cpu") -> dict:
    """One unit in (its number in `units`), all its rows out as one block."""
    (number,) = batch["unit"]
    unit = units[int(number)]
    n = unit.hi - unit.lo
    out = {name: np.empty(n, dtype=object) for name in (columns.key, *columns.carry)}
    errors = np.full(n, "", dtype=object)
    if modality == "image" and decode == "gpu":
        modality = "bytes"  # decoded by the encoder, on its device
        images = np.empty(n, dtype=object)
    elif modality == "image":
        spec_ = ImageSpec(**spec)
        pixels = np.zeros((n, spec_.height, spec_.width, 3), np.uint8)  # filled in place: no concatenation
    else:
        texts = np.empty(n, dtype=object)
    at = 0
    for chunk in reader.read(unit, columns.read_as("image" if modality != "text" else "text")):
        size = chunk.num_rows
        for name in out:
            out[name][at:at + size] = chunk[name].to_numpy(zero_copy_only=False)
        data = chunk[columns.data]
        if modality != "text":
            data = parquet.image_bytes(data).to_pylist() if pa.types.is_struct(data.type) else data.to_pylist()
        if modality == "bytes":
            images[at:at + size] = [b or b"" for b in data]
            errors[at:at + size] = ["missing image" if b is None else "" for b in data]
        elif modality == "image":
            pixels[at:at + size], bad = load_images(data, spec_)
            errors[at:at + size] = [e or "" for e in bad]
        else:
            values = [_text(t) for t in data.to_pylist()]
            errors[at:at + size] = [_text_error(t) for t in values]
            texts[at:at + size] = [t if isinstance(t, str) else "" for t in values]
        at += size
    if at != n:
        raise FormatError(f"{storage.display(unit.pieces[0].uri)} has {unit.lo + at:,} rows, fewer than the "
                          f"{unit.hi:,} it had when the job was planned; was it changed during the run?")
    data = {"pixels": pixels} if modality == "image" else {"images": images} if modality == "bytes" \
        else {columns.data: texts}
    return {**out, **data, "__error": errors, "__unit": np.full(n, int(number))}


def _text(value):
    """A text to encode as it came: a tar member's bytes decoded if they are UTF-8 (else left as bytes)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def _text_error(text) -> str:
    if isinstance(text, bytes):  # a tar member that did not decode
        return "text is not valid UTF-8"
    return "" if isinstance(text, str) and text.strip() else "empty text"


class EncodeStage:
    """Holds one model; encodes a unit's good rows in model calls of `batch_size`. Error rows get zeros."""

    def __init__(self, model: str, revision: str | None, modality: str, data_column: str, spec: dict | None,
                 batch_size: int, device: str | None, threads: int, decode: str = "cpu", strict: bool = True):
        import torch

        torch.set_num_threads(max(1, threads))
        path = resolve(model, revision)  # on this node: a local dir, or the hub's / S3's files cached here
        self.encoder = Encoder(path, load_info(path, model, revision, modality=modality), device=device)
        self.modality, self.data_column, self.spec, self.batch_size = modality, data_column, spec, batch_size
        self.on_rows = None  # in-process runs: called with the rows of each model call, for progress lines
        self.decoder = None
        if modality == "image" and decode == "gpu":
            self.decoder = DeviceDecoder(ImageSpec(**spec), str(self.encoder.device), strict=strict)

    def __call__(self, batch: dict) -> dict:
        if self.decoder is not None:
            images, read = batch.pop("images"), batch["__error"]
            data, errors = self.decoder([b if e == "" else None for b, e in zip(images, read)])  # on the device
            batch["__error"] = np.array([e or r for e, r in zip(errors, read)], dtype=object)
        else:
            data = batch.pop("pixels" if self.modality == "image" else self.data_column)
        good = np.flatnonzero(batch["__error"] == "")
        out = np.zeros((len(data), self.encoder.info.dim), dtype=np.float32)
        for lo in range(0, len(good), self.batch_size):
            rows = good[lo:lo + self.batch_size]
            out[rows] = self._encode(data[rows])
            if self.on_rows is not None:
                self.on_rows(len(rows))
        return {**batch, "embedding": out}

    def _encode(self, data: np.ndarray) -> np.ndarray:
        if self.modality == "text":
            return self.encoder.encode_texts([str(t) for t in data])
        import torch

        pixels = data if isinstance(data, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(data))
        pixels = pixels.to(self.encoder.device)
        return self.encoder.encode_pixel_values(normalize(pixels, ImageSpec(**self.spec), dtype=self.encoder.dtype))


def commit_stage(batch: dict, units: list[Unit], out: str, schema, columns: TableColumns,
                 progress: Progress) -> dict:
    """Commit the shard of each unit in the block, then its progress record; return the records' results."""
    results = []
    for number in np.unique(batch["__unit"]):
        unit, mine = units[int(number)], batch["__unit"] == number
        if mine.sum() != unit.hi - unit.lo:  # a unit travels as one block: anything else would lose rows
            raise RuntimeError(f"unit {unit.name} arrived with {int(mine.sum())} of its {unit.hi - unit.lo} rows")
        rows = {k: v[mine] for k, v in batch.items()}
        result = embeddings.commit_shard(out, unit.name, schema, rows, columns.key, columns.carry)
        progress.record(unit.name, unit.identity, result)
        results.append(result)
    return {"unit": np.unique(batch["__unit"]), "result": np.array([json.dumps(r) for r in results], dtype=object)}
