"""The embed job at a GPU's speed (issue 40, item 3): `mieb-ray embed` as a user runs it (Ray on this one node: its
CPUs and its GPU), on 100,000 photos of mixed sizes, against what bounds it, all in one run:

  encoder alone       Encoder.image_features (bf16, batch 512) on a batch already on the GPU: the model's own rate
  CPU decode ceiling  load_image to the model's input in one process per CPU, on the same photos: what the CPUs feed
  embed, auto         `--decode auto` (the default) on all the photos; its log names the feed it chose
  embed, other feed   the feed auto did not choose, on the first 20,000 photos: whether auto chose the faster

Per job: start-up (process start to the first committed unit, which includes Ray's start and the model's load),
the steady rate (rows committed between 10% and 90% of the rows, over that time: units' progress records as they
appear), the whole job's rate, and the GPU's utilisation over the steady window (`nvidia-smi dmon`, SM %).
Random weights of the real shapes (tests/support/models.py): the weights do not change the speed.

    python bench/gpu_embed.py OUT_DIR [--rows 100000] [--models b32,l14]   # on a GPU machine (bench/gpu_check.sh)
    python bench/gpu_embed.py OUT_DIR --cpu-smoke                          # tiny sizes on CPU: the script only
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]  # the repo, without installing; the tests' support (models)

from bench.gpu_encode import PICTURES, decode_rate, resized_jpeg, table  # noqa: E402

FILE_ROWS = 2000  # rows per Parquet file: 50 files for 100,000 rows
DISTINCT = 4096  # different photos, repeated to the rows asked for (the decode costs the same)
OTHER_ROWS = 20_000


def photo(args: tuple[int, int, int]) -> bytes:
    i, w, h = args
    files = sorted(glob.glob(os.path.join(PICTURES, "*.jpg")))
    with open(files[i % len(files)], "rb") as f:
        return resized_jpeg(f.read(), (w, h))


def write_photos(folder: str, rows: int, distinct: int, file_rows: int = FILE_ROWS) -> list[bytes]:
    """`rows` photos of `distinct` sizes, 160 to 800 px a side (MIEB's datasets are mostly in that range), landscape
    and portrait, in Parquet files of FILE_ROWS rows; returns the distinct photos."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(160, 800, size=(distinct, 2))
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        photos = list(pool.map(photo, [(i, int(w), int(h)) for i, (w, h) in enumerate(sizes)], chunksize=64))
    os.makedirs(folder, exist_ok=True)
    for lo in range(0, rows, file_rows):
        n = min(file_rows, rows - lo)
        pq.write_table(pa.table({"key": [f"{i:07d}" for i in range(lo, lo + n)],
                                 "image": [photos[i % distinct] for i in range(lo, lo + n)]}),
                       os.path.join(folder, f"part-{lo // file_rows:04d}.parquet"), compression="none")
    return photos


def encoder_rate(model: str, size: int, batch: int, seconds: float) -> float:
    """images/s of Encoder.image_features (the job's encoder, its default dtype) on a batch resident on the device."""
    import torch

    from bench.gpu_encode import timed
    from mieb_ray.encode.model import Encoder, load_info

    encoder = Encoder(model, load_info(model, model, None))
    x = torch.randn(batch, 3, size, size, device=encoder.device, dtype=encoder.dtype)
    iters, elapsed = timed(lambda: encoder.image_features(x), encoder.device, seconds, 3)
    return iters * batch / elapsed  # its memory goes back with this frame (the job runs in another process)


STARTUP_PARTS = """
import time, sys
t = [time.time()]
import torch; t.append(time.time())
torch.zeros(1, device="cuda" if torch.cuda.is_available() else "cpu"); t.append(time.time())
from mieb_ray.encode.model import Encoder, load_info; t.append(time.time())
import transformers; transformers.CLIPModel; t.append(time.time())
Encoder(sys.argv[1], load_info(sys.argv[1], sys.argv[1], None)); t.append(time.time())
import ray; t.append(time.time())
ray.init(include_dashboard=False, log_to_driver=False); t.append(time.time())
ray.get(ray.remote(lambda: 1).remote()); t.append(time.time())
ray.shutdown(); t.append(time.time())
print(" ".join(f"{b - a:.2f}" for a, b in zip(t, t[1:])))
"""
STARTUP_NAMES = ["import torch", "CUDA context", "import mieb_ray.encode.model", "import transformers (CLIPModel)",
                 "model loaded to the device",
                 "import ray", "ray.init (this node)", "first task", "ray.shutdown"]


def startup_parts(model: str) -> dict[str, float]:
    """Seconds of what an embed job's start-up is made of, each in order in one fresh process (the job's driver and
    its encoder actor each pay their share)."""
    got = subprocess.run([sys.executable, "-c", STARTUP_PARTS, model], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])})
    if got.returncode:
        return {"failed": got.stderr.strip().splitlines()[-1] if got.stderr.strip() else str(got.returncode)}
    return dict(zip(STARTUP_NAMES, map(float, got.stdout.split())))


