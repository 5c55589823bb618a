"""Each model family (mieb_ray/encode/families.py) embeds as its own processor + model do, on tiny random models
saved with save_pretrained and loaded back through the path a hub name takes (resolve -> load_info -> Encoder):
texts equal (allclose), images by centred cosine as test_equivalence.py does for CLIP (support/equivalence.py).
SigLIP's texts are padded to max_length, which padding=True would get wrong; unsupported models fail in one line."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from support import models
from support.equivalence import BAR, centred_cosine, decoded, photos
from transformers import AutoModel, AutoProcessor, BertConfig, BertModel, CLIPVisionConfig, CLIPVisionModel

from mieb_ray.demo_data.models import make_tiny_clip
from mieb_ray.encode import families, model
from mieb_ray.encode.model import Encoder, load_info, resolve
from mieb_ray.encode.preprocess import ImageSpec, load_image, normalize
from mieb_ray.errors import UserError

TEXTS = ["a photo of a crab.", "A cat!", "hi", "a blurry photo of the Hubble deep field, in the dark",
         "a photo of a " + "very " * 20 + "long crab."]  # over 64 (SigLIP) and 52 (the generic's) tokens
MAKERS = {"clip": make_tiny_clip, "siglip": models.make_tiny_siglip, "siglip2": models.make_tiny_siglip2,
          "siglip2-naflex": models.make_tiny_siglip2_naflex, "generic": models.make_tiny_chinese_clip}
FAMILY = {"clip": "clip", "siglip": "siglip", "siglip2": "siglip", "siglip2-naflex": "siglip2-naflex",
          "generic": "generic"}
# How each family's own documentation calls its processor for texts (Siglip2Processor pads to 64 by default).
REFERENCE_TEXT = {"clip": dict(padding=True, truncation=True, max_length=77),
                  "siglip": dict(padding="max_length", truncation=True, max_length=64),
                  "siglip2": dict(padding="max_length", truncation=True, max_length=64),
                  "siglip2-naflex": {},
                  "generic": dict(padding=True, truncation=True, max_length=52)}
IMAGES = ["clip", "siglip", "siglip2", "generic"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    made = {}

    def get(kind: str) -> str:
        if kind not in made:
            made[kind] = MAKERS[kind](str(tmp_path_factory.mktemp(kind)))
        return made[kind]
    return get


@pytest.fixture(scope="module")
def reference(saved):
    cache = {}

    def get(kind: str):
        if kind not in cache:
            path = saved(kind)
            cache[kind] = AutoProcessor.from_pretrained(path), AutoModel.from_pretrained(path).eval()
        return cache[kind]
    return get


def unit(out) -> np.ndarray:
    return torch.nn.functional.normalize(out.pooler_output, dim=-1).numpy()


def reference_texts(reference, kind: str, texts: list[str], **kwargs) -> np.ndarray:
    processor, ref = reference(kind)
    with torch.inference_mode():
        return unit(ref.get_text_features(**processor(text=texts, return_tensors="pt", **kwargs)))


def encoder(saved, kind: str, modality: str) -> Encoder:
    path = saved(kind)
    return Encoder(path, load_info(resolve(path), path, None, modality=modality), device="cpu")


@pytest.mark.parametrize("kind", list(MAKERS))
def test_texts_equal_the_familys_processor_and_model(saved, reference, kind):
    enc = encoder(saved, kind, "text")
    assert enc.info.family == FAMILY[kind]
    ours = enc.encode_texts(TEXTS)
    assert ours.dtype == np.float32 and ours.shape == (len(TEXTS), enc.info.dim)
    np.testing.assert_allclose(ours, reference_texts(reference, kind, TEXTS, **REFERENCE_TEXT[kind]), atol=1e-5)


@pytest.mark.parametrize("kind", ["siglip", "siglip2"])
def test_siglip_texts_are_padded_to_max_length(saved, reference, kind):
    """SigLIP reads the last position: padding=True would read each short text at its last real token, not at
    the pad token it was trained with, and change every embedding but the 64-token ones."""
    enc = encoder(saved, kind, "text")
    assert enc.info.max_text_length == 64
    assert enc.family.tokenizer_kwargs(64)["padding"] == "max_length"
    ours = enc.encode_texts(TEXTS[:4])
    processor = reference(kind)[0]
    assert {len(ids) for ids in processor(text=TEXTS[:4], padding="max_length", max_length=64)["input_ids"]} == {64}
    np.testing.assert_allclose(ours, reference_texts(reference, kind, TEXTS[:4], padding="max_length",
                                                     max_length=64), atol=1e-5)
    longest = reference_texts(reference, kind, TEXTS[:4], padding=True)
    assert np.abs(ours - longest).max(1).min() > 1e-3  # every text differs under padding=True
    # one text at a time, as a batch of one would be, gives the same embedding: no dependence on the batch
    np.testing.assert_allclose(enc.encode_texts(TEXTS[2:3]), ours[2:3], atol=1e-5)


@pytest.fixture(scope="module")
def cases():
    return photos()


@pytest.fixture(scope="module")
def embedded(saved, reference, cases):
    """Per family: names, the processor + model's embeddings, ours (load_image -> normalize -> Encoder)."""
    names = list(cases)
    out = {}

    def get(kind: str):
        if kind not in out:
            enc = encoder(saved, kind, "image")
            spec = ImageSpec.from_processor_config(enc.info.image_config)
            processor, ref = reference(kind)
            with torch.inference_mode():
                want = unit(ref.get_image_features(**processor(images=[decoded(cases[n]) for n in names],
                                                                 return_tensors="pt")))
            pixels = torch.from_numpy(np.stack([load_image(cases[n], spec) for n in names]))
            out[kind] = names, want, enc.encode_pixel_values(normalize(pixels, spec)), enc, spec
        return out[kind]
    return get


