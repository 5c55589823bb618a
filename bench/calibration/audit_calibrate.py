"""Calibrate the audit's detectors on real pictures: copies under the edits datasets make, against distinct images.

Originals: the real photographs two PyPI packages ship at full size, each under the licence its package states:
scikit-image's `skimage/data/` (astronaut, camera, coffee, coins, hubble_deep_field, rocket: public domain or no
known copyright restrictions; brick, cell, chelsea, grass, gravel, microaneurysms, retina: CC0; ihc: no known
copyright restrictions) and scikit-learn's `sklearn/datasets/images/` (china, flower: CC BY 2.0). Neither package
is a dependency of mieb-ray: `pip install scikit-image ImageHash` first.

Copies (the eval side): every original under each edit of EDITS. Distinct images: each original's four quadrants
and its centre half (half of them on each side), and every other original. The train side holds the originals and
half the distinct crops; a pair found between a copy and its own original is a true match, any other pair found is
a false one (a quadrant of a photo is not a copy of it, nor is a 20% crop of the quadrant's photo).

Detectors, each over a grid of thresholds: exact (sha256), pixels (decoded pixels), pdq (mieb-ray's: PDQ of the
pixels box-downscaled to 512, against the eval image and its mirror; Hamming distance of 256 bits), phash
(imagehash.phash, 64 bits, as imagededup uses it: the anchor) and, with --clip, the near detector's cosine on a
random tiny CLIP (tests' model: its cosines mean nothing; stated so, until a trained model can be loaded: pass
--model NAME_OR_PATH for one).

Prints recall per edit and threshold, precision and false pairs per threshold, the recall on the edits a hash can
see (all but crops over 10% and rotations), the distances of the pairs that are not copies, and the hash stage's
images per second on one core on mieb-train's mix (bench/preprocess.py's kinds, weighted by rows).

Run through the harness (wrapped): what it prints becomes bench/records/audit_calibrate.json.

    .venv/bin/python bench/calibration/audit_calibrate.py [--clip] [--model PATH] [--records DIR]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import tempfile
import time

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [BENCH, os.path.dirname(BENCH)]  # bench/ (the harness, preprocess.py's kinds), the repository

from mieb_ray.audit.fingerprints import fingerprint  # noqa: E402
from mieb_ray.audit.matches import PDQ_COMPARED  # noqa: E402

SKIMAGE = ("astronaut", "brick", "camera", "cell", "chelsea", "coffee", "coins", "grass", "gravel",
           "hubble_deep_field", "ihc", "microaneurysms", "retina", "rocket")
SKLEARN = ("china", "flower")
PDQ = (8, 16, 24, 31, 40, 48, 56, 64)
PHASH = (4, 6, 8, 10, 12, 16)
COSINE = (0.90, 0.95, 0.99)
NOT_HASHABLE = ("crop 20%", "rotate 2°", "rotate 5°", "chain: crop 10% + rotate 2°")


def originals() -> dict[str, Image.Image]:
    import skimage
    import sklearn

    out = {}
    data = os.path.join(os.path.dirname(skimage.__file__), "data")
    for name in SKIMAGE:
        path = next(os.path.join(data, f) for f in os.listdir(data) if os.path.splitext(f)[0] == name)
        out[name] = Image.open(path).convert("RGB")
    images = os.path.join(os.path.dirname(sklearn.__file__), "datasets", "images")
    for name in SKLEARN:
        out[name] = Image.open(os.path.join(images, f"{name}.jpg")).convert("RGB")
    return out


def encode(image: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def crop(image: Image.Image, p: float) -> Image.Image:
    """Remove p of the width and of the height, centred."""
    w, h = image.size
    dx, dy = round(w * p / 2), round(h * p / 2)
    return image.crop((dx, dy, w - dx, h - dy))


def letterbox(image: Image.Image) -> Image.Image:
    w, h = image.size
    side = round(max(w, h) * 1.2)
    canvas = Image.new("RGB", (side, side))
    canvas.paste(image, ((side - w) // 2, (side - h) // 2))
    return canvas


def jpeg(q: int):
    return lambda im: encode(im, "JPEG", quality=q)


def png(f):
    return lambda im: encode(f(im))


EDITS = {
    **{f"jpeg q{q}": jpeg(q) for q in (90, 70, 50, 30, 10)},
    "resize x0.5": png(lambda im: im.resize((im.width // 2, im.height // 2), Image.Resampling.BICUBIC)),
    "resize x2": png(lambda im: im.resize((im.width * 2, im.height * 2), Image.Resampling.BICUBIC)),
    **{f"crop {round(p * 100)}%": png(lambda im, p=p: crop(im, p)) for p in (0.05, 0.10, 0.20)},
    "mirror": png(ImageOps.mirror),
    "rotate 2°": png(lambda im: im.rotate(2, Image.Resampling.BICUBIC)),
    "rotate 5°": png(lambda im: im.rotate(5, Image.Resampling.BICUBIC)),
    "brightness +20%": png(lambda im: ImageEnhance.Brightness(im).enhance(1.2)),
    "brightness -20%": png(lambda im: ImageEnhance.Brightness(im).enhance(0.8)),
    "contrast +20%": png(lambda im: ImageEnhance.Contrast(im).enhance(1.2)),
    "contrast -20%": png(lambda im: ImageEnhance.Contrast(im).enhance(0.8)),
    "letterbox borders": png(letterbox),
    "grayscale": png(lambda im: ImageOps.grayscale(im).convert("RGB")),
    "format: JPEG q95": jpeg(95),
    "format: WebP q80": lambda im: encode(im, "WEBP", quality=80),
    "chain: resize x0.5 + jpeg q50": lambda im: encode(im.resize((im.width // 2, im.height // 2)), "JPEG", quality=50),
    "chain: mirror + brightness -20%": png(lambda im: ImageEnhance.Brightness(ImageOps.mirror(im)).enhance(0.8)),
    "chain: crop 10% + rotate 2°": png(lambda im: crop(im, 0.10).rotate(2, Image.Resampling.BICUBIC)),
}


def pieces(image: Image.Image) -> list[Image.Image]:
    """The four quadrants and the centre half: distinct images made of the same photo."""
    w, h = image.size
    quads = [image.crop((i * w // 2, j * h // 2, (i + 1) * w // 2, (j + 1) * h // 2)) for j in range(2)
             for i in range(2)]
    return quads + [crop(image, 0.5)]


def bits(b: bytes) -> np.ndarray:
    return np.unpackbits(np.frombuffer(b, np.uint8))


def clip_vectors(model: str, images: list[bytes]) -> np.ndarray:
    import torch
    from transformers import AutoProcessor, CLIPModel

    net, processor = CLIPModel.from_pretrained(model).eval(), AutoProcessor.from_pretrained(model)
    out = []
    with torch.no_grad():
        for lo in range(0, len(images), 32):
            batch = [Image.open(io.BytesIO(b)).convert("RGB") for b in images[lo:lo + 32]]
            v = net.get_image_features(**processor(images=batch, return_tensors="pt"))
            v = v if isinstance(v, torch.Tensor) else v.pooler_output
            out.append(torch.nn.functional.normalize(v, dim=-1).numpy())
    return np.concatenate(out)


def hash_rate() -> str:
    """CPU-seconds images per second of `fingerprint` (decode, sha256, pixel hash, four PDQ hashes) on mieb-train's
    mix: bench/preprocess.py's kinds (crops of the fixture pictures at each kind's size and format), weighted by
    their rows in mieb-train."""
    from preprocess import KINDS, make_kind, mix_weights

    weights, seconds, cells = mix_weights(), {}, []
    for i, kind in enumerate(KINDS):
        images = make_kind(kind, 64, seed=i)
        t0 = time.process_time()
        for data in images:
            fingerprint(data)
        seconds[kind] = (time.process_time() - t0) / len(images)
        cells.append(f"{kind} {1 / seconds[kind]:,.0f}/s")
    mix = 1 / sum(weights[k] * seconds[k] for k in KINDS)
    return f"mieb-train's mix (weighted by rows) {mix:,.0f}/s; " + ", ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clip", action="store_true", help="also the near detector's cosine on a random tiny CLIP")
    ap.add_argument("--model", help="a CLIP model (hub name or folder) for the near detector instead")
    args = ap.parse_args()
    import imagehash

    photos = originals()
    train, evals = [], []  # (name, bytes, original it copies or None)
    for name, image in photos.items():
        train.append((name, encode(image), name))
        for edit, make in EDITS.items():
            evals.append((f"{name} | {edit}", make(image), name))
        for n, piece in enumerate(pieces(image)):
            (train if n % 2 else evals).append((f"{name} | piece {n}", encode(piece), None))
    prints = {k: [fingerprint(b) for _, b, _ in side] for k, side in (("train", train), ("eval", evals))}
    phash = {k: [imagehash.phash(Image.open(io.BytesIO(b)).convert("RGB")) for _, b, _ in side]
             for k, side in (("train", train), ("eval", evals))}
    truth = np.array([[t[2] is not None and t[2] == e[2] and t[0] == t[2] for e in evals] for t in train])
    def side(k: str, column: str) -> np.ndarray:
        return np.stack([bits(getattr(p, column)) for p in prints[k]])

    pdq_d = np.min([(side("train", a)[:, None] != side("eval", b)[None]).sum(2) for a, b in PDQ_COMPARED], axis=0)
    pdq_full = (side("train", "pdq")[:, None] != side("eval", "pdq")[None]).sum(2)
    pdq_mirror = np.minimum(pdq_full, (side("train", "pdq")[:, None] != side("eval", "pdq_mirror")[None]).sum(2))
    ph_d = np.array([[a - b for b in phash["eval"]] for a in phash["train"]])
    detectors = {
        "exact": {"": np.array([[a.sha == b.sha for b in prints["eval"]] for a in prints["train"]])},
        "pixels": {"": np.array([[a.pix is not None and a.pix == b.pix for b in prints["eval"]]
                                 for a in prints["train"]])},
        "pdq": {f"<={t}": pdq_d <= t for t in PDQ},
        "pdq, no crop hashes": {"<=31": pdq_mirror <= 31},
        "pdq, one hash": {"<=31": pdq_full <= 31},
        "phash": {f"<={t}": ph_d <= t for t in PHASH},
    }
    clip_note = None
    if args.clip or args.model:
        model = args.model
        if not model:
            from mieb_ray.demo_data.models import make_tiny_clip

            model = make_tiny_clip(os.path.join(tempfile.mkdtemp(), "tiny-clip"))
        vt = clip_vectors(model, [b for _, b, _ in train])
        ve = clip_vectors(model, [b for _, b, _ in evals])
        cos = vt @ ve.T
        detectors["near (cosine)"] = {f">={t}": cos >= t for t in COSINE}
        clip_note = args.model or "a random tiny CLIP (tests' model): its cosines mean nothing"

    edits = list(EDITS)
    edit_of = np.array([e[0].split(" | ", 1)[1] if e[2] is not None and " | piece" not in e[0] else "" for e in evals])
    hashable = np.isin(edit_of, [e for e in edits if e not in NOT_HASHABLE])
    print(f"# Audit detectors on real pictures: {len(photos)} originals x {len(EDITS)} edits = "
          f"{sum(edit_of != '')} copies; {sum(e[2] is None for e in train + evals)} distinct crops; "
          f"{len(train)} train x {len(evals)} eval = {len(train) * len(evals):,} pairs\n")
    columns = [(d, t) for d, grid in detectors.items() for t in grid]
    print("| edit | " + " | ".join(f"{d} {t}".strip() for d, t in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for edit in edits:
        cells = []
        for d, t in columns:
            found = detectors[d][t] & truth
            copies = edit_of == edit
            cells.append(f"{found[:, copies].any(0).mean():.2f}")
        print(f"| {edit} | " + " | ".join(cells) + " |")
    rows = {"recall, hashable edits": [], "recall, all edits": [], "precision": [], "false pairs": []}
    for d, t in columns:
        found = detectors[d][t]
        tp = (found & truth).any(0)
        rows["recall, hashable edits"].append(f"{tp[hashable].mean():.3f}")
        rows["recall, all edits"].append(f"{tp[edit_of != ''].mean():.3f}")
        false = int((found & ~truth).sum())
        rows["false pairs"].append(f"{false}")
        rows["precision"].append(f"{(found & truth).sum() / max(found.sum(), 1):.3f}")
    for name, cells in rows.items():
        print(f"| **{name}** | " + " | ".join(cells) + " |")
    distinct = np.sort(pdq_d[~truth])
    print(f"\npdq distances of the {distinct.size:,} pairs that are not copies: min {distinct[0]}, 0.1% "
          f"{np.quantile(distinct, 0.001):.0f}, 1% {np.quantile(distinct, 0.01):.0f}, median {np.median(distinct):.0f}")
    false = [(train[i][0], evals[j][0], int(pdq_d[i, j])) for i, j in zip(*np.nonzero((pdq_d <= 31) & ~truth))]
    print(f"pdq false pairs at 31: {false}")
    print(f"hash stage (decode, sha256, pixel hash, 4 PDQ hashes), one core: {hash_rate()}")
    if clip_note:
        print(f"near: {clip_note}")
    print(f"CPU: {platform.processor() or platform.machine()}; Python {platform.python_version()}; "
          f"imagehash {imagehash.__version__}")


if __name__ == "__main__":
    import harness

    harness.wrap(main, "audit_calibrate", "Audit detectors on real pictures", kind="calibration", group="Audit")
