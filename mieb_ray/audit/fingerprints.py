"""What the audit computes of each image where it is read, once: pure functions, no Ray.

  sha256   of the encoded bytes: the exact detector.
  pixels   sha256 of the decoded, EXIF-oriented RGB pixels and their size: the pixel detector, which catches a
           lossless re-encode or a change of container (JPEG -> PNG, PNG -> WebP lossless, EXIF orientation
           applied to the pixels).
  pdq      Meta's PDQ perceptual hash (256 bits, `pdqhash`) of the same pixels brought to one scale and cut of
           letterbox bars (`pdq_pixels`), with the hashes of their left-right mirror and of their central 95% and
           90% (a centred crop of 5% or 10% is then the same picture), and PDQ's quality (0-100: a flat image, a
           blank frame, has little of it): the pdq detector, which catches re-encodes, resizes, centred crops of
           up to 10%, mirrors, borders, colour and brightness edits (bench/calibration/audit_calibrate.py).
"""

from __future__ import annotations

import hashlib
import io
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

PDQ_SIDE = 256
TRIM_SPAN = 12  # a bar's values: within 12 of each other, and of 0 or 255 (JPEG noise at the edge of a bar)


class Fingerprint(NamedTuple):
    sha: bytes | None
    pix: bytes | None  # None: undecodable (or no image)
    pdq: bytes | None  # 32 bytes, PDQ's bit order packed big-endian
    pdq_mirror: bytes | None
    pdq_c95: bytes | None  # of the central 95% (2.5% cut off each side)
    pdq_c90: bytes | None
    pdq_quality: int | None
    error: str | None


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def decode(data: bytes) -> Image.Image:
    """The upright RGB pixels; raises ValueError with a one-line reason if undecodable."""
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
        return ImageOps.exif_transpose(image).convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"undecodable image: {reason}") from None


def pixel_hash(rgb: Image.Image) -> bytes:
    """sha256 of the pixels and size."""
    return hashlib.sha256(b"%dx%d:" % rgb.size + rgb.tobytes()).digest()


def trimmed(pixels: np.ndarray) -> np.ndarray:
    """The pixels without letterbox bars: edge rows and columns that are uniform (values within TRIM_SPAN) and
    black or white are cut off, unless that would leave under half of either side. Mirror-symmetric."""
    def kept(low: np.ndarray, high: np.ndarray) -> tuple[int, int]:
        low, high = low.astype(np.int16), high.astype(np.int16)
        bar = (high - low <= TRIM_SPAN) & ((high <= TRIM_SPAN) | (low >= 255 - TRIM_SPAN))
        if bar.all():
            return 0, len(bar)
        lo, hi = int(np.argmin(bar)), len(bar) - int(np.argmin(bar[::-1]))
        return (lo, hi) if (hi - lo) * 2 >= len(bar) else (0, len(bar))

    # each row's and column's extremes over its pixels and channels; reduced one axis at a time, which numpy does
    # 100x faster than min(axis=(0, 2)) (a strided reduction over two axes: most of the hash stage's time)
    rows = pixels.reshape(len(pixels), -1)
    top, bottom = kept(rows.min(axis=1), rows.max(axis=1))
    left, right = kept(pixels.min(axis=0).min(axis=1), pixels.max(axis=0).max(axis=1))
    return pixels[top:bottom, left:right]


def pdq_pixels(rgb: Image.Image) -> np.ndarray:
    """What PDQ hashes: the pixels without letterbox bars (`trimmed`, on a copy box-downscaled by a whole factor to
    at most twice PDQ_SIDE), then resized so that the longer side is PDQ_SIDE (box filter down, bilinear up): every
    copy of a picture at one scale."""
    factor = max(1, max(rgb.size) // (2 * PDQ_SIDE))
    pixels = trimmed(np.asarray(rgb.reduce(factor) if factor > 1 else rgb))
    h, w = pixels.shape[:2]
    scale = PDQ_SIDE / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    image = Image.fromarray(np.ascontiguousarray(pixels))
    return np.asarray(image.resize(size, Image.Resampling.BOX if scale < 1 else Image.Resampling.BILINEAR))


def central(pixels: np.ndarray, keep: float) -> np.ndarray:
    h, w = pixels.shape[:2]
    dy, dx = round(h * (1 - keep) / 2), round(w * (1 - keep) / 2)
    return np.ascontiguousarray(pixels[dy:h - dy, dx:w - dx])


def pdq(rgb: Image.Image) -> tuple[bytes, bytes, bytes, bytes, int]:
    """(PDQ hash, the left-right mirror's, the central 95%'s, the central 90%'s, quality) of upright RGB pixels."""
    import pdqhash

    pixels = pdq_pixels(rgb)
    bits, quality = pdqhash.compute(pixels)
    others = [pdqhash.compute(p)[0] for p in (np.ascontiguousarray(pixels[:, ::-1]), central(pixels, 0.95),
                                               central(pixels, 0.90))]
    return pack(bits), *(pack(b) for b in others), int(quality)


def pack(bits: np.ndarray) -> bytes:
    """256 bits (0/1) as 32 bytes."""
    return np.packbits(np.asarray(bits, np.uint8)).tobytes()


def fingerprint(data: bytes | None) -> Fingerprint:
    """Every hash of one image, decoded once. A missing image is an error; an undecodable one keeps its sha256
    (the exact detector still applies) and has no other hash."""
    if not data:
        return Fingerprint(None, None, None, None, None, None, None, "no image")
    digest = sha256(data)
    try:
        rgb = decode(data)
    except ValueError as exc:
        return Fingerprint(digest, None, None, None, None, None, None, str(exc))
    return Fingerprint(digest, pixel_hash(rgb), *pdq(rgb), None)