@pytest.mark.parametrize("kind", IMAGES)
def test_images_match_the_familys_processor_and_model(embedded, kind):
    names, want, got, enc, _ = embedded(kind)
    assert got.shape == (len(names), enc.info.dim)
    scores = centred_cosine(got, want, want.mean(0))
    print(kind, "centred cosine:", {n: round(float(s), 4) for n, s in zip(names, scores)})
    assert scores.min() >= BAR, {n: round(float(s), 4) for n, s in zip(names, scores) if s < BAR}


def test_siglip_preprocessing_is_its_own(embedded, cases):
    """SigLIP resizes straight to its size with mean/std 0.5: CLIP's crop and constants on the same model fall
    below the bar, so the test above could fail."""
    names, want, _, enc, spec = embedded("siglip")
    assert (spec.resize_shortest_edge, spec.do_center_crop, spec.mean, spec.std) == (None, False, (.5,) * 3, (.5,) * 3)
    assert spec.resample == 3 and embedded("siglip2")[4].resample == 2  # SigLIP2 resizes bilinearly
    clip = ImageSpec.from_processor_config(embedded("clip")[3].info.image_config)
    clip = ImageSpec(**{**clip.to_dict(), "height": spec.height, "width": spec.width,
                        "resize_shortest_edge": spec.height})
    pixels = torch.from_numpy(np.stack([load_image(cases[n], clip) for n in names]))
    scores = centred_cosine(enc.encode_pixel_values(normalize(pixels, clip)), want, want.mean(0))
    assert scores.min() < BAR


def test_naflex_siglip2_images_are_refused_in_one_line(saved):
    path = saved("siglip2-naflex")
    with pytest.raises(UserError) as caught:
        load_info(path, path, None, modality="image")
    message = str(caught.value)
    assert "\n" not in message and "NaFlex" in message and "spatial_shapes" in message and "Siglip2Model" in message


