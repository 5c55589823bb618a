"""What the audit computes of each image where it is read, once: pure functions, no Ray.

  sha256   of the encoded bytes: the exact detector.
  pixels   sha256 of the decoded, EXIF-oriented RGB pixels and their size: the pixel detector, which catches a
           lossless re-encode or a change of container (JPEG -> PNG, PNG -> WebP lossless, EXIF orientation
           applied to the pixels).
  pdq      Meta's PDQ perceptual hash (256 bits, `pdqhash`) of the same pixels, box-downscaled first so that the
           longer side is at most PDQ_SIDE (PDQ itself works on 64 x 64: the full size costs 25x the time and
           changes no decision), with the hash of their left-right mirror (PDQ's dihedral hash, free) and PDQ's
           quality (0-100: a flat image, a blank frame, has little of it): the pdq detector, which catches
           re-encodes, resizes, small crops, mirrors, colour and brightness edits.
"""

from __future__ import annotations

import hashlib
import io
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

PDQ_SIDE = 512
MIRROR = 5  # pdqhash.compute_dihedral's order: the hash of the left-right mirrored image


class Fingerprint(NamedTuple):
    sha: bytes | None
    pix: bytes | None  # None: undecodable (or no image)
    pdq: bytes | None  # 32 bytes, PDQ's bit order packed big-endian
    pdq_mirror: bytes | None
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


def pdq_pixels(rgb: Image.Image) -> np.ndarray:
    """What PDQ hashes: the pixels box-downscaled (Pillow's reduce, whole factors) until the longer side is at most
    PDQ_SIDE."""
    factor = -(-max(rgb.size) // PDQ_SIDE)
    return np.asarray(rgb.reduce(factor) if factor > 1 else rgb)


def pdq(rgb: Image.Image) -> tuple[bytes, bytes, int]:
    """(PDQ hash, the mirror's PDQ hash, quality) of upright RGB pixels."""
    import pdqhash

    hashes, quality = pdqhash.compute_dihedral(pdq_pixels(rgb))
    return pack(hashes[0]), pack(hashes[MIRROR]), int(quality)


def pack(bits: np.ndarray) -> bytes:
    """256 bits (0/1) as 32 bytes."""
    return np.packbits(np.asarray(bits, np.uint8)).tobytes()


def fingerprint(data: bytes | None) -> Fingerprint:
    """Every hash of one image, decoded once. A missing image is an error; an undecodable one keeps its sha256
    (the exact detector still applies) and has no other hash."""
    if not data:
        return Fingerprint(None, None, None, None, None, "no image")
    digest = sha256(data)
    try:
        rgb = decode(data)
    except ValueError as exc:
        return Fingerprint(digest, None, None, None, None, str(exc))
    return Fingerprint(digest, pixel_hash(rgb), *pdq(rgb), None)
