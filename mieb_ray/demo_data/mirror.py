"""A mirror of the catalog's source repos in the hub's own layout: the demo's (`mieb-ray demo`), which the tests and
the benchmarks build on too (tests/support/mirror.py: the rows the build keeps of it, a full-scale mirror's rows).

`make_mirror(root)` writes what `huggingface-cli download --repo-type dataset REPO --revision REV
--local-dir ROOT/REPO` would: parquet repos as `datasets` pushes them (data/{split}-NNNNN-of-NNNNN.parquet,
HF features in the schema metadata, README front matter), WebDataset repos as CLIP_benchmark's
webdataset_builder.py writes them ({split}/N.tar of s%07d.<ext> + s%07d.cls, nshards.txt, classnames.txt).
`layouts={slug: fmt}` writes a source in the other layout, as if its repo had changed: a parquet source as
tars (its class list in classnames.txt, SciMMIR's caption as .txt), a WebDataset source as `datasets` pushes
a WebDataset (columns __key__, __url__, <ext> as an Image, cls).
Each repo holds a train split and its MIEB eval split under the real name (test; validation for food101).
Images are crops of a few real pictures (images/SOURCES.md), encoded the way each source stores them.
Everything streams, so a full-scale mirror (TOTAL_ROWS) takes little memory.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import random
import shutil
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import (
    ClassLabel,
    DatasetInfo,
    Features,
    Image,
    SplitDict,
    SplitInfo,
    Value,
)
from datasets.info import DatasetInfosDict
from datasets.utils.metadata import MetadataConfigs
from huggingface_hub import DatasetCardData
from PIL import Image as PILImage
from webdataset import TarWriter

from mieb_ray.sources import (
    PARQUET,
    WEBDATASET,
    Source,
    by_slug,
    hub_labels,
    read_labels,
    select,
)

DEFAULT_ROWS = 12
TEST_ROWS = 3  # default size of each repo's eval split beside train, which only `build --split eval` reads
# push_to_hub wrote image datasets in row groups of config.PARQUET_ROW_GROUP_SIZE_FOR_IMAGE_DATASETS = 100 rows
# from datasets 2.13 (PR #5935), when these repos were pushed; datasets 5.2 sets it to None (groups up to 100MB).
ROW_GROUP_ROWS = 100
POOL = 32  # distinct encoded pictures per source, reused cyclically by row index
TAR_MTIME = 1_673_568_000  # fixed, so that tars are byte-for-byte reproducible

# Labels of each source's first rows, so that even a 12-row mirror meets every fix the build makes
# (renames, a/an exceptions, dropped rows); the rest of the class list follows, see label_order().
INTERESTING: dict[str, list[int]] = {
    "cifar100": [26, 1],  # cra, aquarium_fish
    "imagenet1k": [744, 836, 657, 837, 0],  # missile/sunglasses twice each, tench
    "gtsrb": [17, 29, 6, 15],  # the two typos; "end / de-restriction ...", "empty ..." take "an"
    "clevr": [3],  # the blank name
    "caltech101": [4],  # background_google: dropped by the build
    "stanfordcars": [0, 98, 25],  # am general hummer suv 2000, fiat 500 abarth 2012, bmw activehybrid 5 ...
    "ucf101": [0, 36],  # ApplyEyeMakeup, HandstandPushups
    "sun397": [95, 367],  # /c/church/outdoor, /u/utility_room
    "food101": [0],  # apple_pie
    "birdsnap": [172],  # Eurasian Collared Dove ("a", not "an")
    "fer2013": [0],  # angry
    "oxfordpets": [0],  # abyssinian
    "patchcamelyon": [0, 1],
    "renderedsst2": [0, 1],
    "eurosat": [0],  # hub AnnualCrop, mteb "annual crop land"
}

# SciMMIR `text` is the caption as extracted from the paper: line breaks, double spaces, snake_case.
_CAPTIONS = {
    "fig_result": ("Figure 3: Accuracy of the model_v2 on\nImageNet  across epochs.",
                   "Fig. 5. Test loss vs. training steps for N_layer = 12 (log scale)."),
    "fig_illustration": ("Figure 1: Illustration of the  sampling procedure.",
                         "Fig. 2. Generated samples\n(best viewed in color)."),
    "fig_architecture": ("Figure 2: Overview of the proposed encoder_decoder architecture.",
                         "Fig. 1. The  network: a ResNet-50 backbone followed by\ntwo attention blocks."),
    "table_parameter": ("Table 1: Hyper-parameters used for pre-training.",
                        "Table 5: Settings of the  lr_schedule and batch_size\nfor each model."),
    "table_result": ("Table 3: Results on the GLUE dev set; best\nresults in bold.",
                     "Table 2: Top-1 accuracy (%) on  CIFAR-100."),
}
SCIMMIR_NO_CAPTION: dict[int, str | None] = {5: None, 6: "  "}  # row index % 1000 -> a null or blank text

# uoft-cs/cifar100 `coarse_label` of each fine label (the official CIFAR-100 superclass map)
_CIFAR100_COARSE_NAMES = [
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables", "household_electrical_devices",
    "household_furniture", "insects", "large_carnivores", "large_man-made_outdoor_things",
    "large_natural_outdoor_scenes", "large_omnivores_and_herbivores", "medium_mammals", "non-insect_invertebrates",
    "people", "reptiles", "small_mammals", "trees", "vehicles_1", "vehicles_2"]
_CIFAR100_COARSE = [
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11, 6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10,
    12, 14, 16, 9, 11, 5, 5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17, 10, 3, 2, 12, 12, 16,
    12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13, 16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8,
    14, 13]
_PET_CATS = frozenset({"abyssinian", "bengal", "birman", "bombay", "british shorthair", "egyptian mau", "maine coon",
                       "persian", "ragdoll", "russian blue", "siamese", "sphynx"})

# Image sizes (w, h) of the sources whose images all have one size; the others get varied photo sizes.
_FIXED_SIZE = {"cifar10": (32, 32), "cifar100": (32, 32), "mnist": (28, 28), "stl10": (96, 96),
               "patchcamelyon": (96, 96), "fer2013": (48, 48), "clevr": (480, 320), "clevr_count": (480, 320),
               "eurosat": (64, 64), "resisc45": (256, 256), "ucf101": (320, 240), "renderedsst2": (448, 448)}
_GRAY = {"mnist", "fer2013"}
_ASPECTS = (1.0, 4 / 3, 3 / 2, 16 / 9, 3 / 4, 2 / 3)
_IMAGES = resources.files("mieb_ray.demo_data").joinpath("images")


# ---------------------------------------------------------------------------------------------- labels


@functools.cache
def hub_names(slug: str) -> list[str] | None:
    """The ClassLabel names of a parquet repo's label column (sources/labels/hub/<slug>.txt), else None."""
    return hub_labels(slug)