def test_unsupported_models_fail_in_one_line(tmp_path):
    bert = str(tmp_path / "bert")
    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(bert)
    vision = str(tmp_path / "vision-only")
    CLIPVisionModel(CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     image_size=32, patch_size=16)).save_pretrained(vision)
    for path, modality, arch in [(bert, "image", "BertModel"), (bert, "text", "BertModel"),
                                 (vision, "text", "CLIPVisionModel")]:
        with pytest.raises(UserError) as caught:
            load_info(path, path, None, modality=modality)
        message = str(caught.value)
        assert "\n" not in message, message
        assert f"({arch}) cannot embed {modality}s: it has no get_{modality}_features" in message
        assert families.SUPPORTED in message
    remote = tmp_path / "remote-code"
    remote.mkdir()
    (remote / "config.json").write_text('{"architectures": ["OpenCLIPModel"], "model_type": "open_clip"}')
    (remote / "model.safetensors").write_bytes(b"")  # load_info reads no weights
    with pytest.raises(UserError, match=r"\(OpenCLIPModel\) cannot embed images: transformers has no class for it"):
        load_info(str(remote), str(remote), None)


def test_a_missing_tokenizer_backend_is_one_line(saved, monkeypatch):
    """SiglipTokenizer needs sentencepiece: without it transformers raises a paragraph; we say it in one line."""
    import transformers

    def no_backend(*args, **kwargs):
        raise ImportError("\nSiglipTokenizer requires the SentencePiece library but it was not found in your "
                          "environment. Check out the instructions on the\ninstallation page of its repo.")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_backend)
    model.load_tokenizer.cache_clear()  # what an earlier test loaded
    path = saved("siglip")
    with pytest.raises(UserError) as caught:
        load_info(path, path, None, modality="text")
    message = str(caught.value)
    assert "\n" not in message and "SentencePiece" in message and "(pip install sentencepiece)" in message
    assert load_info(path, path, None, modality="image").family == "siglip"  # images need no tokenizer


def test_image_processor_defaults_come_from_its_class(tmp_path, saved):
    """A preprocessor_config.json that leaves keys out gets its processor class's defaults: CLIP's crops."""
    import shutil

    path = str(tmp_path / "clip")
    shutil.copytree(saved("clip"), path)
    (tmp_path / "clip" / "processor_config.json").unlink()
    with open(f"{path}/preprocessor_config.json", "w") as f:
        json.dump({"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 64},
                   "crop_size": {"height": 64, "width": 64}}, f)
    spec = ImageSpec.from_processor_config(load_info(path, path, None).image_config)
    assert spec.do_center_crop and spec.resample == 3 and spec.mean[0] == pytest.approx(0.48145466)


def test_embed_job_with_a_tiny_siglip(ray_local, saved, reference, tmp_path):
    """Through mieb_ray.pipelines.embed (driver's load_info, actors' Encoder): SigLIP texts equal its processor
    with padding="max_length" + model. Images take the load_info -> ImageSpec path the tests above take."""
    from mieb_ray.io import embeddings
    from mieb_ray.pipelines.embed import EmbedConfig, embed

    keys = [f"t/{i}" for i in range(len(TEXTS))]
    table = str(tmp_path / "table.parquet")
    pq.write_table(pa.table({"key": keys, "text": TEXTS}), table)
    out = str(tmp_path / "out")
    manifest = embed(EmbedConfig(table, out, saved("siglip"), modality="text", batch_size=3, workers=1,
                                 cpus_per_worker=0.5), log=lambda _: None)
    assert manifest["model"]["family"] == "siglip" and manifest["model"]["max_text_length"] == 64
    rows = {}
    for uri in embeddings.shard_uris(out):
        shard = embeddings.open_shard(uri)
        rows.update(zip(shard.column("key").to_pylist(), embeddings.matrix(shard)))
    want = reference_texts(reference, "siglip", TEXTS, padding="max_length", truncation=True, max_length=64)
    np.testing.assert_allclose(np.stack([rows[k] for k in keys]), want, atol=1e-5)


def test_family_registry():
    assert families.family_of("clip") is families.CLIP and families.family_of("siglip") is families.SIGLIP
    assert families.family_of("chinese_clip") is families.GENERIC and families.family_of(None) is families.GENERIC
    assert families.CLIP.tokenizer_kwargs(77)["padding"] is True
    assert set(families.BY_NAME) == {"clip", "siglip", "siglip2-naflex", "generic"}
    assert model.families is families
