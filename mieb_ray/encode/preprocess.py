"""Image preprocessing for the embed job, split where the work is cheapest.

CPU tasks: `load_images` decodes bytes and resizes + center-crops to the model's input size, as uint8
(a quarter of the bytes of float32 to ship to the encoder). GPU actor: `normalize` rescales and
normalises on the device. Together they reproduce the `pixel_values` of the model's transformers image
processor (PIL backend: `convert_rgb` -> PIL resize -> center crop -> rescale -> normalise), as the installed
transformers release computes them: its RGB conversion of transparent images changed in 5.21 (`pixels.to_rgb`).

How, per image (bench/preprocess.py measures each choice against the processor, one core):
  decode   RGB and greyscale JPEGs by simplejpeg (libjpeg-turbo, the same pixels as Pillow's decode, at
           the same DCT scale as Pillow's draft mode: see `DRAFT_FACTOR`), straight to RGB; anything
           else (PNG, WebP, GIF, CMYK JPEGs, JPEGs simplejpeg refuses) by Pillow, converted to RGB as
           the installed transformers does (`pixels.to_rgb`: transparency onto white, or dropped before 5.21).
  resize   bilinear and bicubic: torch's antialiased uint8 resampler (`pixels.resize`), which computes Pillow's
           filter (Keys a = -0.5 for bicubic, support widened by the scale when shrinking, the draft
           box as its scale) and rounds to uint8 after each pass as Pillow does: within one level of
           Pillow's resize at ~0.3% of pixels, 3-6x faster, and one call for all the images of a batch
           that share a size (CIFAR's 32x32, UCF101's 320x240 frames), decoded into the rows of one array
           (no copy to stack them). In the image's stored orientation; the EXIF transpose (a view) and the
           crop follow. Only the rows and columns up to the crop's far edge are computed (a 320x240 frame:
           224x261 of the 224x298 resize; the 37 columns before the crop cannot be skipped, torch's
           resampler takes no offset), and images resized to the model's size as they are upright (small
           square ones) are written straight into the output.
           Other filters (nearest, Lanczos, box, Hamming): Pillow's resize, per image (`pillow_pixels`).
  errors   every refusal is an ImageError with a one-line reason, as Pillow words it.

Without simplejpeg installed every image is decoded by Pillow (the same pixels, slower).

No Ray and no torch at import time: torch is imported on the first resize.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from PIL import ExifTags, Image, UnidentifiedImageError

from mieb_ray.encode.pixels import TORCH_FILTERS, UPRIGHT, UPRIGHT_ARRAY, crop_into, resize, to_rgb

try:  # libjpeg-turbo, for JPEGs: a leaner path to the same pixels than Pillow's
    import simplejpeg
except ImportError:  # pragma: no cover - a dependency; without it Pillow decodes everything
    simplejpeg = None

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
# DRAFT_FACTOR times its resized size. Against the full decode this differs only at sharp edges. With a
# factor of 1 (1600x1200 -> 400x300 for 224 px): mean 1.5, max 26 uint8 levels on sharp photo mosaics,
# a centred cosine of pixel_values >= 0.999 and of a CLIP's embeddings >= 0.999 (tests/unit/encode/test_equivalence.py),
# for 1.3-1.5x the speed of a factor of 2 (1/2 scale there: mean 0.4, max 7), which keeps the bicubic
# resize shrinking by 2x or more; 3 and up decodes in full (bench/preprocess.py --draft-factor N).
# Pillow's draft picks the scale; simplejpeg decodes at it (libjpeg-turbo's other scales, 3/8 ... 7/8,
# are slower than a full decode here). mieb-train's images (500x375 and less) are never drafted at 224.
DRAFT_FACTOR = 1

# load_images resizes the images of one size together, at most this many images or bytes at once. Room is taken
# ahead only for a size met before: taken for every new size, as most photos' are, it cost fresh memory per photo
# (up to 64 MB each under the old 64 MB bound, the kernel zeroing its pages at first touch: 295 MB held for 40
# photos, a read task on Ray 1.6x slower: bench/embed_feed.py).
_GROUP_IMAGES, _GROUP_BYTES = 64, 16 << 20


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
    # as the processor computes it: decoded in full (no draft) and resized by Pillow (torch's resize rounds a pixel
    # the other way now and then: one level, rarely, which moves a tiny or near-tied task's score)
    exact: bool = False

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
    pixels, errors = load_images([data], spec, max_pixels)
    if errors[0] is not None:
        raise ImageError(errors[0])
    return pixels[0]


def load_images(
    items: list[bytes | None], spec: ImageSpec, max_pixels: int = MAX_PIXELS, out: np.ndarray | None = None
) -> tuple[np.ndarray, list[str | None]]:
    """A batch of load_image: uint8 (n, height, width, 3) with zeros where an item failed, and per item
    the failure reason or None. Images that decode to the same size are resized in one call.

    out: an array to fill instead (of zeros where items may fail): a read task decodes into its unit's block,
    with no array of the chunk's own to allocate (150 MB of fresh pages per 1,000 images of 224 px) and copy."""
    pixels = np.zeros((len(items), spec.height, spec.width, 3), dtype=np.uint8) if out is None else out
    errors: list[str | None] = [None] * len(items)
    groups: dict[tuple, _Group] = {}
    met: set[tuple] = set()  # the sizes met so far
    pending = 0

    def slot(key: tuple) -> np.ndarray:
        """Where the image of item i (of group `key`) decodes to: its group's next row. A new group has room
        for itself alone when its size is met for the first time (photos mostly come each in a size of its own),
        else for the items left, at most _GROUP_IMAGES and _GROUP_BYTES; it is resized once full."""
        group = groups.get(key)
        if group is None:
            nbytes = int(np.prod(key[0]))
            room = 1 if key not in met else min(_GROUP_IMAGES, len(items) - i, _GROUP_BYTES // max(nbytes, 1))
            group = groups[key] = _Group(np.empty((max(1, room), *key[0]), dtype=np.uint8), [])
            met.add(key)
        return group.batch[len(group.members)]

    for i, data in enumerate(items):
        try:
            if data is None:
                raise ImageError("missing image")
            decoded = _open(data, spec, max_pixels, slot)
        except ImageError as exc:
            errors[i] = str(exc)
            continue
        if isinstance(decoded, np.ndarray):  # done by Pillow
            pixels[i] = decoded
            continue
        group = groups[decoded.key]
        group.members.append((i, decoded))
        pending += decoded.array.nbytes
        if len(group.members) == len(group.batch):  # full: resized now, its room let go
            _resize_crop(group, spec, pixels)
            del groups[decoded.key]
            pending -= sum(d.array.nbytes for _, d in group.members)
        elif pending >= _GROUP_BYTES:
            for g in groups.values():
                if g.members:
                    _resize_crop(g, spec, pixels)
            groups, pending = {}, 0
    for g in groups.values():
        if g.members:
            _resize_crop(g, spec, pixels)
    return pixels, errors


class _Decoded(NamedTuple):
    """An image decoded as stored (not yet upright), and how to resize it."""

    array: np.ndarray  # uint8 (h, w, 3)
    box: tuple[float, float]  # the original image's extent in these pixels (less than h, w after a draft)
    size: tuple[int, int]  # (height, width) to resize to, as stored: swapped for orientations 5-8
    orientation: int
    key: tuple  # its group: images of the same key are resized together


class _Group(NamedTuple):
    batch: np.ndarray  # uint8 (room, h, w, 3): the images decoded into its first len(members) rows
    members: list[tuple[int, _Decoded]]  # (index in the batch of load_images, the image)


def _open(data: bytes, spec: ImageSpec, max_pixels: int, slot=None) -> _Decoded | np.ndarray:
    """Decoded for _resize_crop, or (another resample filter) the finished uint8 pixels; else ImageError.

    slot(key) gives the array to decode into (load_images: a row of the image's group); None, a new one."""
    if not data:
        raise ImageError("empty image")
    try:
        with Image.open(io.BytesIO(data)) as im:
            if spec.exact or spec.resample not in TORCH_FILTERS:
                return pillow_pixels(im, spec, max_pixels)
            return _decode(im, data, spec, max_pixels, slot)
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


def _sizes(im: Image.Image, spec: ImageSpec, max_pixels: int) -> tuple[int, int, int, bool]:
    """From the header: (out_h, out_w) upright, the EXIF orientation and whether it swaps the sides."""
    w, h = im.size  # from the header: nothing is decoded yet
    if w * h > max_pixels:
        raise ImageError(f"image too large ({w}x{h} pixels)")
    orientation = im.getexif().get(ExifTags.Base.Orientation, 1)
    if orientation not in UPRIGHT:
        orientation = 1
    swap = orientation in (5, 6, 7, 8)  # stored on its side: width and height swap
    out_h, out_w = resize_output_size(spec, w if swap else h, h if swap else w)
    if out_h * out_w > max_pixels:  # an extreme aspect ratio: the processor would allocate this much
        raise ImageError(f"image too large once resized ({out_w}x{out_h} pixels)")
    return out_h, out_w, orientation, swap


def _decode(im: Image.Image, data: bytes, spec: ImageSpec, max_pixels: int, slot=None) -> _Decoded:
    out_h, out_w, orientation, swap = _sizes(im, spec, max_pixels)
    size = (out_w, out_h) if swap else (out_h, out_w)  # (height, width) as stored
    w, h = im.size
    drafted = im.draft("RGB", (DRAFT_FACTOR * size[1], DRAFT_FACTOR * size[0]))  # None unless JPEG
    # The original image's extent in (draft) pixels: in draft mode the last pixel may cover less.
    box = (float(drafted[1][3]), float(drafted[1][2])) if drafted else (float(h), float(w))
    # im.size is now the size it decodes to (the draft's): images of one size, box and pass order are
    # resized together.
    key = ((im.height, im.width, 3), box, size, swap)
    out = slot(key) if slot is not None else None
    array = None
    if simplejpeg is not None and im.format == "JPEG" and im.mode in ("RGB", "L"):
        # At the draft's scale: im.size is the draft size. simplejpeg takes the smallest libjpeg scale
        # (of 1/8 .. 8/8) that reaches it, which is the draft's own 1/2^k once both sides are >= 8 (below
        # that, 3/8 could also reach it); a full decode asks for no scale at all.
        full = im.size == (w, h)
        if full or min(im.size) >= 8:
            try:
                array = simplejpeg.decode_jpeg(data, "RGB", min_height=0 if full else im.height,
                                               min_width=0 if full else im.width, buffer=out)
            except Exception:  # corrupt, truncated, or a kind it does not decode: Pillow names it or copes
                array = None
            if array is not None and array.shape != key[0]:
                array = None
    if array is None:
        im.load()  # decode errors (truncated, corrupt) surface here
        array = np.asarray(to_rgb(im))
        if out is not None:
            out[:] = array
    return _Decoded(array if out is None else out, box, size, orientation, key)


def _resize_crop(group: _Group, spec: ImageSpec, pixels: np.ndarray) -> None:
    """Resize the images of a group (one size, box and pass order) together, then make each upright and crop
    it into pixels[i]."""
    members = group.members
    first = members[0][1]
    (h, w), (out_h, out_w) = first.array.shape[:2], first.size
    # Per orientation (the group's may differ by a flip), the rows and columns its crop keeps, as stored.
    windows = {d.orientation: _crop_window(spec, out_h, out_w, d.orientation) for _, d in members}
    batch = group.batch[:len(members)]
    i0 = members[0][0]
    if (h, w) == (out_h, out_w) and first.box == (h, w):  # Pillow returns a copy: nothing to resample
        resized = batch
    elif (first.size == (spec.height, spec.width) and windows.keys() == {1}
          and [i for i, _ in members] == list(range(i0, i0 + len(members)))):
        # Resized to the model's size, upright, into consecutive rows (small square images, the usual
        # case): torch writes straight into pixels, with no array of its own to allocate and copy from.
        resize(batch, first.box, first.size, spec.resample, out=pixels[i0:i0 + len(members)])
        return
    else:
        stop = (max(r.stop for r, _, _ in windows.values()), max(c.stop for _, c, _ in windows.values()))
        resized = resize(batch, first.box, first.size, spec.resample,
                          transposed=first.orientation in (5, 6, 7, 8), stop=stop)
    for (i, d), r in zip(members, resized):
        rows, cols, dst = windows[d.orientation]
        kept = r[rows, cols]
        pixels[i][dst] = UPRIGHT_ARRAY[d.orientation](kept) if d.orientation in UPRIGHT_ARRAY else kept


def _crop_window(spec: ImageSpec, out_h: int, out_w: int, orientation: int) -> tuple[slice, slice, tuple]:
    """The center crop of an image resized to (out_h, out_w) as stored, for its EXIF orientation: the rows and
    columns it keeps as stored (before the transpose), and where they go in the model's input (the rest
    stays zero where the crop is larger than the image). Offsets as pixels.crop_into."""
    up_h, up_w = (out_w, out_h) if orientation in (5, 6, 7, 8) else (out_h, out_w)
    top, left = ((up_h - spec.height) // 2, (up_w - spec.width) // 2) if spec.do_center_crop else (0, 0)
    y0, x0 = max(top, 0), max(left, 0)
    y1, x1 = min(top + spec.height, up_h), min(left + spec.width, up_w)
    dst = (slice(y0 - top, y1 - top), slice(x0 - left, x1 - left))
    # Upright rows/columns -> stored ones: undo the flips of UPRIGHT_ARRAY, then its swap.
    if orientation in (3, 4, 7, 8):
        y0, y1 = up_h - y1, up_h - y0
    if orientation in (2, 3, 6, 7):
        x0, x1 = up_w - x1, up_w - x0
    if orientation in (5, 6, 7, 8):
        (y0, y1), (x0, x1) = (x0, x1), (y0, y1)
    return slice(y0, y1), slice(x0, x1), dst


def pillow_pixels(im: Image.Image, spec: ImageSpec, max_pixels: int) -> np.ndarray:
    """The whole of load_image by Pillow, for resample filters pixels.resize does not compute, and --exact."""
    out_h, out_w, orientation, swap = _sizes(im, spec, max_pixels)
    w, h = im.size
    want = (DRAFT_FACTOR * out_h, DRAFT_FACTOR * out_w) if swap else (DRAFT_FACTOR * out_w, DRAFT_FACTOR * out_h)
    drafted = None if spec.exact else im.draft("RGB", want)  # None unless JPEG
    # The original image's extent in (draft) pixels: in draft mode the last pixel may cover less.
    box = drafted[1] if drafted else (0, 0, w, h)
    im.load()  # decode errors (truncated, corrupt) surface here
    # The processor's order: upright, RGB (compositing alpha), resize, crop. Turning a draft image
    # upright moves its partial last pixels, so the box moves with it.
    if orientation in UPRIGHT:
        method, move = UPRIGHT[orientation]
        (x0, y0), (x1, y1) = move(*box[:2], *im.size), move(*box[2:], *im.size)
        im, box = im.transpose(method), (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))
    im = to_rgb(im).resize((out_w, out_h), spec.resample, box=box)
    out = np.zeros((spec.height, spec.width, 3), dtype=np.uint8)
    crop_into(np.asarray(im), out, spec.do_center_crop)
    return out


class Normalizer:
    """uint8 (n, h, w, 3) on `device` -> the model's pixel_values (n, 3, h, w): (x * rescale - mean) / std.

    Built once per encoder (the constants live on its device). Computed in float32 as x * (rescale / std) +
    (-mean / std), in place in the output (the processor's values to within float32 rounding, ~5e-7), then cast
    to dtype (default float32), so that bf16/fp16 round only once."""

    def __init__(self, spec: ImageSpec, device="cpu"):
        import torch

        mean = torch.tensor(spec.mean, dtype=torch.float64)
        std = torch.tensor(spec.std, dtype=torch.float64)
        self.scale = (spec.rescale_factor / std).to(torch.float32).view(1, 3, 1, 1).to(device)
        self.shift = (-mean / std).to(torch.float32).view(1, 3, 1, 1).to(device)

    def __call__(self, pixels: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        import torch

        n, h, w, c = pixels.shape
        x = torch.empty((n, c, h, w), dtype=torch.float32, device=pixels.device)
        if x.device.type == "cpu":  # numpy's strided uint8 -> float32 cast is ~1.4x torch's here
            np.copyto(x.numpy(), pixels.numpy().transpose(0, 3, 1, 2), casting="unsafe")
        else:
            x.copy_(pixels.permute(0, 3, 1, 2))
        x.mul_(self.scale).add_(self.shift)  # in place: no float temporaries to allocate
        return x if dtype in (None, torch.float32) else x.to(dtype)


def normalize(pixels: torch.Tensor, spec: ImageSpec, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Normalizer(spec, pixels.device)(pixels, dtype), for one call."""
    return Normalizer(spec, pixels.device)(pixels, dtype)
