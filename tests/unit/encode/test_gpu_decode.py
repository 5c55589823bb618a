"""`embed --decode gpu`: the device path (mieb_ray/encode/gpu_decode.py) against the CPU path.

What needs no torchvision runs everywhere: routing by header, EXIF orientation, the torch resize and crop with
the model's filter, the read tasks' split, and the embeddings of the device path's pixels against the processor
+ model (test_equivalence's bar). The decoder's own logic (chunks, halving around a bad JPEG, CUDA errors raised,
the start-up probe, the counts per path) runs on tests/support/torchvision_standin.py; the real torchvision decoder on
the CPU where it imports, and nvJPEG only where CUDA is (skipped otherwise, failed under MIEB_REQUIRE_GPU=1).
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image, ImageOps
from support import models
from support.equivalence import BAR, centred_cosine, decoded, photos, reference
from support.paths import ROOT
from support.pictures import bad_inputs, encode, picture, with_orientation

from mieb_ray.demo_data.models import make_tiny_clip
from mieb_ray.encode import families, gpu_decode
from mieb_ray.encode.gpu_decode import DeviceDecoder, Route, resize_crop, route, upright
from mieb_ray.encode.preprocess import ImageError, ImageSpec, load_image, load_images, normalize
from mieb_ray.errors import UserError

SPEC = ImageSpec(height=224, width=224, resize_shortest_edge=224, resample=3, do_center_crop=True,
                 mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711),
                 rescale_factor=1 / 255)


def device_path_pixels(data: bytes, spec: ImageSpec) -> torch.Tensor:
    """The device path after its decode: a full decode (here Pillow's libjpeg-turbo; on a GPU nvJPEG) as
    stored, made upright, resized and cropped by gpu_decode. Images route() sends to the CPU go there."""
    how = route(data, spec)
    if how is None:
        return torch.from_numpy(load_image(data, spec))
    stored = np.array(Image.open(io.BytesIO(data)).convert("RGB"))
    return resize_crop([upright(torch.from_numpy(stored).permute(2, 0, 1), how.orientation)], spec)[0]


def test_route_sends_rgb_and_grey_jpegs_to_the_device_and_the_rest_to_the_cpu():
    photo = picture("coffee.jpg")
    w, h = photo.size
    assert route(encode(photo, "JPEG"), SPEC) == Route(1, w * h)
    assert route(encode(photo.convert("L"), "JPEG"), SPEC) == Route(1, w * h)
    assert route(with_orientation(photo, "JPEG", 6), SPEC) == Route(6, w * h)
    assert route(encode(photo, "PNG"), SPEC) is None
    assert route(encode(photo.convert("CMYK"), "JPEG"), SPEC) is None
    assert route(encode(photo, "JPEG", progressive=True), SPEC) is None  # host-side Huffman: the read tasks'
    assert route(encode(photo, "JPEG") + b"trailing bytes", SPEC) is None
    assert route(encode(photo, "JPEG")[:-100], SPEC) is None  # truncated: the CPU path says so
    assert route(b"not an image", SPEC) is None and route(b"", SPEC) is None and route(None, SPEC) is None
    assert route(encode(photo, "JPEG"), SPEC, max_pixels=100) is None  # too large: the CPU path names it


def test_route_sends_downscales_past_the_device_resizes_limit_to_the_cpu():
    """An 8 px model: 8 x MAX_DOWNSCALE = 256 px is the largest short side the device shrinks (either side)."""
    tiny = ImageSpec(height=8, width=8, resize_shortest_edge=8, resample=3, do_center_crop=True,
                     mean=(0, 0, 0), std=(1, 1, 1), rescale_factor=1 / 255)
    assert route(encode(Image.new("RGB", (384, 256)), "JPEG"), tiny) == Route(1, 384 * 256)
    assert route(encode(Image.new("RGB", (384, 264)), "JPEG"), tiny) is None
    assert route(encode(Image.new("RGB", (264, 384)), "JPEG"), tiny) is None
    square = ImageSpec(**{**tiny.to_dict(), "resize_shortest_edge": None})  # a fixed 8x8 resize: the long side
    assert route(encode(Image.new("RGB", (256, 100)), "JPEG"), square) == Route(1, 256 * 100)
    assert route(encode(Image.new("RGB", (264, 100)), "JPEG"), square) is None


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

    encoder = Encoder(tiny_clip, load_info(tiny_clip, tiny_clip, None), device="cpu")
    spec = ImageSpec.from_processor_config(encoder.info.image_config)
    models = (encoder, spec, CLIPProcessor.from_pretrained(tiny_clip), CLIPModel.from_pretrained(tiny_clip).eval())
    cases = photos()
    ref = reference(models, [decoded(b) for b in cases.values()])
    pixels = torch.stack([device_path_pixels(b, spec) for b in cases.values()])
    scores = centred_cosine(encoder.encode_pixel_values(normalize(pixels, spec)), ref, ref.mean(0))
    print(dict(zip(cases, np.round(scores, 4))))
    assert scores.min() >= BAR


def test_resolve():
    assert gpu_decode.resolve("auto", 0, SPEC) == ("cpu", "--decode auto: the encoders have no GPU")
    assert gpu_decode.resolve("gpu", 0, SPEC)[0] == "gpu" and gpu_decode.resolve("cpu", 1, SPEC)[0] == "cpu"
    with pytest.raises(ValueError, match="unknown decode mode"):
        gpu_decode.resolve("nvjpeg", 1, SPEC)
    # auto: gpu when the encoders have GPUs and torchvision imports (the driver may have no GPU itself)
    problem = gpu_decode.torchvision_problem()
    want = ("gpu", "--decode auto: the encoders have GPUs and torchvision imports") if problem is None \
        else ("cpu", f"--decode auto: {problem}")
    assert gpu_decode.resolve("auto", 1, SPEC) == want


def test_auto_decodes_on_the_cpus_where_they_outrun_the_device_path():
    """The measured feeds (gpu_decode.CPU_DECODE_PER_CORE, DEVICE_DECODE_PER_GPU): 16 CPUs per GPU (the H200
    machine) decode about 6,400 images/s against the device path's 2,400, so auto takes the CPUs (there, the job's
    steady rate was 4,346 rows/s on the CPUs' feed against 2,569 on the device's); 2 CPUs per GPU decode 800 and
    auto takes the device, where torchvision can."""
    mode, why = gpu_decode.resolve("auto", 1, SPEC, cpus_per_gpu=16)
    assert mode == "cpu" and "16 CPUs per GPU decode about 6,400 images/s" in why
    problem = gpu_decode.torchvision_problem()
    assert gpu_decode.resolve("auto", 1, SPEC, cpus_per_gpu=2)[0] == ("cpu" if problem else "gpu")
    assert gpu_decode.resolve("gpu", 1, SPEC, cpus_per_gpu=16)[0] == "gpu"  # asked for: taken


@pytest.fixture(scope="module")
def family_specs(tmp_path_factory) -> dict[str, ImageSpec]:
    """The image spec of each family's tiny model, as its processor resolves it (CLIP and SigLIP bicubic,
    fixed-resolution SigLIP2 bilinear)."""
    root = tmp_path_factory.mktemp("families")
    makers = {"clip": make_tiny_clip, "siglip": models.make_tiny_siglip, "siglip2": models.make_tiny_siglip2}
    return {kind: ImageSpec.from_processor_config(families.image_config(make(str(root / kind))))
            for kind, make in makers.items()}


@pytest.mark.parametrize("kind", ["clip", "siglip", "siglip2"])
def test_the_device_resize_uses_each_familys_filter(family_specs, kind):
    """resize_crop (the same function on a cpu or cuda tensor) against the CPU path (a PNG: decoded in full) with
    the family's own filter, closer than with the other filter: a resize that ignored the spec's filter fails."""
    spec = family_specs[kind]
    assert spec.resample == {"clip": 3, "siglip": 3, "siglip2": 2}[kind] and gpu_decode.filter_problem(spec) is None
    data = encode(picture("astronaut.jpg").resize((300, 200)), "PNG")
    stored = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).permute(2, 0, 1)
    ours = resize_crop([stored], spec)[0].numpy().astype(np.int16)
    other = ImageSpec(**{**spec.to_dict(), "resample": 5 - spec.resample})  # bicubic <-> bilinear
    diff = np.abs(ours - load_image(data, spec).astype(np.int16)).mean()
    assert diff < 0.5 and diff < np.abs(ours - load_image(data, other).astype(np.int16)).mean() / 2


@pytest.mark.parametrize("resample", [0, 1, 4, 5])  # nearest, Lanczos, box, Hamming
def test_a_filter_torch_lacks_goes_to_the_cpu(resample):
    spec = ImageSpec(**{**SPEC.to_dict(), "resample": resample})
    name = {0: "nearest", 1: "lanczos", 4: "box", 5: "hamming"}[resample]
    problem = f"the model resizes with Pillow's {name} filter, which torch cannot compute on a device"
    assert gpu_decode.filter_problem(spec) == problem
    assert gpu_decode.resolve("auto", 1, spec) == ("cpu", f"--decode auto: {problem}")
    with pytest.raises(UserError, match=f"^--decode gpu: {problem}; use --decode cpu or auto$"):
        gpu_decode.resolve("gpu", 1, spec)


def test_a_resize_group_that_fails_goes_to_on_error_and_a_cuda_error_is_raised(monkeypatch):
    import torch.nn.functional as F

    images = [torch.zeros((3, 40, 60), dtype=torch.uint8), torch.zeros((3, 50, 50), dtype=torch.uint8),
              torch.zeros((3, 40, 60), dtype=torch.uint8)]
    real = F.interpolate

    def failing(x, **kwargs):
        if x.shape[-1] == 60:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 48.00 GiB")
        return real(x, **kwargs)

    monkeypatch.setattr(F, "interpolate", failing)
    failed = []
    resize_crop(images, SPEC, on_error=failed.extend)
    assert failed == [0, 2]
    with pytest.raises(torch.OutOfMemoryError):  # no on_error: raised
        resize_crop(images, SPEC)

    def sticky(x, **kwargs):
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(F, "interpolate", sticky)
    with pytest.raises(torch.AcceleratorError):  # the device is gone: never a fall-back
        resize_crop(images, SPEC, on_error=failed.extend)


def test_chunks_are_bounded_by_count_and_by_pixels(torchvision_standin):
    decoder = DeviceDecoder(SPEC, "cpu", batch=3, chunk_pixels=100)
    routes = [(i, Route(1, p)) for i, p in enumerate([10, 20, 30, 60, 50, 500, 5, 5, 5, 5])]
    got = [[i for i, _ in chunk] for chunk in decoder._chunks(routes)]
    assert got == [[0, 1, 2], [3], [4], [5], [6, 7, 8], [9]]  # 60 + 50 > 100; 500 alone


def jpegs(n: int) -> list[bytes]:
    return [encode(picture("coffee.jpg").resize((64 + i, 48)), "JPEG", quality=90) for i in range(n)]


def test_one_bad_jpeg_is_isolated_by_halving_not_by_decoding_one_by_one(torchvision_standin):
    items = jpegs(16)
    jpeg = items[11]
    scan = jpeg.find(b"\xff\xda")
    noise = np.random.default_rng(0).bytes(4000)
    items[11] = jpeg[:scan + 14] + noise + b"\xff\xd9"  # a valid header and end: route takes it
    assert route(items[11], SPEC) is not None
    decoder = DeviceDecoder(SPEC, "cpu")
    torchvision_standin.calls.clear()
    got = decoder(items)
    assert got.on_device.tolist() == [i != 11 for i in range(16)]
    # 1 + 2 log2(16) calls, not 1 + 16: each failed batch halved, depth first
    assert sorted(torchvision_standin.calls, reverse=True) == [16, 8, 8, 4, 4, 2, 2, 1, 1]
    want, reasons = load_images(items, SPEC)
    assert got.errors[11] == reasons[11] and got.errors[:11] == [None] * 11
    assert np.array_equal(got.pixels[11].numpy(), want[11])  # the bad one took the CPU path, as it would there


def test_a_cuda_error_is_raised_not_taken_for_a_bad_image(torchvision_standin):
    decoder = DeviceDecoder(SPEC, "cpu")
    torchvision_standin.fail_with = torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(torch.AcceleratorError, match="illegal memory access"):
        decoder(jpegs(4))
    assert torchvision_standin.calls[-1] == 4  # raised at once: no halving, no CPU fall-back


def test_the_start_up_probe_fails_gpu_and_falls_back_once_under_auto(torchvision_standin):
    torchvision_standin.fail_with = RuntimeError("nvjpegCreateEx failed: 6 (NVJPEG_STATUS_EXECUTION_FAILED)")
    with pytest.raises(UserError, match=r"^--decode gpu cannot decode on cpu: a test JPEG does not decode there "
                                        r"\(nvjpegCreateEx failed: 6 \(NVJPEG_STATUS_EXECUTION_FAILED\)\); "
                                        r"use --decode cpu$"):
        DeviceDecoder(SPEC, "cpu")
    lines = []
    decoder = DeviceDecoder(SPEC, "cpu", strict=False, log=lines.append)
    assert lines == ["[embed] an encoder decodes its images on its CPU instead of cpu: a test JPEG does not decode "
                     "there (nvjpegCreateEx failed: 6 (NVJPEG_STATUS_EXECUTION_FAILED)) (--decode auto)"]
    items = jpegs(3)
    got = decoder(items)
    assert not got.on_device.any() and np.array_equal(got.pixels.numpy(), load_images(items, SPEC)[0])


def test_decoder_logic_on_the_standin(torchvision_standin):
    check_decoder("cpu")


def test_the_probe_finds_no_cuda_before_any_decode(torchvision_standin):
    """Here torch has no CUDA, as on a node whose driver the build cannot use: the probe says so in one line."""
    if torch.cuda.is_available():
        pytest.skip("this machine decodes on CUDA")
    lines = []
    decoder = DeviceDecoder(SPEC, "cuda", strict=False, log=lines.append)
    assert not decoder.on_device and lines == ["[embed] an encoder decodes its images on its CPU instead of cuda: "
                                               "torch sees no CUDA device (--decode auto)"]
    assert torchvision_standin.calls == []
    with pytest.raises(UserError, match="^--decode gpu cannot decode on cuda: torch sees no CUDA device; "
                                        "use --decode cpu$"):
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
    pixels, errors, on_device = decoder(list(items.values()))
    assert pixels.device.type == torch.device(device).type and pixels.shape == (len(items), 224, 224, 3)
    assert on_device.tolist() == [name in ("jpeg", "grey jpeg", "rotated jpeg") for name in items]
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


def test_decoder_on_the_cpu_with_torchvision(torchvision):
    check_decoder("cpu")


def test_decoder_on_cuda_with_nvjpeg(cuda, torchvision):
    check_decoder("cuda")


# ---- the embed job with --decode gpu ---------------------------------------------------------------------


def mixed_table(path) -> list[str]:
    """A table of JPEGs (colour, grey, rotated, large), a PNG, a CMYK JPEG and bad images; its keys."""
    photo = picture("coffee.jpg")
    images = {"jpeg": encode(photo, "JPEG", quality=90), "grey": encode(photo.convert("L"), "JPEG"),
              "rotated": with_orientation(picture("astronaut.jpg"), "JPEG", 6), "png": encode(photo, "PNG"),
              "large": encode(picture("china.jpg").resize((1600, 1200)), "JPEG", quality=90),
              "cmyk": encode(photo.convert("CMYK"), "JPEG"), **{f"bad {k}": d for k, (d, _) in bad_inputs().items()}}
    pq.write_table(pa.table({"key": list(images), "image": pa.array(list(images.values()), pa.binary())}), path)
    return list(images)


def errors_of(out: str, manifest: dict) -> dict[str, str]:
    return {r["key"]: r["error"] for f in manifest["error_files"]
            for r in pa.ipc.open_file(os.path.join(out, f)).read_all().to_pylist()}


def test_decode_gpu_without_torchvision_is_one_line_before_ray(tiny_clip, tmp_path, capsys):
    if gpu_decode.torchvision_problem() is None:
        pytest.skip("torchvision imports here")
    from mieb_ray.cli import main

    mixed_table(tmp_path / "t.parquet")
    code = main(["embed", "--input", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "out"), "--model",
                 tiny_clip, "--decode", "gpu", "--address", "127.0.0.1:9"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith("mieb-ray: error: --decode gpu needs torchvision: ")
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.timeout(600)
def test_embed_job_decoding_on_the_encoders_device(ray_local, tiny_clip, tmp_path, torchvision):
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


def test_read_tasks_decode_what_the_device_will_not_and_ship_the_rest_as_bytes(tmp_path):
    """--decode gpu's read stage: the JPEGs route() takes travel as their bytes, untouched; everything else (PNG,
    CMYK, progressive, bad images) is decoded there as --decode cpu would, its pixels in the row's bytes."""
    from mieb_ray.encode.stages import DECODED, ERROR, read_stage
    from mieb_ray.io import reader

    keys = mixed_table(tmp_path / "t.parquet")
    table = pq.read_table(tmp_path / "t.parquet")
    data = dict(zip(keys, table["image"].to_pylist()))
    fmt, files = reader.input_files(str(tmp_path / "t.parquet"))
    reader.read_parquet_layouts(files)
    units = reader.plan_table(files, 100)
    columns = reader.TableColumns("key", "image", ())
    out = read_stage({"unit": np.array([0])}, units, columns, "image", SPEC.to_dict(), decode="gpu")
    assert list(out["key"]) == keys
    for key, image, ready, error in zip(keys, out["images"], out[DECODED], out[ERROR]):
        if route(data[key], SPEC) is not None:
            assert not ready and image == data[key] and error == "", key
            continue
        assert ready, key
        pixels, reasons = load_images([data[key]], SPEC)
        assert error == (reasons[0] or ""), key
        if not error:
            assert image == pixels[0].tobytes(), key
    assert sorted(k for k, d in zip(keys, out[DECODED]) if not d) == ["grey", "jpeg", "large", "rotated"]


