"""Image preprocessing for the embed job, split where the work is cheapest.

CPU tasks: `load_image` decodes bytes and resizes + center-crops to the model's input size, as uint8
(a quarter of the bytes of float32 to ship to the encoder). GPU actor: `normalize` rescales and
normalises on the device. Together they reproduce the `pixel_values` of the model's transformers image
processor (PIL backend: `convert_rgb` -> PIL resize -> center crop -> rescale -> normalise):
exactly (float rounding aside) when the image is decoded at full size, within a few levels for JPEGs
decoded in draft mode (see `DRAFT_FACTOR`).

No Ray and no torch at import time: the decode tasks need neither.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import ExifTags, Image, UnidentifiedImageError

if TYPE_CHECKING:
    import torch

# Refuse images of more pixels than this before decoding them (Image.open reads only the header). It is
# Pillow's own hard limit (2 * Image.MAX_IMAGE_PIXELS, above which Image.open raises
# DecompressionBombError), so by default the two agree: 179 M pixels, e.g. 15,000 x 11,900, more than
# a 100-megapixel photo, and at most about 0.5 GB once decoded to RGB. A larger max_pixels takes effect
# only where the caller has also raised Image.MAX_IMAGE_PIXELS.
MAX_PIXELS = 178_956_970

# JPEGs are decoded in draft mode (libjpeg's DCT scaling by 1/2, 1/4 or 1/8: less work than a full
# decode and a much smaller image to resize) at the smallest scale that leaves each side at least
# DRAFT_FACTOR times its resized size, so the bicubic resize still shrinks by 2x or more and its
# antialiasing still decides the result. Against the full decode this differs only at sharp edges: on
# 1600x1200 photo mosaics to 224 px, mean 0.4 and max 7 uint8 levels (bench/preprocess.py). With a
# factor of 1 (1/4 scale there) it is 1.6 and 27, for 1.3-1.5x the speed; 3 and up decodes in full.
DRAFT_FACTOR = 2

# EXIF orientation -> the transpose that makes the image upright (as PIL.ImageOps.exif_transpose), and
# where that transpose takes a point (x, y) of a w x h image.
_T = Image.Transpose
_UPRIGHT = {
    2: (_T.FLIP_LEFT_RIGHT, lambda x, y, w, h: (w - x, y)),
    3: (_T.ROTATE_180, lambda x, y, w, h: (w - x, h - y)),
    4: (_T.FLIP_TOP_BOTTOM, lambda x, y, w, h: (x, h - y)),
    5: (_T.TRANSPOSE, lambda x, y, w, h: (y, x)),
    6: (_T.ROTATE_270, lambda x, y, w, h: (h - y, x)),
    7: (_T.TRANSVERSE, lambda x, y, w, h: (h - y, w - x)),
    8: (_T.ROTATE_90, lambda x, y, w, h: (y, w - x)),
}


class ImageError(ValueError):
    """An image that cannot be used; the message is a one-line reason for the errors table."""


# The image processor steps load_image + normalize do; any other do_* flag set, or a key of _NOT_DONE set,
# is a step they would silently skip.
_DONE = {"do_resize", "do_center_crop", "do_rescale", "do_normalize", "do_convert_rgb"}
_NOT_DONE = {"crop_pct", "rescale_offset", "max_num_patches"}


@dataclass(frozen=True)
class ImageSpec:
    """What the model's image processor does to an image, in the terms load_image/normalize need."""

    height: int  # the model's input size: the crop size, or the resize size when there is no crop
    width: int
    resize_shortest_edge: int | None  # resize so the shortest edge is this (aspect kept); None: to (height, width)
    resample: int  # PIL resample filter (3 = bicubic)
    do_center_crop: bool
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale_factor: float

    @classmethod
    def from_processor_config(cls, config: dict) -> ImageSpec:
        """The spec of a `preprocessor_config.json` (or an image processor's `to_dict()`).

        Supported: `size` {"shortest_edge": N} with a center crop (CLIP), {"height", "width"} (SigLIP),
        or a legacy int (shortest edge when there is a crop, as CLIP's old configs mean it; else square);
        `crop_size` a dict or an int. Anything else, or a step this module does not do (padding, a crop
        percentage, an offset rescale, ...), raises ValueError rather than preprocess differently.

        Give it the processor's own `to_dict()` (families.image_config), not the raw JSON file: keys a file
        leaves out take the processor class's defaults, which differ by family (CLIP crops, SigLIP does not).
        """
        if not config.get("do_resize", True):
            raise ValueError("image processors without a resize are not supported")
        extra = [k for k, v in config.items() if v and (k.startswith("do_") and k not in _DONE or k in _NOT_DONE)]
        if extra:
            raise ValueError(f"the image processor's {', '.join(sorted(extra))} is not reproduced")
        crop = config.get("do_center_crop", False)
        size = config["size"]
        if isinstance(size, int):
            size = {"shortest_edge": size} if crop else {"height": size, "width": size}
        crop_size = config.get("crop_size")
        if isinstance(crop_size, int):
            crop_size = {"height": crop_size, "width": crop_size}

        if set(size) == {"shortest_edge"}:
            if not crop:
                raise ValueError("a shortest_edge resize without a center crop gives images of varying size")
            height, width, shortest = crop_size["height"], crop_size["width"], size["shortest_edge"]
        elif set(size) == {"height", "width"}:
            if crop and crop_size != size:
                raise ValueError(f"a fixed resize to {size} followed by a crop to {crop_size} is not supported")
            height, width, shortest = size["height"], size["width"], None
        else:
            raise ValueError(f"unsupported image processor size {size}")

        # do_rescale / do_normalize false: the same formula with identity constants.
        rescale = config.get("rescale_factor", 1 / 255) if config.get("do_rescale", True) else 1.0
        normalise = config.get("do_normalize", True)
        return cls(
            height=int(height),
            width=int(width),
            resize_shortest_edge=None if shortest is None else int(shortest),
            resample=int(config["resample"]),
            do_center_crop=bool(crop),
            mean=tuple(float(m) for m in config["image_mean"]) if normalise else (0.0, 0.0, 0.0),
            std=tuple(float(s) for s in config["image_std"]) if normalise else (1.0, 1.0, 1.0),
            rescale_factor=float(rescale),
        )

    def to_dict(self) -> dict:
        """JSON-able (the tuples become lists), and ImageSpec(**spec.to_dict()) == spec."""
        return asdict(self)


