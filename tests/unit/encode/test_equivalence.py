"""Per image, the embed job's path (load_image -> normalize -> Encoder) equals the model's own CLIPProcessor +
get_image_features, for real photos of several sizes and modes, with a tiny CLIP loaded from its saved folder.

A tiny random CLIP maps every image to nearly the same direction, so a raw cosine of 0.99 proves nothing:
embeddings are compared after subtracting the mean embedding of many different images (centred cosine), and
the test shows that a rotated, mirrored, channel-swapped or squashed image falls below the bar (the photos, the
bar and the reference: support/equivalence.py). test_families.py does the same for the other model families
(SigLIP, SigLIP2, a generic model).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from support.equivalence import BAR, MIX, centred_cosine, decoded, photos, reference
from support.pictures import encode

from mieb_ray.encode.model import Encoder, load_info
from mieb_ray.encode.preprocess import ImageSpec, load_images, normalize

CONTROLS = ["astronaut.jpg crop", "chelsea.jpg crop", "china.jpg crop"]


@pytest.fixture(scope="module")
def models(tiny_clip):
    from transformers import CLIPModel, CLIPProcessor

    encoder = Encoder(tiny_clip, load_info(tiny_clip, tiny_clip, None), device="cpu")
    spec = ImageSpec.from_processor_config(encoder.info.image_config)
    return encoder, spec, CLIPProcessor.from_pretrained(tiny_clip), CLIPModel.from_pretrained(tiny_clip).eval()


def ours(models, blobs: list[bytes]) -> np.ndarray:
    """As the embed job: the whole list through load_images (images of one size resized together)."""
    encoder, spec, _, _ = models
    pixels, errors = load_images(blobs, spec)
    assert not any(errors), errors
    return encoder.encode_pixel_values(normalize(torch.from_numpy(pixels), spec))


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
