"""Embed, end to end on this CPU: images/s of the embed job against a plain PyTorch loop, same images, same model.

The model is a ViT-B/32-sized CLIP with random weights (mieb_ray.fixtures.models.make_clip_b32: 151M parameters,
the real CLIP processor config: shortest edge 224, centre crop 224, bicubic), saved and loaded back with
from_pretrained. The images: --images JPEGs of 400-1000 px (crops of the fixture pictures, quality 90) in one
Parquet table of mieb-train's shape (key, image struct), split over 4 files.

  1. plain PyTorch loop   torch DataLoader (2 workers, batch --batch) whose dataset decodes the bytes with PIL
                          and runs CLIPProcessor; the main process calls get_image_features (float32) and
                          L2-normalises; embeddings kept in memory (nothing written).
  2. mieb-ray embed       embed(EmbedConfig(table, out, model)): Ray tasks decode and resize, one encoder actor
                          with 2 torch threads (float32), Arrow IPC shards written with their sha256 and a manifest.

Ray starts before timing (its start-up excluded); each contender's own model load and worker start-up are
included. Both run float32, as the embed job does on a CPU by default.

Run from the repository root:
    .venv/bin/python bench/embed_cpu.py                 # 512 images
    .venv/bin/python bench/embed_cpu.py --images 64     # a quick check
"""

from __future__ import annotations

import argparse
import io
import random
import shutil
import time
from pathlib import Path

import _baselines as b  # first: sets RAY_AUTH_MODE before Ray is imported
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
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


class Photos(torch.utils.data.Dataset):
    def __init__(self, blobs: list[bytes], model_dir: str):
        self.blobs, self.model_dir, self.processor = blobs, model_dir, None

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.processor is None:  # in the worker process
            from transformers import CLIPImageProcessor

            self.processor = CLIPImageProcessor.from_pretrained(self.model_dir)
        image = Image.open(io.BytesIO(self.blobs[i]))
        return self.processor(images=image, return_tensors="pt")["pixel_values"][0]


def plain_loop(blobs: list[bytes], model_dir: str, batch: int) -> np.ndarray:
    from transformers import CLIPModel

    torch.set_num_threads(2)
    model = CLIPModel.from_pretrained(model_dir).eval()
    loader = torch.utils.data.DataLoader(Photos(blobs, model_dir), batch_size=batch, num_workers=2)
    out = []
    with torch.inference_mode():
        for pixel_values in loader:
            emb = model.get_image_features(pixel_values=pixel_values).pooler_output
            out.append(torch.nn.functional.normalize(emb, dim=-1).numpy())
    return np.concatenate(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--work", type=Path, default=Path("bench/_work/embed_cpu"))
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    model_dir = str(work / "clip-b32")
    print("[setup] ViT-B/32-sized random CLIP and the images ...", flush=True)
    make_clip_b32(model_dir)
    blobs = make_table(work / "table", args.images)
    print(f"[setup] {len(blobs)} JPEGs, {sum(map(len, blobs)) / len(blobs) / 1e3:.0f} KB mean")
    b.start_ray(work)

    t0 = time.perf_counter()
    ref = plain_loop(blobs, model_dir, args.batch)
    t_loop = time.perf_counter() - t0
    print(f"[run] plain PyTorch loop: {t_loop:.1f}s, {len(blobs) / t_loop:.1f} img/s", flush=True)

    t0 = time.perf_counter()
    manifest = embed(EmbedConfig(str(work / "table"), str(work / "out"), model_dir, batch_size=args.batch, workers=1,
                     cpus_per_worker=2), log=lambda line: print("   ", line, flush=True))
    t_ours = time.perf_counter() - t0
    print(f"[run] mieb-ray embed: {t_ours:.1f}s, {len(blobs) / t_ours:.1f} img/s", flush=True)

    from mieb_ray.io import embeddings

    got = np.concatenate([embeddings.matrix(embeddings.open_shard(u)) for u in embeddings.shard_uris(str(work / "out"))])
    centred = (got - ref.mean(0), ref - ref.mean(0))
    cos = (centred[0] * centred[1]).sum(1) / np.linalg.norm(centred[0], axis=1) / np.linalg.norm(centred[1], axis=1)

    rows = [["plain PyTorch loop (DataLoader, 2 workers, CLIPProcessor, get_image_features)", f"{t_loop:.1f}",
             f"{len(blobs) / t_loop:.1f}", "1.00"],
            ["mieb-ray embed (Ray decode tasks, 1 encoder actor x 2 threads, shards + manifest)", f"{t_ours:.1f}",
             f"{len(blobs) / t_ours:.1f}", f"{t_loop / t_ours:.2f}"]]
    print("\n" + "=" * 100)
    print(f"### Embed on CPU: {len(blobs)} JPEGs (400-1000 px), ViT-B/32-sized random CLIP, float32, batch {args.batch}\n")
    print(b.markdown_table(["contender", "seconds", "images/s", "speed vs loop"], rows))
    print(f"\nSame embeddings: {manifest['counts']['total']} rows; centred cosine of ours vs the loop's: "
          f"min {cos.min():.4f}, mean {cos.mean():.4f} (JPEG draft decoding is the only difference).\n")
    b.footer("Ray start-up excluded; model load and worker start-up included in both.",
             f"torch {torch.__version__}, threads: 2 for the model in both contenders")


if __name__ == "__main__":
    main()
