"""Embed, end to end on this CPU: images/s of the embed job against a plain PyTorch loop, same images, same model.

A. The whole call, each a fresh process timed from spawn to exit (Python imports, model load, embeddings written):
  1. plain PyTorch loop   bench/embed_loop_call.py: reads the table's image bytes, torch DataLoader (2 workers,
                          batch --batch) whose dataset decodes the bytes with PIL and runs CLIPProcessor;
                          get_image_features (float32, 2 threads), L2-normalised, saved as .npy.
  2. mieb-ray embed       `python -m mieb_ray embed --input ... --out ... --model ...`: --executor auto runs it
                          in that process (no cluster, no GPU): a thread decodes the next unit while the model
                          (every core: 2 torch threads here) encodes this one; shards, sha256s and a manifest.
B. In one process with Ray started (its start-up excluded; each contender's model load and worker start-up
   included): the same loop, and the embed job on Ray (--executor ray: Ray tasks decode and resize, one encoder
   actor with 2 torch threads).

The model is a ViT-B/32-sized CLIP with random weights (mieb_ray.fixtures.models.make_clip_b32: 151M parameters,
the real CLIP processor config: shortest edge 224, centre crop 224, bicubic), saved and loaded back with
from_pretrained. The images: --images JPEGs of 400-1000 px (crops of the fixture pictures, quality 90) in one
Parquet table of mieb-train's shape (key, image struct), split over 4 files. Both run float32, as the embed
job does on a CPU by default.

Run from the repository root:
    .venv/bin/python bench/embed_cpu.py                 # 512 images
    .venv/bin/python bench/embed_cpu.py --images 64     # a quick check
"""

from __future__ import annotations

import argparse
import io
import json
import random
import shutil
import sys
import time
from pathlib import Path

import _baselines as b  # first: sets RAY_AUTH_MODE before Ray is imported
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from embed_loop_call import plain_loop
from PIL import Image

from mieb_ray.fixtures.models import make_clip_b32
from mieb_ray.pipelines.embed import EmbedConfig, embed

FIXTURES = Path(__file__).resolve().parents[1] / "mieb_ray" / "fixtures" / "images"


