"""Per image, the embed job's path (load_image -> normalize -> Encoder) equals the model's own CLIPProcessor +
get_image_features, for real photos of several sizes and modes, with a tiny CLIP loaded from its saved folder.

A tiny random CLIP maps every image to nearly the same direction, so a raw cosine of 0.99 proves nothing:
embeddings are compared after subtracting the mean embedding of many different images (centred cosine), and
the test shows that a rotated, mirrored, channel-swapped or squashed image falls below the bar.
tests/test_families.py does the same for the other model families (SigLIP, SigLIP2, a generic model).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from test_preprocess import encode, i16_png, large_jpeg, palette_png, picture, rgba_png, with_orientation

from mieb_ray.encode.model import Encoder, load_info
from mieb_ray.encode.preprocess import ImageSpec, load_images, normalize

BAR = 0.95
MIX = {  # as bench/preprocess.py's KINDS
    "mix png 32x32": ("PNG", 32, 32, "RGB", {}),
    "mix png 28x28 grey": ("PNG", 28, 28, "L", {}),
    "mix png 96x96": ("PNG", 96, 96, "RGB", {}),
    "mix jpeg 320x240 frame": ("JPEG", 320, 240, "RGB", {"quality": 75}),
    "mix jpeg 500x375": ("JPEG", 500, 375, "RGB", {"quality": 85}),
    "mix jpeg 64x64 satellite": ("JPEG", 64, 64, "RGB", {"quality": 90}),
}
CONTROLS = ["astronaut.jpg crop", "chelsea.jpg crop", "china.jpg crop"]
PICTURES = ["astronaut.jpg", "coffee.jpg", "chelsea.jpg", "china.jpg", "flower.jpg", "rocket.jpg", "camera.jpg",
            "coins.jpg", "brick.jpg", "grass.jpg"]


def photos() -> dict[str, bytes]:
    """Sizes and modes the issue names, plus many different pictures for the mean."""
    astronaut = picture("astronaut.jpg")
    cases = {
        "large jpeg 1600x1200": large_jpeg(),
        "small png 100x80": encode(picture("coffee.jpg").resize((100, 80)), "PNG"),
        "grayscale jpeg": encode(picture("rocket.jpg").convert("L"), "JPEG", quality=90),
        "rgba png": rgba_png(),
        "cmyk jpeg": encode(picture("flower.jpg").convert("CMYK"), "JPEG", quality=90),
        "exif-rotated jpeg": with_orientation(astronaut, "JPEG", 6, quality=92),
        "palette png with transparency": palette_png(),
        "16-bit png": i16_png(),
    }
    # mieb-train's kinds of image (bench/preprocess.py KINDS), small ones resized in groups of one size
    for name, (fmt, w, h, mode, params) in MIX.items():
        for i, pic in enumerate(("chelsea.jpg", "coffee.jpg")):
            im = picture(pic).convert("RGB").resize((w, h), Image.Resampling.LANCZOS).convert(mode)
            cases[f"{name} {i}"] = encode(im, fmt, **params)
    for name in PICTURES:  # varied crops and aspect ratios of every fixture picture
        im = picture(name)
        w, h = im.size
        cases[f"{name} crop"] = encode(im.crop((0, 0, w * 2 // 3, h)), "JPEG", quality=90)
        cases[f"{name} png"] = encode(im.resize((w // 2, h // 3)), "PNG")
    return cases


def decoded(data: bytes) -> Image.Image:
    """What a user hands the processor: the upright picture (the processor itself ignores EXIF)."""
    return ImageOps.exif_transpose(Image.open(io.BytesIO(data)))


@pytest.fixture(scope="module")
def models(tiny_clip):
    from transformers import CLIPModel, CLIPProcessor

    encoder = Encoder(tiny_clip, load_info(tiny_clip, tiny_clip, None), device="cpu")
    spec = ImageSpec.from_processor_config(encoder.info.image_config)
    return encoder, spec, CLIPProcessor.from_pretrained(tiny_clip), CLIPModel.from_pretrained(tiny_clip).eval()


def reference(models, images: list[Image.Image]) -> np.ndarray:
    _, _, processor, model = models
    with torch.inference_mode():
        out = model.get_image_features(**processor(images=images, return_tensors="pt")).pooler_output.numpy()
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def ours(models, blobs: list[bytes]) -> np.ndarray:
    """As the embed job: the whole list through load_images (images of one size resized together)."""
    encoder, spec, _, _ = models
    pixels, errors = load_images(blobs, spec)
    assert not any(errors), errors
    return encoder.encode_pixel_values(normalize(torch.from_numpy(pixels), spec))


def centred_cosine(a: np.ndarray, b: np.ndarray, mean: np.ndarray) -> np.ndarray:
    a, b = a - mean, b - mean
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def embedded(models):
    cases = photos()
    names = list(cases)
    ref = reference(models, [decoded(cases[n]) for n in names])
    return names, cases, ref, ours(models, [cases[n] for n in names]), ref.mean(0)


def test_mieb_train_kinds_match_the_processor_and_model(embedded):
    names, _, ref, got, mean = embedded
    scores = {n: round(float(s), 4) for n, s in zip(names, centred_cosine(got, ref, mean)) if n.startswith("mix ")}
    print("centred cosine of mieb-train's kinds:", scores)
    assert len(scores) == 2 * len(MIX) and min(scores.values()) >= BAR, scores


def test_every_photo_matches_the_processor_and_model(embedded):
    names, _, ref, got, mean = embedded
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    scores = centred_cosine(got, ref, mean)
    worst = {n: round(float(s), 4) for n, s in zip(names, scores) if s < 0.999}
    print("centred cosine, ours vs processor+model:", {n: round(float(s), 4) for n, s in zip(names, scores)})
    assert scores.min() >= BAR, worst


@pytest.mark.parametrize("change", ["rotated 90", "mirrored", "channels swapped", "squashed 2:1"])
def test_a_different_image_falls_below_the_bar(embedded, models, change):
    """The bar is discriminating: the same photo, altered, is not "equal" to the original.

    On colour photos without mirror symmetry: a random 2-layer ViT is close to a bag of patches, so a
    mirrored flower is, to it, the same picture, and swapping the channels of a grey one changes nothing.
    """
    names, cases, ref, _, mean = embedded
    altered, originals = [], []
    for i, name in enumerate(names):
        if name not in CONTROLS:
            continue
        im = decoded(cases[name]).convert("RGB")
        w, h = im.size
        im = {"rotated 90": lambda: im.transpose(Image.Transpose.ROTATE_90),
              "mirrored": lambda: ImageOps.mirror(im),
              "channels swapped": lambda: Image.merge("RGB", im.split()[::-1]),
              "squashed 2:1": lambda: im.resize((w, max(1, h // 2)))}[change]()
        altered.append(encode(im, "PNG"))
        originals.append(i)
    scores = centred_cosine(ours(models, altered), ref[originals], mean)
    print(change, np.round(scores, 3))
    assert scores.max() < BAR