# Sources are not hashable (dict fields): caches are keyed by slug.
@functools.cache
def _class_names(slug: str) -> list[str]:
    return hub_names(slug) or read_labels(by_slug(slug).names)


@functools.cache
def label_order(slug: str) -> list[int]:
    """The labels of a split's rows, cycled: INTERESTING first, then the other classes in a scattered order;
    every class once per cycle."""
    n = len(_class_names(slug))
    first = INTERESTING.get(slug, [])
    return first + [c for c in (k * 7919 % n for k in range(n)) if c not in first]


def label_of(source: Source, index: int) -> int:
    """The label id of row `index` of a split (for scimmir: the index of its class code in labels/scimmir.txt)."""
    order = label_order(source.slug)
    return order[index % len(order)]


# ---------------------------------------------------------------------------------------------- images


def photo_names() -> list[str]:
    """The photos among the real pictures in images/ (the .jpg files), by name."""
    return sorted(p.name for p in _IMAGES.iterdir() if p.name.endswith(".jpg"))


@functools.cache
def picture(name: str) -> PILImage.Image:
    """One of the real pictures in images/, decoded once, RGB."""
    with _IMAGES.joinpath(name).open("rb") as f:
        image = PILImage.open(f)
        image.load()
    return image.convert("RGB")


@functools.cache
def _digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (values 0-16), saved in images/digits.npz: MNIST stand-ins."""
    with _IMAGES.joinpath("digits.npz").open("rb") as f, np.load(f) as z:
        return z["images"], z["labels"]


def _pictures(slug: str) -> list[str]:
    names = photo_names()
    return names + ["horse.png", "text.png"] if slug == "scimmir" else names  # line art for "figures"


def _size(slug: str, rng: random.Random) -> tuple[int, int]:
    if slug in _FIXED_SIZE:
        return _FIXED_SIZE[slug]
    if slug == "gtsrb":  # GTSRB crops are small and roughly square
        side = rng.randint(30, 64)
        return side + rng.randint(-3, 3), side
    longest, aspect = rng.randint(200, 500), rng.choice(_ASPECTS)
    return (longest, round(longest / aspect)) if aspect >= 1 else (round(longest * aspect), longest)


def _cut(picture: PILImage.Image, size: tuple[int, int], rng: random.Random) -> PILImage.Image:
    """A random crop of `picture` with the aspect of `size`, resized to `size`, maybe mirrored."""
    (w, h), (pw, ph) = size, picture.size
    scale = rng.uniform(0.6, 1.0)
    cw, ch = (pw * scale, pw * scale * h / w) if pw * h <= ph * w else (ph * scale * w / h, ph * scale)
    x, y = rng.uniform(0, pw - cw), rng.uniform(0, ph - ch)
    image = picture.resize(size, box=(x, y, x + cw, y + ch))
    return image.transpose(PILImage.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else image


def _digit(label: int, variant: int) -> PILImage.Image:
    """An MNIST-like 28x28 digit: the 8x8 digit scaled into the central 20x20 box, white on black."""
    images, labels = _digits()
    same = images[labels == label]
    digit = PILImage.fromarray((same[variant % len(same)] * (255 / 16)).astype(np.uint8), "L")
    canvas = PILImage.new("L", (28, 28))
    canvas.paste(digit.resize((20, 20), PILImage.Resampling.BILINEAR), (4, 4))
    return canvas


def _encode(image: PILImage.Image, ext: str) -> bytes:
    buf = io.BytesIO()
    if ext == "webp":  # clip_benchmark saves lossless WebP; the least effort makes the same format 30x faster
        image.save(buf, "WEBP", lossless=True, quality=0, method=0)
    elif ext == "png":
        image.save(buf, "PNG")
    else:
        image.save(buf, "JPEG", quality=90)
    return buf.getvalue()


@functools.cache
def _render(slug: str, variant: int, label: int) -> bytes:
    """Picture number `variant` of a source (label matters only for MNIST), encoded once and reused."""
    rng = random.Random(f"{slug}/{variant}")  # str seeds are hashed with sha512: stable across runs
    if slug == "mnist":
        image = _digit(label, variant)
    elif slug == "renderedsst2":  # a line of black text on white, like the rendered reviews
        image = PILImage.new("RGB", _FIXED_SIZE[slug], "white")
        text = picture("text.png")
        image.paste(text, (0, rng.randint(0, image.height - text.height)))
    else:
        names = _pictures(slug)
        image = _cut(picture(names[variant % len(names)]), _size(slug, rng), rng)
    return _encode(image.convert("L" if slug in _GRAY else "RGB"), by_slug(slug).image_ext)


def _picture_bytes(source: Source, index: int, label: int) -> bytes:
    return _render(source.slug, index % POOL, label if source.slug == "mnist" else -1)


# ---------------------------------------------------------------------------------------------- parquet


@functools.cache
def _features(slug: str) -> Features:
    """The columns and HF feature types of the source's hub repo."""
    source = by_slug(slug)
    if source.layout == WEBDATASET:  # what `datasets` makes of the tars: key, url, image by extension, cls
        return Features({"__key__": Value("string"), "__url__": Value("string"), source.image_ext: Image(),
                         "cls": Value("int64")})
    if slug == "scimmir":  # m-a-p/SciMMIR: every column but the image is a string
        return Features({"image": Image(), **{c: Value("string") for c in (
            "text", "file_name_index", "class", "super_class", "sub_class", "split")}})
    columns = {source.image_column: Image()}
    if slug == "ucf101":
        columns |= {"video_id": Value("string"), "clip_id": Value("int64"), "frame": Value("int64")}
    columns[source.label_column] = ClassLabel(names=hub_names(slug))
    if slug == "cifar100":
        columns["coarse_label"] = ClassLabel(names=_CIFAR100_COARSE_NAMES)
    if slug == "oxfordpets":
        columns |= {"species": ClassLabel(names=["Cat", "Dog"]), "id": Value("string")}
    return Features(columns)


