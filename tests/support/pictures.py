"""Images made in memory from the demo's real pictures (mieb_ray/demo_data/images), in the sizes, modes and
containers the preprocessing must handle, and the bad inputs it must refuse: the tests of preprocessing, the
encoder, the device decoder and the jobs' error rows share them."""

from __future__ import annotations

import io
import struct
import zlib
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from support.paths import PICTURES


@lru_cache
def picture(name: str) -> Image.Image:
    """One of the real pictures, as stored (its own mode: camera.jpg is greyscale); demo_data's picture() is RGB."""
    with Image.open(PICTURES / name) as im:
        return im.copy()


def encode(im: Image.Image, fmt: str = "JPEG", **params) -> bytes:
    """`im` saved as `fmt` with Pillow's `params` (Pillow's defaults for the rest: JPEG at quality 75)."""
    buf = io.BytesIO()
    im.save(buf, fmt, **params)
    return buf.getvalue()


def jpeg(im: Image.Image, quality: int = 90) -> bytes:
    """`im` as a JPEG at `quality` (90 unless said: the planted tables' and the audit tests' pictures)."""
    return encode(im, "JPEG", quality=quality)


def large_jpeg() -> bytes:  # the size of BioVITA's photos
    return encode(picture("chelsea.jpg").resize((1600, 1200), Image.Resampling.BICUBIC), "JPEG", quality=90)


def rgba_png() -> bytes:  # alpha from 0 to 255 across the picture: composited onto white
    im = picture("astronaut.jpg").convert("RGBA")
    im.putalpha(Image.linear_gradient("L").rotate(90).resize(im.size))
    return encode(im, "PNG")


def la_png() -> bytes:
    im = picture("camera.jpg").convert("LA")
    im.putalpha(Image.radial_gradient("L").resize(im.size))
    return encode(im, "PNG")


def palette_png() -> bytes:  # palette with one transparent entry
    im = picture("china.jpg").convert("P", palette=Image.Palette.ADAPTIVE, colors=32)
    return encode(im, "PNG", transparency=int(np.bincount(np.asarray(im).ravel()).argmax()))


def i16_png() -> bytes:  # 16-bit grayscale: 0..510, so the processor's clip at 255 shows
    return encode(Image.fromarray(np.asarray(picture("coins.jpg"), dtype=np.uint16) * 2), "PNG")


def with_orientation(im: Image.Image, fmt: str, orientation: int, **params) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(im, fmt, exif=exif, **params)


def png_claiming(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header says width x height: a decompression bomb as Image.open sees it."""
    data = bytearray(encode(Image.new("L", (1, 1)), "PNG"))
    # 8-byte signature, then the IHDR chunk: length (4), b"IHDR" (4), width, height, ... (13), CRC of type + data.
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def bad_inputs() -> dict[str, tuple[bytes, str]]:
    """{name: (bytes, the start of the one-line error preprocessing gives them)}."""
    jpeg, png = large_jpeg(), encode(picture("coffee.jpg"), "PNG")
    scan = jpeg.find(b"\xff\xda")  # start of the entropy-coded scan: a valid header before it
    noise = np.random.default_rng(0).bytes(20_000)
    return {
        "zero bytes": (b"", "empty image"),
        "text file": (b"key,label\nastronaut,3\n" * 50, "not an image"),
        "jpeg header, then noise": (jpeg[:scan + 14] + noise, "corrupt image (broken data stream"),
        "noise after a jpeg start": (jpeg[:20] + noise, "not an image"),
        "truncated jpeg": (jpeg[: len(jpeg) // 2], "truncated image"),
        "truncated png": (png[: len(png) // 2], "truncated image"),
        "30000x30000 png": (png_claiming(30_000, 30_000), "image too large"),
        "1x1000000 png": (png_claiming(1, 1_000_000), "image too large once resized (224x224000000 pixels)"),
    }


def photo_table(root, files: int, rows: int) -> str:
    """`files` Parquet files of `rows` small PNG photos each, keyed p/<file>/<row>: a table to embed."""
    root.mkdir()
    photos = [encode(picture(name).resize((64, 48)), "PNG") for name in ("chelsea.jpg", "coffee.jpg", "rocket.jpg")]
    for f in range(files):
        keys = [f"p/{f}/{i}" for i in range(rows)]
        pq.write_table(pa.table({"key": keys, "image": pa.array([photos[i % 3] for i in range(rows)], pa.binary())}),
                       root / f"{f:03d}.parquet")
    return str(root)
