"""Decode on the encoder's device (`embed --decode gpu`): JPEGs in batches by torchvision's `decode_jpeg`
(nvJPEG on a CUDA device), resized and center-cropped there too, so the CPUs feeding a GPU only read bytes.

Who decodes what, per image, from its header alone (`route`, PIL, nothing decoded):
  device   baseline RGB or greyscale JPEGs that end where JPEGs end, whose resize shrinks them at most
           MAX_DOWNSCALE times: the read task ships their bytes (a tenth of the decoded pixels' size);
  CPU      everything else (PNG, WebP, CMYK, progressive JPEGs, trailing bytes, huge downscales), and any model
           whose resize filter torch cannot compute on a device as Pillow does: decoded by the read tasks as
           `--decode cpu` does (preprocess.load_images, with its one-line errors), on the cluster's many CPUs
           rather than in the encoder.
`DeviceDecoder` then decodes the device's share in the encoder; what the device refuses (a JPEG nvJPEG cannot
take, a size group whose resize fails) goes to `load_images` there. Both end as the same uint8
(n, height, width, 3) that `preprocess.Normalizer` takes.

Against the CPU path: the same EXIF orientation, RGB conversion, resize size (truncated long side), filter
(bilinear or bicubic, antialiased, in float32 on the device) and crop offsets; the resize runs on the full decode
rather than a draft decode and rounds once rather than per pass, so pixels differ by a few levels and embeddings
by a centred cosine well above 0.95 (tests/unit/encode/test_gpu_decode.py measures it).
"""

from __future__ import annotations

import io
from collections import defaultdict
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from PIL import ExifTags, Image

from mieb_ray.encode.pixels import TORCH_FILTERS
from mieb_ray.encode.preprocess import (
    MAX_PIXELS,
    ImageSpec,
    load_images,
    resize_output_size,
)
from mieb_ray.errors import UserError, first_line

if TYPE_CHECKING:
    import torch

MODES = ("cpu", "gpu", "auto")
BATCH = 64  # JPEGs per batched decode_jpeg call at most
# ... and decoded pixels per call: 192 MB as uint8, about 1 GB once a size group is stacked in float32 for the
# resize (x4) beside its output. A count alone would let 64 photos of 50 MP ask for 48 GB.
CHUNK_PIXELS = 64 << 20
# torch's antialiased CUDA resize keeps each output pixel's filter weights in shared memory, which overflows past
# a downscale of about 47x for bicubic (a short side over ~10k px at 224): images that shrink more than this
# are decoded on the CPU, whose draft decode shrinks them cheaply anyway.
MAX_DOWNSCALE = 32
_FILTER_NAMES = {int(f): f.name.lower() for f in Image.Resampling}
# What each feed gave one H200 with 16 CPUs (bench/gpu_encode.py and bench/gpu_embed.py, 2026-12-04; bench/RESULTS.md):
# 16 CPU decode processes gave 6,350 to 6,600 images/s (about 400 a process) of photos 160 to 800 px a side, while
# the device path is bound by its one encoder process's host work (0.43 to 0.79 ms an image) at about 2,400
# images/s per GPU (2,377 in the bench, 2,569 steady in the job, ViT-B/32). So `auto` decodes on the GPU only where
# a GPU's share of the cluster's CPUs decodes less than that: fewer than 6 CPUs per GPU.
CPU_DECODE_PER_CORE = 400
DEVICE_DECODE_PER_GPU = 2400


class Route(NamedTuple):
    """A JPEG the device decodes: its EXIF orientation and its decoded size in pixels (for sizing chunks)."""

    orientation: int
    pixels: int


class Decoded(NamedTuple):
    pixels: torch.Tensor  # uint8 (n, height, width, 3) on the decoder's device, zeros where an item failed
    errors: list  # per item None or a one-line reason
    on_device: np.ndarray  # bool per item: decoded on the device (else on this process's CPU)


def filter_problem(spec: ImageSpec) -> str | None:
    """None when torch resizes with the model's filter on a device as Pillow does (bilinear, bicubic)."""
    if spec.resample in TORCH_FILTERS:
        return None
    name = _FILTER_NAMES.get(spec.resample, str(spec.resample))
    return f"the model resizes with Pillow's {name} filter, which torch cannot compute on a device"


def torchvision_problem() -> str | None:
    """None when torchvision's decode_jpeg imports here, else the one-line reason."""
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception as exc:  # absent, or a build that does not match torch ("operator ... does not exist")
        return f"torchvision's decode_jpeg is not importable ({' '.join(str(exc).split())})"
    return None


