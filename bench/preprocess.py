"""Preprocessing: images/s per core of our decode+resize against CLIPImageProcessor on 1600x1200 JPEGs.

The photos of BioVITA are 1600x1200 JPEGs. From the fixture pictures (mieb_ray/fixtures/images, about
400 px), --n JPEGs of 1600x1200 at quality 90, half of each kind:
  smooth  one picture, a random 4:3 crop upscaled to 1600x1200 (about 4x), sometimes mirrored: little
          fine detail, so small files that decode fast;
  sharp   a 4x5 mosaic of 400x240 crops at the pictures' own resolution: detail in every pixel, as in a
          photo shrunk from a camera's, so large files that decode slowly (the harder case for us,
          whose time is mostly the JPEG decode).
In one process, torch and PIL single-threaded, batches of --batch images, both contenders from the same
bytes (each includes the decode):
  processor  CLIPImageProcessor(PIL backend), default CLIP ViT-B/32 settings (shortest edge 224, crop 224,
             bicubic) on Image.open(bytes) -> pixel_values;
  mieb-ray   load_images(bytes) (draft-mode decode, one resize, crop: uint8) -> normalize -> pixel_values.
Each is timed --repeat times, interleaved; the fastest run counts. Prints images/s, the ratio (target >= 3)
and how far our pixel_values are from the processor's, and ends with a Markdown block for bench/RESULTS.md.

Run from the repository root:
    .venv/bin/python bench/preprocess.py
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import PIL
import torch
import transformers
from PIL import Image, features
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from mieb_ray.encode.preprocess import DRAFT_FACTOR, ImageSpec, load_images, normalize

FIXTURES = Path(__file__).resolve().parents[1] / "mieb_ray" / "fixtures" / "images"
W, H = 1600, 1200


def make_jpegs(n: int, seed: int = 0) -> dict[str, list[bytes]]:
    pictures = [Image.open(p).convert("RGB") for p in sorted(FIXTURES.glob("*.jpg"))]
    tiles = [p for p in pictures if p.width >= 400]  # coins.jpg is 384 wide
    rng = np.random.default_rng(seed)
    out = {"smooth": [], "sharp": []}
    for i in range(n):
        if i % 2 == 0:
            pic = pictures[i // 2 % len(pictures)]
            cw = int(rng.integers(pic.width * 3 // 4, pic.width + 1))
            ch = min(cw * 3 // 4, pic.height)
            cw = ch * 4 // 3
            x, y = rng.integers(0, pic.width - cw + 1), rng.integers(0, pic.height - ch + 1)
            im = pic.crop((x, y, x + cw, y + ch)).resize((W, H), Image.Resampling.BICUBIC)
            if rng.random() < 0.5:
                im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            kind = "smooth"
        else:
            im = Image.new("RGB", (W, H))
            for ty in range(H // 240):
                for tx in range(W // 400):
                    pic = tiles[rng.integers(len(tiles))]
                    x, y = rng.integers(0, pic.width - 400 + 1), rng.integers(0, pic.height - 240 + 1)
                    im.paste(pic.crop((x, y, x + 400, y + 240)), (tx * 400, ty * 240))
            kind = "sharp"
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=90)
        out[kind].append(buf.getvalue())
    return out


def batches(items: list, size: int):
    return [items[i : i + size] for i in range(0, len(items), size)]


def run_processor(proc, jpegs: list[bytes], batch: int) -> torch.Tensor:
    return torch.cat([proc(images=[Image.open(io.BytesIO(b)) for b in chunk], return_tensors="pt")["pixel_values"]
                      for chunk in batches(jpegs, batch)])


def run_ours(spec: ImageSpec, jpegs: list[bytes], batch: int) -> torch.Tensor:
    out = []
    for chunk in batches(jpegs, batch):
        pixels, errors = load_images(chunk, spec)
        assert not any(errors), errors
        out.append(normalize(torch.from_numpy(pixels), spec))
    return torch.cat(out)


def seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def difference(ours: torch.Tensor, ref: torch.Tensor, spec: ImageSpec) -> dict:
    diff = (ours - ref).abs()
    levels = diff * torch.tensor(spec.std).view(1, 3, 1, 1) / spec.rescale_factor  # back to uint8 steps
    return {"max": diff.max().item(), "mean": diff.mean().item(), "levels_max": levels.max().item(),
            "levels_mean": levels.mean().item(), "over_1": (levels > 1.5).float().mean().item()}


def machine_facts() -> list[str]:
    with open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    return [f"CPUs: {os.cpu_count()} ({model}); {platform.platform()}",
            f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
            f"Pillow {PIL.__version__} (libjpeg-turbo {features.version('libjpeg_turbo')}), numpy {np.__version__}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50, help="JPEGs, half smooth, half sharp")
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    torch.set_num_threads(1)
    proc = CLIPImageProcessorPil()
    spec = ImageSpec.from_processor_config(proc.to_dict())
    sets = make_jpegs(args.n)
    sets["all"] = sets["smooth"] + sets["sharp"]

    rows = []
    for name, jpegs in sets.items():
        kb = np.mean([len(b) for b in jpegs]) / 1e3
        run_processor(proc, jpegs[:2], args.batch)  # warm up both
        run_ours(spec, jpegs[:2], args.batch)
        t_proc, t_ours = [], []
        for _ in range(args.repeat):  # interleaved, so that a busy moment hurts both
            t_proc.append(seconds(lambda: run_processor(proc, jpegs, args.batch)))
            t_ours.append(seconds(lambda: run_ours(spec, jpegs, args.batch)))
        ips_proc, ips_ours = len(jpegs) / min(t_proc), len(jpegs) / min(t_ours)
        d = difference(run_ours(spec, jpegs, args.batch), run_processor(proc, jpegs, args.batch), spec)
        print(f"[{name}] {len(jpegs)} JPEGs {W}x{H}, mean {kb:.0f} KB: processor {ips_proc:.1f} img/s, "
              f"mieb-ray {ips_ours:.1f} img/s, ratio {ips_ours / ips_proc:.2f}")
        print(f"[{name}] runs (s): processor {', '.join(f'{t:.2f}' for t in t_proc)}; "
              f"mieb-ray {', '.join(f'{t:.2f}' for t in t_ours)}")
        print(f"[{name}] pixel_values |ours - processor|: max {d['max']:.4f}, mean {d['mean']:.5f}; in uint8 "
              f"levels: max {d['levels_max']:.1f}, mean {d['levels_mean']:.3f}, {d['over_1']:.2%} off by more than 1")
        rows.append([name, len(jpegs), f"{kb:.0f}", f"{ips_proc:.1f}", f"{ips_ours:.1f}",
                     f"**{ips_ours / ips_proc:.2f}**", f"{d['max']:.4f} / {d['mean']:.5f}",
                     f"{d['levels_max']:.0f} / {d['levels_mean']:.2f} / {d['over_1']:.2%}"])

    header = ["JPEGs (1600x1200, q90)", "n", "mean KB", "processor img/s", "mieb-ray img/s", "ratio",
              "pixel_values diff max / mean", "uint8 levels max / mean / share > 1"]
    table = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    table += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    print("\n" + "\n".join([
        "## Embed: preprocessing (decode + resize + crop + normalise), one core",
        "",
        *table,
        "",
        "processor: `CLIPImageProcessorPil()` (CLIP ViT-B/32 defaults: shortest edge 224, center crop 224, "
        "bicubic) on `Image.open(bytes)`; mieb-ray: `load_images` (JPEG draft decode to >= "
        f"{DRAFT_FACTOR}x the resized size, one bicubic resize, crop; uint8) + `normalize`. Batches of "
        f"{args.batch}, fastest of {args.repeat} interleaved runs, both from the same bytes, torch and PIL on "
        "one thread.",
        "",
        f"Command: `.venv/bin/python {os.path.relpath(sys.argv[0])}{''.join(' ' + a for a in sys.argv[1:])}`  ",
        *[f + "  " for f in machine_facts()],
    ]))


if __name__ == "__main__":
    main()
