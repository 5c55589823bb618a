"""Preprocessing: images/s per core of our decode+resize against CLIPImageProcessor, on two sets.

Every contender goes from the same encoded bytes to the final normalised float32 pixel_values (n, 3, 224, 224),
CLIP ViT-B/32 settings (shortest edge 224, center crop 224, bicubic), torch and Pillow on one thread, in
batches of --batch images of one kind (as the embed job's read tasks hand them over: rows of one input file, one
source, in chunks of up to reader.CHUNK_ROWS, the default):
  processor (PIL)          `CLIPImageProcessorPil()` on `[Image.open(bytes)]` (decode, convert_rgb, PIL
                           resize, crop, rescale, normalise in numpy): the baseline the target is against.
  processor (torchvision)  transformers' `CLIPImageProcessor()` with its torchvision backend on the same
                           `[Image.open(bytes)]` (what transformers 5 picks where torchvision is installed), in
                           a subprocess of --torchvision-python (a venv that has torchvision; this one does not):
                           skipped with a note when that is absent.
  mieb-ray                 `load_images(bytes)` (simplejpeg/Pillow decode, torch's antialiased uint8 resize per
                           size group, crop: uint8) -> `normalize` (on the CPU here; on the GPU in the job).
  mieb-ray, Pillow decode  the same with every image decoded by Pillow (simplejpeg hidden): what simplejpeg adds.
  mieb-ray load_images only  uint8 (n, 224, 224, 3), no normalise: the CPU work of the embed job's decode tasks
                           (the job normalises on the encoder's device); not from bytes to pixel_values, so not
                           the figure the target is measured on.
  decode floor             the decode alone, as mieb-ray decodes (simplejpeg at the draft scale, Pillow for PNG,
                           to RGB; preprocess._open): the floor; the table gives mieb-ray's time over it.
  baseline load_images only  with --baseline FILE: load_images of another copy of preprocess.py (e.g. the last
                           commit's: git show HEAD:mieb_ray/encode/preprocess.py > /tmp/base.py), uint8: before
                           and after a change in the same run.
  mieb-ray, Pillow resize  with --pillow-resize: load_images with every image through Pillow (decode, draft,
                           Pillow's resize with the draft box, crop: preprocess.pillow_pixels, the path of filters
                           torch lacks), uint8. Run under pillow-simd (a venv where it replaces Pillow) it
                           measures pillow-simd's resize against torch's.
  pyvips                   with --vips: libvips' `thumbnail_buffer` (decode, shrink on load, resize to fill,
                           centre crop, its own filter) + mieb-ray's normalize: a candidate, adopted only if it
                           wins and keeps the centred cosine >= 0.95.
Timed by CPU time of the process (time.process_time; one thread, so per core), --repeat times interleaved
(the subprocess takes its turn in the same loop); the fastest run counts. Quality against processor (PIL): the
pixel difference in uint8 levels, and the centred cosine of pixel_values (each image's pixel_values minus the
set's mean pixel_values of the processor, cosine with the processor's; the bar is 0.95).

Sets:
  jpeg1600  --n JPEGs of 1600x1200 (BioVITA's photos) at quality 90, from the fixture pictures
            (mieb_ray/demo_data/images): half "smooth" (a 4:3 crop upscaled ~4x: little detail, small files) and
            half "sharp" (a 4x5 mosaic of crops at the pictures' own resolution: detail everywhere, large
            files, slow to decode).
  photos    --photos JPEGs each of its own size, 160 to 800 px a side, landscape and portrait (the fixture
            pictures resized, quality 90, as bench/gpu_embed.py's): what most sources' photos are (Food101,
            SUN397, DTD, Caltech101 ...), unlike the mix's kinds, which are of one size each. A chunk of them
            makes load_images a size group per image.
  mix       mieb-train's real mix: --per-kind images of each of the kinds below (crops of the fixture pictures,
            resized to the kind's size with Lanczos: real content, not flat colour), timed per kind; the mix
            figure weights each kind's time per image by its rows in mieb-train (mieb_ray/sources/catalog.py,
            mapped to kinds by MIX_KINDS). Images/s of the mix = 1 / sum(share * seconds per image).

Prints the harness table (bench/harness.py: per contender, the CPU seconds per image of every run, on
mieb-train's mix weighted by rows, or on the 1600x1200 JPEGs without the mix) with the per-kind table beside it,
and writes bench/records/preprocess.json.

Run from the repository root (the lead's figures: on a quiet machine):
    .venv/bin/python bench/preprocess.py --torchvision-python tvenv/bin/python
    .venv/bin/python bench/preprocess.py --sets mix --per-kind 8 --repeat 1 --records /tmp/records   # a smoke run
where tvenv is a separate venv whose transformers can use torchvision (PyPI's torchvision does not import beside
torch 2.13.0): python3 -m venv tvenv && tvenv/bin/pip install torch==2.14.1 torchvision==0.29.1 transformers==5.24.0
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness as h
import numpy as np

from mieb_ray.io.reader import CHUNK_ROWS

FIXTURES = Path(__file__).resolve().parents[1] / "mieb_ray" / "demo_data" / "images"
W, H = 1600, 1200

# The image kinds of mieb-train the issue names: name -> (format, width, height, PIL mode, save options).
KINDS = {
    "png 32x32": ("PNG", 32, 32, "RGB", {}),
    "png 28x28 grey": ("PNG", 28, 28, "L", {}),
    "png 96x96": ("PNG", 96, 96, "RGB", {}),
    "jpeg 320x240 frame": ("JPEG", 320, 240, "RGB", {"quality": 75}),
    "jpeg 500x375": ("JPEG", 500, 375, "RGB", {"quality": 85}),
    "jpeg 64x64 satellite": ("JPEG", 64, 64, "RGB", {"quality": 90}),
}
# Each of the 23 sources -> the kind closest to its images (size first, then format), with what they are
# (../shared/reference/mieb-train-sources.md). Not every source is one of the six kinds exactly; the mapping
# is by decode + resize cost, which is set by pixel count and format.
MIX_KINDS = {
    "ucf101": ("jpeg 320x240 frame", "320x240 video frames"),
    "imagenet1k": ("jpeg 500x375", "photos, typically 500x375 / 500x333"),
    "scimmir": ("jpeg 500x375", "figures and tables of papers, a few hundred px a side"),
    "patchcamelyon": ("png 96x96", "96x96 lossless WebP patches"),
    "sun397": ("jpeg 500x375", "scene photos, a few hundred px a side"),
    "food101": ("jpeg 500x375", "photos, at most 512 px a side"),
    "clevr": ("jpeg 500x375", "480x320 lossless WebP renders"),
    "clevr_count": ("jpeg 500x375", "480x320 lossless WebP renders"),
    "mnist": ("png 28x28 grey", "28x28 greyscale PNG"),
    "cifar10": ("png 32x32", "32x32 PNG"),
    "cifar100": ("png 32x32", "32x32 PNG"),
    "country211": ("jpeg 500x375", "YFCC photos"),
    "fer2013": ("jpeg 64x64 satellite", "48x48 greyscale faces, JPEG"),
    "gtsrb": ("jpeg 64x64 satellite", "traffic signs of 15-250 px, mostly ~50, lossless WebP"),
    "resisc45": ("jpeg 320x240 frame", "256x256 aerial JPEGs"),
    "eurosat": ("jpeg 64x64 satellite", "64x64 satellite JPEGs"),
    "birdsnap": ("jpeg 500x375", "photos"),
    "stanfordcars": ("jpeg 500x375", "photos"),
    "renderedsst2": ("jpeg 500x375", "448x448 PNG renders of text"),
    "stl10": ("png 96x96", "96x96 PNG"),
    "dtd": ("jpeg 500x375", "texture photos"),
    "oxfordpets": ("jpeg 500x375", "photos"),
    "caltech101": ("jpeg 500x375", "photos, ~300 px a side"),
}


def mix_weights() -> dict[str, float]:
    from mieb_ray.sources.catalog import SOURCES, TOTAL_ROWS

    assert set(MIX_KINDS) == {s.slug for s in SOURCES}, "a source of the catalog is missing from MIX_KINDS"
    rows = dict.fromkeys(KINDS, 0)
    for s in SOURCES:
        rows[MIX_KINDS[s.slug][0]] += s.rows
    return {k: r / TOTAL_ROWS for k, r in rows.items()}


# ---- images ---------------------------------------------------------------------------------------------


def _pictures():
    from PIL import Image

    return [Image.open(p).convert("RGB") for p in sorted(FIXTURES.glob("*.jpg"))]


def _encode(im, fmt: str, **params) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **params)
    return buf.getvalue()


def make_jpegs(n: int, seed: int = 0) -> dict[str, list[bytes]]:
    from PIL import Image

    pictures = _pictures()
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
        out[kind].append(_encode(im, "JPEG", quality=90))
    return out


def make_photos(n: int, seed: int = 0) -> list[bytes]:
    """n JPEGs, each of its own size (160 to 800 px a side): the fixture pictures resized as bench/gpu_embed.py's
    photos are."""
    sys.path.insert(0, str(h.ROOT))
    from bench.gpu_embed import photo

    sizes = np.random.default_rng(seed).integers(160, 801, size=(n, 2))
    return [photo((i, int(width), int(height))) for i, (width, height) in enumerate(sizes)]


def make_kind(kind: str, n: int, seed: int = 0) -> list[bytes]:
    """n images of a kind: random crops (a quarter to all of a picture's short side) of random fixture
    pictures, mirrored at random, resized to the kind's size with Lanczos."""
    from PIL import Image

    fmt, w, h, mode, params = KINDS[kind]
    pictures = _pictures()
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        pic = pictures[rng.integers(len(pictures))]
        scale = min(pic.width / w, pic.height / h) * rng.uniform(0.25, 1)
        cw, ch = max(1, int(w * scale)), max(1, int(h * scale))
        x, y = rng.integers(0, pic.width - cw + 1), rng.integers(0, pic.height - ch + 1)
        im = pic.crop((x, y, x + cw, y + ch)).resize((w, h), Image.Resampling.LANCZOS)
        if rng.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out.append(_encode(im.convert(mode), fmt, **params))
    return out


# ---- contenders -----------------------------------------------------------------------------------------


def batches(items: list, size: int):
    return [items[i : i + size] for i in range(0, len(items), size)]


# Each runner hands each batch's pixel_values to `keep` (timed runs drop them; the quality check keeps them).


def run_processor(proc, blobs: list[bytes], batch: int, keep=None):
    from PIL import Image

    for chunk in batches(blobs, batch):
        out = proc(images=[Image.open(io.BytesIO(b)) for b in chunk], return_tensors="pt")["pixel_values"]
        if keep is not None:
            keep.append(out)


def run_ours(spec, blobs: list[bytes], batch: int, keep=None):
    import torch

    from mieb_ray.encode.preprocess import load_images, normalize

    for chunk in batches(blobs, batch):
        pixels, errors = load_images(chunk, spec)
        assert not any(errors), errors
        out = normalize(torch.from_numpy(pixels), spec)
        if keep is not None:
            keep.append(out)


def run_ours_uint8(spec, blobs: list[bytes], batch: int, keep=None):
    from mieb_ray.encode.preprocess import load_images

    for chunk in batches(blobs, batch):
        pixels, errors = load_images(chunk, spec)
        assert not any(errors), errors
        if keep is not None:
            keep.append(pixels)


def run_floor(spec, blobs: list[bytes], batch: int, keep=None):
    """The decode alone, as mieb-ray's path decodes (simplejpeg at the draft scale, Pillow for the rest, to RGB):
    the floor of any preprocessing of these bytes that decodes them so."""
    from mieb_ray.encode import preprocess

    for b in blobs:
        preprocess._open(b, spec, preprocess.MAX_PIXELS)


def run_baseline(module, spec, blobs: list[bytes], batch: int, keep=None):
    bspec = module.ImageSpec(**spec.to_dict())
    for chunk in batches(blobs, batch):
        pixels, errors = module.load_images(chunk, bspec)
        assert not any(errors), errors
        if keep is not None:
            keep.append(pixels)


def run_pillow_resize(spec, blobs: list[bytes], batch: int, keep=None):
    from mieb_ray.encode import preprocess

    saved, preprocess.TORCH_FILTERS = preprocess.TORCH_FILTERS, {}  # every filter through Pillow
    try:
        run_ours_uint8(spec, blobs, batch, keep)
    finally:
        preprocess.TORCH_FILTERS = saved


def load_baseline(path: str):
    """Another copy of mieb_ray/encode/preprocess.py, as a module of its own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("preprocess_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_vips(spec, blobs: list[bytes], batch: int, keep=None):
    """pyvips (libvips): decode, shrink on load, resize to fill 224 x 224 and centre-crop in one call
    (`thumbnail_buffer`, its own filter), then mieb-ray's `normalize`."""
    import pyvips
    import torch

    from mieb_ray.encode.preprocess import normalize

    side = spec.height
    for chunk in batches(blobs, batch):
        arrays = []
        for b in chunk:
            im = pyvips.Image.thumbnail_buffer(b, side, height=side, crop="centre")
            a = np.ndarray(buffer=im.write_to_memory(), dtype=np.uint8, shape=(im.height, im.width, im.bands))
            arrays.append(np.repeat(a[:, :, :1], 3, 2) if a.shape[2] < 3 else a[:, :, :3])
        out = normalize(torch.from_numpy(np.stack(arrays)), spec)
        if keep is not None:
            keep.append(out)


def run_ours_pillow(spec, blobs: list[bytes], batch: int, keep=None):
    from mieb_ray.encode import preprocess

    saved, preprocess.simplejpeg = preprocess.simplejpeg, None
    try:
        run_ours(spec, blobs, batch, keep)
    finally:
        preprocess.simplejpeg = saved


def collect(run, *args):
    """All the pixel_values of a runner, as one tensor."""
    import torch

    keep = []
    run(*args, keep=keep)
    return torch.cat(keep)


def cpu_seconds(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


class TorchvisionWorker:
    """processor (torchvision) in another interpreter: `time NAME` -> CPU seconds of one run over the images
    of NAME (files under root/NAME), `dump NAME PATH` -> its pixel_values saved with numpy."""

    def __init__(self, python: str, root: Path, batch: int):
        self.proc = subprocess.Popen([python, __file__, "--worker", str(root), "--batch", str(batch)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.facts = self._ask("facts")

    def _ask(self, line: str):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the torchvision worker ended (on {line!r})")
        return json.loads(answer)

    def seconds(self, name: str) -> float:
        return self._ask(f"time {name}")

    def pixel_values(self, name: str):
        import torch

        path = Path(tempfile.mkdtemp()) / "pv.npy"
        self._ask(f"dump {name} {path}")
        return torch.from_numpy(np.load(path))

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def worker(root: str, batch: int) -> None:
    """The subprocess side of TorchvisionWorker (no mieb_ray imports: another venv)."""
    import PIL
    import torch
    import torchvision
    import transformers
    from transformers import CLIPImageProcessor

    torch.set_num_threads(1)
    proc = CLIPImageProcessor()
    sets = {d.name: [p.read_bytes() for p in sorted(d.iterdir())] for d in Path(root).iterdir()}
    run_processor(proc, next(iter(sets.values()))[:2], batch)  # warm up
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "facts":
            out = {"class": f"{type(proc).__module__}.{type(proc).__name__}", "backend": getattr(proc, "backend", None),
                   "torch": torch.__version__, "torchvision": torchvision.__version__,
                   "transformers": transformers.__version__, "Pillow": PIL.__version__}
        elif cmd == "time":
            blobs = sets[args[0]]
            out = cpu_seconds(lambda: run_processor(proc, blobs, batch))
        elif cmd == "dump":
            np.save(args[1], collect(run_processor, proc, sets[args[0]], batch).numpy())
            out = args[1]
        print(json.dumps(out), flush=True)


# ---- measures -------------------------------------------------------------------------------------------


def difference(ours, ref, spec) -> dict:
    import torch

    diff = (ours - ref).abs()
    levels = diff * torch.tensor(spec.std).view(1, 3, 1, 1) / spec.rescale_factor  # back to uint8 steps
    return {"levels_max": levels.max().item(), "levels_mean": levels.mean().item(),
            "over_1": (levels > 1.5).float().mean().item()}


def centred_cosine(ours, ref):
    """Per image: cosine of (ours - m) and (ref - m), m = the mean pixel_values of ref over the set."""
    mean = ref.mean(0, keepdim=True)
    a, b = (ours - mean).flatten(1), (ref - mean).flatten(1)
    return (a * b).sum(1) / a.norm(dim=1) / b.norm(dim=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50, help="1600x1200 JPEGs, half smooth, half sharp")
    ap.add_argument("--per-kind", type=int, default=64, help="images of each kind of the mix")
    ap.add_argument("--photos", type=int, default=500, help="JPEGs of the photos set, each its own size")
    ap.add_argument("--batch", type=int, default=CHUNK_ROWS, help="images per load_images call (default: the job's "
                                                                   "chunk, reader.CHUNK_ROWS)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sets", default="jpeg1600,photos,mix", help="comma-separated: jpeg1600, photos, mix")
    ap.add_argument("--torchvision-python", help="an interpreter whose transformers has torchvision")
    ap.add_argument("--draft-factor", type=int, help="mieb-ray's preprocess.DRAFT_FACTOR for this run")
    ap.add_argument("--vips", action="store_true", help="also pyvips (pip install pyvips pyvips-binary)")
    ap.add_argument("--baseline", help="another preprocess.py whose load_images to time beside this one's")
    ap.add_argument("--pillow-resize", action="store_true", help="also load_images through Pillow's resize")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    h.add_records_option(ap)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.batch)

    import PIL
    import torch
    from PIL import features
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from mieb_ray.encode import preprocess
    from mieb_ray.encode.preprocess import ImageSpec

    torch.set_num_threads(1)
    if args.draft_factor is not None:
        preprocess.DRAFT_FACTOR = args.draft_factor
    proc = CLIPImageProcessorPil()
    spec = ImageSpec.from_processor_config(proc.to_dict())
    wanted = args.sets.split(",")
    groups: dict[str, dict[str, list[bytes]]] = {}  # set -> {group name: bytes}
    if "jpeg1600" in wanted:
        groups["jpeg1600"] = make_jpegs(args.n)
    if "photos" in wanted:
        groups["photos"] = {"mixed sizes": make_photos(args.photos)}
    weights = mix_weights()
    if "mix" in wanted:
        groups["mix"] = {k: make_kind(k, args.per_kind, seed=i) for i, k in enumerate(KINDS)}

    names = [f"{s}/{g}" for s, gs in groups.items() for g in gs]
    blobs = {f"{s}/{g}": b for s, gs in groups.items() for g, b in gs.items()}
    contenders = {
        "processor (PIL)": lambda b: run_processor(proc, b, args.batch),
        "mieb-ray": lambda b: run_ours(spec, b, args.batch),
        "mieb-ray, Pillow decode": lambda b: run_ours_pillow(spec, b, args.batch),
        "mieb-ray load_images only": lambda b: run_ours_uint8(spec, b, args.batch),
        "decode floor": lambda b: run_floor(spec, b, args.batch),
    }
    uint8 = ["mieb-ray load_images only"]  # contenders that stop at uint8, for the ratio to the floor
    if args.baseline:
        baseline = load_baseline(args.baseline)
        contenders["baseline load_images only"] = lambda b: run_baseline(baseline, spec, b, args.batch)
        uint8.append("baseline load_images only")
    if args.pillow_resize:
        contenders["mieb-ray, Pillow resize"] = lambda b: run_pillow_resize(spec, b, args.batch)
        uint8.append("mieb-ray, Pillow resize")
    if args.vips:
        contenders["pyvips"] = lambda b: run_vips(spec, b, args.batch)
    tv, tmp, tv_facts = None, None, None
    if args.torchvision_python and Path(args.torchvision_python).exists():
        tmp = tempfile.TemporaryDirectory()
        for name in names:
            d = Path(tmp.name) / name.replace("/", "__").replace(" ", "_")
            d.mkdir()
            for i, b in enumerate(blobs[name]):
                (d / f"{i:05d}").write_bytes(b)
        tv = TorchvisionWorker(args.torchvision_python, Path(tmp.name), args.batch)
        tv_facts = tv.facts
        print(f"processor (torchvision): {tv_facts}")
    else:
        print(f"NOTE: processor (torchvision) skipped: --torchvision-python {args.torchvision_python or '(not given)'} "
              "is not an interpreter here (it needs transformers with torchvision)")
    order = list(contenders) + (["processor (torchvision)"] if tv else [])

    for fn in contenders.values():  # warm up (imports, first allocations)
        fn(blobs[names[0]][:2])

    def headline(per: dict[str, float]) -> float:
        """CPU seconds per image of one run: mieb-train's mix weighted by rows, else the 1600x1200 JPEGs' mean."""
        if "mix" in groups:
            return sum(weights[g] * per[f"mix/{g}"] for g in groups["mix"])
        return float(np.mean(list(per.values())))

    def timed(c: str):
        def call(i):
            per = {}
            for name in names:
                if c == "processor (torchvision)":
                    seconds = tv.seconds(name.replace("/", "__").replace(" ", "_"))
                else:
                    seconds = cpu_seconds(lambda: contenders[c](blobs[name]))
                per[name] = seconds / len(blobs[name])
            return {"seconds": headline(per), "per_image": per}
        return call

    includes = {
        "processor (PIL)": "`CLIPImageProcessorPil()` on `Image.open(bytes)`: decode, convert_rgb, PIL resize, crop, "
                           "rescale, normalise in numpy",
        "mieb-ray": "`load_images` (simplejpeg/Pillow decode, torch's antialiased uint8 resize per size group, crop) "
                    "+ `normalize`",
        "mieb-ray, Pillow decode": "the same with every image decoded by Pillow (simplejpeg hidden)",
        "mieb-ray load_images only": "uint8, no normalise: the CPU work of the embed job's decode tasks",
        "decode floor": "the decode alone, as mieb-ray decodes (`preprocess._open`)",
        "baseline load_images only": f"load_images of {args.baseline}, uint8",
        "mieb-ray, Pillow resize": "load_images with every image through Pillow's resize, uint8",
        "pyvips": "libvips `thumbnail_buffer` + mieb-ray's normalize",
        "processor (torchvision)": "`CLIPImageProcessor()` with transformers' torchvision backend, in "
                                   f"{args.torchvision_python}",
    }
    bench = h.Benchmark(
        "preprocess", "Embed preprocessing, one core, CPU seconds per image "
        + ("on mieb-train's mix (weighted by rows)" if "mix" in groups else "on 1600x1200 JPEGs")
        + f": sets {', '.join(groups)}, batches of {args.batch}", [
            h.Contender(c, includes[c], call=timed(c),
                        baseline=None if c in ("processor (PIL)", "decode floor") else
                        "decode floor" if c in uint8 else "processor (PIL)")
            for c in order], group="Embed", repeat=args.repeat, unit="CPU s per image",
        ratio=("mieb-ray load_images only", "decode floor"),
        columns=[("img/s (fastest)", lambda r: f"{1 / r.fastest:,.0f}")])
    record = h.run(bench)
    times = {(c, n): [e["per_image"][n] * len(blobs[n]) for e in record[c].extras] for c in order for n in names}

    per_image = {(c, n): min(t) / len(blobs[n]) for (c, n), t in times.items()}  # best-of-N, s per image
    quality = {}
    for name in names:
        ref = collect(run_processor, proc, blobs[name], args.batch)
        outs = {"mieb-ray": collect(run_ours, spec, blobs[name], args.batch),
                "mieb-ray, Pillow decode": collect(run_ours_pillow, spec, blobs[name], args.batch)}
        if args.vips:
            outs["pyvips"] = collect(run_vips, spec, blobs[name], args.batch)
        if args.baseline:  # what changed between the two, in uint8 levels
            pair = [[], []]
            run_ours_uint8(spec, blobs[name], args.batch, pair[0])
            run_baseline(baseline, spec, blobs[name], args.batch, pair[1])
            new, old = (np.concatenate(p).astype(int) for p in pair)
            print(f"{name}: load_images against the baseline's: max {np.abs(new - old).max()} levels, "
                  f"{(new != old).mean():.2%} of values differ")
        if tv:
            outs["processor (torchvision)"] = tv.pixel_values(name.replace("/", "__").replace(" ", "_"))
        quality[name] = {c: {**difference(o, ref, spec), "cos": centred_cosine(o, ref)} for c, o in outs.items()}
    if tv:
        tv.close()
        tmp.cleanup()

    rows = []

    def row(label: str, n_images: int, kb: float, sec: dict[str, float], q: dict | None):
        base = sec["processor (PIL)"]
        cells = [label, str(n_images), f"{kb:.0f}"]
        for c in order:
            cells.append(f"{1 / sec[c]:.0f}" + ("" if c == "processor (PIL)" else f" ({base / sec[c]:.2f}x)"))
        cells.append(" / ".join(f"{sec[c] / sec['decode floor']:.2f}" for c in ["mieb-ray", *uint8]))
        if q is not None:
            for c in ("mieb-ray", "processor (torchvision)", "pyvips"):
                m = q.get(c)
                cells.append(f"{m['cos'].min():.4f} / {m['levels_max']:.0f} / {m['levels_mean']:.2f}" if m else "-")
        else:
            cells += ["", "", ""]
        rows.append(cells)
        print(" | ".join(cells))

    print("\nper group (img/s per core; ratio to processor (PIL)); mieb-ray and torchvision vs processor (PIL): "
          "min centred cosine / max / mean uint8 levels")
    for s, gs in groups.items():
        for g, b in gs.items():
            name = f"{s}/{g}"
            row(name, len(b), np.mean([len(x) for x in b]) / 1e3, {c: per_image[c, name] for c in order},
                quality[name])
        if s == "jpeg1600":
            all_sec = {c: np.mean([per_image[c, f"{s}/{g}"] for g in gs]) for c in order}
            row("jpeg1600 (all)", sum(len(b) for b in gs.values()),
                np.mean([len(x) for b in gs.values() for x in b]) / 1e3, all_sec, None)
        if s == "mix":
            mix_sec = {c: sum(weights[g] * per_image[c, f"{s}/{g}"] for g in gs) for c in order}
            kb = sum(weights[g] * np.mean([len(x) for x in gs[g]]) for g in gs) / 1e3
            row("**mix (weighted by rows)**", sum(len(b) for b in gs.values()), kb, mix_sec, None)

    header = ["set / kind", "n", "mean KB"] + [f"{c} img/s" for c in order] + [
        "time ÷ decode floor: " + " / ".join(["mieb-ray", *(c.removeprefix("mieb-ray ") for c in uint8)]),
        "mieb-ray: min centred cos / max / mean levels", "torchvision: same", "pyvips: same"]
    mix_lines = [f"{k}: {weights[k]:.2%} of rows ({', '.join(s for s, (kk, _) in MIX_KINDS.items() if kk == k)})"
                 for k in KINDS]
    sj = preprocess.simplejpeg
    record.finish(figures={
        "tables": [{"title": "Per set and kind: img/s per core, fastest run (x processor (PIL)); quality against "
                             "processor (PIL)", "header": header, "rows": rows}],
        "versions": f"Pillow {PIL.__version__} (libjpeg-turbo {features.version('libjpeg_turbo')}), simplejpeg "
                    f"{getattr(sj, '__version__', 'absent')}"
                    + (f"; processor (torchvision): {tv_facts}" if tv_facts else "")}, notes=[
        "Every contender from the same bytes to normalised float32 pixel_values (the uint8 ones to uint8); CPU time "
        f"of one thread, {args.repeat} runs interleaved, batches of {args.batch} images of one kind; the per-kind "
        f"table takes the fastest run of each kind. mieb-ray decodes JPEGs by simplejpeg at Pillow's draft scale "
        f"for >= {preprocess.DRAFT_FACTOR}x the resized size.",
        "Mix weights (rows of mieb-train): " + "; ".join(mix_lines) + "."])


if __name__ == "__main__":
    main()
