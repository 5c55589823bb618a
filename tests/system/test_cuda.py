"""On a CUDA machine only (each test takes the `cuda` fixture: skipped without CUDA, failed under
MIEB_REQUIRE_GPU=1, which bench/gpu_check.sh sets): what a GPU run must show before its numbers are trusted.

- the model in bf16 on the GPU against float32 on the CPU;
- nvJPEG plus the device resize against the CPU path, pixel by pixel, on a mixed-size set;
- the decoder's output intact when the caller's stream still has work queued (nvJPEG's stream race);
- one Ray GPU actor, end to end: the embed job with --decode gpu on the tests' Ray.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from support.equivalence import BAR, centred_cosine, photos
from support.pictures import encode, picture

from mieb_ray.encode.gpu_decode import DeviceDecoder
from mieb_ray.encode.model import Encoder, load_info
from mieb_ray.encode.preprocess import ImageSpec, load_images, normalize

PIXEL_TOLERANCE = 1.5  # mean uint8 levels between the device path and the CPU path (test_gpu_decode's bar)


def mixed_sizes() -> list[bytes]:
    """Photos at many sizes and orientations: same-size grouping gets no help."""
    out = []
    for i, name in enumerate(["astronaut.jpg", "coffee.jpg", "chelsea.jpg", "china.jpg", "rocket.jpg"] * 4):
        w, h = 160 + 37 * i, 120 + 23 * ((i * 7) % 11)
        out.append(encode(picture(name).resize((w, h) if i % 3 else (h, w)), "JPEG", quality=92))
    return out


def test_bf16_on_the_gpu_is_close_to_float32_on_the_cpu(cuda, tiny_clip):
    info = load_info(tiny_clip, tiny_clip, None)
    gpu, cpu = Encoder(tiny_clip, info, device=cuda), Encoder(tiny_clip, info, device="cpu")
    assert gpu.dtype in (torch.bfloat16, torch.float16) and gpu.device.type == "cuda"
    spec = ImageSpec.from_processor_config(info.image_config)
    pixels = torch.from_numpy(load_images(list(photos().values()), spec)[0])
    a = cpu.encode_pixel_values(normalize(pixels, spec))
    b = gpu.encode_pixel_values(normalize(pixels.to(cuda), spec, gpu.dtype))
    assert centred_cosine(b, a, a.mean(0)).min() >= 0.99


def test_device_decode_matches_the_cpu_path_on_mixed_sizes(cuda, torchvision, tiny_clip):
    spec = ImageSpec.from_processor_config(load_info(tiny_clip, tiny_clip, None).image_config)
    items = mixed_sizes()
    got = DeviceDecoder(spec, cuda)(items)
    assert got.on_device.all() and got.errors == [None] * len(items)
    want = load_images(items, spec)[0].astype(np.int16)
    diff = np.abs(got.pixels.cpu().numpy().astype(np.int16) - want)
    assert diff.mean(axis=(1, 2, 3)).max() < PIXEL_TOLERANCE, diff.mean(axis=(1, 2, 3))


def test_decoded_pixels_survive_work_queued_on_the_stream(cuda, torchvision, tiny_clip):
    """The upstream repro's shape (pytorch/vision#9606): queue long work, then reductions over tensors freed while
    those are still queued, then decode; the reductions must still see their own data."""
    spec = ImageSpec.from_processor_config(load_info(tiny_clip, tiny_clip, None).image_config)
    decoder = DeviceDecoder(spec, cuda)
    items = mixed_sizes()
    want = decoder(items).pixels.cpu()
    wrong = 0
    for _ in range(20):
        big = torch.randn(8192, 8192, device=cuda)
        for _ in range(4):
            big = big @ big.T / 8192  # ~100 ms of queued work
        blocks = [torch.full((1 << 20,), float(i), device=cuda) for i in range(16)]
        sums = [b.sum() for b in blocks]
        del blocks  # freed while their sums are still queued: the allocator may hand the decoder these blocks
        got = decoder(items).pixels.cpu()
        wrong += int(any(float(s) != float(i) * (1 << 20) for i, s in enumerate(sums)))
        assert torch.equal(got, want)
    assert wrong == 0


@pytest.mark.timeout(600)
def test_one_ray_gpu_actor_end_to_end(cuda, torchvision, ray_local, tiny_clip, tmp_path):
    from mieb_ray.io import embeddings
    from mieb_ray.pipelines.embed import EmbedConfig, embed

    items = mixed_sizes() + [encode(picture("coffee.jpg"), "PNG")]
    pq.write_table(pa.table({"key": [f"k{i:02d}" for i in range(len(items))], "image": items}), tmp_path / "t.parquet")
    runs = {}
    for decode, gpus in (("cpu", 0), ("gpu", 1)):
        out = str(tmp_path / decode)
        manifest = embed(EmbedConfig(str(tmp_path / "t.parquet"), out, tiny_clip, decode=decode, gpus_per_worker=gpus,
                                     executor="ray"), log=print)
        keys, vectors = embeddings.read_all(out)
        runs[decode] = dict(zip(keys, vectors)), manifest
    (cpu, _), (gpu, manifest) = runs["cpu"], runs["gpu"]
    assert sorted(gpu) == sorted(cpu) and len(cpu) == len(items)
    a, b = np.stack([cpu[k] for k in sorted(cpu)]), np.stack([gpu[k] for k in sorted(cpu)])
    assert manifest["counts"]["decoded_on_device"] == len(items) - 1 and manifest["counts"]["decoded_on_cpu"] == 1
    assert centred_cosine(b, a, (a.mean(0) + b.mean(0)) / 2).min() >= BAR
