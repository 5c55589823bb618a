"""Decode on the encoder's device (`embed --decode gpu`): JPEGs in batches by torchvision's `decode_jpeg`
(nvJPEG on a CUDA device), resized and center-cropped there too, so the CPUs feeding a GPU only read bytes.

The read stage then ships the raw bytes (a tenth of the decoded pixels' size), and the encoder actor calls
`DeviceDecoder` on each batch. Per image, from its header alone (PIL, nothing decoded): an RGB or greyscale
JPEG goes to the device; anything else (PNG, WebP, CMYK JPEGs, ...) and any JPEG the device decoder refuses
is decoded on the CPU by `preprocess.load_images`, which also gives the one-line error of a bad image. Both
end as the same uint8 (n, height, width, 3) that `preprocess.normalize` takes.

Against the CPU path: the same EXIF orientation, RGB conversion, resize size (truncated long side) and crop
offsets; the resize is torch's antialiased bicubic (Pillow's filter, in float32 on the device) of the full
decode, not a draft decode, so pixels differ by a few levels and embeddings by a centred cosine well above 0.95
(tests/test_gpu_decode.py measures it).
"""

from __future__ import annotations

import io
from collections import defaultdict
from typing import TYPE_CHECKING

from PIL import ExifTags, Image

from mieb_ray.encode.preprocess import (
    MAX_PIXELS,
    ImageSpec,
    load_images,
    resize_output_size,
)
from mieb_ray.errors import UserError

if TYPE_CHECKING:
    import torch

MODES = ("cpu", "gpu", "auto")
BATCH = 64  # JPEGs per decode_jpeg call: nvJPEG's batched decode, bounded GPU memory for the full-size images


def device_decode_available(device: str) -> str | None:
    """None when torchvision's decode_jpeg can decode on `device`, else the one-line reason it cannot."""
    try:
        import torch
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception as exc:  # absent, or a build that does not match torch ("operator ... does not exist")
        return f"torchvision's decode_jpeg is not importable ({' '.join(str(exc).split())})"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        return "no CUDA device"
    return None


def resolve(mode: str, gpus: float) -> str:
    """The decode mode a job runs: auto is gpu when the encoders have GPUs and torchvision imports here (the
    driver, often on a node without a GPU, cannot check CUDA for them: an encoder that cannot decode on its
    device under auto decodes on its CPU instead, see DeviceDecoder's strict)."""
    if mode not in MODES:
        raise ValueError(f"unknown decode mode {mode!r}: one of {', '.join(MODES)}")
    if mode == "auto":
        return "gpu" if gpus > 0 and device_decode_available("cpu") is None else "cpu"
    return mode


def route(data: bytes | None, max_pixels: int = MAX_PIXELS) -> int | None:
    """The EXIF orientation (1-8) of a JPEG the device should decode, or None: decode it on the CPU."""
    if not data or not data.rstrip(b"\0").endswith(b"\xff\xd9"):  # no end marker: maybe truncated, which
        return None  # Pillow calls an error and a device decoder may not
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format != "JPEG" or im.mode not in ("RGB", "L") or im.width * im.height > max_pixels:
                return None
            return int(im.getexif().get(ExifTags.Base.Orientation, 1))
    except Exception:  # not an image, a bomb, a broken header: load_image names it
        return None


def upright(x: torch.Tensor, orientation: int) -> torch.Tensor:
    """(3, h, w) as stored -> upright, as PIL's exif_transpose (preprocess._UPRIGHT)."""
    import torch

    if orientation in (5, 6, 7, 8):
        x = x.transpose(1, 2)  # 5 = transpose; the others are a transpose plus a flip
        return {5: x, 6: torch.flip(x, [2]), 7: torch.flip(x, [1, 2]), 8: torch.flip(x, [1])}[orientation]
    flips = {2: [2], 3: [1, 2], 4: [1]}.get(orientation)
    return torch.flip(x, flips) if flips else x