def make_table(folder: Path, n: int, files: int = 4) -> list[bytes]:
    rng = random.Random(0)
    pictures = [Image.open(p).convert("RGB") for p in sorted(FIXTURES.glob("*.jpg"))]
    blobs = []
    for i in range(n):
        im = pictures[i % len(pictures)]
        w, h = rng.randint(400, 1000), rng.randint(300, 800)
        x, y = rng.randint(0, max(0, im.width // 4)), rng.randint(0, max(0, im.height // 4))
        crop = im.crop((x, y, im.width - x // 2, im.height - y // 2)).resize((w, h), Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        crop.save(buf, "JPEG", quality=90)
        blobs.append(buf.getvalue())
    folder.mkdir(parents=True, exist_ok=True)
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for k in range(files):
        part = range(k * n // files, (k + 1) * n // files)
        pq.write_table(pa.table({"key": [f"bench/{i}" for i in part],
                                 "image": pa.array([{"bytes": blobs[i], "path": None} for i in part], image_type)}),
                       folder / f"{k:06d}.parquet")
    return blobs


def centred_min_mean(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    a, r = got - ref.mean(0), ref - ref.mean(0)
    cos = (a * r).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(r, axis=1)
    return float(cos.min()), float(cos.mean())


def shards(out: Path) -> np.ndarray:
    from mieb_ray.io import embeddings

    return np.concatenate([embeddings.matrix(embeddings.open_shard(u)) for u in embeddings.shard_uris(str(out))])


def whole_calls(work: Path, model_dir: str, batch: int, repeat: int) -> dict:
    """Fresh processes, one after the other: the loop script, and `python -m mieb_ray embed` (--executor auto:
    in-process on this machine, no cluster and no GPU)."""
    env = b.fresh_process_env()
    times = {"loop": [], "ours": []}
    for i in range(repeat):
        times["loop"].append(b.run_process([sys.executable, str(b.BENCH / "embed_loop_call.py"), "--input",
                                            str(work / "table"), "--model", model_dir, "--out",
                                            str(work / "loop.npy"), "--batch", str(batch)], env))
        shutil.rmtree(work / "out_call", ignore_errors=True)
        times["ours"].append(b.run_process([sys.executable, "-m", "mieb_ray", "embed", "--input", str(work / "table"),
                                            "--out", str(work / "out_call"), "--model", model_dir, "--batch-size",
                                            str(batch)], env))
        print(f"[whole call {i + 1}] loop {times['loop'][-1]:.1f}s, mieb-ray embed {times['ours'][-1]:.1f}s",
              flush=True)
    manifest = json.loads((work / "out_call" / "_manifest.json").read_text())
    cos = centred_min_mean(shards(work / "out_call"), np.load(work / "loop.npy"))
    return {**times, "executor": manifest.get("executor"), "cos": cos}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2, help="whole calls of each contender (default: 2)")
    ap.add_argument("--work", type=Path, default=Path("bench/_work/embed_cpu"))
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    model_dir = str(work / "clip-b32")
    print("[setup] ViT-B/32-sized random CLIP and the images ...", flush=True)
    make_clip_b32(model_dir)
    blobs = make_table(work / "table", args.images)
    print(f"[setup] {len(blobs)} JPEGs, {sum(map(len, blobs)) / len(blobs) / 1e3:.0f} KB mean")
    n = len(blobs)

    calls = whole_calls(work, model_dir, args.batch, args.repeat)  # before this process starts Ray
    t_loop_call, t_ours_call = min(calls["loop"]), min(calls["ours"])
    print("\n" + "=" * 100)
    print(f"### Embed on CPU, the whole call (process start to embeddings on disk): {n} JPEGs (400-1000 px), "
          f"ViT-B/32-sized random CLIP, float32, batch {args.batch}\n")
    print(b.markdown_table(["contender", f"seconds (fastest of {args.repeat})", "images/s", "speed vs loop"], [
        ["plain PyTorch loop: `python bench/embed_loop_call.py` (imports, DataLoader with 2 workers, CLIPProcessor, "
         "get_image_features, .npy)", f"{t_loop_call:.1f}", f"{n / t_loop_call:.1f}", "1.00"],
        ["mieb-ray: `python -m mieb_ray embed` (--executor auto: in this process, Ray not started; shards, "
         "checksums, manifest)", f"{t_ours_call:.1f}", f"{n / t_ours_call:.1f}", f"{t_loop_call / t_ours_call:.2f}"]]))
    print(f"\n**whole call: mieb-ray {t_ours_call:.1f}s vs loop {t_loop_call:.1f}s = "
          f"{t_loop_call / t_ours_call:.2f}x the loop's speed**; executor taken (manifest): {calls['executor']}; "
          "centred cosine of ours vs the loop's: "
          f"min {calls['cos'][0]:.4f}, mean {calls['cos'][1]:.4f}\n")
    b.footer(f"All runs: loop {', '.join(f'{t:.1f}' for t in calls['loop'])} s; mieb-ray "
             f"{', '.join(f'{t:.1f}' for t in calls['ours'])} s. Each a fresh process timed from spawn to exit.",
             f"torch {torch.__version__}, threads: 2 for the model in both contenders")

    b.start_ray(work)
    t0 = time.perf_counter()
    ref = plain_loop(blobs, model_dir, args.batch)
    t_loop = time.perf_counter() - t0
    print(f"[run] plain PyTorch loop: {t_loop:.1f}s, {n / t_loop:.1f} img/s", flush=True)

    t0 = time.perf_counter()
    manifest = embed(EmbedConfig(str(work / "table"), str(work / "out"), model_dir, batch_size=args.batch, workers=1,
                     cpus_per_worker=2, executor="ray"), log=lambda line: print("   ", line, flush=True))
    t_ours = time.perf_counter() - t0
    print(f"[run] mieb-ray embed on Ray: {t_ours:.1f}s, {n / t_ours:.1f} img/s", flush=True)
    cos = centred_min_mean(shards(work / "out"), ref)

    rows = [["plain PyTorch loop (DataLoader, 2 workers, CLIPProcessor, get_image_features)", f"{t_loop:.1f}",
             f"{n / t_loop:.1f}", "1.00"],
            ["mieb-ray embed --executor ray (Ray decode tasks, 1 encoder actor x 2 threads, shards + manifest)",
             f"{t_ours:.1f}", f"{n / t_ours:.1f}", f"{t_loop / t_ours:.2f}"]]
    print("\n" + "=" * 100)
    print(f"### Embed on CPU, in one process with Ray started: {n} JPEGs (400-1000 px), ViT-B/32-sized random CLIP, "
          f"float32, batch {args.batch}\n")
    print(b.markdown_table(["contender", "seconds", "images/s", "speed vs loop"], rows))
    print(f"\nSame embeddings: {manifest['counts']['total']} rows; centred cosine of ours vs the loop's: "
          f"min {cos[0]:.4f}, mean {cos[1]:.4f} (JPEG draft decoding is the only difference).\n")
    b.footer("Ray start-up excluded; model load and worker start-up included in both.",
             f"torch {torch.__version__}, threads: 2 for the model in both contenders")


if __name__ == "__main__":
    main()