def test_embed_in_process_decoding_on_the_device_counts_each_path(tiny_clip, tmp_path, torchvision_standin, capsys):
    """The job's log and manifest say how many images each path decoded; the rows and errors are --decode cpu's."""
    from mieb_ray.io import embeddings
    from mieb_ray.pipelines.embed import EmbedConfig, embed

    keys = mixed_table(tmp_path / "t.parquet")
    runs = {}
    for decode in ("cpu", "gpu"):
        out = str(tmp_path / decode)
        manifest = embed(EmbedConfig(str(tmp_path / "t.parquet"), out, tiny_clip, decode=decode, executor="local",
                                     max_error_rate=1.0, batch_size=3), log=print)
        got, vectors = embeddings.read_all(out)
        runs[decode] = dict(zip(got, vectors)), errors_of(out, manifest), manifest
    (cpu, cpu_errors, cpu_manifest), (gpu, gpu_errors, manifest) = runs["cpu"], runs["gpu"]
    assert gpu_errors == cpu_errors
    assert sorted(gpu) == sorted(cpu) == sorted(k for k in keys if not k.startswith("bad "))
    assert manifest["counts"]["decoded_on_device"] == 4 and manifest["counts"]["decoded_on_cpu"] == 2  # png, cmyk
    assert "decoded_on_device" not in cpu_manifest["counts"]
    assert "[embed] images decoded: 4 on the encoders' devices, 2 on CPUs (--decode gpu)" in capsys.readouterr().out
    a, b = np.stack([cpu[k] for k in sorted(cpu)]), np.stack([gpu[k] for k in sorted(cpu)])
    assert centred_cosine(b, a, (a.mean(0) + b.mean(0)) / 2).min() >= BAR