def resolve(mode: str, gpus: float, spec: ImageSpec, cpus_per_gpu: float | None = None) -> tuple[str, str]:
    """(the decode mode a job runs, why). auto is gpu when the encoders have GPUs, the model's filter can run
    there, torchvision imports here (the driver, often on a node without a GPU, cannot check CUDA for them: an
    encoder that cannot decode on its device under auto says so once and decodes on its CPU, see DeviceDecoder),
    and the cluster's CPUs per GPU (None: unknown) would feed a GPU more slowly than the device path does."""
    if mode not in MODES:
        raise ValueError(f"unknown decode mode {mode!r}: one of {', '.join(MODES)}")
    if mode == "cpu":
        return "cpu", "--decode cpu"
    problem = filter_problem(spec)
    if mode == "gpu":
        if problem:
            raise UserError(f"--decode gpu: {problem}; use --decode cpu or auto")
        return "gpu", "--decode gpu"
    if gpus <= 0:
        return "cpu", "--decode auto: the encoders have no GPU"
    if cpus_per_gpu is not None and cpus_per_gpu * CPU_DECODE_PER_CORE >= DEVICE_DECODE_PER_GPU:
        return "cpu", (f"--decode auto: {cpus_per_gpu:g} CPUs per GPU decode about "
                       f"{cpus_per_gpu * CPU_DECODE_PER_CORE:,.0f} images/s, more than the device path's "
                       f"{DEVICE_DECODE_PER_GPU:,} per GPU")
    problem = problem or torchvision_problem()
    return ("cpu", f"--decode auto: {problem}") if problem else \
        ("gpu", "--decode auto: the encoders have GPUs and torchvision imports" + (
            f", and {cpus_per_gpu:g} CPUs per GPU decode less than the device path" if cpus_per_gpu else ""))


def route(data: bytes | None, spec: ImageSpec, max_pixels: int = MAX_PIXELS) -> Route | None:
    """How the device should decode this image, or None: decode it on the CPU."""
    if not data or not data.rstrip(b"\0").endswith(b"\xff\xd9"):  # no end marker: maybe truncated, which
        return None  # Pillow calls an error and a device decoder may not
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format != "JPEG" or im.mode not in ("RGB", "L") or im.width * im.height > max_pixels \
                    or im.info.get("progressive") or im.info.get("progression"):
                return None  # progressive scans are Huffman-decoded on the host by nvJPEG too: the read tasks' job
            orientation = int(im.getexif().get(ExifTags.Base.Orientation, 1))
            w, h = im.size
    except Exception:  # not an image, a bomb, a broken header: load_image names it
        return None
    orientation = orientation if 1 <= orientation <= 8 else 1
    if orientation in (5, 6, 7, 8):
        w, h = h, w
    out_h, out_w = resize_output_size(spec, h, w)
    if max(h / out_h, w / out_w) > MAX_DOWNSCALE:
        return None
    return Route(orientation, w * h)


def upright(x: torch.Tensor, orientation: int) -> torch.Tensor:
    """(3, h, w) as stored -> upright, as PIL's exif_transpose (pixels.UPRIGHT)."""
    import torch

    if orientation in (5, 6, 7, 8):
        x = x.transpose(1, 2)  # 5 = transpose; the others are a transpose plus a flip
        return {5: x, 6: torch.flip(x, [2]), 7: torch.flip(x, [1, 2]), 8: torch.flip(x, [1])}[orientation]
    flips = {2: [2], 3: [1, 2], 4: [1]}.get(orientation)
    return torch.flip(x, flips) if flips else x


def sticky(exc: BaseException) -> bool:
    """A CUDA error that leaves the device unusable (an illegal address, a failed launch): raised, never taken
    for a bad image or a group to redo on the CPU. Running out of memory is not one."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return False
    return isinstance(exc, getattr(torch, "AcceleratorError", ())) or "CUDA error" in str(exc)


def resize_crop(images: list[torch.Tensor], spec: ImageSpec, on_error=None) -> torch.Tensor:
    """Upright uint8 (3, h, w) images on one device -> uint8 (n, height, width, 3): resized as the processor
    sizes them, with its filter (antialiased bilinear or bicubic, rounded and clipped to uint8 as PIL's resize
    is), then center-cropped with the processor's offsets (zeros outside the image). Images of one size are
    resized in one call; when that call fails, `on_error(rows)` (if given) takes the group's rows, left zero."""
    import torch
    import torch.nn.functional as F

    mode = TORCH_FILTERS[spec.resample]  # callers route other filters to the CPU (filter_problem)
    out = torch.zeros((len(images), spec.height, spec.width, 3), dtype=torch.uint8,
                      device=images[0].device if images else "cpu")
    sizes = defaultdict(list)
    for i, x in enumerate(images):
        sizes[tuple(x.shape[1:])].append(i)
    for (h, w), rows in sizes.items():
        out_h, out_w = resize_output_size(spec, h, w)
        try:
            batch = torch.stack([images[i] for i in rows]).to(torch.float32)
            batch = F.interpolate(batch, size=(out_h, out_w), mode=mode, antialias=True, align_corners=False)
            batch = batch.round_().clamp_(0, 255).to(torch.uint8)
            if spec.do_center_crop:
                left, top = (out_w - spec.width) // 2, (out_h - spec.height) // 2
                # F.pad with negative amounts crops; positive ones pad with zeros, as PIL's crop outside the image.
                batch = F.pad(batch, (-left, left + spec.width - out_w, -top, top + spec.height - out_h))
            out[rows] = batch.permute(0, 2, 3, 1)
        except Exception as exc:
            if on_error is None or sticky(exc):
                raise
            on_error(rows)
    return out


