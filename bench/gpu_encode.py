"""GPU image encoding: images/s of ViT-B/32- and ViT-L/14-sized CLIPs in bf16, against the FLOP bound.

Random-weight CLIPs of the real shapes (tests/support/models.py; the weights do not change the speed) are saved
to a temp dir and loaded with mieb_ray's Encoder, as an embed actor loads them. For each model and batch size:
  synthetic   model.get_image_features on a bf16 batch already on the GPU: the model alone;
  pipeline    what an actor does per unit: uint8 NHWC pixels pinned and copied to the GPU once, then per batch
              normalise + cast -> Encoder.image_features (model, float32 L2-normalise), results copied back once.
  compiled    Encoder(compile=True).image_features on the synthetic batch (torch.compile's inductor kernels);
              its compile time beside it.
  timm        timm's model of the same shape (vit_base_patch32_clip_224, vit_large_patch14_clip_224: the open_clip
              architecture) on the same batch: the contender the encoder is held to.
  gpu decode  raw JPEG bytes -> DeviceDecoder (header read on the CPU, batched nvJPEG decode, resize and crop
              on the GPU) -> normalise -> encode (`embed --decode gpu`), on photos of mixed sizes and
              orientations (same-size grouping gets no help there); its host CPU seconds per
              image give the CPU cores per GPU that path needs. Every image must decode on the device: a row that
              fell back to the CPU fails the run.
Then JPEG decode + resize + centre crop of real pictures in a CPU process pool (`--decode cpu`): the per-core
rate that sizes the CPU pool feeding one GPU (tests/system/test_cuda.py probes nvJPEG's stream race).

The FLOP bound is given twice: from the datasheet's dense bf16 peak, and from a bf16 8192^3 matmul measured on
the same device (what this GPU reaches at its clocks). Needs torch, torchvision, transformers, Pillow, numpy
(simplejpeg if there) and mieb_ray.encode (pyarrow, fsspec); no Ray, datasets or webdataset. Exits non-zero when
any measurement fails.

FLOPs per image (forward, 2 FLOPs per multiply-add; the counting of open_clip's model_profile.csv: 8.82 GFLOP
for B/32 and 162.0 for L/14 at 224 px). With n = (image/patch)^2 + 1 tokens, width d, MLP width m, L layers,
patch p, projection e:
  patch embedding   2 * (n-1) * 3p^2 * d
  per layer         2*n*d*3d (QKV) + 2*n^2*d (QK^T) + 2*n^2*d (AV) + 2*n*d*d (out) + 2 * 2*n*d*m (MLP)
                    = 8nd^2 + 4ndm + 4n^2 d   (= 24nd^2 + 4n^2 d when m = 4d)
  projection        2 * d * e (the pooled token only)
Layer norms, softmax, GELU, biases and the position add are O(n*d) and left out (<0.5%).
"% of peak" = achieved FLOP/s / the GPU's dense bf16 tensor peak: the ratio to the FLOP bound.

Run from the repository root (about 2 minutes on one H200):
    python bench/gpu_encode.py                      # writes $OUT/gpu_encode.md too when OUT is set
    python bench/gpu_encode.py --peak-tflops 989    # a GPU the table below does not know
    python bench/gpu_encode.py --cpu-smoke          # tiny sizes on CPU: checks the script, measures nothing useful
"""

from __future__ import annotations

import argparse
import glob
import io
import math
import multiprocessing
import os
import platform
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
import transformers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]  # the repo, without installing; the tests' support (models)

from support.models import make_clip_b32, make_clip_l14  # noqa: E402

from mieb_ray.demo_data.models import make_tiny_clip  # noqa: E402
from mieb_ray.encode.gpu_decode import DeviceDecoder, torchvision_problem  # noqa: E402
from mieb_ray.encode.model import Encoder, load_info  # noqa: E402
from mieb_ray.encode.preprocess import ImageSpec, Normalizer, load_image  # noqa: E402

PICTURES = os.path.join(REPO, "mieb_ray", "demo_data", "images")

# Dense (not 2:4 sparse) bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s; first match wins.
PEAK_TFLOPS = [
    (r"H[12]00 NVL", 835), (r"H100 PCIe", 756), (r"GH200|H100|H200", 989), (r"B200", 2250), (r"A100", 312),
    (r"L40S", 362), (r"L4\b", 121), (r"A10\b", 125),
]

# timm's models of the same shapes (the open_clip architecture: fused QKV, F.scaled_dot_product_attention)
TIMM = {"ViT-B/32": "vit_base_patch32_clip_224", "ViT-L/14": "vit_large_patch14_clip_224"}


def timm_forward(model, x):
    with torch.inference_mode():
        return model(x)