def test_a_filter_the_device_lacks_is_one_line_before_any_work(tiny_clip, tmp_path, capsys):
    from mieb_ray.cli import main

    model = tmp_path / "lanczos-clip"
    os.system(f"cp -r {tiny_clip} {model}")
    for name in ("preprocessor_config.json", "processor_config.json"):  # transformers 5 reads the second
        config = json.loads((model / name).read_text())
        image = config.get("image_processor", config)
        image["resample"] = 1  # Lanczos
        (model / name).write_text(json.dumps(config))
    assert ImageSpec.from_processor_config(families.image_config(str(model))).resample == 1
    mixed_table(tmp_path / "t.parquet")
    code = main(["embed", "--input", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "out"), "--model",
                 str(model), "--decode", "gpu", "--executor", "local"])
    err = capsys.readouterr().err.strip().splitlines()
    if gpu_decode.torchvision_problem() is not None:  # checked first, as before
        assert err[-1].startswith("mieb-ray: error: --decode gpu needs torchvision")
    else:
        assert err[-1] == ("mieb-ray: error: --decode gpu: the model resizes with Pillow's lanczos filter, which "
                           "torch cannot compute on a device; use --decode cpu or auto")
    assert code == 1 and not os.path.exists(tmp_path / "out")


def test_units_whose_images_travel_undecoded_are_bounded_by_bytes(tmp_path):
    """--decode gpu on Ray: a unit holds at most unit_bytes of its file (by the file's average row), for parquet
    and for tars (indexed again at the finer step); the rows are all there, in order, once."""
    from mieb_ray.io import reader
    from mieb_ray.pipelines.embed import table_units
    from mieb_ray.runtime import tasks

    rows = [np.random.default_rng(i).bytes(10_000) for i in range(20)]
    pq.write_table(pa.table({"key": [f"k{i}" for i in range(20)], "image": rows}), tmp_path / "a.parquet",
                   compression="none")
    import webdataset as wds

    with wds.TarWriter(str(tmp_path / "b.tar")) as sink:
        for i, data in enumerate(rows):
            sink.write({"__key__": f"{i:06d}", "jpg": data})
    for name in ("a.parquet", "b.tar"):
        fmt, files = reader.input_files(str(tmp_path / name))
        with tasks.using("local"):
            whole = table_units(files, 1000)
            _, files = reader.input_files(str(tmp_path / name))
            cut = table_units(files, 1000, unit_bytes=45_000)
        assert [(u.lo, u.hi) for u in whole] == [(0, 20)]
        sizes = [u.hi - u.lo for u in cut]
        assert sum(sizes) == 20 and max(sizes) <= 4 and [u.lo for u in cut] == list(range(0, 20, sizes[0])), name
        got = [r for u in cut for chunk in reader.read(u, reader.TableColumns("key", "image", ()).read_as("image"))
               for r in chunk["key"].to_pylist()]
        assert len(got) == 20 and len(set(got)) == 20, name


