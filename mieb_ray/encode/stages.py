"""The embed job's three stages, as Ray Data runs them. Each block is one unit (rows [lo, hi) of one input
file) from the read to the commit, so the worker that commits it has all of its rows:

read_stage    a CPU task per unit: its rows read, images decoded and resized to uint8 at the model's size
              (raw image bytes never enter the object store); with --decode gpu, the bytes of the JPEGs the device
              takes as they are, and the others decoded here (gpu_decode.route)
EncodeStage   an actor holding one model (a GPU each on a cluster): the unit's pixels moved to its device a model
              call at a time, its embeddings copied back once; with --decode gpu it decodes the unit's JPEGs
              first, on its device (encode/gpu_decode.py)
commit_stage  a CPU task: the unit's shard and error rows committed, then its progress record; what comes back
              to the driver is that record's result (path, rows, bytes, sha256, errors), never an embedding

Beside the table's own columns a unit's block carries the columns below, named with "__" so that no input
column can take their place. A row's ERROR is "" when good (a None would come back from Ray's numpy -> Arrow ->
numpy trip as NaN). With --decode gpu a row's `images` holds a JPEG, or (DECODED) the height x width x 3 bytes of
its decoded pixels; ON_DEVICE says whether the device decoded it, which the unit's result counts.
"""

from __future__ import annotations

import json
import socket
import warnings

import numpy as np
import pyarrow as pa

from mieb_ray import storage
from mieb_ray.encode.gpu_decode import DeviceDecoder, route
from mieb_ray.encode.model import Encoder, load_info, resolve
from mieb_ray.encode.preprocess import ImageSpec, Normalizer, load_images
from mieb_ray.errors import FormatError
from mieb_ray.io import embeddings, parquet, reader
from mieb_ray.io.reader import TableColumns, Unit
from mieb_ray.runtime import tasks
from mieb_ray.runtime.output import Progress

ERROR = "__error"  # per row: why it is an error row, "" for a good one
UNIT = "__unit"  # per row: its unit's number in the plan
DECODED = "__decoded"  # --decode gpu, per row: the read task decoded it (its pixels' bytes), not the device
ON_DEVICE = "__device"  # --decode gpu, per row: the encoder's device decoded it
PRECISION = "__precision"  # per row: the torch dtype its encoder ran in ("bfloat16", "float32"), which the unit's
# result says: under --precision auto only the encoder knows it (its device's)


def read_stage(batch: dict, units: list[Unit], columns: TableColumns, modality: str,
               spec: dict | None, decode: str = "cpu", blank_texts: bool = False) -> dict:
    """One unit in (its number in `units`), all its rows out as one block: its key and carried columns, its data
    (pixels or JPEGs for the device: _READERS; texts), ERROR per row and UNIT. blank_texts: a text of
    whitespace is encoded as it is (mteb's tasks hold some) rather than an error row."""
    (number,) = batch["unit"]
    unit = units[int(number)]
    n = unit.hi - unit.lo
    out = {name: np.empty(n, dtype=object) for name in (columns.key, *columns.carry)}
    errors = np.full(n, "", dtype=object)
    kind = "text" if modality == "text" else "jpeg" if decode == "gpu" else "pixels"
    data = _Texts(n, blank_texts) if kind == "text" else _READERS[kind](n, ImageSpec(**spec) if spec else None)
    at = 0
    for chunk in reader.read(unit, columns.read_as("text" if kind == "text" else "image")):
        size = chunk.num_rows
        for name in out:
            out[name][at:at + size] = chunk[name].to_numpy(zero_copy_only=False)
        values, files = chunk[columns.data], [None] * size
        if kind != "text" and pa.types.is_struct(values.type):  # (the reader read the images a table has by path)
            values, files = parquet.image_bytes(values), values.combine_chunks().field("path").to_pylist()
        errors[at:at + size] = [f"cannot read its image file {f}" if e == "missing image" and f else e
                                for e, f in zip(data.add(at, values.to_pylist()), files)]
        at += size
    if at != n:
        raise FormatError(f"{storage.display(unit.pieces[0].uri)} has {unit.lo + at:,} rows, fewer than the "
                          f"{unit.hi:,} it had when the job was planned; was it changed during the run?")
    for i in np.flatnonzero([k is None for k in out[columns.key]]):  # a row the output could not name
        errors[i] = errors[i] or reader.null_key(columns.key, unit, unit.lo + i)
    return {**out, **data.columns(columns.data), ERROR: errors, UNIT: np.full(n, int(number))}


