"""What the audit computes of each image where it is read, once: pure functions, no Ray.

  sha256   of the encoded bytes: the exact detector.
  pixels   sha256 of the decoded, EXIF-oriented RGB pixels and their size: the pixel detector, which catches a
           lossless re-encode or a change of container (JPEG -> PNG, PNG -> WebP lossless, EXIF orientation
           applied to the pixels).
  pdq      Meta's PDQ perceptual hash (256 bits: of a 64 x 64 luminance image, the 16 x 16 lowest frequencies of
           its DCT, each bit set where its coefficient is above their median) of the pixels brought to one scale
           without letterbox bars (`pdq_pixels`) and area-averaged to 64 x 64; with the hash of their left-right
           mirror, the hashes of windows cutting 1 to 9% off their centre (`pdq_centred`), off one side or off a
           corner's two sides (`pdq_sides`), and PDQ's quality (0-100: a flat image, a blank frame, has little of
           it): the pdq detector, which catches re-encodes, resizes (down to 64 px), crops of up to 10% (centred,
           off one side or a corner), mirrors, borders, colour and brightness edits
           (bench/calibration/audit_calibrate.py).
"""

from __future__ import annotations

import hashlib
import io
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from mieb_ray.errors import first_line

PDQ_SIDE = 256
TRIM_SPAN = 12  # a bar's values: within 12 of each other, and of 0 or 255 (JPEG noise at the edge of a bar)
GRID = 64  # PDQ hashes a 64 x 64 image
# What a window cuts off: every 2 points, a crop of up to 10% off a side (or the centre) is within 1 point of a
# window (or of the whole picture), which keeps its hash within PDQ's match distance (a point moves a hash about
# 14 bits); off a corner every 1.5 points, two sides off at once moving it more (bench/calibration/)
CUTS = (0.01, 0.03, 0.05, 0.07, 0.09)
CORNER_CUTS = (0.0075, 0.0225, 0.0375, 0.0525, 0.0675, 0.0825, 0.0975)
# Windows as the shares (left, right, top, bottom) cut off each side
CENTRED = tuple((cut / 2,) * 4 for cut in CUTS)
SIDES = (tuple(tuple(cut * s for s in side) for side in ((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1))
               for cut in CUTS)
         + tuple(tuple(cut * s for s in corner) for corner in ((1, 0, 1, 0), (0, 1, 1, 0), (1, 0, 0, 1), (0, 1, 0, 1))
                 for cut in CORNER_CUTS))
WHOLE = (0.0, 0.0, 0.0, 0.0)
# PDQ's DCT: row k is the cosine of frequency k + 1 (its lowest 16 but the constant one) over 64 samples
DCT = (np.sqrt(2 / GRID) * np.cos(np.pi / (2 * GRID) * np.arange(1, 17)[:, None] * (2 * np.arange(GRID) + 1))
       ).astype(np.float32)
# the DCT of a left-right mirror: the signs of its odd horizontal frequencies flipped
MIRRORED = np.where(np.arange(16) % 2 == 0, -1, 1).astype(np.float32)


