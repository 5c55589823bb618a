"""The pixel operations of mieb_ray/encode/pixels.py against Pillow's own: the EXIF transposes (as point maps and
as array views), and the antialiased resize with a draft box, whole and cut short at a crop's far edge. No Ray.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from support.pictures import picture

from mieb_ray.encode import pixels


@pytest.mark.parametrize("orientation", pixels.UPRIGHT)
def test_upright_point_maps_are_pils_transposes(orientation):
    """Where UPRIGHT says a pixel centre goes is where PIL's transpose puts that pixel."""
    stored = np.arange(5 * 3, dtype=np.uint8).reshape(3, 5)  # (h, w), every pixel distinct
    method, move = pixels.UPRIGHT[orientation]
    upright = np.asarray(Image.fromarray(stored).transpose(method))
    for y, x in np.ndindex(stored.shape):
        ux, uy = move(x + 0.5, y + 0.5, 5, 3)
        assert upright[int(uy), int(ux)] == stored[y, x]


@pytest.mark.parametrize("resample", [Image.Resampling.BILINEAR, Image.Resampling.BICUBIC])
def test_resize_is_pillows_with_a_box(resample):
    """resize with a draft box (the original's extent, less than the decoded size) is Pillow's resize(box=)."""
    im = picture("chelsea.jpg").convert("RGB").crop((0, 0, 301, 203))
    a = np.array(im)
    for box, size in [((203.0, 301.0), (64, 95)), ((202.5, 300.25), (64, 95)), ((202.5, 300.25), (224, 331)),
                      ((203.0, 301.0), (203, 301)), ((101.5, 300.5), (64, 64))]:
        got = pixels.resize(a[None], box, size, int(resample))[0].astype(int)
        want = np.asarray(im.resize(size[::-1], resample, box=(0, 0, box[1], box[0]))).astype(int)
        diff = np.abs(got - want)
        assert diff.max() <= 1 and diff.mean() < 0.01, (box, size, diff.max(), diff.mean())


@pytest.mark.parametrize("orientation", pixels.UPRIGHT)
def test_upright_arrays_are_pils_transposes(orientation):
    stored = np.arange(5 * 3 * 2, dtype=np.uint8).reshape(3, 5, 2)
    method, _ = pixels.UPRIGHT[orientation]
    want = np.stack([np.asarray(Image.fromarray(stored[..., c]).transpose(method)) for c in range(2)], -1)
    assert np.array_equal(pixels.UPRIGHT_ARRAY[orientation](stored), want)


@pytest.mark.parametrize("resample", [Image.Resampling.BILINEAR, Image.Resampling.BICUBIC])
def test_resize_stop_is_the_first_rows_and_columns(resample):
    """resize(stop=) against the whole resize: the same pixels, but for torch's weight precision, which it
    sets from the largest weight of the outputs it computes: fewer outputs can round a value the other way
    (here at most 1 level at <0.5% of values; mieb-train's sizes, e.g. 500x375 and 320x240, are identical)."""
    rng = np.random.default_rng(0)
    for _ in range(60):
        h, w, out_h, out_w = (int(v) for v in rng.integers(2, 300, 4))
        box = (h - float(rng.choice([0, 0.25, 0.5])), w - float(rng.choice([0, 0.25, 0.5])))
        stop = (int(rng.integers(1, out_h + 1)), int(rng.integers(1, out_w + 1)))
        batch = rng.integers(0, 256, (2, h, w, 3), dtype=np.uint8)
        for transposed in (False, True):
            full = pixels.resize(batch, box, (out_h, out_w), int(resample), transposed)
            cut = pixels.resize(batch, box, (out_h, out_w), int(resample), transposed, stop=stop)
            diff = np.abs(cut[:, :stop[0], :stop[1]].astype(int) - full[:, :stop[0], :stop[1]])
            assert diff.max() <= 1 and (diff > 0).mean() < 0.005, (h, w, box, out_h, out_w, stop, transposed)
    for (h, w), size in [((375, 500), (224, 298)), ((240, 320), (224, 298)), ((500, 375), (298, 224))]:
        batch = rng.integers(0, 256, (2, h, w, 3), dtype=np.uint8)
        full = pixels.resize(batch, (h, w), size, int(resample))
        assert np.array_equal(pixels.resize(batch, (h, w), size, int(resample), stop=(224, 261)),
                              full[:, :224, :261])
