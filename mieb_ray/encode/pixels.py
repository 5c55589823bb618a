"""The pixel operations preprocess composes, each equal to one of Pillow's (or the installed transformers') own,
which tests/unit/encode/test_pixels.py checks it against: the EXIF transposes, the antialiased resize with a draft
box, the center crop and the RGB conversion.

No torch at import time: torch is imported on the first resize.
"""

from __future__ import annotations

import functools
import inspect

import numpy as np
from PIL import Image

# EXIF orientation -> the transpose that makes the image upright (as PIL.ImageOps.exif_transpose), where
# that transpose takes a point (x, y) of a w x h image, and the same transpose as a numpy view of (h, w, c).
_T = Image.Transpose
UPRIGHT = {
    2: (_T.FLIP_LEFT_RIGHT, lambda x, y, w, h: (w - x, y)),
    3: (_T.ROTATE_180, lambda x, y, w, h: (w - x, h - y)),
    4: (_T.FLIP_TOP_BOTTOM, lambda x, y, w, h: (x, h - y)),
    5: (_T.TRANSPOSE, lambda x, y, w, h: (y, x)),
    6: (_T.ROTATE_270, lambda x, y, w, h: (h - y, x)),
    7: (_T.TRANSVERSE, lambda x, y, w, h: (h - y, w - x)),
    8: (_T.ROTATE_90, lambda x, y, w, h: (y, w - x)),
}
UPRIGHT_ARRAY = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.swapaxes(0, 1),
    6: lambda a: a.swapaxes(0, 1)[:, ::-1],
    7: lambda a: a.swapaxes(0, 1)[::-1, ::-1],
    8: lambda a: a.swapaxes(0, 1)[::-1],
}

# Pillow filters that torch's antialiased resampler computes as Pillow does; others go through Pillow.
TORCH_FILTERS = {int(Image.Resampling.BILINEAR): "bilinear", int(Image.Resampling.BICUBIC): "bicubic"}

def resize(batch: np.ndarray, box: tuple[float, float], size: tuple[int, int], resample: int,
            transposed: bool = False, stop: tuple[int, int] | None = None, out: np.ndarray | None = None,
            ) -> np.ndarray:
    """uint8 (n, h, w, c) -> uint8 (n, size[0], size[1], c): Pillow's resize(size, resample, box=(0, 0, box[1],
    box[0])) of each image, computed by torch (the antialiased resampler transformers' torchvision backend uses).

    The box is given as the scales (out / box), which is how it maps output pixel centres to input
    coordinates: (x + 0.5) * box / out, as Pillow's box (0, 0, bw, bh) does. Like Pillow, torch resizes
    rows, rounds to uint8, then columns; `transposed` (an image stored on its side, which Pillow would
    resize upright) does the columns first, so that the rounding is Pillow's too.

    `stop` (rows, columns): only the first ones of the output are computed (the ones a crop keeps end
    there). Output pixel x maps to input (x + 0.5) / scale whatever the output size, so they are the same
    pixels, but for torch's fixed-point weights, whose precision it sets from the largest weight it
    computes: rarely, a value rounds the other way by one level (identical at mieb-train's sizes:
    tests/unit/encode/test_pixels.py). An axis whose size stays is not resampled by torch, so it is not cut short.
    `out`: an uint8 (n, size[0], size[1], c) array to write into (not with transposed).
    """
    import torch

    x = torch.from_numpy(batch).permute(0, 3, 1, 2)  # NCHW with channels-last strides: no copy
    op = getattr(torch.ops.aten, f"_upsample_{TORCH_FILTERS[resample]}2d_aa")
    (h, w), (out_h, out_w) = batch.shape[1:3], size
    if stop is not None:
        out_h, out_w = _cut(out_h, stop[0], h), _cut(out_w, stop[1], w)
    if transposed and (size[0], box[0]) != (h, h) and (size[1], box[1]) != (w, w):
        x = op(x, [out_h, w], False, size[0] / box[0], None)  # a size that stays is not resampled
        return op(x, [out_h, out_w], False, None, size[1] / box[1]).permute(0, 2, 3, 1).numpy()
    if out is not None:  # as NCHW with channels-last strides, the layout torch gives this input: no copy
        op.out(x, [out_h, out_w], False, size[0] / box[0], size[1] / box[1],
               out=torch.from_numpy(out).permute(0, 3, 1, 2))
        return out
    return op(x, [out_h, out_w], False, size[0] / box[0], size[1] / box[1]).permute(0, 2, 3, 1).numpy()


def _cut(size: int, stop: int, before: int) -> int:
    """Output size `size` cut to `stop`, on an axis of input size `before`: not when torch would not resample
    it (size == before), and never to the input size (torch would then copy instead of resampling)."""
    if size == before or stop >= size:
        return size
    return stop + 1 if stop == before else stop


def crop_into(im: np.ndarray, out: np.ndarray, center: bool = True) -> None:
    """Center-crop an upright uint8 (h, w, c) into out (height, width, c), which holds zeros.

    Offsets as transformers' center_crop (and PIL's crop, which pads outside the image with zeros); with no
    center crop the image is already the model's size."""
    (h, w), (height, width) = im.shape[:2], out.shape[:2]
    top, left = ((h - height) // 2, (w - width) // 2) if center else (0, 0)
    y0, x0 = max(top, 0), max(left, 0)
    y1, x1 = min(top + height, h), min(left + width, w)
    out[y0 - top:y1 - top, x0 - left:x1 - left] = im[y0:y1, x0:x1]


def to_rgb(im: Image.Image) -> Image.Image:
    """As the installed transformers' image_transforms.convert_to_rgb, which every image processor applies first
    (do_convert_rgb), on its PIL and its torchvision backend alike.

    Releases differ here, and only here (issue 40): from 5.21 transparency is composited onto white, where
    "transparency" is an "A" band (RGBA, LA, PA, and also LAB, whose A is not alpha; converting it through RGBA is
    harmless) or a `transparency` entry (palette or colour-key PNG/GIF); up to 5.20 every mode goes through PIL's
    convert("RGB"), which drops alpha (a transparent pixel keeps its stored colour) and ignores the entry. Which
    one is asked of the installed release itself (`alpha_onto_white`), not read from a table of versions. Other
    modes go through convert("RGB") in both; I;16 clips at 255.
    """
    if ("A" in im.getbands() or im.info.get("transparency") is not None) and alpha_onto_white():
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return im if im.mode == "RGB" else im.convert("RGB")


@functools.cache
def alpha_onto_white() -> bool:
    """Whether the installed transformers' convert_to_rgb composites transparency onto white (5.21 on) or drops it
    (before): its answer for one fully transparent black pixel, white or black. Once per process, on the first
    image with transparency (importing transformers takes a second or more)."""
    from transformers.image_transforms import convert_to_rgb

    pixel = Image.new("RGBA", (1, 1), (0, 0, 0, 0))
    # 5.21 on warns unless asked for an array (the PIL return is deprecated); earlier releases have no such argument
    numpy = {"return_numpy": True} if "return_numpy" in inspect.signature(convert_to_rgb).parameters else {}
    return bool(np.asarray(convert_to_rgb(pixel, **numpy)).reshape(-1)[0] == 255)