def probe(device: str) -> str | None:
    """None when a small JPEG decodes on `device` to Pillow's colour, else the one-line reason it does not."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    if str(device).startswith("cuda") and not torch.cuda.is_available():
        return "torch sees no CUDA device"
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 120, 40)).save(buffer, "JPEG", quality=95)
    try:
        got = decode_jpeg([torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)],
                          mode=ImageReadMode.RGB, device=device)[0]
        colour = got.float().mean(dim=(1, 2)).cpu()
    except Exception as exc:
        return f"a test JPEG does not decode there ({first_line(exc)})"
    if (colour - torch.tensor([200.0, 120.0, 40.0])).abs().max() > 4:
        return f"a test JPEG decodes there to the wrong colour ({colour.round().tolist()})"
    return None


class DeviceDecoder:
    """Raw image bytes -> Decoded: the JPEGs route() takes decoded, resized and cropped on `device`, the rest (and
    what the device refuses) by load_images on this process's CPU.

    At start it decodes a small JPEG on the device. If that fails (no torchvision, a driver nvJPEG cannot use, a
    filter torch lacks), it is an error when `strict` (--decode gpu); otherwise (--decode auto) it says so once
    through `log` and every image takes the CPU path."""

    def __init__(self, spec: ImageSpec, device: str, max_pixels: int = MAX_PIXELS, batch: int = BATCH,
                 chunk_pixels: int = CHUNK_PIXELS, strict: bool = True, log=print):
        import torch

        self.spec, self.device, self.max_pixels = spec, torch.device(device), max_pixels
        self.batch, self.chunk_pixels = batch, chunk_pixels
        problem = filter_problem(spec) or torchvision_problem() or probe(device)
        if problem and strict:
            raise UserError(f"--decode gpu cannot decode on {device}: {problem}; use --decode cpu")
        if problem:
            log(f"[embed] an encoder decodes its images on its CPU instead of {device}: {problem} (--decode auto)")
        self.on_device = problem is None

    def __call__(self, items: list[bytes | None]) -> Decoded:
        import torch

        out = torch.zeros((len(items), self.spec.height, self.spec.width, 3), dtype=torch.uint8, device=self.device)
        routes = [(i, r) for i, r in ((i, route(d, self.spec, self.max_pixels)) for i, d in enumerate(items)) if r] \
            if self.on_device else []
        on_device = np.zeros(len(items), dtype=bool)
        on_device[[i for i, _ in routes]] = True
        for chunk in self._chunks(routes):
            decoded = self._decode([items[i] for i, _ in chunk])
            good = [(i, upright(x, r.orientation)) for (i, r), x in zip(chunk, decoded) if x is not None]
            on_device[[i for (i, _), x in zip(chunk, decoded) if x is None]] = False
            if good:
                rows = [i for i, _ in good]
                failed = []
                out[rows] = resize_crop([x for _, x in good], self.spec, on_error=failed.extend)
                on_device[[rows[j] for j in failed]] = False
        errors: list[str | None] = [None] * len(items)
        fallback = np.flatnonzero(~on_device)
        if len(fallback):  # the CPU path, batched as the read tasks run it: its pixels and its one-line errors
            pixels, reasons = load_images([items[i] for i in fallback], self.spec, self.max_pixels)
            out[torch.from_numpy(fallback).to(self.device)] = torch.from_numpy(pixels).to(self.device)
            for i, reason in zip(fallback, reasons):
                errors[i] = reason
        return Decoded(out, errors, on_device)

    def _chunks(self, routes: list[tuple[int, Route]]):
        """Runs of at most `batch` images and `chunk_pixels` decoded pixels (an image larger alone)."""
        chunk, pixels = [], 0
        for item in routes:
            if chunk and (len(chunk) == self.batch or pixels + item[1].pixels > self.chunk_pixels):
                yield chunk
                chunk, pixels = [], 0
            chunk.append(item)
            pixels += item[1].pixels
        if chunk:
            yield chunk

    def _decode(self, datas: list[bytes]) -> list[torch.Tensor | None]:
        """One batched decode; where it fails, the batch halved until the images that fail are alone (None)."""
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg

        if not datas:
            return []
        tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
        if self.device.type == "cuda":
            # nvJPEG's hardware decoder writes its outputs (allocated on this stream) without waiting for the work
            # still queued on it, so a block freed by that work can be overwritten: drain the stream first, as
            # upstream does (pytorch/vision#9606, meta-pytorch/torchcodec#1634).
            torch.cuda.current_stream(self.device).synchronize()
        try:
            return list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=self.device))
        except Exception as exc:
            if sticky(exc):
                raise
            if len(datas) == 1:
                return [None]
        half = len(datas) // 2
        return self._decode(datas[:half]) + self._decode(datas[half:])
