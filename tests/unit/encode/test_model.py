"""Model loading and encoding against transformers' own CLIP path, on a tiny random CLIP (from a folder, or a server
in the hub's image; no Ray)."""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from PIL import Image
from support import fakehub, paths
from transformers import BertConfig, BertModel, CLIPModel, CLIPProcessor

from mieb_ray.demo_data.models import make_tiny_clip
from mieb_ray.encode.model import Encoder, ModelInfo, describe, load_info, resolve
from mieb_ray.errors import UserError

PICTURES = sorted(glob.glob(str(paths.PICTURES / "*.jpg")))
TEXTS = ["a photo of a crab.", "a photo of a cat.", "A blurry photo of the Hubble deep field, in the dark!"]
LONG = "a photo of a " + "very " * 30 + "long crab."  # ~160 characters: over 77 tokens with a char tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_clip(str(tmp_path_factory.mktemp("tiny-clip")))


@pytest.fixture(scope="module")
def info(tiny) -> ModelInfo:
    return load_info(resolve(tiny), tiny, None)


@pytest.fixture(scope="module")
def reference(tiny):
    return CLIPModel.from_pretrained(tiny).eval(), CLIPProcessor.from_pretrained(tiny)


@pytest.fixture(scope="module")
def pixel_values(reference) -> torch.Tensor:
    assert len(PICTURES) >= 8
    return reference[1](images=[Image.open(p).convert("RGB") for p in PICTURES], return_tensors="pt")["pixel_values"]


@pytest.fixture(scope="module")
def reference_images(reference, pixel_values) -> np.ndarray:
    with torch.no_grad():
        out = reference[0].get_image_features(pixel_values=pixel_values).pooler_output
    return torch.nn.functional.normalize(out, dim=-1).numpy()


