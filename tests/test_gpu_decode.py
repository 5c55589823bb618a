"""`embed --decode gpu`: the device path (mieb_ray/encode/gpu_decode.py) against the CPU path.

What needs no torchvision runs everywhere: routing by header, EXIF orientation, the torch resize and crop, and
the embeddings of its pixels against the processor + model (test_equivalence's bar). The decoder itself needs
torchvision: on the CPU where it imports, and nvJPEG only where CUDA is (skipped otherwise, never faked).
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from test_equivalence import BAR, centred_cosine, decoded, photos, reference
from test_preprocess import bad_inputs, encode, picture, with_orientation

from mieb_ray.encode import gpu_decode
from mieb_ray.encode.gpu_decode import DeviceDecoder, resize_crop, route, upright
from mieb_ray.encode.preprocess import ImageError, ImageSpec, load_image, normalize
from mieb_ray.errors import UserError

SPEC = ImageSpec(height=224, width=224, resize_shortest_edge=224, resample=3, do_center_crop=True,
                 mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711),
                 rescale_factor=1 / 255)
needs_torchvision = pytest.mark.skipif(gpu_decode.device_decode_available("cpu") is not None,
                                       reason="torchvision's decode_jpeg is not importable here")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def device_path_pixels(data: bytes, spec: ImageSpec) -> torch.Tensor:
    """The device path after its decode: a full decode (here Pillow's libjpeg-turbo; on a GPU nvJPEG) as
    stored, made upright, resized and cropped by gpu_decode. Images route() sends to the CPU go there."""
    orientation = route(data)
    if orientation is None:
        return torch.from_numpy(load_image(data, spec))
    stored = np.array(Image.open(io.BytesIO(data)).convert("RGB"))
    return resize_crop([upright(torch.from_numpy(stored).permute(2, 0, 1), orientation)], spec)[0]


def test_route_sends_rgb_and_grey_jpegs_to_the_device_and_the_rest_to_the_cpu():
    photo = picture("coffee.jpg")
    assert route(encode(photo, "JPEG")) == 1
    assert route(encode(photo.convert("L"), "JPEG")) == 1
    assert route(with_orientation(photo, "JPEG", 6)) == 6
    assert route(encode(photo, "PNG")) is None
    assert route(encode(photo.convert("CMYK"), "JPEG")) is None
    assert route(encode(photo, "JPEG")[:-100]) is None  # truncated: the CPU path says so
    assert route(b"not an image") is None and route(b"") is None and route(None) is None
    assert route(encode(photo, "JPEG"), max_pixels=100) is None  # too large: the CPU path names it


@pytest.mark.parametrize("orientation", range(1, 9))
def test_upright_is_pils_exif_transpose(orientation):
    data = with_orientation(picture("astronaut.jpg").resize((60, 40)), "PNG", orientation)
    stored = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).permute(2, 0, 1)
    want = np.array(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    assert np.array_equal(upright(stored, orientation).permute(1, 2, 0).numpy(), want)


@pytest.mark.parametrize("size", [(1600, 1200), (320, 240), (500, 375), (32, 32), (120, 300), (224, 224)])
def test_resize_crop_is_within_a_few_levels_of_the_cpu_path(size):
    """Against load_image on a PNG (decoded in full, PIL's bicubic): the same size and crop offsets, and
    only the filter's small difference. A crop off by one pixel would fail the mean."""
    data = encode(picture("chelsea.jpg").resize(size), "PNG")
    ours = device_path_pixels(encode(picture("chelsea.jpg").resize(size), "JPEG", quality=95), SPEC)
    theirs = load_image(data, SPEC).astype(np.int16)
    jpeg_only = load_image(encode(picture("chelsea.jpg").resize(size), "JPEG", quality=95), SPEC).astype(np.int16)
    diff = np.abs(ours.numpy().astype(np.int16) - theirs)
    assert ours.shape == (224, 224, 3) and ours.dtype == torch.uint8
    # the JPEG's own loss plus the filter's difference
    assert diff.mean() <= np.abs(jpeg_only - theirs).mean() + 1.5, diff.mean()


def test_crop_larger_than_the_resize_pads_with_zeros():
    spec = ImageSpec(height=8, width=8, resize_shortest_edge=4, resample=3, do_center_crop=True,
                     mean=(0, 0, 0), std=(1, 1, 1), rescale_factor=1 / 255)
    data = encode(Image.new("RGB", (8, 4), (200, 100, 50)), "PNG")
    ours = resize_crop([torch.from_numpy(np.array(Image.open(io.BytesIO(data)))).permute(2, 0, 1)], spec)[0]
    assert np.array_equal(ours.numpy(), load_image(data, spec))


def test_images_of_one_size_are_resized_together_as_alone():
    images = [torch.from_numpy(np.array(picture(n).convert("RGB").resize((96, 64)))).permute(2, 0, 1)
              for n in ("coffee.jpg", "rocket.jpg", "brick.jpg")]
    together = resize_crop(images + [images[0][:, :50]], SPEC)
    for i, x in enumerate(images + [images[0][:, :50]]):
        assert torch.equal(together[i], resize_crop([x], SPEC)[0])


def test_device_path_embeddings_match_the_processor_and_model(tiny_clip):
    """test_equivalence's photos and bar (centred cosine >= 0.95), through the device path's pixels."""
    from transformers import CLIPModel, CLIPProcessor

    from mieb_ray.encode.model import Encoder, load_info

    encoder = Encoder(tiny_clip, load_info(tiny_clip, tiny_clip, None))
    spec = ImageSpec.from_processor_config(encoder.info.image_config)
    models = (encoder, spec, CLIPProcessor.from_pretrained(tiny_clip), CLIPModel.from_pretrained(tiny_clip).eval())
    cases = photos()
    ref = reference(models, [decoded(b) for b in cases.values()])
    pixels = torch.stack([device_path_pixels(b, spec) for b in cases.values()])
    scores = centred_cosine(encoder.encode_pixel_values(normalize(pixels, spec)), ref, ref.mean(0))
    print(dict(zip(cases, np.round(scores, 4))))
    assert scores.min() >= BAR


def test_resolve():
    assert gpu_decode.resolve("auto", 0) == "cpu"
    assert gpu_decode.resolve("gpu", 0) == "gpu" and gpu_decode.resolve("cpu", 1) == "cpu"
    with pytest.raises(ValueError, match="unknown decode mode"):
        gpu_decode.resolve("nvjpeg", 1)
    # auto: gpu when the encoders have GPUs and torchvision imports (the driver may have no GPU itself)
    assert gpu_decode.resolve("auto", 1) == ("gpu" if gpu_decode.device_decode_available("cpu") is None else "cpu")


@pytest.mark.skipif(gpu_decode.device_decode_available("cuda") is None, reason="this machine can decode on CUDA")
def test_under_auto_an_encoder_that_cannot_decode_on_its_device_decodes_on_its_cpu():
    items = [encode(picture("china.jpg"), "JPEG", quality=90), encode(picture("coffee.jpg"), "PNG"), b"not an image"]
    decoder = DeviceDecoder(SPEC, "cuda" if torch.cuda.is_available() else "cpu", strict=False)
    if decoder.on_device:
        pytest.skip("torchvision decodes on this device")
    pixels, errors = decoder(items)
    want, want_errors = zip(*[(load_image(d, SPEC), None) if i < 2 else (np.zeros((224, 224, 3), np.uint8),
                                                                          "not an image")
                              for i, d in enumerate(items)])
    assert errors == list(want_errors) and np.array_equal(pixels.cpu().numpy(), np.stack(want))
    assert decoder.device_rows == 0 and decoder.cpu_rows == 3


@pytest.mark.skipif(gpu_decode.device_decode_available("cuda") is None, reason="this machine can decode on CUDA")
def test_a_device_that_cannot_decode_is_one_line():
    with pytest.raises(UserError, match="--decode gpu cannot decode on cuda: .*; use --decode cpu"):
        DeviceDecoder(SPEC, "cuda")


def check_decoder(device: str):
    photo = picture("china.jpg")
    items = {
        "jpeg": encode(photo, "JPEG", quality=90),
        "grey jpeg": encode(photo.convert("L"), "JPEG", quality=90),
        "rotated jpeg": with_orientation(photo, "JPEG", 8, quality=90),
        "png": encode(photo.resize((64, 48)), "PNG"),
        "cmyk jpeg": encode(photo.convert("CMYK"), "JPEG", quality=90),
        **{name: data for name, (data, _) in bad_inputs().items()},
        "missing": None,
    }
    decoder = DeviceDecoder(SPEC, device, batch=2)
    pixels, errors = decoder(list(items.values()))
    assert pixels.device.type == torch.device(device).type and pixels.shape == (len(items), 224, 224, 3)
    assert decoder.device_rows == 3 and decoder.cpu_rows == len(items) - 3
    for (name, data), got, error in zip(items.items(), pixels.cpu(), errors):
        if data is None or name in bad_inputs():
            want = "missing image" if data is None else None
            if want is None:
                with pytest.raises(ImageError) as exc:
                    load_image(data, SPEC)
                want = str(exc.value)
            assert error == want, name
            assert not got.any(), name
        else:
            assert error is None, name
            diff = (got.numpy().astype(np.int16) - device_path_pixels(data, SPEC).numpy()).__abs__()
            assert diff.mean() < 1.0, (name, diff.mean())


@needs_torchvision
def test_decoder_on_the_cpu_with_torchvision():
    check_decoder("cpu")


@needs_cuda
@needs_torchvision
def test_decoder_on_cuda_with_nvjpeg():
    check_decoder("cuda")


# ---- the embed job with --decode gpu ---------------------------------------------------------------------


def mixed_table(path) -> list[str]:
    """A table of JPEGs (colour, grey, rotated, large), a PNG, a CMYK JPEG and bad images; its keys."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    photo = picture("coffee.jpg")
    images = {"jpeg": encode(photo, "JPEG", quality=90), "grey": encode(photo.convert("L"), "JPEG"),
              "rotated": with_orientation(picture("astronaut.jpg"), "JPEG", 6), "png": encode(photo, "PNG"),
              "large": encode(picture("china.jpg").resize((1600, 1200)), "JPEG", quality=90),
              "cmyk": encode(photo.convert("CMYK"), "JPEG"), **{f"bad {k}": d for k, (d, _) in bad_inputs().items()}}
    pq.write_table(pa.table({"key": list(images), "image": pa.array(list(images.values()), pa.binary())}), path)
    return list(images)


def errors_of(out: str, manifest: dict) -> dict[str, str]:
    import pyarrow as pa

    return {r["key"]: r["error"] for f in manifest["error_files"]
            for r in pa.ipc.open_file(os.path.join(out, f)).read_all().to_pylist()}


def test_decode_gpu_without_torchvision_is_one_line_before_ray(tiny_clip, tmp_path, capsys):
    if gpu_decode.device_decode_available("cpu") is None:
        pytest.skip("torchvision imports here")
    from mieb_ray.cli import main

    mixed_table(tmp_path / "t.parquet")
    code = main(["embed", "--input", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "out"), "--model",
                 tiny_clip, "--decode", "gpu", "--address", "127.0.0.1:9"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith("mieb-ray: error: --decode gpu needs torchvision: ")
    assert not os.path.exists(tmp_path / "out")


@needs_torchvision
@pytest.mark.timeout(600)
def test_embed_job_decoding_on_the_encoders_device(ray_local, tiny_clip, tmp_path):
    """--decode gpu on a CPU encoder (torchvision's CPU decoder; nvJPEG where CUDA is): the same rows and error
    rows as --decode cpu, embeddings equal to the bar."""
    from mieb_ray.io import embeddings
    from mieb_ray.pipelines.embed import EmbedConfig, embed

    keys = mixed_table(tmp_path / "t.parquet")
    runs = {}
    for decode in ("cpu", "gpu"):
        out = str(tmp_path / decode)
        manifest = embed(EmbedConfig(str(tmp_path / "t.parquet"), out, tiny_clip, decode=decode, gpus_per_worker=0,
                                     max_error_rate=1.0), log=print)
        got, vectors = embeddings.read_all(out)
        runs[decode] = dict(zip(got, vectors)), errors_of(out, manifest), manifest
    (cpu, cpu_errors, _), (gpu, gpu_errors, manifest) = runs["cpu"], runs["gpu"]
    assert manifest["config"]["decode"] == "gpu"
    assert gpu_errors == cpu_errors and set(cpu_errors) == {k for k in keys if k.startswith("bad ")}
    assert sorted(gpu) == sorted(cpu) == sorted(k for k in keys if not k.startswith("bad "))
    a, b = np.stack([cpu[k] for k in sorted(cpu)]), np.stack([gpu[k] for k in sorted(cpu)])
    mean = (a.mean(0) + b.mean(0)) / 2  # few rows: the mean of both paths' embeddings
    assert centred_cosine(b, a, mean).min() >= BAR