def resize_crop(images: list[torch.Tensor], spec: ImageSpec) -> torch.Tensor:
    """Upright uint8 (3, h, w) images on one device -> uint8 (n, height, width, 3): resized as the processor
    sizes them (antialiased bicubic, rounded and clipped to uint8 as PIL's resize is), then center-cropped with
    the processor's offsets (zeros outside the image). Images of one size are resized in one call."""
    import torch
    import torch.nn.functional as F

    out = torch.zeros((len(images), spec.height, spec.width, 3), dtype=torch.uint8,
                      device=images[0].device if images else "cpu")
    sizes = defaultdict(list)
    for i, x in enumerate(images):
        sizes[tuple(x.shape[1:])].append(i)
    for (h, w), rows in sizes.items():
        out_h, out_w = resize_output_size(spec, h, w)
        batch = torch.stack([images[i] for i in rows]).to(torch.float32)
        batch = F.interpolate(batch, size=(out_h, out_w), mode="bicubic", antialias=True, align_corners=False)
        batch = batch.round_().clamp_(0, 255).to(torch.uint8)
        if spec.do_center_crop:
            left, top = (out_w - spec.width) // 2, (out_h - spec.height) // 2
            # F.pad with negative amounts crops; positive ones pad with zeros, as PIL's crop outside the image.
            batch = F.pad(batch, (-left, left + spec.width - out_w, -top, top + spec.height - out_h))
        out[rows] = batch.permute(0, 2, 3, 1)
    return out


class DeviceDecoder:
    """Raw image bytes -> (uint8 (n, height, width, 3) on `device`, per item None or a one-line error).

    A device torchvision cannot decode on is an error when `strict` (--decode gpu); otherwise (--decode auto)
    every image takes the CPU path, in this process."""

    def __init__(self, spec: ImageSpec, device: str, max_pixels: int = MAX_PIXELS, batch: int = BATCH,
                 strict: bool = True):
        reason = device_decode_available(device)
        if reason is not None and strict:
            raise UserError(f"--decode gpu cannot decode on {device}: {reason}; use --decode cpu")
        self.spec, self.device, self.max_pixels, self.batch = spec, device, max_pixels, batch
        self.on_device = reason is None
        self.device_rows = self.cpu_rows = 0  # what went where, for the job's statistics

    def __call__(self, items: list[bytes | None]) -> tuple[torch.Tensor, list[str | None]]:
        import torch

        out = torch.zeros((len(items), self.spec.height, self.spec.width, 3), dtype=torch.uint8, device=self.device)
        errors: list[str | None] = [None] * len(items)
        on_device = [(i, o) for i, o in ((i, route(d, self.max_pixels)) for i, d in enumerate(items)) if o] \
            if self.on_device else []
        fallback = sorted(set(range(len(items))) - {i for i, _ in on_device})
        for lo in range(0, len(on_device), self.batch):
            chunk = on_device[lo:lo + self.batch]
            decoded = self._decode([items[i] for i, _ in chunk])
            good = [(i, upright(x, o)) for (i, o), x in zip(chunk, decoded) if x is not None]
            fallback += [i for (i, _), x in zip(chunk, decoded) if x is None]
            if good:
                out[[i for i, _ in good]] = resize_crop([x for _, x in good], self.spec)
        if fallback:  # the CPU path, batched as the read tasks run it: its pixels and its one-line errors
            pixels, reasons = load_images([items[i] for i in fallback], self.spec, self.max_pixels)
            out[fallback] = torch.from_numpy(pixels).to(self.device)
            for i, reason in zip(fallback, reasons):
                errors[i] = reason
        self.device_rows += len(items) - len(fallback)
        self.cpu_rows += len(fallback)
        return out, errors

    def _decode(self, datas: list[bytes]) -> list[torch.Tensor | None]:
        """One batched decode; if it fails (it returns nothing then), each image alone, None where that fails."""
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg

        tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
        try:
            return list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=self.device))
        except Exception:
            pass
        decoded = []
        for t in tensors:
            try:
                decoded.append(decode_jpeg(t, mode=ImageReadMode.RGB, device=self.device))
            except Exception:
                decoded.append(None)
        return decoded