def _row(source: Source, split: str, index: int, image: bytes, label: int) -> dict:
    if source.layout == WEBDATASET:
        key = "s%07d" % index
        return {"__key__": key, "__url__": f"{split}/{index // 10_000}.tar",
                source.image_ext: {"bytes": image, "path": f"{key}.{source.image_ext}"}, "cls": label}
    row = {source.image_column: {"bytes": image, "path": f"{index}.{source.image_ext}"}}
    if source.slug == "scimmir":
        code = _class_names(source.slug)[label]
        kind, sub = code.split("_")
        text = SCIMMIR_NO_CAPTION.get(index % 1000, _CAPTIONS[code][index // 5 % 2])
        paper = f"{22 + index % 3}{1 + index % 12:02d}.{index * 7919 % 100000:05d}v1"  # an arXiv id
        figure = f"{'Figure' if kind == 'fig' else 'Table'}{1 + index % 7}-1"
        return row | {"text": text, "file_name_index": f"{paper}-{figure}", "class": code, "super_class": kind,
                      "sub_class": sub, "split": split}
    row[source.label_column] = label
    name = hub_names(source.slug)[label]
    if source.slug == "ucf101":  # split-1 train groups are g08-g25; HandstandPushups videos say HandStand
        group, clip = 8 + index % 18, 1 + index // 18 % 5
        video = name.replace("HandstandPushups", "HandStandPushups")
        row |= {"video_id": f"v_{video}_g{group:02d}_c{clip:02d}", "clip_id": clip, "frame": index % 150}
    elif source.slug == "cifar100":
        row["coarse_label"] = _CIFAR100_COARSE[label]
    elif source.slug == "oxfordpets":  # Oxford-IIIT file names: cat breeds capitalised, dog breeds lower case
        cat = name in _PET_CATS
        row |= {"species": 0 if cat else 1, "id": f"{(name.title() if cat else name).replace(' ', '_')}_{index + 1}"}
    return row


def _spans(rows: int, files: int) -> list[tuple[int, int]]:
    files = max(1, min(files, rows))
    return [(rows * k // files, rows * (k + 1) // files) for k in range(files)]


def _write_parquet(source: Source, repo: Path, rows: int, files: int, image: Callable, eval_rows: int,
                   eval_files: int, padded: bool = True) -> list[str]:
    features = _features(source.slug)
    schema = features.arrow_schema  # carries the `huggingface` metadata: ClassLabel names, Image type
    written, splits = [], []
    (repo / "data").mkdir()
    for split, n, parts in (("train", rows, files), (source.eval_split, eval_rows, eval_files)):
        spans, nbytes = _spans(n, parts), 0
        for k, (lo, hi) in enumerate(spans):
            name = f"data/{split}-{k:05d}-of-{len(spans):05d}.parquet" if padded else f"data/{split}-{k}.parquet"
            with pq.ParquetWriter(repo / name, schema) as writer:
                for start in range(lo, hi, ROW_GROUP_ROWS):
                    batch = []
                    for i in range(start, min(start + ROW_GROUP_ROWS, hi)):
                        label = label_of(source, i)
                        batch.append(_row(source, split, i, image(source, i, label), label))
                    table = pa.Table.from_pylist(batch, schema=schema)
                    writer.write_table(table)
                    nbytes += table.nbytes
            written.append(name)
        splits.append(SplitInfo(name=split, num_bytes=nbytes, num_examples=n))
    _write_card(repo, features, splits, sum((repo / name).stat().st_size for name in written))
    return written + ["README.md"]


def _write_card(repo: Path, features: Features, splits: list[SplitInfo], download_size: int) -> None:
    """README.md with the YAML front matter push_to_hub writes: dataset_info and the default config's files."""
    info = DatasetInfo(features=features, splits=SplitDict(), download_size=download_size,
                       dataset_size=sum(s.num_bytes for s in splits))
    for split in splits:
        info.splits.add(split)
    card = DatasetCardData()
    DatasetInfosDict({"default": info}).to_dataset_card_data(card)
    MetadataConfigs({"default": {"data_files": [{"split": s.name, "path": f"data/{s.name}-*"} for s in splits]}}
                    ).to_dataset_card_data(card)
    (repo / "README.md").write_text(f"---\n{card}\n---\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------- webdataset


def _write_webdataset(source: Source, repo: Path, rows: int, files: int, image: Callable, eval_rows: int,
                      eval_files: int, tar_rows: int | None = None, card: bool = True) -> list[str]:
    if source.layout == WEBDATASET:
        (repo / "classnames.txt").write_bytes(resources.files("mieb_ray.sources").joinpath(
            "labels", source.names).read_bytes())  # verbatim: CLEVR's blank line included
    else:  # a parquet source as tars: the class list its ClassLabel (or scimmir's codes) had
        (repo / "classnames.txt").write_text("".join(f"{n}\n" for n in _class_names(source.slug)), "utf-8")
    # the real file holds CLIP_benchmark's templates (`{c}` = class name); the build does not read it
    (repo / "zeroshot_classification_templates.txt").write_text(
        source.template.format(a="a", name="{c}") + "\n", encoding="utf-8")
    written = ["classnames.txt", "zeroshot_classification_templates.txt"]
    splits = (("train", rows, files), (source.eval_split, eval_rows, eval_files))
    for split, n, parts in splits:
        spans = [(lo, min(lo + tar_rows, n)) for lo in range(0, n, tar_rows)] if tar_rows else _spans(n, parts)
        (repo / split).mkdir()
        for k, (lo, hi) in enumerate(spans):
            with TarWriter(str(repo / split / f"{k}.tar"), mtime=TAR_MTIME) as sink:
                for i in range(lo, hi):
                    label = label_of(source, i)
                    # bytes pass through TarWriter as they are (it would re-encode a PIL image)
                    sample = {"__key__": "s%07d" % i, source.image_ext: image(source, i, label), "cls": label}
                    if source.caption_column:  # scimmir's own caption; a null one as an empty text
                        sample["txt"] = _row(source, split, i, b"", label)[source.caption_column] or ""
                    sink.write(sample)
            written.append(f"{split}/{k}.tar")
        (repo / split / "nshards.txt").write_text(f"{len(spans)}\n")
        written.append(f"{split}/nshards.txt")
    if card:
        # A split of one tar beside its nshards.txt reads to `datasets` as a text dataset (a tie of extensions,
        # broken alphabetically), and it refuses the repo; mteb loads the hub's copies, so their cards must name
        # each split's tars (or their split folders hold no nshards.txt): the fixture declares them.
        data = MetadataConfigs({"default": {"data_files": [{"split": s, "path": f"{s}/*.tar"} for s, _, _ in splits]}})
        front = DatasetCardData()
        data.to_dataset_card_data(front)
        (repo / "README.md").write_text(f"---\n{front}\n---\n", encoding="utf-8")
        written.append("README.md")
    return written


# ---------------------------------------------------------------------------------------------- mirror


def record_download(repo: Path, files: list[str], revision: str) -> None:
    """The bookkeeping `huggingface-cli download --local-dir` leaves in .cache/huggingface: per file the
    commit, the etag (sha256, as for LFS files) and the time."""
    cache = repo / ".cache" / "huggingface"
    for name in files:
        meta = cache / "download" / f"{name}.metadata"
        meta.parent.mkdir(parents=True, exist_ok=True)
        etag = hashlib.sha256()
        with open(repo / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                etag.update(block)
        meta.write_text(f"{revision}\n{etag.hexdigest()}\n{time.time()}\n")
    (cache / ".gitignore").write_text("*")


def make_mirror(root: str | os.PathLike, rows: int | dict[str, int] = DEFAULT_ROWS, datasets: list[str] | None = None,
                files: int = 2, image_bytes: Callable[[Source, int], bytes] | None = None,
                tar_rows: int | None = None, eval_rows: int | dict[str, int] = TEST_ROWS,
                layouts: dict[str, str] | None = None, eval_files: int = 1, cards: bool = True,
                padded: bool = True) -> dict[str, int]:
    """Write the hub-layout mirror under root/<repo>/ for each source; return train rows written per slug.

    The demo sets rows and eval_rows; the other options are the tests' and the benchmarks', parameters of this one
    writer's loops (which sources, how many files and tars, their names, the cards, the layout, the image bytes).
    rows: train rows per source, or a dict by slug (slugs it lacks get DEFAULT_ROWS); files: how many parquet
    files or tars the train split is spread over, rows split evenly in order; image_bytes(source, index):
    the image of train/eval row `index` instead of the real pictures (benchmarks use it to choose sizes);
    tar_rows: fill each tar with this many rows instead, as CLIP_benchmark's --max-count (10,000 on the hub);
    eval_rows: rows of the eval split (`source.eval_split`), or a dict by slug (default TEST_ROWS); eval_files:
    how many files (tars, unpadded names: `10.tar` sorts before `2.tar`) the eval split is spread over.
    cards: False writes WebDataset repos without a README (`datasets` then finds the splits by their folders);
    padded: False names parquet files `data/train-10.parquet` rather than push_to_hub's `train-00010-of-00012`.
    layouts: slug -> PARQUET or WEBDATASET, to write that source in a layout other than the catalog's (the same
    rows, labels and image bytes either way).
    Labels cycle in both splits as label_of() says, so a small eval split meets the interesting labels too.
    Each source's repo folder is rewritten from scratch. The build keeps the rows written but those of the classes
    it drops (tests/support/mirror.py: kept_rows).
    """
    if image_bytes is None:
        image = _picture_bytes
    else:
        def image(source: Source, index: int, label: int) -> bytes:
            return image_bytes(source, index)
    counts = {}
    for source in select(datasets):
        n = rows.get(source.slug, DEFAULT_ROWS) if isinstance(rows, dict) else rows
        n_eval = eval_rows.get(source.slug, TEST_ROWS) if isinstance(eval_rows, dict) else eval_rows
        repo = Path(root) / source.repo
        shutil.rmtree(repo, ignore_errors=True)  # no stale shards from an earlier, larger mirror
        repo.mkdir(parents=True)
        layout = (layouts or {}).get(source.slug, source.layout)
        if layout not in (PARQUET, WEBDATASET):
            raise ValueError(f"{source.slug}: unknown layout {layout!r}")
        if layout == PARQUET:
            written = _write_parquet(source, repo, n, files, image, n_eval, eval_files, padded)
        else:
            written = _write_webdataset(source, repo, n, files, image, n_eval, eval_files, tar_rows, cards)
        record_download(repo, written, source.revision)
        counts[source.slug] = n
    return counts
