"""Embed, end to end on this CPU: images/s of the embed job against a plain PyTorch loop, same images, same model.

A. The whole call, each a fresh process timed from spawn to exit (Python imports, model load, embeddings written):
  1. plain PyTorch loop   bench/contenders/embed_loop_call.py: reads the table's image bytes, torch DataLoader
                          (2 workers, batch --batch) whose dataset decodes the bytes with PIL and runs CLIPProcessor;
                          get_image_features (float32, 2 threads), L2-normalised, saved as .npy.
  2. mieb-ray embed       `python -m mieb_ray embed --input ... --out ... --model ...`: --executor auto runs it
                          in that process (no cluster, no GPU): a thread decodes the next unit while the model
                          (every core: 2 torch threads here) encodes this one; shards, sha256s and a manifest.
B. In one process with Ray started (its start-up excluded; each contender's model load and worker start-up
   included): the same loop, and the embed job on Ray (--executor ray: Ray tasks decode and resize, one encoder
   actor with 2 torch threads).

The model is a ViT-B/32-sized CLIP with random weights (tests/support/models.py's make_clip_b32: 151M parameters,
the real CLIP processor config: shortest edge 224, centre crop 224, bicubic), saved and loaded back with
from_pretrained. The images: --images JPEGs of 400-1000 px (crops of the fixture pictures, quality 90) in one
Parquet table of mieb-train's shape (key, image struct), split over 4 files. Both run float32, as the embed
job does on a CPU by default.

One harness table (bench/harness.py) of both blocks, each contender against its block's loop, and the record
bench/records/embed_cpu.json.

Run from the repository root:
    .venv/bin/python bench/embed_cpu.py                 # 512 images
    .venv/bin/python bench/embed_cpu.py --images 64 --repeat 1 --ray-repeat 0 --records /tmp/records  # a quick check
"""

from __future__ import annotations

import argparse
import io
import json
import random
import shutil
import sys
from pathlib import Path

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from contenders.embed_loop_call import plain_loop
from PIL import Image

h.use_test_fixtures()
from support.models import make_clip_b32  # noqa: E402

from mieb_ray.pipelines.embed import EmbedConfig, embed  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "mieb_ray" / "demo_data" / "images"


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2, help="whole calls of each contender (default: 2)")
    ap.add_argument("--ray-repeat", type=int, default=1, help="runs of each in-process contender with Ray started "
                    "(default: 1; 0 leaves that block out)")
    ap.add_argument("--work", type=Path, default=Path("bench/_work/embed_cpu"))
    h.add_records_option(ap)
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    model_dir = str(work / "clip-b32")
    print("[setup] ViT-B/32-sized random CLIP and the images ...", flush=True)
    make_clip_b32(model_dir)
    blobs = make_table(work / "table", args.images)
    print(f"[setup] {len(blobs)} JPEGs, {sum(map(len, blobs)) / len(blobs) / 1e3:.0f} KB mean")
    n, table = len(blobs), str(work / "table")
    rate = [("images/s (fastest)", lambda r: f"{n / r.fastest:.1f}")]

    # A. whole calls, fresh processes, before this process starts Ray (a running Ray would change `auto`)
    loop, ours = "plain PyTorch loop, whole call", "mieb-ray embed, whole call"
    calls = h.run(h.Benchmark("embed_cpu_calls", "whole calls", [
        h.Contender(loop, "`python bench/contenders/embed_loop_call.py`: imports, DataLoader with 2 workers, "
                    "CLIPProcessor, get_image_features, .npy",
                    argv=lambda i: [sys.executable, str(h.CONTENDERS / "embed_loop_call.py"), "--input", table,
                                    "--model", model_dir, "--out", str(work / f"loop{i}.npy"), "--batch",
                                    str(args.batch)]),
        h.Contender(ours, "`python -m mieb_ray embed` (--executor auto: in this process, Ray not started; shards, "
                    "checksums, manifest)", baseline=loop,
                    argv=lambda i: [sys.executable, "-m", "mieb_ray", "embed", "--input", table, "--out",
                                    str(work / f"out_call{i}"), "--model", model_dir, "--batch-size",
                                    str(args.batch)])],
        repeat=args.repeat, columns=rate))
    last = args.repeat - 1
    manifest = json.loads((work / f"out_call{last}" / "_manifest.json").read_text())
    cos = centred_min_mean(shards(work / f"out_call{last}"), np.load(work / f"loop{last}.npy"))
    parts = [calls]
    figures = {"whole call": {"executor taken (manifest)": manifest.get("executor"),
                              "centred cosine of ours vs the loop's, min / mean": f"{cos[0]:.4f} / {cos[1]:.4f}"}}

    # B. in one process with Ray started (its start-up excluded)
    if args.ray_repeat:
        h.start_ray(work)
        kept = {}

        def in_loop(i):
            kept["ref"] = plain_loop(blobs, model_dir, args.batch)

        def in_ray(i):
            kept["manifest"] = embed(EmbedConfig(table, str(work / f"out{i}"), model_dir, batch_size=args.batch,
                                                 workers=1, cpus_per_worker=2, executor="ray"),
                                     log=lambda line: print("   ", line, flush=True))
            kept["out"] = work / f"out{i}"

        inloop = "plain PyTorch loop, Ray started"
        parts.append(h.run(h.Benchmark("embed_cpu_ray", "in one process with Ray started", [
            h.Contender(inloop, "DataLoader, 2 workers, CLIPProcessor, get_image_features, in this process (torch and "
                        "transformers imported before timing)", call=in_loop),
            h.Contender("mieb-ray embed --executor ray, Ray started", "Ray decode tasks, 1 encoder actor x 2 threads, "
                        "shards + manifest; model load and worker start-up included", call=in_ray, baseline=inloop)],
            repeat=args.ray_repeat, columns=rate)))
        cos = centred_min_mean(shards(kept["out"]), kept["ref"])
        figures["Ray started"] = {"rows": kept["manifest"]["counts"]["total"],
                                  "centred cosine of ours vs the loop's, min / mean": f"{cos[0]:.4f} / {cos[1]:.4f}"}
    record = h.combine("embed_cpu", f"Embed on CPU: {n} JPEGs (400-1000 px), ViT-B/32-sized random CLIP, float32, "
                       f"batch {args.batch}", parts, ratio=(ours, loop), group="Embed")
    record.finish(figures=figures, notes=[
        "Whole calls: each a fresh process timed from spawn to exit (Python start, imports, model load, reading the "
        "table, encoding, writing: the loop a .npy; ours shards, sha256s, progress records, the manifest).",
        *(["Ray started: its start-up excluded; model load and worker start-up included in both."]
          if args.ray_repeat else []),
        f"torch {torch.__version__}, 2 threads for the model in both contenders."])


if __name__ == "__main__":
    main()