def resize_output_size(spec: ImageSpec, height: int, width: int) -> tuple[int, int]:
    """(height, width) the processor resizes an upright height x width image to, before any crop.

    As transformers' get_resize_output_image_size(default_to_square=False): the long side is
    truncated, not rounded (1600x1200 -> 298x224, not 299x224).
    """
    if spec.resize_shortest_edge is None:
        return spec.height, spec.width
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = spec.resize_shortest_edge, int(spec.resize_shortest_edge * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def load_image(data: bytes, spec: ImageSpec, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """Decode, make upright (EXIF), convert to RGB, resize and center-crop: uint8 (spec.height, spec.width, 3).

    Raises ImageError with a one-line reason for anything that is not a usable image.
    """
    if not data:
        raise ImageError("empty image")
    try:
        with Image.open(io.BytesIO(data)) as im:
            return _preprocess(im, spec, max_pixels)
    except ImageError:
        raise
    except Image.DecompressionBombError:
        raise ImageError(f"image too large (over {2 * Image.MAX_IMAGE_PIXELS} pixels)") from None
    except UnidentifiedImageError:
        raise ImageError("not an image") from None
    # Pillow's decoders raise OSError, SyntaxError, ValueError, struct.error, EOFError, ... on bad data.
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ImageError("truncated image" if "truncated" in reason.lower() else f"corrupt image ({reason})") from exc


def _preprocess(im: Image.Image, spec: ImageSpec, max_pixels: int) -> np.ndarray:
    w, h = im.size  # from the header: nothing is decoded yet
    if w * h > max_pixels:
        raise ImageError(f"image too large ({w}x{h} pixels)")
    orientation = im.getexif().get(ExifTags.Base.Orientation, 1)
    swap = orientation in (5, 6, 7, 8)  # stored on its side: width and height swap
    out_h, out_w = resize_output_size(spec, w if swap else h, h if swap else w)
    if out_h * out_w > max_pixels:  # an extreme aspect ratio: the processor would allocate this much
        raise ImageError(f"image too large once resized ({out_w}x{out_h} pixels)")

    want = (DRAFT_FACTOR * out_h, DRAFT_FACTOR * out_w) if swap else (DRAFT_FACTOR * out_w, DRAFT_FACTOR * out_h)
    drafted = im.draft("RGB", want)  # None unless JPEG
    # The original image's extent in (draft) pixels: in draft mode the last pixel may cover less.
    box = drafted[1] if drafted else (0, 0, w, h)
    im.load()  # decode errors (truncated, corrupt) surface here
    # The processor's order: upright, RGB (compositing alpha), resize, crop. Turning a draft image
    # upright moves its partial last pixels, so the box moves with it.
    if orientation in _UPRIGHT:
        method, move = _UPRIGHT[orientation]
        (x0, y0), (x1, y1) = move(*box[:2], *im.size), move(*box[2:], *im.size)
        im, box = im.transpose(method), (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))
    im = _to_rgb(im).resize((out_w, out_h), spec.resample, box=box)
    if spec.do_center_crop:
        # Offsets as transformers' center_crop; PIL pads outside the image with zeros, as it does.
        left, top = (out_w - spec.width) // 2, (out_h - spec.height) // 2
        im = im.crop((left, top, left + spec.width, top + spec.height))
    return np.array(im)


def _to_rgb(im: Image.Image) -> Image.Image:
    """As transformers' image_transforms.convert_to_rgb: transparency is composited onto white.

    "Transparency" is what transformers tests: an "A" band (RGBA, LA, PA, and also LAB, whose A is
    not alpha; converting it through RGBA is harmless) or a `transparency` entry (palette or
    colour-key PNG/GIF). Other modes go through PIL's convert("RGB"); I;16 clips at 255.
    """
    if "A" in im.getbands() or im.info.get("transparency") is not None:
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return im if im.mode == "RGB" else im.convert("RGB")


def load_images(
    items: list[bytes | None], spec: ImageSpec, max_pixels: int = MAX_PIXELS
) -> tuple[np.ndarray, list[str | None]]:
    """A batch of load_image: uint8 (n, height, width, 3) with zeros where an item failed, and per item
    the failure reason or None."""
    pixels = np.zeros((len(items), spec.height, spec.width, 3), dtype=np.uint8)
    errors: list[str | None] = [None] * len(items)
    for i, data in enumerate(items):
        try:
            if data is None:
                raise ImageError("missing image")
            pixels[i] = load_image(data, spec, max_pixels)
        except ImageError as exc:
            errors[i] = str(exc)
    return pixels, errors


def normalize(pixels: torch.Tensor, spec: ImageSpec, dtype: torch.dtype | None = None) -> torch.Tensor:
    """uint8 (n, h, w, 3) on any device -> the model's pixel_values (n, 3, h, w): (x * rescale - mean) / std.

    Computed in float32 on the tensor's device (the processor's values to within float32 rounding,
    ~5e-7), then cast to dtype (default float32), so that bf16/fp16 round only once.
    """
    import torch

    x = pixels.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    mean = torch.tensor(spec.mean, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(spec.std, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    return ((x * spec.rescale_factor - mean) / std).to(dtype or torch.float32)
