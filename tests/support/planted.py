"""Train and eval tables with planted duplicates, for the audit's tests and benchmarks.

The images are tiles of the demo's real photos (mieb_ray/demo_data/images): each cut into quadrants, so no two
tiles share a pixel. The train table holds most tiles (and one undecodable image); two eval tables hold the
others, and copies of some train tiles, each changed in one of the ways a dataset copy is changed (PLANTS).
"""

from __future__ import annotations

import io
import os

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from mieb_ray.demo_data.mirror import photo_names, picture
from support.pictures import encode, jpeg

FROM_EVAL = "the train image cropped 6% off the eval one's bottom"  # the plant whose copy is on the train side
# how each planted copy differs from its train image, and the detectors that must find it (pdq: within 31 bits,
# crops through the train image's windows; the train image cropped from the eval one through the eval image's)
PLANTS = {
    "same bytes": ("exact", "pixels", "pdq"),
    "JPEG -> PNG": ("pixels", "pdq"),
    "JPEG quality 90 -> 50": ("pdq", "near"),
    "PNG -> JPEG": ("pdq", "near"),
    "resized by 1 px": ("pdq", "near"),
    "cropped 7% off the left": ("pdq", "near"),
    "mirrored": ("pdq", "near"),
    "cropped 3% off a corner": ("pdq", "near"),
    "downscaled to 64 px": ("pdq", "near"),
    FROM_EVAL: ("pdq",),
}
TILE = 96
TRAIN_TILES = 36  # tiles 0..35 go to train (tile 3, the PNG -> JPEG one, as a PNG); the rest are eval-only
EVAL_TASKS = ("CIFAR100ZeroShot", "Food101ZeroShot")
UNDECODABLE = b"\xff\xd8\xff\xe0 not really a JPEG"


def tiles() -> list[Image.Image]:
    out = []
    for name in photo_names():
        image = picture(name).convert("RGB")
        w, h = image.size
        out += [image.crop((i * w // 2, j * h // 2, (i + 1) * w // 2, (j + 1) * h // 2)).resize((TILE, TILE))
                for j in range(2) for i in range(2)]
    return out


def plant(kind: str, data: bytes) -> bytes:
    """A copy of the image `data` changed as PLANTS' `kind` says."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = image.size
    return {"same bytes": lambda: data,
            "JPEG -> PNG": lambda: encode(image, "PNG"),
            "JPEG quality 90 -> 50": lambda: jpeg(image, 50),
            "PNG -> JPEG": lambda: jpeg(image),
            "resized by 1 px": lambda: jpeg(image.resize((w - 1, h - 1), Image.Resampling.BICUBIC)),
            "cropped 7% off the left": lambda: jpeg(image.crop((round(w * 0.07), 0, w, h))),
            "mirrored": lambda: jpeg(image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)),
            "cropped 3% off a corner": lambda: jpeg(image.crop((0, round(h * 0.03), w - round(w * 0.03), h))),
            "downscaled to 64 px": lambda: jpeg(image.resize((64, 64), Image.Resampling.LANCZOS)),
            FROM_EVAL: lambda: jpeg(image.crop((0, 0, w, h - round(h * 0.06))))}[kind]()


def write_table(folder: str, keys: list[str], images: list[bytes]) -> str:
    """A Parquet table of key and image (struct of bytes and path) in `folder`, as a foreign tool writes one."""
    os.makedirs(folder, exist_ok=True)
    image = pa.array([{"bytes": b, "path": None} for b in images],
                     pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(pa.table({"key": keys, "image": image}), os.path.join(folder, "000000.parquet"))
    return folder


def make_planted(root: str) -> dict:
    """Write ROOT/train/ and ROOT/<task>/ for each EVAL_TASKS (Parquet tables of key and image). Returns
    {"train": uri, "against": [uris], "planted": [(train_key, eval_task, eval_key, kind)], "undecodable": key}."""
    all_tiles = tiles()
    train = [encode(t, "PNG") if i == 3 else jpeg(t) for i, t in enumerate(all_tiles[:TRAIN_TILES])]
    train_keys = [f"{'cifar100' if i % 2 else 'food101'}/{i}" for i in range(TRAIN_TILES)]
    undecodable = "food101/999"
    distinct = [jpeg(t) for t in all_tiles[TRAIN_TILES:]]
    planted, evals = [], {task: ([], []) for task in EVAL_TASKS}
    for n, kind in enumerate(PLANTS):  # train tile n -> a planted copy in the first task
        task = EVAL_TASKS[0]
        keys, images = evals[task]
        key = f"cifar100/test/{len(keys)}"
        keys.append(key)
        if kind == FROM_EVAL:  # the eval image is the train tile; the train image, its crop
            train[n], copy = plant(kind, train[n]), train[n]
        else:
            copy = plant(kind, train[n])
        images.append(copy)
        planted.append((train_keys[n], task, key, kind))
    for n, data in enumerate(distinct):  # unseen tiles, spread over both tasks
        keys, images = evals[EVAL_TASKS[n % 2]]
        keys.append(f"{'cifar100' if n % 2 == 0 else 'food101'}/test/{len(keys)}")
        images.append(data)
    keys, images = evals[EVAL_TASKS[1]]  # and the same bytes once more, in the second task
    keys.append(f"food101/validation/{len(keys)}")
    images.append(train[len(PLANTS)])
    planted.append((train_keys[len(PLANTS)], EVAL_TASKS[1], keys[-1], "same bytes"))
    return {"train": write_table(os.path.join(root, "train"), train_keys + [undecodable], train + [UNDECODABLE]),
            "against": [write_table(os.path.join(root, task), *evals[task]) for task in EVAL_TASKS],
            "planted": planted, "undecodable": undecodable}