def flops_per_image(model) -> float:
    v = model.config.vision_config
    n = (v.image_size // v.patch_size) ** 2 + 1
    d, m = v.hidden_size, v.intermediate_size
    patch = 2 * (n - 1) * 3 * v.patch_size ** 2 * d
    layer = 8 * n * d * d + 4 * n * d * m + 4 * n * n * d
    return patch + v.num_hidden_layers * layer + 2 * d * model.config.projection_dim


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    if override or device.type != "cuda":
        return override
    name = torch.cuda.get_device_name(device)
    return next((tf for pattern, tf in PEAK_TFLOPS if re.search(pattern, name)), None)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step, device: torch.device, seconds: float, warmup: int) -> tuple[int, float]:
    """(iterations, seconds) of `step` run for about `seconds`, after warm-up (CUDA kernels and allocator)."""
    for _ in range(warmup):
        step()
    sync(device)
    t = time.perf_counter()
    step()
    sync(device)
    iters = max(3, math.ceil(seconds / (time.perf_counter() - t)))
    t = time.perf_counter()
    for _ in range(iters):
        step()
    sync(device)
    return iters, time.perf_counter() - t


def decode_for(files: list[bytes], spec: ImageSpec, seconds: float) -> int:
    done, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        load_image(files[done % len(files)], spec)
        done += 1
    return done


def decode_rate(files: list[bytes], spec: ImageSpec, workers: int, seconds: float) -> float:
    # spawn: the parent holds a CUDA context and torch's thread pools, which a fork would copy half-alive
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(decode_for, [files] * workers, [spec] * workers, [0.2] * workers))  # start and import
        t = time.perf_counter()
        done = sum(pool.map(decode_for, [files] * workers, [spec] * workers, [seconds] * workers))
        return done / (time.perf_counter() - t)


def resized_jpeg(data: bytes, size: tuple[int, int]) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.open(io.BytesIO(data)).convert("RGB").resize(size, Image.BICUBIC).save(out, "JPEG", quality=90)
    return out.getvalue()


def mixed_jpegs(files: list[bytes], n: int = 256) -> list[bytes]:
    """n photos of n different sizes, 160-1600 px a side, landscape and portrait."""
    rng = np.random.default_rng(0)
    sizes = [(int(w), int(h)) for w, h in rng.integers(160, 1600, size=(n, 2))]
    return [resized_jpeg(files[i % len(files)], size) for i, size in enumerate(sizes)]