def centred(a: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Random CLIPs put all images in a narrow cone, so raw cosines near 1 prove little: compare directions
    around the pictures' mean instead."""
    a = a - mean
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def test_resolve_and_info_of_a_local_dir(tiny, info):
    assert resolve(tiny) == tiny
    assert info == ModelInfo(name=tiny, revision=None, architecture="CLIPModel", family="clip", dim=32,
                             image_config=info.image_config, max_text_length=77)
    assert info.image_config["crop_size"] == {"height": 64, "width": 64}
    assert info.image_config["resample"] == 3 and info.to_dict()["dim"] == 32
    assert load_info(tiny, tiny, None, modality="text").dim == 32


def test_fixture_is_deterministic(tiny, tmp_path):
    again = make_tiny_clip(str(tmp_path / "again"))
    assert sorted(os.listdir(again)) == sorted(os.listdir(tiny))
    for name in os.listdir(tiny):
        assert open(os.path.join(again, name), "rb").read() == open(os.path.join(tiny, name), "rb").read(), name


def test_images_equal_transformers(tiny, info, pixel_values, reference_images):
    ours = Encoder(tiny, info, device="cpu").encode_pixel_values(pixel_values)
    assert ours.dtype == np.float32 and ours.shape == (len(PICTURES), 32)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(ours, reference_images, atol=1e-5)

    mean = reference_images.mean(0)
    cos = centred(ours, mean) @ centred(reference_images, mean).T
    assert cos.diagonal().min() >= 0.999
    # each picture against the others: clearly lower, so the centred check above can fail
    assert cos[~np.eye(len(PICTURES), dtype=bool)].max() < 0.98


def test_the_actor_path_uint8_then_normalize_matches_the_processor(tiny, info, reference_images):
    """What the embed job does: CPU tasks decode to uint8 at the model's size, the actor normalises and encodes."""
    from mieb_ray.encode.preprocess import ImageSpec, load_images, normalize

    spec = ImageSpec.from_processor_config(info.image_config)
    pixels, errors = load_images([open(p, "rb").read() for p in PICTURES], spec)
    assert errors == [None] * len(PICTURES)
    encoder = Encoder(tiny, info, device="cpu")
    ours = encoder.encode_pixel_values(normalize(torch.from_numpy(pixels), spec, encoder.dtype))
    mean = reference_images.mean(0)
    # not exact: load_image decodes JPEGs in draft mode at DRAFT_FACTOR 1, here at 1/8 or 1/4 scale for this
    # model's 64 px (0.9973 at worst, against 0.999 at factor 2); the project's bar is 0.95 (test_equivalence),
    # and another picture scores below 0.98 (test_images_equal_transformers), so this still tells them apart
    assert (centred(ours, mean) * centred(reference_images, mean)).sum(1).min() >= 0.995


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_on_cpu_is_close_to_float32(tiny, info, pixel_values, reference_images, dtype):
    encoder = Encoder(tiny, info, dtype=dtype, device="cpu")
    assert encoder.device.type == "cpu" and next(encoder.model.parameters()).dtype == getattr(torch, dtype)
    ours = encoder.encode_pixel_values(pixel_values)
    assert ours.dtype == np.float32
    mean = reference_images.mean(0)
    assert (centred(ours, mean) * centred(reference_images, mean)).sum(1).min() > 0.99


def test_auto_dtype_is_float32_on_cpu(tiny, info):
    assert Encoder(tiny, info, device="cpu").dtype == torch.float32
    with pytest.raises(UserError, match="unknown dtype 'fp8'"):
        Encoder(tiny, info, dtype="fp8", device="cpu")


def reference_texts(reference, texts, **kwargs) -> np.ndarray:
    model, processor = reference
    with torch.no_grad():
        out = model.get_text_features(**processor(text=texts, padding=True, return_tensors="pt", **kwargs))
    return torch.nn.functional.normalize(out.pooler_output, dim=-1).numpy()


def test_texts_equal_transformers(tiny, info, reference):
    encoder = Encoder(tiny, info, device="cpu")
    ours = encoder.encode_texts(TEXTS)
    assert ours.dtype == np.float32 and ours.shape == (3, 32)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(ours, reference_texts(reference, TEXTS), atol=1e-5)
    assert encoder.encode_texts([]).shape == (0, 32)


def test_long_text_is_truncated_to_77_tokens(tiny, info, reference):
    assert len(reference[1].tokenizer(LONG)["input_ids"]) > 77
    ours = Encoder(tiny, info, device="cpu").encode_texts([LONG, TEXTS[0]])
    expected = reference_texts(reference, [LONG, TEXTS[0]], truncation=True, max_length=77)
    np.testing.assert_allclose(ours, expected, atol=1e-5)


def test_missing_path_is_a_user_error(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(UserError, match=f"model path {missing} does not exist"):
        resolve(missing)


def test_model_without_image_features_fails_from_its_config(tmp_path):
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32)
    BertModel(config).save_pretrained(str(tmp_path))
    with pytest.raises(UserError, match=r"\(BertModel\) cannot embed images: it has no get_image_features"):
        load_info(resolve(str(tmp_path)), str(tmp_path), None)
    with pytest.raises(UserError, match=r"\(BertModel\) cannot embed texts: it has no get_text_features"):
        load_info(str(tmp_path), str(tmp_path), None, modality="text")


@pytest.mark.parametrize("config, line", [
    ('{"model_type": "clip",', "config.json is not valid JSON (Expecting property name enclosed in double quotes"),
    ("[1]", "config.json holds a JSON list, not an object"),
    ('{"architectures": "CLIPModel"}', "config.json's model_type is not a string or its architectures not a list"),
    ('{"model_type": ["clip"]}', "config.json's model_type is not a string or its architectures not a list"),
])
def test_a_config_json_transformers_did_not_write_is_one_line(tiny, tmp_path, config, line):
    shutil.copytree(tiny, tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(config)
    with pytest.raises(UserError) as caught:
        load_info(str(tmp_path / "m"), "m", None)
    assert str(caught.value).startswith(f"model m: {line}")


def test_weights_their_config_cannot_load_are_one_line(tiny, info, tmp_path):
    """Truncated weights (a download cut short), and weights of another size than config.json says (the tiny model's
    weights under CLIP's default config): one line when the encoder loads them, no trace."""
    truncated, resized = shutil.copytree(tiny, tmp_path / "truncated"), shutil.copytree(tiny, tmp_path / "resized")
    weights = tmp_path / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    (tmp_path / "resized" / "config.json").write_text('{"model_type": "clip", "architectures": ["CLIPModel"]}')
    expected = {truncated: "Error while deserializing header: incomplete metadata, file not fully covered",
                resized: "its weights' shapes are not those its config.json gives"}
    for path, why in expected.items():
        with pytest.raises(UserError) as caught:
            Encoder(str(path), info, device="cpu")
        assert str(caught.value) == f"model {info.name} (CLIPModel) cannot be loaded from its files: {why}"


def test_hub_name_while_offline_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once, at import
    with pytest.raises(UserError) as caught:
        resolve("openai/clip-vit-base-patch32", cache_dir=str(tmp_path))
    message = str(caught.value)
    assert "\n" not in message and "openai/clip-vit-base-patch32" in message and "3d74acf9" in message


def test_hub_snapshot_in_the_cache_resolves_offline_to_its_commit(tiny, tmp_path, monkeypatch):
    """What an actor does: resolve(info.name, info.revision) from the node's HF cache, touching no network."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--someone--tiny-clip"
    shutil.copytree(tiny, repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)

    path = resolve("someone/tiny-clip", revision="main", cache_dir=str(tmp_path))
    assert path == str(repo / "snapshots" / sha)
    assert load_info(path, "someone/tiny-clip", "main").revision == sha  # the commit, not the branch
    assert resolve("someone/tiny-clip", revision=sha, cache_dir=str(tmp_path)) == path


@pytest.fixture
def model_hub(tiny, tmp_path, monkeypatch):
    """The hub, serving `someone/tiny-clip` (the tiny CLIP's files, and the TF and Flax copies and a PyTorch pickle
    of its weights that the real openai repos hold too) and `someone/tf-only` (a config and TF weights), to a
    machine that never loaded either."""
    full = tmp_path / "full"
    shutil.copytree(tiny, full)
    for other in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack", "README.md"):
        (full / other).write_bytes(b"other weights or a model card")
    tf_only = tmp_path / "tf-only"
    tf_only.mkdir()
    shutil.copy(full / "config.json", tf_only)
    shutil.copy(full / "tf_model.h5", tf_only)
    hub = fakehub.serve_models(monkeypatch, str(tmp_path / "hub"),
                               {"someone/tiny-clip": str(full), "someone/tf-only": str(tf_only)})
    yield hub
    hub.stop()


def test_a_job_describes_a_hub_model_from_its_small_files_without_downloading_its_weights(tiny, model_hub):
    """The driver (a cluster's head) needs the config, the tokenizer and the processor; the weights are the
    encoders', on their own nodes (openai/clip-vit-large-patch14's are 1.7 GB)."""
    info, made_by = describe("someone/tiny-clip")
    small = sorted(f for f in os.listdir(tiny) if f.endswith(".json"))
    assert model_hub.downloads() == small
    assert info.revision == fakehub.commit("someone/tiny-clip")  # main, resolved to its commit
    assert made_by == {"name": "someone/tiny-clip", "revision": info.revision}
    assert info == load_info(tiny, "someone/tiny-clip", info.revision)


def test_an_encoder_downloads_one_weight_format_once_and_then_reads_its_cache(tiny, model_hub):
    info, _ = describe("someone/tiny-clip")
    seen = len(model_hub.requests)
    path = resolve("someone/tiny-clip", info.revision)
    assert model_hub.downloads(seen) == ["model.safetensors"]  # not the pickle, TF or Flax copies
    assert sorted(os.listdir(path)) == sorted(f for f in os.listdir(tiny) if f.endswith((".json", ".safetensors")))
    for name in os.listdir(path):
        assert (Path(path) / name).read_bytes() == (Path(tiny) / name).read_bytes(), name
    seen = len(model_hub.requests)
    assert resolve("someone/tiny-clip", info.revision) == path
    assert model_hub.requests[seen:] == []  # every other encoder on the node


def test_a_hub_model_without_weights_transformers_loads_is_one_line_and_downloads_nothing_big(model_hub):
    for where in (describe, resolve):
        with pytest.raises(UserError) as caught:
            where("someone/tf-only")
        assert str(caught.value) == "model someone/tf-only has no weights (*.safetensors or pytorch_model*.bin)"
    assert model_hub.downloads() == ["config.json"]  # once: the second asked the cache


def test_a_hub_outage_longer_than_the_clients_retries_is_one_line_naming_the_hubs_answer(model_hub, monkeypatch):
    import huggingface_hub.utils._http as hub_http

    monkeypatch.setattr(hub_http, "time", SimpleNamespace(sleep=lambda seconds: None))  # its backoff, not its waits
    info, _ = describe("someone/tiny-clip")
    model_hub.outage["model.safetensors"] = 100  # every try of the encoder's download
    with pytest.raises(UserError) as caught:
        resolve("someone/tiny-clip", info.revision)
    assert str(caught.value) == (
        f"model someone/tiny-clip is not a local directory and cannot be fetched from the Hugging Face hub at "
        f"revision {info.revision}: the hub kept failing: HfHubHTTPError: Server error '503 Service Unavailable' "
        f"for url '{model_hub.url}/someone/tiny-clip/resolve/{info.revision}/model.safetensors'")
    assert model_hub.outage["model.safetensors"] < 100 - 1  # the client's own retries came first
    model_hub.outage.clear()
    assert "model.safetensors" in os.listdir(resolve("someone/tiny-clip", info.revision))  # once the hub answers


def test_a_hub_model_that_is_not_there_or_not_for_us_is_one_line_that_says_which(model_hub, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    cases = {
        ("someone/tiny-clp", None): "model someone/tiny-clp is not a local directory, and the hub has no model repo "
                                    "someone/tiny-clp (or it is private and HF_TOKEN gives no access to it)",
        ("someone/tiny-clip", "v2"): "model someone/tiny-clip has no revision v2 on the hub (a commit, branch or tag)",
    }
    for (name, revision), message in cases.items():
        with pytest.raises(UserError) as caught:
            describe(name, revision)
        assert str(caught.value) == message
    model_hub.token, model_hub.gated = "granted", {"someone/tiny-clip"}
    with pytest.raises(UserError) as caught:
        describe("someone/tiny-clip")
    assert str(caught.value) == ("model someone/tiny-clip is gated on the hub: accept its conditions on its page, "
                                 "then set HF_TOKEN to a token of that account")
