"""What the audit computes of each image where it is read, once: pure functions, no Ray.

  sha256   of the encoded bytes: the exact detector.
  pixels   sha256 of the decoded, EXIF-oriented RGB pixels and their size: the pixel detector, which catches a
           lossless re-encode or a change of container (JPEG -> PNG, PNG -> WebP lossless, EXIF orientation
           applied to the pixels).
"""

from __future__ import annotations

import hashlib
import io

from PIL import Image, ImageOps, UnidentifiedImageError


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def pixel_hash(data: bytes) -> bytes:
    """sha256 of the upright RGB pixels and size; raises ValueError with a one-line reason if undecodable."""
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
        rgb = ImageOps.exif_transpose(image).convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"undecodable image: {reason}") from None
    return hashlib.sha256(b"%dx%d:" % rgb.size + rgb.tobytes()).digest()


def fingerprint(data: bytes | None) -> tuple[bytes | None, bytes | None, str | None]:
    """(sha256, pixel hash, error). A missing image is an error; an undecodable one keeps its sha256 (the
    exact detector still applies) and has no pixel hash."""
    if not data:
        return None, None, "no image"
    digest = sha256(data)
    try:
        return digest, pixel_hash(data), None
    except ValueError as exc:
        return digest, None, str(exc)
