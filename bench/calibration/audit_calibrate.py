"""Calibrate the audit's pdq detector on real pictures: copies under the edits datasets make, against distinct images.

Originals, two sets, read from the installed packages (nothing of them is copied into this repository). Set A, the
16 pictures the detector was designed on: the real photographs scikit-image's `skimage/data/` ships at full size
(astronaut, camera, coffee, coins, hubble_deep_field, rocket: public domain or no known copyright restrictions;
brick, cell, chelsea, grass, gravel, microaneurysms, retina: CC0; ihc: no known copyright restrictions) and
scikit-learn's `sklearn/datasets/images/` (china, flower: CC BY 2.0). Set B, to check it on pictures it was not
designed on: scikit-image's other photographs (clock_motion, text: public domain; motorcycle_left: the Middlebury
2014 stereo benchmark; moon, page: no source stated) and a window (half to three quarters of each side, at a random
place) of each picture of set A, as a photograph of its own. Neither package is a dependency of mieb-ray:
`pip install scikit-image ImageHash scikit-learn` first.

Copies (the eval side): every original under each edit of EDITS and under edits drawn at random (random_edits):
crops of up to 10% centred, off one side, off a corner's two sides (the same share off each) and asymmetric ones
(up to 10% of each axis split at random between its two ends), downscales to a longer side of 64, 96 or 128 px
(a filter drawn at random), and chains of them with JPEG. Distinct images: each original's four quadrants and its
centre half (half of them on each side), every other original, and 100 faces of 25 x 25 px (scikit-image's
lfw_subset, from the LFW data set, half on each side: small, alike pictures). The train side holds the originals,
half the distinct crops and half the faces; a pair found between a copy and its own original is a true match, any
other pair found is a false one (a quadrant of a photo is not a copy of it, nor is a 20% crop of the quadrant's
photo).

Detectors: exact (sha256), pixels (decoded pixels), pdq (mieb-ray's, matches.PDQ_COMPARED: the train picture's
hash and its windows' against the eval picture's hash, its mirror's and its centred windows', pictures of PDQ
quality 50 or more), over a grid of thresholds; the same with the copies on the train side (a train image made by
editing an eval image); pdq as it was before its windows (hash version 1: pdqhash of the pixels at 256 px, their
mirror, central 95% and 90%); phash (imagehash.phash, 64 bits, as imagededup uses it: the anchor) and, with --clip,
the near detector's cosine on a random tiny CLIP (tests' model: its cosines mean nothing; pass --model
NAME_OR_PATH for a trained one).

Prints, per set, the recall of each family of edits and threshold, precision and false pairs; the distances of the
pairs that are not copies; whether matches.pdq_pairs (the audit's search) finds exactly the pairs within 31 bits;
the recall of the crop families for other grids of windows (how the windows were chosen), and what windows would
take for crops cut unevenly from several sides; the pdq search's CPU
time before and after on hashes of a task's shape; and the hash stage's images per second on one core before and
after, on mieb-train's mix (bench/preprocess.py's kinds, weighted by rows). Every draw is seeded (SEED).

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
import pyarrow as pa
from PIL import Image, ImageEnhance, ImageOps

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [BENCH, os.path.dirname(BENCH)]  # bench/ (the harness, preprocess.py's kinds), the repository

from mieb_ray.audit import fingerprints, matches  # noqa: E402
from mieb_ray.audit.fingerprints import decode, fingerprint, pdq_pixels, pixel_hash, sha256  # noqa: E402

SEED = 0
SKIMAGE = ("astronaut", "brick", "camera", "cell", "chelsea", "coffee", "coins", "grass", "gravel",
           "hubble_deep_field", "ihc", "microaneurysms", "retina", "rocket")
SKLEARN = ("china", "flower")
SKIMAGE_OTHERS = ("motorcycle_left", "clock_motion", "moon", "page", "text")
FACES = 100  # the first 100 of lfw_subset are faces
PDQ = (16, 24, 31, 40, 48, 64)
PHASH = 10  # imagededup's distance
COSINE = (0.90, 0.95, 0.99)
THRESHOLD = matches.PDQ_THRESHOLD
FILTERS = (Image.Resampling.BOX, Image.Resampling.BILINEAR, Image.Resampling.BICUBIC, Image.Resampling.LANCZOS)
# (left, right, top, bottom): the sides a crop of each kind cuts off
ONE_SIDE = {"left": (1, 0, 0, 0), "right": (0, 1, 0, 0), "top": (0, 0, 1, 0), "bottom": (0, 0, 0, 1)}
CORNERS = {"top left": (1, 0, 1, 0), "top right": (0, 1, 1, 0), "bottom left": (1, 0, 0, 1),
           "bottom right": (0, 1, 0, 1)}
# the version-1 detector (before the windows): its hash columns and comparisons
V1_COMPARED = (("pdq", "pdq"), ("pdq", "pdq_mirror"), ("pdq_c95", "pdq"), ("pdq", "pdq_c95"), ("pdq_c90", "pdq"),
               ("pdq", "pdq_c90"))


def skimage_picture(name: str) -> Image.Image:
    import skimage

    data = os.path.join(os.path.dirname(skimage.__file__), "data")
    path = next(os.path.join(data, f) for f in os.listdir(data) if os.path.splitext(f)[0] == name)
    return Image.open(path).convert("RGB")


def set_a() -> dict[str, Image.Image]:
    import sklearn

    out = {name: skimage_picture(name) for name in SKIMAGE}
    images = os.path.join(os.path.dirname(sklearn.__file__), "datasets", "images")
    for name in SKLEARN:
        out[name] = Image.open(os.path.join(images, f"{name}.jpg")).convert("RGB")
    return out


def set_b(a: dict[str, Image.Image], rng: np.random.Generator) -> dict[str, Image.Image]:
    """Other photographs, and a window of each picture of set A (half to three quarters of each side)."""
    out = {name: skimage_picture(name) for name in SKIMAGE_OTHERS}
    for name, image in a.items():
        w, h = image.size
        cw, ch = round(w * rng.uniform(0.5, 0.75)), round(h * rng.uniform(0.5, 0.75))
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        out[f"{name} window"] = image.crop((x, y, x + cw, y + ch))
    return out


def faces() -> list[Image.Image]:
    import skimage

    stack = np.load(os.path.join(os.path.dirname(skimage.__file__), "data", "lfw_subset.npy"))[:FACES]
    return [Image.fromarray(np.round(face * 255).astype(np.uint8)).convert("RGB") for face in stack]


def encode(image: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def cut(image: Image.Image, left: float, right: float, top: float, bottom: float) -> Image.Image:
    """The image with these shares of its width and height cut off each side."""
    w, h = image.size
    return image.crop((round(w * left), round(h * top), w - round(w * right), h - round(h * bottom)))


def crop(image: Image.Image, p: float) -> Image.Image:
    """Remove p of the width and of the height, centred."""
    return cut(image, p / 2, p / 2, p / 2, p / 2)


def downscale(image: Image.Image, side: int, resample=Image.Resampling.LANCZOS) -> Image.Image:
    """The image with its longer side `side` px."""
    scale = side / max(image.size)
    return image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), resample)


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


# name -> (family, edit); a family in NOT_HASHABLE is one no hash is meant to see
EDITS = {
    **{f"jpeg q{q}": ("re-encode", jpeg(q)) for q in (90, 70, 50, 30)},
    "jpeg q10": ("jpeg q10", jpeg(10)),
    "format: JPEG q95": ("re-encode", jpeg(95)),
    "format: WebP q80": ("re-encode", lambda im: encode(im, "WEBP", quality=80)),
    "resize x0.5": ("resize x0.5, x2", png(lambda im: im.resize((im.width // 2, im.height // 2),
                                                                 Image.Resampling.BICUBIC))),
    "resize x2": ("resize x0.5, x2", png(lambda im: im.resize((im.width * 2, im.height * 2),
                                                               Image.Resampling.BICUBIC))),
    "crop 5%": ("crop centred", png(lambda im: crop(im, 0.05))),
    "crop 10%": ("crop centred", png(lambda im: crop(im, 0.10))),
    "crop 20%": ("crop 20%", png(lambda im: crop(im, 0.20))),
    "mirror": ("mirror", png(ImageOps.mirror)),
    "rotate 2°": ("rotate", png(lambda im: im.rotate(2, Image.Resampling.BICUBIC))),
    "rotate 5°": ("rotate", png(lambda im: im.rotate(5, Image.Resampling.BICUBIC))),
    "brightness +20%": ("colour", png(lambda im: ImageEnhance.Brightness(im).enhance(1.2))),
    "brightness -20%": ("colour", png(lambda im: ImageEnhance.Brightness(im).enhance(0.8))),
    "contrast +20%": ("colour", png(lambda im: ImageEnhance.Contrast(im).enhance(1.2))),
    "contrast -20%": ("colour", png(lambda im: ImageEnhance.Contrast(im).enhance(0.8))),
    "grayscale": ("colour", png(lambda im: ImageOps.grayscale(im).convert("RGB"))),
    "letterbox borders": ("letterbox", png(letterbox)),
    "chain: resize x0.5 + jpeg q50": ("chain", lambda im: encode(im.resize((im.width // 2, im.height // 2)), "JPEG",
                                                                 quality=50)),
    "chain: mirror + brightness -20%": ("chain", png(lambda im: ImageEnhance.Brightness(ImageOps.mirror(im))
                                                     .enhance(0.8))),
    "chain: crop 10% + rotate 2°": ("rotate", png(lambda im: crop(im, 0.10).rotate(2, Image.Resampling.BICUBIC))),
}
NOT_HASHABLE = ("crop 20%", "rotate")
FAMILIES = ("re-encode", "jpeg q10", "resize x0.5, x2", "downscale to 64-128 px", "crop centred", "crop one side",
            "crop corner", "crop asymmetric", "mirror", "colour", "letterbox", "chain", "crop 20%", "rotate")


def random_edits(rng: np.random.Generator) -> list[tuple[str, str, object]]:
    """(name, family, edit) of one original's edits drawn at random: crop shares in (0, 10%], sides, filters."""
    def share() -> float:
        return float(rng.uniform(0.0, 0.10)) or 0.10

    def shaped(shape: tuple, p: float):
        return lambda im: cut(im, *(p * s for s in shape))

    out = []
    for _ in range(4):
        p = share()
        out.append((f"crop centred {p:.1%}", "crop centred", png(lambda im, p=p: crop(im, p))))
    for kind, family in ((ONE_SIDE, "crop one side"), (CORNERS, "crop corner")):
        for name, shape in kind.items():
            for _ in range(2):
                p = share()
                out.append((f"crop {name} {p:.1%}", family, png(shaped(shape, p))))
    for _ in range(6):
        across, down = share(), share()
        left, top = across * rng.uniform(), down * rng.uniform()
        sides = (left, across - left, top, down - top)
        out.append(("crop " + "/".join(f"{s:.1%}" for s in sides), "crop asymmetric",
                    png(lambda im, s=sides: cut(im, *s))))
    for side in (64, 64, 96, 128):
        f = FILTERS[rng.integers(len(FILTERS))]
        out.append((f"downscale to {side} px ({f.name.lower()})", "downscale to 64-128 px",
                    png(lambda im, side=side, f=f: downscale(im, side, f))))
    out.append(("chain: downscale to 64 px + jpeg q75", "chain",
                lambda im: encode(downscale(im, 64), "JPEG", quality=75)))
    for kind in (ONE_SIDE, CORNERS):
        name = list(kind)[rng.integers(len(kind))]
        p = share()
        out.append((f"chain: crop {name} {p:.1%} + downscale to 128 px + jpeg q75", "chain",
                    lambda im, s=kind[name], p=p: encode(downscale(cut(im, *(p * x for x in s)), 128), "JPEG",
                                                         quality=75)))
    p = share()
    out.append((f"chain: crop centred {p:.1%} + jpeg q50", "chain", lambda im, p=p: encode(crop(im, p), "JPEG",
                                                                                               quality=50)))
    return out


