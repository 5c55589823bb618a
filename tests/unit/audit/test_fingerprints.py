"""The audit's fingerprints (mieb_ray/audit/fingerprints.py): the pixel hash sees through containers and EXIF, not
through lossy changes; the pdq columns are pdqhash's own hashes of the pixels prepared as documented."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest
from PIL import Image
from support.pictures import encode, jpeg
from support.planted import tiles

from mieb_ray.audit import fingerprints
from mieb_ray.demo_data.mirror import picture

pytestmark = pytest.mark.timeout(600)


def _pix(data: bytes) -> bytes:
    return fingerprints.fingerprint(data).pix


def test_pixel_hash_sees_through_containers_and_exif_not_through_lossy_changes():
    tile = tiles()[0]
    data = jpeg(tile)
    decoded = Image.open(io.BytesIO(data)).convert("RGB")
    assert _pix(encode(decoded, "PNG")) == _pix(data)
    assert _pix(jpeg(decoded, 50)) != _pix(data)
    # stored rotated with an EXIF orientation that turns it back: the same upright pixels
    png = encode(decoded, "PNG")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW to view
    buf = io.BytesIO()
    decoded.transpose(Image.Transpose.ROTATE_90).save(buf, "PNG", exif=exif.tobytes())
    assert _pix(buf.getvalue()) == _pix(png)
    bad = fingerprints.fingerprint(b"not an image")
    assert bad.sha == hashlib.sha256(b"not an image").digest() and bad.pix is None and bad.pdq is None
    assert bad.error.startswith("undecodable image")
    assert fingerprints.fingerprint(None).error == "no image"


def test_pdq_is_pdqhash_of_the_prepared_pixels():
    """The pdq columns are pdqhash's own hashes, bit for bit, of the pixels prepared as fingerprints.py documents
    it, done here with plain Pillow and numpy: letterbox bars cut off, a box reduction by a whole factor when the
    longer side is at least twice 256, then a resize to a longer side of 256 (box filter down, bilinear up); and
    pdqhash's hashes of their mirror, of their central 95% and 90% (2.5% and 5% cut off each side), and its quality.
    Pillow's filters are the product's, so the expectation is exact."""
    import pdqhash

    def packed(pixels: np.ndarray) -> bytes:
        return np.packbits(pdqhash.compute(np.ascontiguousarray(pixels))[0].astype(np.uint8)).tobytes()

    def cut(pixels: np.ndarray, each_side: float) -> np.ndarray:
        h, w = pixels.shape[:2]
        return pixels[round(h * each_side):h - round(h * each_side), round(w * each_side):w - round(w * each_side)]

    def expected(pixels: np.ndarray) -> tuple:
        return (packed(pixels), packed(pixels[:, ::-1]), packed(cut(pixels, 0.025)), packed(cut(pixels, 0.05)),
                pdqhash.compute(np.ascontiguousarray(pixels))[1])

    def hashed(image: Image.Image) -> tuple:
        got = fingerprints.fingerprint(encode(image, "PNG"))
        return got.pdq, got.pdq_mirror, got.pdq_c95, got.pdq_c90, got.pdq_quality

    box, bilinear = Image.Resampling.BOX, Image.Resampling.BILINEAR
    # (picture, resized to) -> (whole factor reduced by, size hashed, filter); none of these has a bar to cut
    cases = {("astronaut.jpg", None): (1, (256, 256), box),  # 400 x 400
             ("astronaut.jpg", (1300, 700)): (2, (256, 138), box),  # 1300 >= 2 x 256: 650 x 350 first
             ("astronaut.jpg", (90, 120)): (1, (192, 256), bilinear),
             ("text.png", None): (1, (256, 98), box),  # 448 x 172
             ("text.png", (1300, 700)): (2, (256, 138), box),
             ("text.png", (90, 120)): (1, (192, 256), bilinear)}
    for (name, size), (factor, side, resample) in cases.items():
        image = picture(name) if size is None else picture(name).resize(size)
        reduced = image.reduce(factor) if factor > 1 else image
        assert hashed(image) == expected(np.asarray(reduced.resize(side, resample))), (name, size)
    # black bars around a picture, where it was pasted: cut off before hashing, the hashes the picture's own
    plain = picture("coffee.jpg").resize((400, 300))
    framed = Image.new("RGB", (500, 500))
    framed.paste(plain, (50, 100))
    want = expected(np.asarray(plain.resize((256, 192), box)))
    assert hashed(plain) == want and hashed(framed) == want