class Fingerprint(NamedTuple):
    sha: bytes | None
    pix: bytes | None  # None: undecodable (or no image)
    pdq: bytes | None  # 32 bytes, PDQ's bit order packed big-endian
    pdq_mirror: bytes | None
    pdq_centred: bytes | None  # a hash (32 bytes) per window of CENTRED, in order
    pdq_sides: bytes | None  # a hash per window of SIDES
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
        raise ValueError(f"undecodable image: {first_line(exc)}") from None


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
    at most twice PDQ_SIDE), box-downscaled to a longer side of at most PDQ_SIDE. A smaller picture is hashed as it
    is: averaging it to 64 x 64 cells enlarges it without the blur of a filter, which would lower the quality of a
    picture downscaled to 64 px under the detector's bar (bench/calibration/)."""
    factor = max(1, max(rgb.size) // (2 * PDQ_SIDE))
    pixels = trimmed(np.asarray(rgb.reduce(factor) if factor > 1 else rgb))
    h, w = pixels.shape[:2]
    if max(h, w) <= PDQ_SIDE:
        return pixels
    scale = PDQ_SIDE / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return np.asarray(Image.fromarray(np.ascontiguousarray(pixels)).resize(size, Image.Resampling.BOX))


def luma(pixels: np.ndarray) -> np.ndarray:
    """PDQ's luminance of RGB pixels, float32."""
    return (pixels @ np.array([0.299, 0.587, 0.114])).astype(np.float32)


@lru_cache(maxsize=4096)
def cells(n: int, lo: float, hi: float) -> np.ndarray:
    """(GRID, n) float32: the area average of each of GRID equal cells of an axis of n pixels, with the shares lo
    and hi cut off its two ends (a weight is the part of a pixel a cell covers). Averaging rather than PDQ's own
    downscale (a box filter of half a cell, read at one point a cell) keeps what lies between its points: a picture
    resampled or shifted by a fraction of a cell keeps its hash (PDQ's own flipped up to 72 bits of a texture)."""
    bounds = lo * n + (1 - lo - hi) * n * np.arange(GRID + 1) / GRID
    covered = np.diff(np.clip(np.arange(n + 1), bounds[:-1, None], bounds[1:, None]), axis=1)
    return (covered / covered.sum(axis=1, keepdims=True)).astype(np.float32)


@lru_cache(maxsize=1024)
def pdq_cells(n: int) -> np.ndarray:
    """(GRID, n) float32: PDQ's own downscale of an axis of n pixels (pdqhash's Jarosz filter: a box filter of
    (n + 127) // 128 pixels twice, then the pixel at each cell's centre), for its quality."""
    width = (n + 2 * GRID - 1) // (2 * GRID)
    ahead = (width + 2) // 2 - 1
    box = np.zeros((n, n))
    for o in range(n):
        lo, hi = max(0, o + ahead + 1 - width), min(n - 1, o + ahead)
        box[o, lo:hi + 1] = 1 / (hi - lo + 1)
    return (box @ box)[((np.arange(GRID) + 0.5) * n / GRID).astype(int)].astype(np.float32)


@lru_cache(maxsize=1024)
def _windows(h: int, w: int, windows: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For `coefficients`: the DCT of the cells of each top and bottom cut (rows, 16, h), of each left and right cut
    (columns, 16, w), and each window's row and column."""
    rows, columns = sorted({win[2:] for win in windows}), sorted({win[:2] for win in windows})
    return (np.stack([DCT @ cells(h, *r) for r in rows]), np.stack([DCT @ cells(w, *c) for c in columns]),
            np.array([rows.index(win[2:]) for win in windows]), np.array([columns.index(win[:2]) for win in windows]))


def coefficients(gray: np.ndarray, windows: tuple) -> np.ndarray:
    """(windows, 16, 16): PDQ's DCT coefficients of each window (left, right, top, bottom: the shares cut off) of a
    luminance image averaged to GRID x GRID cells. Windows share their rows' products (one per top and bottom)."""
    by_row, by_column, r, c = _windows(*gray.shape, windows)
    return (by_row @ gray)[r] @ by_column[c].transpose(0, 2, 1)


def hash_bits(coefs: np.ndarray) -> bytes:
    """PDQ's hashes of (n, 16, 16) coefficients, 32 bytes each: bit k (row * 16 + column) set where its coefficient
    is above the median of the 256, packed as pdqhash lists them (bit 255 first)."""
    flat = coefs.reshape(len(coefs), 256)
    bits = flat > np.median(flat, axis=1, keepdims=True)
    return np.packbits(bits[:, ::-1], axis=1).tobytes()


def quality(grid: np.ndarray) -> int:
    """PDQ's quality of its GRID x GRID image: the steps between neighbours, each in whole percent of 255, summed
    over 90, at most 100."""
    steps = np.concatenate([np.diff(grid, axis=0).ravel(), np.diff(grid, axis=1).ravel()])
    return min(100, int(np.trunc(np.abs(steps) * np.float32(100) / np.float32(255)).sum()) // 90)


@lru_cache(maxsize=1)
def _blas():
    from threadpoolctl import ThreadpoolController  # scikit-learn's dependency

    return ThreadpoolController()


def pdq_hashes(pixels: np.ndarray) -> tuple[bytes, bytes, bytes, bytes, int]:
    """(PDQ hash, the left-right mirror's, the CENTRED windows', the SIDES windows', PDQ's quality) of RGB pixels.
    The quality is pdqhash's own, of its own downscale: the cells' averages are smoother, and PDQ's bar of 50 is
    set on its own."""
    # products of a few hundred rows, on one thread: BLAS threads wait on each other (100x slower on a busy machine)
    with _blas().limit(limits=1, user_api="blas"):
        gray = luma(pixels)
        coefs = coefficients(gray, (WHOLE, *CENTRED, *SIDES))
        grid = pdq_cells(gray.shape[0]) @ gray @ pdq_cells(gray.shape[1]).T
    centred = 1 + len(CENTRED)
    return (hash_bits(coefs[:1]), hash_bits(coefs[:1] * MIRRORED), hash_bits(coefs[1:centred]),
            hash_bits(coefs[centred:]), quality(grid))


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
    return Fingerprint(digest, pixel_hash(rgb), *pdq_hashes(pdq_pixels(rgb)), None)
