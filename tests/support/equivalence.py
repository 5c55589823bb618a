"""The embed path against a model's own processor + model, per image: the photos (sizes, modes and mieb-train's
kinds, made from the real pictures), what a user hands the processor, the reference embeddings and the bar.

A tiny random model maps every image to nearly the same direction, so a raw cosine of 0.99 proves nothing:
embeddings are compared after subtracting the mean embedding of many different images (centred cosine), and
tests/unit/encode/test_equivalence.py shows that a rotated, mirrored, channel-swapped or squashed image falls below
the bar. The families' tests, the device decoder's and the GPU's use the same photos and bar."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image, ImageOps

from support.pictures import encode, i16_png, la_png, large_jpeg, palette_png, picture, rgba_png, with_orientation

BAR = 0.95
MIX = {  # as bench/preprocess.py's KINDS
    "mix png 32x32": ("PNG", 32, 32, "RGB", {}),
    "mix png 28x28 grey": ("PNG", 28, 28, "L", {}),
    "mix png 96x96": ("PNG", 96, 96, "RGB", {}),
    "mix jpeg 320x240 frame": ("JPEG", 320, 240, "RGB", {"quality": 75}),
    "mix jpeg 500x375": ("JPEG", 500, 375, "RGB", {"quality": 85}),
    "mix jpeg 64x64 satellite": ("JPEG", 64, 64, "RGB", {"quality": 90}),
}
PICTURES = ["astronaut.jpg", "coffee.jpg", "chelsea.jpg", "china.jpg", "flower.jpg", "rocket.jpg", "camera.jpg",
            "coins.jpg", "brick.jpg", "grass.jpg"]


def photos() -> dict[str, bytes]:
    """Sizes and modes the issue names, plus many different pictures for the mean."""
    astronaut = picture("astronaut.jpg")
    cases = {
        "large jpeg 1600x1200": large_jpeg(),
        "small png 100x80": encode(picture("coffee.jpg").resize((100, 80)), "PNG"),
        "grayscale jpeg": encode(picture("rocket.jpg").convert("L"), "JPEG", quality=90),
        "rgba png": rgba_png(),  # transparency: composited onto white from transformers 5.21, dropped before
        "cmyk jpeg": encode(picture("flower.jpg").convert("CMYK"), "JPEG", quality=90),
        "exif-rotated jpeg": with_orientation(astronaut, "JPEG", 6, quality=92),
        "palette png with transparency": palette_png(),
        "16-bit png": i16_png(),
        "la png": la_png(),
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


def reference(models, images: list[Image.Image]) -> np.ndarray:
    """The processor + model's unit image embeddings; models: (encoder, spec, processor, model)."""
    _, _, processor, model = models
    with torch.inference_mode():
        out = model.get_image_features(**processor(images=images, return_tensors="pt")).pooler_output.numpy()
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def centred_cosine(a: np.ndarray, b: np.ndarray, mean: np.ndarray) -> np.ndarray:
    a, b = a - mean, b - mean
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