def test_a_unit_goes_to_the_device_a_model_call_at_a_time_and_comes_back_once(tiny_clip, monkeypatch):
    """EncodeStage: a unit's pixels copied to the device a model call's good rows at a time (so the host copies
    the next while the device computes: a view where the rows run on, gathered past an error row), the
    normaliser's constants built once per actor, the embeddings copied back in one call; the vectors of one call
    per batch of the model, zeros for the error row."""
    from mieb_ray.encode import stages
    from mieb_ray.encode.model import Encoder

    spec = ImageSpec.from_processor_config(models_info(tiny_clip).image_config)
    built, moved, back = [], [], []
    real_init, real_move = stages.Normalizer.__init__, stages.EncodeStage._to_device
    monkeypatch.setattr(stages.Normalizer, "__init__", lambda self, *a: built.append(1) or real_init(self, *a))
    monkeypatch.setattr(stages.EncodeStage, "_to_device", lambda self, x: moved.append(len(x)) or real_move(self, x))
    stage = stages.EncodeStage(tiny_clip, None, "image", "image", spec.to_dict(), batch_size=2, device="cpu",
                               threads=1)
    pixels, _ = load_images(list(photos().values())[:6], spec)
    real_features = Encoder.image_features

    def features(self, x):
        out = real_features(self, x)
        back.append(out)
        return out

    monkeypatch.setattr(Encoder, "image_features", features)
    out = stage({"pixels": pixels, stages.ERROR: np.array(["", "bad", "", "", "", ""], dtype=object)})
    assert built == [1] and moved == [2, 2, 1] and [len(b) for b in back] == [2, 2, 1]
    want = np.concatenate([stage.encoder.encode_pixel_values(normalize(torch.from_numpy(pixels[rows]), spec))
                           for rows in ([0, 2], [3, 4], [5])])
    np.testing.assert_allclose(out["embedding"][[0, 2, 3, 4, 5]], want, atol=1e-6)
    assert not out["embedding"][1].any()


def models_info(path: str):
    from mieb_ray.encode.model import load_info

    return load_info(path, path, None)


def test_under_mieb_require_gpu_a_gpu_test_that_would_skip_fails(tmp_path):
    """A GPU session (bench/gpu_check.sh) cannot pass by skipping."""
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: nothing would skip")
    test = "tests/system/test_cuda.py::test_bf16_on_the_gpu_is_close_to_float32_on_the_cpu"
    started = {required: subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env={**os.environ, "MIEB_REQUIRE_GPU": required})
               for required in ("0", "1")}  # side by side: each is mostly its imports
    runs = {}
    for required, proc in started.items():
        stdout, stderr = proc.communicate(timeout=300)
        runs[required] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert runs["0"].returncode == 0 and "1 skipped" in runs["0"].stdout, runs["0"].stdout[-2000:]
    assert runs["1"].returncode == 1 and "1 error" in runs["1"].stdout, runs["1"].stdout[-2000:]  # at its setup
    assert "MIEB_REQUIRE_GPU=1, but torch sees no CUDA device" in runs["1"].stdout