def matmul_tflops(device: torch.device, seconds: float) -> float | None:
    """bf16 TFLOP/s of an 8192^3 matmul on this device: its reachable ceiling (None on a CPU)."""
    if device.type != "cuda":
        return None
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    iters, elapsed = timed(lambda: a @ a, device, seconds, 3)
    return 2 * 8192 ** 3 * iters / elapsed / 1e12


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", default="128,256,512")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per measurement")
    parser.add_argument("--peak-tflops", type=float, help="dense bf16 peak of this GPU, TFLOP/s")
    parser.add_argument("--decode-workers", type=int, default=os.cpu_count())
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU, to check the script")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile contender")
    args = parser.parse_args()

    if args.cpu_smoke:
        device = torch.device("cpu")
        models = [("tiny CLIP (64 px)", make_tiny_clip), ("ViT-B/32", make_clip_b32)]
        batch_sizes, seconds, warmup, decode_seconds = [8], 0.5, 1, 1.0
        mixed_n = 16
    elif torch.cuda.is_available():
        device = torch.device("cuda")
        models = [("ViT-B/32", make_clip_b32), ("ViT-L/14", make_clip_l14)]
        batch_sizes, seconds, warmup, decode_seconds = [int(b) for b in args.batch_sizes.split(",")], \
            args.seconds, 5, args.seconds
        mixed_n = 256
    else:
        print("gpu_encode: no CUDA device here (torch.cuda.is_available() is False). Run it on a GPU machine, "
              "or pass --cpu-smoke to check the script on CPU.", file=sys.stderr)
        return 2

    peak = peak_tflops(device, args.peak_tflops)
    measured = matmul_tflops(device, seconds)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    print(f"[gpu_encode] device {gpu}; datasheet peak {peak or 'unknown'} TFLOP/s; measured bf16 matmul "
          f"{f'{measured:.0f}' if measured else 'n/a'} TFLOP/s", flush=True)
    rows, notes, gpu_feed, failures = [], [], [], []
    files = [open(p, "rb").read() for p in sorted(glob.glob(os.path.join(PICTURES, "*.jpg")))]
    sets = {"mixed sizes": mixed_jpegs(files, mixed_n)}

    def bound(rate: float, flops: float) -> list[str]:
        """TFLOP/s, % of the datasheet peak, % of the measured matmul ceiling, FLOP-bound images/s of each."""
        achieved = rate * flops / 1e12
        return [f"{achieved:.1f}", f"{100 * achieved / peak:.1f}%" if peak else "n/a",
                f"{100 * achieved / measured:.1f}%" if measured else "n/a",
                f"{peak * 1e12 / flops:,.0f}" if peak else "n/a",
                f"{measured * 1e12 / flops:,.0f}" if measured else "n/a"]
    with tempfile.TemporaryDirectory(prefix="gpu-encode-") as work:
        for label, make in models:
            t = time.perf_counter()
            path = make(os.path.join(work, label.replace("/", "").replace(" ", "_")))
            info = load_info(path, label, None)
            encoder = Encoder(path, info, device=str(device), dtype="bfloat16")
            normalize = Normalizer(ImageSpec.from_processor_config(info.image_config), device)
            flops = flops_per_image(encoder.model)
            spec = ImageSpec.from_processor_config(info.image_config)
            notes.append(f"{label}: {sum(p.numel() for p in encoder.model.vision_model.parameters()) / 1e6:.1f}M "
                         f"vision params, {flops / 1e9:.2f} GFLOP/image, built and loaded in "
                         f"{time.perf_counter() - t:.1f} s, attention {encoder.model.config._attn_implementation}")
            print(f"[gpu_encode] {notes[-1]}", flush=True)
            compiled, compiled_s = None, 0.0
            if not args.no_compile:
                t = time.perf_counter()
                compiled = Encoder(path, info, device=str(device), dtype="bfloat16", compile=True)
                with torch.inference_mode():  # compiles now, not inside the timing
                    compiled.image_features(torch.randn(batch_sizes[-1], 3, spec.height, spec.width, device=device,
                                                        dtype=encoder.dtype))
                sync(device)
                compiled_s = time.perf_counter() - t
                print(f"[gpu_encode] {label}: compiled in {compiled_s:.1f} s", flush=True)
            timm_name, timm_model = TIMM.get(label), None
            if timm_name and not args.cpu_smoke:
                try:
                    import timm

                    timm_model = timm.create_model(timm_name, pretrained=False, num_classes=0)
                    timm_model = timm_model.to(device, encoder.dtype).eval()
                except Exception as exc:  # no timm here: the row says so
                    rows.append([label, f"timm {timm_name}", "", f"not run: {exc}", "", "", "", "", ""])
            for bs in batch_sizes:
                synthetic = torch.randn(bs, 3, spec.height, spec.width, device=device, dtype=encoder.dtype)
                pixels = np.random.default_rng(0).integers(0, 256, (bs, spec.height, spec.width, 3), dtype=np.uint8)

                @torch.inference_mode()
                def model_only():
                    encoder.model.get_image_features(pixel_values=synthetic)

                def pipeline():  # as EncodeStage: pinned, one copy in; batches sliced there; one copy out
                    host = torch.from_numpy(pixels)
                    on = host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host
                    encoder.image_features(normalize(on, encoder.dtype)).cpu()

                measures = [("synthetic", model_only), ("pipeline", pipeline)]
                if bs == batch_sizes[-1]:  # the contenders, at the largest batch
                    measures += [(f"compiled (torch.compile, {compiled_s:.0f} s to compile)",
                                  lambda: compiled.image_features(synthetic))] if compiled else []
                    measures += [(f"timm {timm_name}", lambda: timm_forward(timm_model, synthetic))] \
                        if timm_model is not None else []
                for kind, step in measures:
                    try:  # one failed measurement (out of memory, say) must not cost the rest of a GPU run
                        iters, elapsed = timed(step, device, seconds, warmup)
                    except Exception as exc:
                        rows.append([label, kind, bs, f"failed: {type(exc).__name__}", "", "", "", "", ""])
                        failures.append(f"{label} {kind} batch {bs}: {exc}")
                        print(f"[gpu_encode] {label} {kind} batch {bs} FAILED: {exc}", flush=True)
                        continue
                    rate = iters * bs / elapsed
                    rows.append([label, kind, bs, f"{rate:,.0f}", *bound(rate, flops)])
                    print(f"[gpu_encode] {label} {kind} batch {bs}: {rate:,.0f} img/s, {rows[-1][4]} TFLOP/s, "
                          f"{rows[-1][5]} of the datasheet peak, {rows[-1][6]} of the measured matmul", flush=True)
            why_not = torchvision_problem()
            for size, photos in sets.items():
                if why_not:
                    rows.append([label, f"gpu decode {size}", "", f"not run: {why_not}", "", "", "", "", ""])
                    if device.type == "cuda":
                        failures.append(f"gpu decode: {why_not}")
                    continue
                bs = batch_sizes[-1]
                decoder, batch = DeviceDecoder(spec, str(device)), [photos[i % len(photos)] for i in range(bs)]
                paths = {"device": 0, "cpu": 0}

                def gpu_decode_pipeline():
                    got = decoder(batch)
                    paths["device"] += int(got.on_device.sum())
                    paths["cpu"] += int((~got.on_device).sum())
                    encoder.image_features(normalize(got.pixels, encoder.dtype)).cpu()

                try:
                    cpu0 = time.process_time()
                    iters, elapsed = timed(gpu_decode_pipeline, device, seconds, warmup)
                    cpu_per_image = (time.process_time() - cpu0) / ((iters + warmup + 1) * bs)
                    if paths["cpu"]:
                        raise RuntimeError(f"{paths['cpu']} of {sum(paths.values())} images fell back to the CPU")
                except Exception as exc:
                    rows.append([label, f"gpu decode {size}", bs, f"failed: {exc}", "", "", "", "", ""])
                    failures.append(f"{label} gpu decode {size}: {exc}")
                    print(f"[gpu_encode] {label} gpu decode {size} FAILED: {exc}", flush=True)
                    continue
                rate = iters * bs / elapsed
                rows.append([label, f"gpu decode {size}", bs, f"{rate:,.0f}", *bound(rate, flops)])
                gpu_feed.append(f"{label}, gpu decode of {size} JPEGs: {rate:,.0f} img/s end to end with "
                                f"{cpu_per_image * 1e3:.2f} ms of host CPU per image (one process), so "
                                f"{rate * cpu_per_image:.2f} cores per GPU")
                print(f"[gpu_encode] {gpu_feed[-1]}", flush=True)
            if device.type == "cuda":
                notes.append(f"{label}: peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB")
                torch.cuda.reset_peak_memory_stats(device)
            encoder = synthetic = compiled = timm_model = None  # free this model's memory before the next one loads
            if device.type == "cuda":
                torch.cuda.empty_cache()

    workers = max(1, args.decode_workers)
    # decoded to the last model's input (224 px, bicubic, centre crop: the same for both CLIPs)
    if workers > 1 and device.type != "cuda":
        workers = 2  # a smoke run checks the pool, nothing more
    one = decode_rate(files, spec, 1, decode_seconds)
    many = decode_rate(files, spec, workers, decode_seconds) if workers > 1 else one
    decode_rows = [[1, f"{one:,.0f}", f"{one:,.0f}"], [workers, f"{many:,.0f}", f"{many / workers:,.0f}"]]
    print(f"[gpu_encode] decode: {one:,.0f} img/s on 1 process, {many:,.0f} on {workers}", flush=True)

    pipeline_rates = {}
    for label, kind, _, rate, *_ in rows:
        if kind == "pipeline" and not rate.startswith("failed"):
            pipeline_rates[label] = max(pipeline_rates.get(label, 0.0), float(rate.replace(",", "")))
    feed = [f"{label}: {rate / (many / workers):,.1f} decode cores per GPU at its best pipeline rate "
            f"({rate:,.0f} img/s)" for label, rate in pipeline_rates.items()]
    report = "\n\n".join([
        "# GPU encode benchmark (bench/gpu_encode.py)",
        f"Device: {gpu}; dense bf16 datasheet peak: {peak or 'unknown'} TFLOP/s; measured bf16 8192^3 matmul: "
        f"{f'{measured:.0f}' if measured else 'n/a'} TFLOP/s; dtype bfloat16; "
        f"torch {torch.__version__}, transformers {transformers.__version__}, CUDA {torch.version.cuda}; "
        f"{os.cpu_count()} CPUs." + (" CPU SMOKE RUN: tiny sizes, no GPU." if args.cpu_smoke else ""),
        table(["model", "measure", "batch", "images/s", "TFLOP/s", "% of datasheet peak", "% of measured matmul",
               "FLOP-bound images/s (datasheet)", "FLOP-bound images/s (measured)"], rows),
        "\n".join(f"- {n}" for n in notes),
        "## CPU decode: mieb_ray.encode.preprocess.load_image to 224 px (as the embed job's decode tasks)\n\n"
        f"{len(files)} pictures of about 400x300 px, {sum(map(len, files)) / len(files) / 1e3:.0f} KB each.\n\n"
        + table(["processes", "images/s", "images/s per process"], decode_rows)
        + "\n\n" + "\n".join(f"- {f}" for f in feed + gpu_feed),
        "FAILURES:\n" + "\n".join(f"- {f}" for f in failures) if failures else "No failures.",
    ]) + "\n"
    print("\n" + report)
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "gpu_encode.md"), "w") as f:
            f.write(report)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