def pieces(image: Image.Image) -> list[Image.Image]:
    """The four quadrants and the centre half: distinct images made of the same photo."""
    w, h = image.size
    quads = [image.crop((i * w // 2, j * h // 2, (i + 1) * w // 2, (j + 1) * h // 2)) for j in range(2)
             for i in range(2)]
    return quads + [crop(image, 0.5)]


# ---------------------------------------------------------------------------------------------- the detectors


def central(pixels: np.ndarray, keep: float) -> np.ndarray:
    h, w = pixels.shape[:2]
    dy, dx = round(h * (1 - keep) / 2), round(w * (1 - keep) / 2)
    return np.ascontiguousarray(pixels[dy:h - dy, dx:w - dx])


def v1_hashes(rgb: Image.Image) -> tuple:
    """The pdq detector's hashes before its windows (hash version 1): pdqhash of the pixels at 256 px, of their
    mirror, of their central 95% and 90%, and the quality."""
    import pdqhash

    pixels = pdq_pixels(rgb)
    bits, quality = pdqhash.compute(pixels)
    others = [pdqhash.compute(p)[0] for p in (np.ascontiguousarray(pixels[:, ::-1]), central(pixels, 0.95),
                                               central(pixels, 0.90))]
    return (*(np.packbits(np.asarray(b, np.uint8)).tobytes() for b in (bits, *others)), int(quality))


def v1_fingerprint(data: bytes) -> tuple:
    """The hash stage before the windows: sha256, decode, pixel hash, the four pdqhash hashes."""
    digest, rgb = sha256(data), decode(data)
    return digest, pixel_hash(rgb), *v1_hashes(rgb)


def v1_rows(keys: list[str], images: list[bytes]) -> pa.Table:
    hashed = [v1_hashes(decode(b)) for b in images]
    columns = ("pdq", "pdq_mirror", "pdq_c95", "pdq_c90")
    return pa.table({"key": keys, "eval_task": ["T"] * len(keys),
                     **{c: pa.array([x[n] for x in hashed], pa.binary(32)) for n, c in enumerate(columns)},
                     "pdq_quality": pa.array([x[4] for x in hashed], pa.int16())})


def distances(train: pa.Table, evals: pa.Table, compared: tuple) -> np.ndarray:
    """The pdq detector's distance of every (train, eval) row, computed pair by pair: the smallest over the hashes
    `compared` pairs; 257 where either side's quality is under matches.MIN_QUALITY."""
    def words(table: pa.Table, column: str) -> np.ndarray:
        return matches.pdq_words(table[column].combine_chunks())

    def usable(table: pa.Table) -> np.ndarray:
        return table["pdq_quality"].fill_null(0).to_numpy() >= matches.MIN_QUALITY

    out = np.full((train.num_rows, evals.num_rows), 257)
    for a, b in compared:
        ours, theirs = words(train, a), words(evals, b)
        for k in range(ours.shape[1]):
            for m in range(theirs.shape[1]):
                d = np.bitwise_count(ours[:, k, None, :] ^ theirs[None, :, m, :]).sum(-1, dtype=np.int64)
                np.minimum(out, d, out=out)
    out[~(usable(train)[:, None] & usable(evals)[None, :])] = 257
    return out


def searched(train: pa.Table, evals: pa.Table, threshold: int) -> dict[tuple[str, str], int]:
    """matches.pdq_pairs, the audit's search: {(train key, eval key): distance}."""
    pairs = matches.pdq_pairs(train, evals, threshold)[0]
    keys = zip(pairs["train_key"].to_pylist(), pairs["eval_key"].to_pylist())
    return {key: round((1 - score) * 256) for key, score in zip(keys, pairs["score"].to_pylist())}


def phash_distances(train: list[bytes], evals: list[bytes]) -> np.ndarray:
    import imagehash

    def bits(data: bytes) -> np.ndarray:
        return imagehash.phash(Image.open(io.BytesIO(data)).convert("RGB")).hash.ravel()

    t, e = np.stack([bits(b) for b in train]), np.stack([bits(b) for b in evals])
    return (t[:, None, :] != e[None, :, :]).sum(-1)


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


# ---------------------------------------------------------------------------------------------- one set


class Sides:
    """The train side (originals, half the distinct crops and faces) and the eval side (copies, the other half) of
    one set of originals: names, bytes, the original each copies (None: a distinct image) and family of edit."""

    def __init__(self, photos: dict[str, Image.Image], people: list[Image.Image], rng: np.random.Generator):
        self.train: list[tuple[str, bytes, str | None]] = []
        self.evals: list[tuple[str, bytes, str | None, str]] = []
        for name, image in photos.items():
            self.train.append((name, encode(image), name))
            edits = [(e, f, fn) for e, (f, fn) in EDITS.items()] + random_edits(rng)
            for edit, family, make in edits:
                self.evals.append((f"{name} | {edit}", make(image), name, family))
            for n, piece in enumerate(pieces(image)):
                if n % 2:
                    self.train.append((f"{name} | piece {n}", encode(piece), None))
                else:
                    self.evals.append((f"{name} | piece {n}", encode(piece), None, ""))
        for n, face in enumerate(people):
            if n % 2:
                self.train.append((f"face {n}", encode(face), None))
            else:
                self.evals.append((f"face {n}", encode(face), None, ""))
        # a copy matches its own original only
        self.truth = np.array([[t[2] is not None and t[2] == e[2] for e in self.evals] for t in self.train])
        self.family = np.array([e[3] for e in self.evals])

    def tables(self) -> tuple[pa.Table, pa.Table]:
        return (matches.hash_rows([t[0] for t in self.train], [t[1] for t in self.train], 0, 0, 1,
                                  [None] * len(self.train)),
                matches.hash_rows([e[0] for e in self.evals], [e[1] for e in self.evals], 0, 0, 1,
                                  ["T"] * len(self.evals)))


def measure(label: str, photos: dict[str, Image.Image], people: list[Image.Image], rng: np.random.Generator,
            clip: str | None) -> dict:
    """Print one set's tables; return its figures."""
    s = Sides(photos, people, rng)
    train, evals = s.tables()
    now = distances(train, evals, matches.PDQ_COMPARED)
    # the copies on the train side: a train image made from an eval image (through the eval side's windows)
    reverse = distances(evals, train, matches.PDQ_COMPARED).T
    v1 = distances(v1_rows([t[0] for t in s.train], [t[1] for t in s.train]),
                   v1_rows([e[0] for e in s.evals], [e[1] for e in s.evals]), V1_COMPARED)
    found = searched(train, evals, THRESHOLD)
    # the search's distance: the train side's search's where the pictures themselves are within the threshold
    rule = np.where(distances(train, evals, (("pdq", "pdq"),)) <= THRESHOLD,
                    distances(train, evals, matches.PDQ_FROM_TRAIN), now)
    within = {(s.train[i][0], s.evals[j][0]): int(rule[i, j]) for i, j in zip(*np.nonzero(now <= THRESHOLD))}
    def same(column: str) -> np.ndarray:
        return np.array([[a is not None and a == b for b in evals[column].to_pylist()]
                         for a in train[column].to_pylist()])

    detectors = {"exact": {"": same("sha")}, "pixels": {"": same("pix")},
                 "pdq before": {f"<={THRESHOLD}": v1 <= THRESHOLD},
                 "pdq": {f"<={t}": now <= t for t in PDQ},
                 "pdq, copy on the train side": {f"<={THRESHOLD}": reverse <= THRESHOLD},
                 "phash": {f"<={PHASH}": phash_distances([t[1] for t in s.train], [e[1] for e in s.evals]) <= PHASH}}
    if clip:
        cos = clip_vectors(clip, [t[1] for t in s.train]) @ clip_vectors(clip, [e[1] for e in s.evals]).T
        detectors["near (cosine)"] = {f">={t}": cos >= t for t in COSINE}
    copies = s.family != ""
    hashable = copies & ~np.isin(s.family, NOT_HASHABLE)
    quality = dict(zip(train["key"].to_pylist(), train["pdq_quality"].to_pylist()))
    flat = [name for name in photos if (quality[name] or 0) < matches.MIN_QUALITY]
    usable = hashable & ~np.isin([e[2] for e in s.evals], flat)
    columns = [(d, t) for d, grid in detectors.items() for t in grid]
    distinct = sum(e[2] is None for e in s.evals) + sum(t[2] is None for t in s.train)
    print(f"### {label}: {len(photos)} originals, {copies.sum()} copies ({len(EDITS)} fixed edits and "
          f"{copies.sum() // len(photos) - len(EDITS)} drawn at random each); {distinct} distinct images; "
          f"{len(s.train)} train x {len(s.evals)} eval = {s.truth.size:,} pairs\n")
    if flat:
        print(f"Originals of PDQ quality under {matches.MIN_QUALITY}, which the pdq detector leaves out: "
              f"{', '.join(flat)}; their copies count only in the rows that say so.\n")

    def recall(d: str, t: str, which: np.ndarray) -> str:
        return f"{(detectors[d][t] & s.truth)[:, which].any(0).mean():.3f}"

    kept = copies & ~np.isin([e[2] for e in s.evals], flat)  # the rows by edit: copies of originals not left out
    rows = [[family, int((kept & (s.family == family)).sum()), *(recall(d, t, kept & (s.family == family))
                                                               for d, t in columns)] for family in FAMILIES]
    summary = {"recall, hashable edits": usable, "recall, hashable edits but asymmetric crops":
               usable & (s.family != "crop asymmetric"),
               f"recall, hashable edits, originals of quality under {matches.MIN_QUALITY} too": hashable,
               f"recall, all edits, originals of quality under {matches.MIN_QUALITY} too": copies}
    rows += [[f"**{name}**", int(which.sum()), *(recall(d, t, which) for d, t in columns)]
             for name, which in summary.items()]
    rows.append(["**precision**", "", *(f"{(detectors[d][t] & s.truth).sum() / max(detectors[d][t].sum(), 1):.3f}"
                                        for d, t in columns)])
    rows.append(["**false pairs**", "", *(f"{int((detectors[d][t] & ~s.truth).sum())}" for d, t in columns)])
    from harness import markdown_table

    print(markdown_table(["edits", "copies", *(f"{d} {t}".strip() for d, t in columns)], rows))
    others = np.sort(now[~s.truth & (now < 257)])
    false = [(s.train[i][0], s.evals[j][0], int(now[i, j])) for i, j in zip(*np.nonzero((now <= THRESHOLD) & ~s.truth))]
    missed = [(s.evals[j][0], int(now[:, j][s.truth[:, j]].min())) for j in np.flatnonzero(usable)
              if not (now[:, j][s.truth[:, j]] <= THRESHOLD).any()]
    uneven = [m for m in missed if s.family[[e[0] for e in s.evals].index(m[0])] == "crop asymmetric"]
    shown = [f"{name} ({d if d < 257 else 'its quality under 50'})" for name, d in missed if (name, d) not in uneven]
    print(f"\npdq distances of the {others.size:,} pairs that are not copies (quality {matches.MIN_QUALITY} or more "
          f"on both sides): min {others[0]}, 0.1% {np.quantile(others, 0.001):.0f}, 1% "
          f"{np.quantile(others, 0.01):.0f}, median {np.median(others):.0f}. False pairs at {THRESHOLD}: "
          f"{false or 'none'}. Hashable copies missed at {THRESHOLD} (their distance), but the left-out originals': "
          f"{len(uneven)} asymmetric crops and {'; '.join(shown) or 'none'}. The audit's search (matches.pdq_pairs) "
          f"finds exactly the pairs within {THRESHOLD}: {found == within}.\n")
    pdq_at = detectors["pdq"][f"<={THRESHOLD}"]
    return {"recall": {f: float((pdq_at & s.truth)[:, kept & (s.family == f)].any(0).mean()) for f in FAMILIES},
            "hashable": float((pdq_at & s.truth)[:, usable].any(0).mean()),
            "with flat": float((pdq_at & s.truth)[:, hashable].any(0).mean()), "flat": flat,
            "precision": float((pdq_at & s.truth).sum() / max(pdq_at.sum(), 1)), "false": len(false),
            "before": float((detectors["pdq before"][f"<={THRESHOLD}"] & s.truth)[:, usable].any(0).mean()),
            "search exact": found == within}


def window_bits(image: Image.Image, windows: tuple) -> np.ndarray:
    """The unpacked PDQ hash bits of the picture and of each window (the shares cut off each side), one row each."""
    gray = fingerprints.luma(pdq_pixels(image))
    coefs = fingerprints.coefficients(gray, (fingerprints.WHOLE, *windows))
    return np.unpackbits(np.frombuffer(fingerprints.hash_bits(coefs), np.uint8)).reshape(len(coefs), 256)


def grids(photos: dict[str, Image.Image], rng: np.random.Generator) -> None:
    """How the windows were chosen: recall of crops drawn at random (the windows of the original against the
    copy's hash) and false pairs (every window of each original against every other picture and piece), for
    windows every 3.3 to 1.5 points of crop, and none."""
    from harness import markdown_table

    third, quarter = (0.0167, 0.05, 0.0833), (0.0125, 0.0375, 0.0625, 0.0875)
    options = {"none": ((), ()), "every 3.3 points": (third, third), "every 2.5 points": (quarter, quarter),
               "every 2 points": (fingerprints.CUTS, fingerprints.CUTS),
               "every 2 points, corners 1.5 (the detector's)": (fingerprints.CUTS, fingerprints.CORNER_CUTS),
               "every 1.5 points": (fingerprints.CORNER_CUTS, fingerprints.CORNER_CUTS)}
    shapes = {"crop centred": [(0.5,) * 4], "crop one side": list(ONE_SIDE.values()),
              "crop corner": list(CORNERS.values())}

    copies = []  # (original, family, the copy's hash)
    for name, image in photos.items():
        for family, kinds in shapes.items():
            for _ in range(8):
                p = float(rng.uniform(0, 0.10))
                copy = cut(image, *(p * x for x in kinds[rng.integers(len(kinds))]))
                copies.append((name, family, window_bits(copy, ())[0]))
    others = [window_bits(p, ())[0] for image in photos.values() for p in [image, *pieces(image)]]
    rows = []
    for label, (cuts, corner_cuts) in options.items():
        windows = tuple(tuple(c * x for x in shape) for family, kinds in shapes.items() for shape in kinds
                        for c in (corner_cuts if family == "crop corner" else cuts))
        originals = {name: window_bits(image, windows) for name, image in photos.items()}
        found = {f: [] for f in shapes}
        for name, family, copy in copies:
            found[family].append((originals[name] != copy).sum(1).min() <= THRESHOLD)
        near = sum(int(((mine != other).sum(1) <= THRESHOLD).any()) for mine in originals.values() for other in others)
        rows.append([label, len(windows), *(f"{np.mean(v):.3f}" for v in found.values()), near - len(photos)])
    print("Windows chosen by measurement (set A, crops drawn at random, 8 of each kind an original; the hash of the "
          "copy against the original's windows; false pairs: an original's windows against the other originals and "
          "all pieces):\n")
    print(markdown_table(["windows", "hashes", *shapes, "false pairs"], rows))


def uneven(photos: dict[str, Image.Image], rng: np.random.Generator) -> None:
    """Crops cut unevenly from several sides (up to 10% of each axis split at random between its two ends): the
    closest window of the original to each crop's hash, for the detector's windows, for grids of every side's cut
    (each axis' (left, right) pairs every 2.5 to 1.67 points, all four sides at once) and for each crop's own window
    (the best any window can do); false pairs as in `grids`."""
    from harness import markdown_table

    def grid(step: float) -> tuple:
        cuts = np.round(np.arange(0, 0.10 + 1e-9, step), 5)
        pairs = [(a, b) for a in cuts for b in cuts if a + b <= 0.10 + step / 2]
        return tuple((*x, *y) for x in pairs for y in pairs)[1:]  # not the whole picture (pairs[0] twice)

    crops = []  # (original, the cut, the crop's hash)
    for name, image in photos.items():
        for _ in range(6):
            across, down = float(rng.uniform(0, 0.10)), float(rng.uniform(0, 0.10))
            left, top = across * rng.uniform(), down * rng.uniform()
            sides = (left, across - left, top, down - top)
            crops.append((name, sides, window_bits(cut(image, *sides), ())[0]))
    others = [window_bits(p, ())[0] for image in photos.values() for p in [image, *pieces(image)]]
    options = {f"the detector's ({len(fingerprints.SIDES) + len(fingerprints.CENTRED)} windows)":
               fingerprints.CENTRED + fingerprints.SIDES}
    steps = (0.025, 0.02, 0.01 / 0.6)
    options.update({f"every side's cut every {step * 100:.3g} points": grid(step) for step in steps})
    rows = []
    for label, windows in options.items():
        originals = {name: window_bits(image, windows) for name, image in photos.items()}
        best = np.array([(originals[name] != h).sum(1).min() for name, _, h in crops])
        apart = [int((mine != other).sum(1).min()) for mine in originals.values() for other in others]
        apart = sorted(apart)[len(photos):]  # less each original against itself
        rows.append([label, len(windows) + 1, *(f"{np.mean(best <= t):.3f}" for t in (31, 40, 48)),
                     sum(d <= THRESHOLD for d in apart), min(apart)])
    own = np.array([(window_bits(photos[name], (sides,))[1] != h).sum() for name, sides, h in crops])
    rows.append(["each crop's own window (the best a window can do)", "-",
                 *(f"{np.mean(own <= t):.3f}" for t in (31, 40, 48)), "-", "-"])
    print("\nCrops cut unevenly from several sides (set A, 6 a picture, drawn at random): the share within each "
          "distance of its original's closest window, by windows; false pairs at 31 and the smallest distance of an "
          "original's windows to another picture or piece:\n")
    print(markdown_table(["windows", "hashes", "<=31", "<=40", "<=48", "false pairs", "closest distinct"], rows))


def hash_rate() -> tuple[float, float, str]:
    """Images per second of the hash stage before (v1_fingerprint) and now (fingerprint) on mieb-train's mix, CPU
    time of one core: bench/preprocess.py's kinds (crops of the fixture pictures at each kind's size and format),
    weighted by their rows in mieb-train; and the share of the mix of PDQ quality 50 or more, each way."""
    from preprocess import KINDS, make_kind, mix_weights

    weights, seconds, cells, usable = mix_weights(), {"before": {}, "now": {}}, [], {"before": 0.0, "now": 0.0}
    for i, kind in enumerate(KINDS):
        images = make_kind(kind, 64, seed=i)
        for way, fn, quality in (("before", v1_fingerprint, lambda x: x[-1]), ("now", fingerprint,
                                                                              lambda x: x.pdq_quality)):
            t0 = time.process_time()
            out = [fn(data) for data in images]
            seconds[way][kind] = (time.process_time() - t0) / len(images)
            usable[way] += weights[kind] * np.mean([quality(x) >= matches.MIN_QUALITY for x in out])
        cells.append(f"{kind} {1 / seconds['before'][kind]:,.0f} -> {1 / seconds['now'][kind]:,.0f}/s")
    rate = {way: 1 / sum(weights[k] * s[k] for k in KINDS) for way, s in seconds.items()}
    return rate["before"], rate["now"], (", ".join(cells) + f"; quality 50 or more: {usable['before']:.1%} of the "
                                                              f"mix before, {usable['now']:.1%} now")


def search_cost(train: int = 2_000, evals: int = 200_000) -> str:
    """CPU seconds of the train side's pdq search (matches.pdq_train_pairs against the eval side made ready once) of
    `train` x `evals` pictures of uniform random hashes, one core, before (V1_COMPARED) and now
    (matches.PDQ_FROM_TRAIN). The other way (matches.PDQ_FROM_EVAL) searches from eval batches in the whole train
    side: its shape is bench/audit_pdq_task.py's."""
    rng = np.random.default_rng(SEED)
    v1 = {c: pa.binary(32) for c in ("pdq", "pdq_mirror", "pdq_c95", "pdq_c90")}
    now = {c: matches.HASH_SCHEMA.field(c).type for c in matches.PDQ_HASHES}

    def table(n: int, types: dict) -> pa.Table:
        return pa.table({"key": [str(i) for i in range(n)], "eval_task": ["T"] * n,
                         **{c: pa.array(np.frombuffer(rng.bytes(n * t.byte_width), f"V{t.byte_width}").tolist(), t)
                            for c, t in types.items()}, "pdq_quality": pa.array(np.full(n, 100), pa.int16())})

    cells = []
    for label, types, compared, per_pair in (("before", v1, V1_COMPARED, len(V1_COMPARED)),
                                             ("now", now, matches.PDQ_FROM_TRAIN,
                                              matches.pdq_comparisons(matches.PDQ_FROM_TRAIN))):
        side = matches.pdq_index(table(evals, types), compared)
        batch = table(train, types)
        t0 = time.process_time()
        matches.pdq_train_pairs(batch, side, compared=compared)
        cells.append(f"{label} {time.process_time() - t0:.2f} CPU-s ({per_pair} hash comparisons a pair)")
    return f"{train:,} train x {evals:,} eval pictures of uniform random hashes: " + ", ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clip", action="store_true", help="also the near detector's cosine on a random tiny CLIP")
    ap.add_argument("--model", help="a CLIP model (hub name or folder) for the near detector instead")
    args = ap.parse_args()
    import imagehash

    clip = args.model
    if args.clip and not clip:
        from mieb_ray.demo_data.models import make_tiny_clip

        clip = make_tiny_clip(os.path.join(tempfile.mkdtemp(), "tiny-clip"))
    rng = np.random.default_rng(SEED)
    a = set_a()
    people = faces()
    figures = {"A": measure("Set A (the 16 pictures the detector was designed on)", a, people[:FACES // 2], rng, clip),
               "B": measure("Set B (other photographs, and a window of each picture of set A)", set_b(a, rng),
                            people[FACES // 2:], rng, clip)}
    grids(a, rng)
    uneven(a, rng)
    before, now, cells = hash_rate()
    centred, sides = len(fingerprints.CENTRED), len(fingerprints.SIDES)
    print(f"\nThe train side's pdq search (matches.pdq_train_pairs, one core; the other way's at its own shape: "
          f"bench/audit_pdq_task.py): {search_cost()}.")
    print(f"\nHash stage (decode, sha256, pixel hash, PDQ hashes), one core, CPU time, mieb-train's mix (weighted by "
          f"rows): **{before:,.0f} images/s before** (4 pdqhash hashes), **{now:,.0f} now** ({2 + centred + sides} "
          f"hashes: the picture, its mirror, {centred} centred and {sides} side and corner windows); {cells}.\n")
    for name, f in figures.items():
        crops = ", ".join(f"{k.removeprefix('crop ')} {f['recall'][k]:.3f}" for k in
                          ("crop centred", "crop one side", "crop corner", "crop asymmetric"))
        downscales = f["recall"]["downscale to 64-128 px"]
        flat = f" ({f['with flat']:.3f} with the originals of quality under 50: {', '.join(f['flat'])})" \
            if f["flat"] else ""
        print(f"- Set {name}, pdq at {THRESHOLD}: recall on hashable edits {f['hashable']:.3f}{flat}, before the "
              f"windows {f['before']:.3f}; crops {crops}; downscales to 64-128 px {downscales:.3f}; precision "
              f"{f['precision']:.3f} ({f['false']} false pairs); search exact: {f['search exact']}.")
    if clip:
        print(f"- near: {args.model or 'a random tiny CLIP (tests model): its cosines mean nothing'}")
    print(f"\nCPU: {platform.processor() or platform.machine()}; Python {platform.python_version()}; imagehash "
          f"{imagehash.__version__}; numpy {np.__version__}")


if __name__ == "__main__":
    import harness

    harness.wrap(main, "audit_calibrate", "Audit: the pdq detector, calibrated on real pictures", kind="calibration",
                 group="Audit")