def free_gpu_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Sampler:
    """nvidia-smi dmon's SM utilisation each second, stamped as it arrives (nothing where there is no nvidia-smi)."""

    def __init__(self):
        self.samples: list[tuple[float, int]] = []
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "dmon", "-s", "u", "-d", "1"], stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            parts = line.split()
            if parts and not line.startswith("#") and parts[1].isdigit():
                self.samples.append((time.time(), int(parts[1])))

    def mean(self, t0: float, t1: float) -> float | None:
        inside = [u for t, u in self.samples if t0 <= t <= t1]
        return sum(inside) / len(inside) if inside else None

    def stop(self):
        if self.proc:
            self.proc.terminate()


def run_job(name: str, inputs: str, out: str, model: str, decode: str, rows: int, sampler: Sampler,
            extra: tuple = ()) -> dict:
    """One `mieb-ray embed` in a fresh process; its committed rows over time from the units' progress records."""
    progress, seen, curve = os.path.join(out, "_progress"), set(), []
    cmd = [sys.executable, "-m", "mieb_ray", "embed", "--input", inputs, "--out", out, "--model", model,
           "--decode", decode, "--batch-size", "512", "--overwrite", *extra]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []  # each stamped with its seconds since the process started: where start-up goes

    def read():
        for line in iter(proc.stdout.readline, ""):  # shown as they come: a job cut off by a timeout still tells
            lines.append(f"{time.time() - t0:6.1f}s {line}")
            print(f"  {name} | {lines[-1].rstrip()}", flush=True)
    threading.Thread(target=read, daemon=True).start()
    while proc.poll() is None:
        for path in glob.glob(os.path.join(progress, "*.json")):
            if path not in seen:
                try:
                    with open(path) as f:
                        result = json.load(f)["result"]
                except (OSError, ValueError):
                    continue  # being written: next round
                seen.add(path)
                curve.append((time.time(), result["rows"] + result.get("errors", 0)))
        time.sleep(0.2)
    wall = time.time() - t0
    time.sleep(0.5)
    if proc.returncode:
        raise RuntimeError(f"{name}: mieb-ray embed exited {proc.returncode}")
    with open(os.path.join(out, "_manifest.json")) as f:
        counts = json.load(f)["counts"]
    chosen = next((line.split("images decoded ", 1)[1].strip() for line in lines if "images decoded " in line), "")
    done = np.cumsum([r for _, r in curve]) if curve else np.array([0])
    times = [t for t, _ in curve]
    lo, hi = (int(np.searchsorted(done, f * done[-1])) for f in (0.1, 0.9))
    steady = (done[hi] - done[lo]) / (times[hi] - times[lo]) if curve and times[hi] > times[lo] else float("nan")
    return {"job": name, "rows": rows, "wall_s": wall, "startup_s": (times[0] - t0) if times else float("nan"),
            "steady_rows_s": steady, "job_rows_s": rows / wall, "counts": counts, "decode": chosen,
            "gpu_util": sampler.mean(times[lo], times[hi]) if curve else None, "units": len(curve)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--models", default="b32,l14")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU: checks the script only")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from support.models import make_clip_b32, make_clip_l14

    from mieb_ray.demo_data.models import make_tiny_clip
    from mieb_ray.encode.model import load_info
    from mieb_ray.encode.preprocess import ImageSpec

    makers = {"b32": ("ViT-B/32", make_clip_b32), "l14": ("ViT-L/14", make_clip_l14), "tiny": ("tiny", make_tiny_clip)}
    from mieb_ray.encode.gpu_decode import torchvision_problem

    rows, distinct, other, names = args.rows, DISTINCT, OTHER_ROWS, args.models.split(",")
    file_rows, extra = FILE_ROWS, ()
    if args.cpu_smoke:  # on Ray, as a GPU machine's default placement runs it
        rows, distinct, other, names, file_rows, extra = 400, 64, 200, ["tiny"], 50, ("--executor", "ray")
    work = os.path.join(tempfile.gettempdir(), "gpu-embed")  # gigabytes: never under OUT, whose files travel back
    shutil.rmtree(work, ignore_errors=True)
    t = time.time()
    photos = write_photos(os.path.join(work, "photos"), rows, distinct, file_rows)
    part = os.path.join(work, "first")  # the other feed's input: the first files, linked
    os.makedirs(part)
    for name in sorted(os.listdir(os.path.join(work, "photos")))[:max(1, other // file_rows)]:
        os.symlink(os.path.join(work, "photos", name), os.path.join(part, name))
    print(f"[gpu_embed] {rows:,} photos ({distinct:,} distinct, {sum(map(len, photos)) / len(photos) / 1e3:.0f} KB "
          f"on average) written in {time.time() - t:.1f} s", flush=True)

    sampler, results, bounds = Sampler(), [], []
    try:
        for key in names:
            label, make = makers[key]
            model = make(os.path.join(work, f"model-{key}"))
            spec = ImageSpec.from_processor_config(load_info(model, model, None).image_config)
            alone = encoder_rate(model, spec.height, 64 if args.cpu_smoke else 512, 1 if args.cpu_smoke else 3)
            free_gpu_memory()
            parts = startup_parts(model) if key == names[0] else None  # once: imports weigh alike for any model
            if parts:
                print(f"[gpu_embed] {label}: start-up parts, s: {json.dumps(parts)}", flush=True)
            ceiling = decode_rate(photos[:256], spec, os.cpu_count(), 1 if args.cpu_smoke else 3)
            bounds.append([label, f"{alone:,.0f}", f"{ceiling:,.0f}", os.cpu_count()])
            print(f"[gpu_embed] {label}: encoder alone {alone:,.0f} images/s; CPU decode ceiling {ceiling:,.0f} "
                  f"images/s on {os.cpu_count()} processes", flush=True)
            auto = run_job(f"{label} auto", os.path.join(work, "photos"), os.path.join(work, f"out-{key}-auto"),
                           model, "auto", rows, sampler, extra)
            auto |= {"model": label, "encoder_alone": alone, "cpu_decode_ceiling": ceiling}
            if parts:
                auto["startup_parts"] = parts
            results.append(auto)
            print(f"[gpu_embed] {json.dumps(auto)}", flush=True)
            feed = "cpu" if "on their GPUs" in auto["decode"] else "gpu"
            if key == names[0] and not (feed == "gpu" and torchvision_problem()):
                # the feed auto did not choose, once: which is faster is the machine's, not the model's
                alt = run_job(f"{label} {feed}", part, os.path.join(work, f"out-{key}-{feed}"), model, feed,
                              min(rows, max(file_rows, other // file_rows * file_rows)), sampler, extra)
                alt |= {"model": label, "encoder_alone": alone, "cpu_decode_ceiling": ceiling}
                results.append(alt)
                print(f"[gpu_embed] {json.dumps(alt)}", flush=True)
            shutil.rmtree(model, ignore_errors=True)
    finally:
        sampler.stop()

    def n(x, fmt=",.0f"):
        return "n/a" if x is None or x != x else format(x, fmt)

    report = "\n\n".join([
        "# The embed job at the GPU's speed (bench/gpu_embed.py)",
        table(["model", "encoder alone, images/s", "CPU decode ceiling, images/s", "decode processes"], bounds),
        table(["job", "rows", "feed", "start-up s", "steady rows/s", "of encoder alone", "whole job rows/s",
               "GPU SM % (steady)", "decoded on device / CPU"],
              [[r["job"], f"{r['rows']:,}", r["decode"], n(r["startup_s"], ".1f"), n(r["steady_rows_s"]),
                f"{100 * r['steady_rows_s'] / r['encoder_alone']:.0f}%", n(r["job_rows_s"]), n(r["gpu_util"], ".0f"),
                f"{r['counts'].get('decoded_on_device', 0):,} / {r['counts'].get('decoded_on_cpu', 0):,}"]
               for r in results]),
    ]) + "\n"
    print("\n" + report)
    with open(os.path.join(args.out, "gpu_embed.json"), "w") as f:
        json.dump({"bounds": bounds, "jobs": results}, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
