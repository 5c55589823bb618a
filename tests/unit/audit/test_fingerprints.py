"""The audit's fingerprints (mieb_ray/audit/fingerprints.py): the pixel hash sees through containers and EXIF, not
through lossy changes; the pdq columns are pdqhash's own hashes of the pixels prepared and averaged to 64 x 64 as
documented, its windows' hashes PDQ's of those parts of the picture."""

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


def _packed(bits) -> bytes:
    return np.packbits(np.asarray(bits, np.uint8)).tobytes()


def _distance(a: bytes, b: bytes) -> int:
    return int(np.unpackbits(np.frombuffer(a, np.uint8) ^ np.frombuffer(b, np.uint8)).sum())


def _hashes(image: Image.Image) -> tuple:
    got = fingerprints.fingerprint(encode(image, "PNG"))
    return got.pdq, got.pdq_mirror, got.pdq_centred, got.pdq_sides, got.pdq_quality


def test_pdq_is_pdqhash_of_the_picture_averaged_to_64_cells():
    """A picture made of blocks that its 64 x 64 cells average exactly (4 x 4 pixels of a 256 x 256 picture, 4 x 2
    of a 256 x 128 one): its pdq and pdq_mirror columns are pdqhash's own hashes, bit for bit, of the 64 x 64
    picture of those blocks (and of its mirror), and its quality pdqhash's of the picture itself."""
    import pdqhash

    for name, (w, h) in (("astronaut.jpg", (64, 64)), ("chelsea.jpg", (64, 32)), ("text.png", (64, 32))):
        small = np.asarray(picture(name).resize((w, h), Image.Resampling.BOX))
        blocks = small.repeat(256 // h, axis=0).repeat(256 // w, axis=1)  # 256 px on its longer side: hashed as is
        cells = np.ascontiguousarray(small.repeat(64 // h, axis=0))  # what its 64 x 64 cells average to
        got = _hashes(Image.fromarray(blocks))
        assert got[0] == _packed(pdqhash.compute(cells)[0]), name
        assert got[1] == _packed(pdqhash.compute(np.ascontiguousarray(cells[:, ::-1]))[0]), name
        assert got[4] == pdqhash.compute(blocks)[1], name


def test_pdq_hashes_the_pixels_prepared_as_documented():
    """fingerprint's pdq columns are pdq_hashes of the pixels prepared with plain Pillow and numpy: letterbox bars
    cut off, a box reduction by a whole factor when the longer side is at least twice 256, then a box resize to a
    longer side of 256; a smaller picture as it is (no enlarging). Its quality is pdqhash's of those pixels."""
    import pdqhash

    box = Image.Resampling.BOX
    # (picture, resized to) -> (whole factor reduced by, size hashed: None as it is); none has a bar to cut
    cases = {("astronaut.jpg", None): (1, (256, 256)),  # 400 x 400
             ("astronaut.jpg", (1300, 700)): (2, (256, 138)),  # 1300 >= 2 x 256: 650 x 350 first
             ("astronaut.jpg", (90, 120)): (1, None),
             ("text.png", None): (1, (256, 98)),  # 448 x 172
             ("text.png", (1300, 700)): (2, (256, 138)),
             ("text.png", (64, 30)): (1, None)}
    for (name, size), (factor, side) in cases.items():
        image = picture(name) if size is None else picture(name).resize(size)
        reduced = image.reduce(factor) if factor > 1 else image
        pixels = np.asarray(reduced if side is None else reduced.resize(side, box))
        want = fingerprints.pdq_hashes(pixels)
        assert _hashes(image) == want, (name, size)
        assert want[4] == pdqhash.compute(np.ascontiguousarray(pixels))[1], (name, size)
    # black bars around a picture, where it was pasted: cut off before hashing, the hashes the picture's own
    plain = picture("coffee.jpg").resize((400, 300))
    framed = Image.new("RGB", (500, 500))
    framed.paste(plain, (50, 100))
    want = fingerprints.pdq_hashes(np.asarray(plain.resize((256, 192), box)))
    assert _hashes(plain) == want and _hashes(framed) == want


def test_each_window_is_pdq_of_that_part_of_the_picture():
    """pdq_centred and pdq_sides hold a hash per window, in the order of CENTRED and SIDES: each within a few bits
    of pdqhash's hash of that part of the picture (left, right, top, bottom shares cut off), box-resized to 64 x 64
    by Pillow (its box filter reads whole pixels at a window's edges, the averages fractions of them), and, where
    it cuts 5% or more, nearer to that part than the whole picture's hash is. The windows cut 1 to 9% off the
    centre, off each side and off each corner."""
    import pdqhash

    windows = fingerprints.CENTRED + fingerprints.SIDES
    assert len(windows) == 53 and len(set(windows)) == 53
    assert {max(w) for w in fingerprints.CENTRED} == {c / 2 for c in fingerprints.CUTS}
    assert all(sum(1 for s in w if s) in (1, 2) and max(w) <= 0.1 for w in fingerprints.SIDES)
    for name in ("astronaut.jpg", "chelsea.jpg", "coffee.jpg"):  # detail up to their edges (a cut sky moves nothing)
        image = picture(name).resize((256, 171))
        got = _hashes(image)
        hashes = [(got[2] + got[3])[32 * k:32 * k + 32] for k in range(len(windows))]
        for k, (left, right, top, bottom) in enumerate(windows):
            part = image.resize((64, 64), Image.Resampling.BOX,
                                box=(256 * left, 171 * top, 256 * (1 - right), 171 * (1 - bottom)))
            want = _packed(pdqhash.compute(np.asarray(part))[0])
            assert _distance(hashes[k], want) <= 12, (name, windows[k])
            if sum(windows[k]) >= 0.05:  # and nearer to it than the whole picture's hash
                assert _distance(got[0], want) > _distance(hashes[k], want) + 12, (name, windows[k])