class _Pixels:
    """Images decoded and resized here, into one (n, height, width, 3) uint8 array filled in place."""

    def __init__(self, n: int, spec: ImageSpec):
        self.spec, self.pixels = spec, np.zeros((n, spec.height, spec.width, 3), np.uint8)

    def add(self, at: int, images: list) -> list[str]:
        _, bad = load_images(images, self.spec, out=self.pixels[at:at + len(images)])
        return [e or "" for e in bad]

    def columns(self, data_column: str) -> dict:
        return {"pixels": self.pixels}


class _Jpegs:
    """--decode gpu: the JPEGs the device takes as they are (its encoder decodes them), the rest decoded here;
    DECODED says which."""

    def __init__(self, n: int, spec: ImageSpec):
        self.spec, self.images, self.decoded = spec, np.empty(n, dtype=object), np.zeros(n, dtype=bool)

    def add(self, at: int, images: list) -> list[str]:
        errors = [""] * len(images)
        self.images[at:at + len(images)] = images
        here = [j for j, b in enumerate(images) if route(b, self.spec) is None]  # not for the device
        if here:
            done, bad = load_images([images[j] for j in here], self.spec)
            self.images[[at + j for j in here]] = [b"" if e else p.tobytes() for p, e in zip(done, bad)]
            self.decoded[[at + j for j in here]] = True
            for j, e in zip(here, bad):
                errors[j] = e or ""
        return errors

    def columns(self, data_column: str) -> dict:
        return {"images": self.images, DECODED: self.decoded}


class _Texts:
    """The texts to encode, a row's bytes decoded when they are UTF-8."""

    def __init__(self, n: int, blank: bool = False):
        self.texts, self.blank = np.empty(n, dtype=object), blank

    def add(self, at: int, values: list) -> list[str]:
        values = [_text(t) for t in values]
        self.texts[at:at + len(values)] = [t if isinstance(t, str) else "" for t in values]
        return [_text_error(t, self.blank) for t in values]

    def columns(self, data_column: str) -> dict:
        return {data_column: self.texts}


_READERS = {"pixels": _Pixels, "jpeg": _Jpegs}


def _text(value):
    """A text to encode as it came: a tar member's bytes decoded if they are UTF-8 (else left as bytes)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def _text_error(text, blank: bool = False) -> str:
    if isinstance(text, bytes):  # a tar member that did not decode
        return "text is not valid UTF-8"
    return "" if isinstance(text, str) and (blank or text.strip()) else "empty text"


class EncodeStage:
    """Holds one model; encodes a unit's good rows in model calls of `batch_size`. Error rows get zeros.

    device: the pool's decision (cuda for an encoder given a GPU, cpu for one given none); None in this process:
    cuda when torch sees one. A unit's pixels go to the device a model call's rows at a time (pinned, without
    waiting), so the host copies the next call's rows while the device computes this one's; its embeddings stay
    there until the unit is done and come back in one copy."""

    def __init__(self, model: str, revision: str | None, modality: str, data_column: str, spec: dict | None,
                 batch_size: int, device: str | None, threads: int, decode: str = "cpu", strict: bool = True,
                 raw: bool = False, precision: str = "auto", compile: bool = False):
        import torch

        torch.set_num_threads(max(1, threads))
        # on this node: a local dir, or the hub's / S3's files cached here
        path = resolve(model, revision, node=socket.gethostname() if tasks.node() else None)
        self.encoder = Encoder(path, load_info(path, model, revision, modality=modality), device=device,
                               dtype=precision, raw=raw, compile=compile)
        self.modality, self.data_column, self.batch_size = modality, data_column, batch_size
        self.spec = ImageSpec(**spec) if modality == "image" else None
        self.normalize = Normalizer(self.spec, self.encoder.device) if self.spec else None
        self.on_rows = None  # in-process runs: called with the rows of each model call, for progress lines
        self.decoder = None
        if modality == "image" and decode == "gpu":
            self.decoder = DeviceDecoder(self.spec, str(self.encoder.device), strict=strict)

    def __call__(self, batch: dict) -> dict:
        if self.modality == "text":
            texts = batch.pop(self.data_column)
            good = np.flatnonzero(batch[ERROR] == "")
            out = np.zeros((len(texts), self.encoder.info.dim), dtype=np.float32)
            for lo in range(0, len(good), self.batch_size):
                rows = good[lo:lo + self.batch_size]
                out[rows] = self.encoder.encode_texts([str(t) for t in texts[rows]])
                self._done(len(rows))
            return {**batch, "embedding": out, PRECISION: self._precision(len(texts))}
        import torch

        device = self.encoder.device
        pixels = self._pixels(batch)  # on the host, or (decoded there) on the device
        good = np.flatnonzero(batch[ERROR] == "")
        on_device = torch.from_numpy(good).to(device)  # once: a copy to the device per call would wait for it
        out = torch.zeros((len(pixels), self.encoder.info.dim), dtype=torch.float32, device=device)
        for lo in range(0, len(good), self.batch_size):
            rows, where = good[lo:lo + self.batch_size], on_device[lo:lo + self.batch_size]
            x = self._to_device(_rows(pixels, rows, where))
            out[where] = self.encoder.image_features(self.normalize(x, self.encoder.dtype))
            self._done(len(rows))
        return {**batch, "embedding": out.cpu().numpy(), PRECISION: self._precision(len(pixels))}

    def _precision(self, n: int) -> np.ndarray:
        return np.full(n, str(self.encoder.dtype).removeprefix("torch."), dtype=object)

    def _done(self, rows: int) -> None:
        if self.on_rows is not None:
            self.on_rows(rows)

    def _pixels(self, batch: dict):
        """The unit's uint8 (n, height, width, 3) on the encoder's device; with a decoder, its JPEGs decoded
        there and ON_DEVICE (per row: decoded on the device) added to the batch."""
        import torch

        if self.decoder is None:
            return _tensor(batch.pop("pixels"))
        images, decoded = batch.pop("images"), batch.pop(DECODED)
        errors = batch[ERROR] = np.array(batch[ERROR], dtype=object)  # ours to change
        spec, device = self.spec, self.encoder.device
        pixels = torch.zeros((len(images), spec.height, spec.width, 3), dtype=torch.uint8, device=device)
        on_device = np.zeros(len(images), dtype=bool)
        ready = np.flatnonzero(decoded & (errors == ""))  # decoded by the read task
        if len(ready):
            host = np.stack([np.frombuffer(images[i], np.uint8) for i in ready])
            pixels[torch.from_numpy(ready).to(device)] = self._to_device(
                _tensor(host.reshape(len(ready), spec.height, spec.width, 3)))
        todo = np.flatnonzero(~decoded & (errors == ""))
        if len(todo):
            got = self.decoder([images[i] for i in todo])
            pixels[torch.from_numpy(todo).to(device)] = got.pixels
            errors[todo] = [e or "" for e in got.errors]
            on_device[todo] = got.on_device
        batch[ON_DEVICE] = on_device
        return pixels

    def _to_device(self, pixels):
        if self.encoder.device.type != "cuda" or pixels.is_cuda:
            return pixels
        return pixels.pin_memory().to(self.encoder.device, non_blocking=True)  # the host copies on while we queue


def _rows(pixels, rows: np.ndarray, where):
    """pixels' `rows` (ascending): a view where they run on (a unit without error rows), else gathered, by `where`
    (the same rows on the device) for pixels there."""
    import torch

    if rows[-1] - rows[0] == len(rows) - 1:
        return pixels[rows[0]:rows[-1] + 1]
    return pixels[where if pixels.is_cuda else torch.from_numpy(rows)]


def _tensor(array: np.ndarray):
    """A tensor over a numpy array without a copy. Ray hands blocks over read-only, which torch warns about on
    every call; nothing here writes to them."""
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def commit_stage(batch: dict, units: list[Unit], out: str, schema, columns: TableColumns,
                 progress: Progress) -> dict:
    """Commit the shard of each unit in the block, then its progress record; return the records' results."""
    results = []
    for number in np.unique(batch[UNIT]):
        unit, mine = units[int(number)], batch[UNIT] == number
        if mine.sum() != unit.hi - unit.lo:  # a unit travels as one block: anything else would lose rows
            raise RuntimeError(f"unit {unit.name} arrived with {int(mine.sum())} of its {unit.hi - unit.lo} rows")
        rows = {k: v[mine] for k, v in batch.items()}
        progress.held(unit.name)
        result = embeddings.commit_shard(out, unit.name, schema, rows, columns.key, columns.carry, rows[ERROR])
        if ON_DEVICE in rows:  # --decode gpu: where the unit's good images were decoded
            on_device = int((rows[ON_DEVICE] & (rows[ERROR] == "")).sum())
            result["decoded"] = {"device": on_device, "cpu": result["rows"] - on_device}
        result["precision"] = str(rows[PRECISION][0])
        progress.record(unit.name, unit.identity, result)
        results.append(result)
    return {"unit": np.unique(batch[UNIT]), "result": np.array([json.dumps(r) for r in results], dtype=object)}
