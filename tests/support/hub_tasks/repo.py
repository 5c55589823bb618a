"""A dataset repo written as the hub holds it, which every fixture mirror of support/hub_tasks/ writes through."""

from __future__ import annotations

import io
import os
import zlib
from collections.abc import Callable

import numpy as np
import pyarrow.parquet as pq
from datasets import Dataset, DatasetInfo, Features, SplitDict, SplitInfo
from datasets.info import DatasetInfosDict
from datasets.utils.metadata import MetadataConfigs
from huggingface_hub import DatasetCardData
from PIL import Image as PILImage

# a picture's file extension by how it is stored (`stored`)
EXT = {"jpeg": "jpg", "gray": "jpg", "cmyk": "jpg", "exif": "jpg", "png": "png", "la": "png", "rgba": "png",
       "palette": "png", "black": "png", "white": "png"}


def seed(*key) -> int:
    return zlib.crc32(repr(key).encode())  # stable across runs (hash() of a str is salted per process)


def stored(im: PILImage.Image, kind: str) -> bytes:
    """`im` stored as `kind`: the file formats and modes MIEB's repos hold, each a pitfall of its own. datasets
    decodes each as stored (and turns an EXIF-rotated JPEG upright); CLIP's processor makes RGB its own way
    (transparency onto white from transformers 5.21, dropped before), while tasks that convert first with PIL's
    convert("RGB") drop alpha: one file, different pictures to embed."""
    buf = io.BytesIO()
    if kind == "jpeg":
        im.save(buf, "JPEG", quality=90)
    elif kind == "png":
        im.save(buf, "PNG")
    elif kind == "gray":  # mode L JPEG (sketches, scans; greyscale photos among colour ones)
        im.convert("L").save(buf, "JPEG", quality=90)
    elif kind == "la":  # greyscale PNG with alpha, from the centre out
        la = im.convert("LA")
        la.putalpha(PILImage.radial_gradient("L").resize(im.size))
        la.save(buf, "PNG")
    elif kind == "rgba":  # alpha from 0 to 255 across the picture
        rgba = im.convert("RGBA")
        rgba.putalpha(PILImage.linear_gradient("L").rotate(90).resize(im.size))
        rgba.save(buf, "PNG")
    elif kind == "palette":  # mode P PNG whose most frequent palette entry is transparent
        pal = im.convert("P", palette=PILImage.Palette.ADAPTIVE, colors=24)
        pal.save(buf, "PNG", transparency=int(np.bincount(np.asarray(pal).ravel()).argmax()))
    elif kind == "cmyk":  # a CMYK JPEG, as some scraped photos are
        im.convert("CMYK").save(buf, "JPEG", quality=90)
    elif kind == "exif":  # a JPEG stored sideways with EXIF orientation 6
        exif = PILImage.Exif()
        exif[0x0112] = 6
        im.transpose(PILImage.Transpose.ROTATE_90).save(buf, "JPEG", quality=90, exif=exif)
    elif kind in ("black", "white"):  # flat pictures (WIT holds some; mteb counts queries whose gold is one)
        PILImage.new("RGB", im.size, (0, 0, 0) if kind == "black" else (255, 255, 255)).save(buf, "PNG")
    else:
        raise ValueError(kind)
    return buf.getvalue()


def shard_name(prefix: str, i: int, n: int) -> str:
    return f"{prefix}-{i:05d}-of-{n:05d}.parquet"


def at_root(config: str) -> dict:
    """Repo.add's files and pattern for a config whose files sit at the repo's root (<config>-0000i-of-0000n.parquet,
    declared as <config>-*), as the M-BEIR and BLINK repos keep them."""
    return {"files": lambda s, n: [shard_name(config, i, n) for i in range(n)], "pattern": lambda s: f"{config}-*"}


class Repo:
    """A dataset repo under root/<hub path>: parquet files as `push_to_hub` writes them (the HF features in the
    schema metadata) and the README front matter that declares each config's data files and dataset_info."""

    def __init__(self, root: str, path: str):
        self.dir = os.path.join(root, path)
        os.makedirs(self.dir, exist_ok=True)
        self.infos: dict[str, DatasetInfo] = {}
        self.configs: dict[str, dict] = {}

    def add(self, config: str, features: Features, splits: dict[str, dict[str, list]],
            files: Callable[[str, int], list[str]] | None = None, pattern: Callable[[str], str] | None = None,
            shards: int | dict[str, int] = 1) -> None:
        """One config: {split: columns}, each split written as `shards` files (or shards[split], 1 if absent).
        `files(split, shards)` are the files' paths in the repo (push_to_hub's by default: data/<split>-0000i-of-0000n
        .parquet for the default config, <config>/<split>-... for the others), `pattern(split)` what the card declares
        (<dir>/<split>-*)."""
        prefix = "data" if config == "default" else config
        files = files or (lambda s, n: [f"{prefix}/{shard_name(s, i, n)}" for i in range(n)])
        pattern = pattern or (lambda s: f"{prefix}/{s}-*")
        info = DatasetInfo(features=features, splits=SplitDict())
        data_files = []
        for split, columns in splits.items():
            ds = Dataset.from_dict(columns, features=features)
            paths = files(split, shards.get(split, 1) if isinstance(shards, dict) else shards)
            bounds = np.linspace(0, len(ds), len(paths) + 1).astype(int)
            for rel, lo, hi in zip(paths, bounds[:-1], bounds[1:], strict=True):
                os.makedirs(os.path.dirname(os.path.join(self.dir, rel)), exist_ok=True)
                # the schema metadata carries the features (Image, not a bare struct)
                pq.write_table(ds.select(range(lo, hi)).data.table, os.path.join(self.dir, rel))
            info.splits.add(SplitInfo(name=split, num_bytes=ds.data.nbytes, num_examples=len(ds)))
            data_files.append({"split": split, "path": pattern(split)})
        info.dataset_size = sum(s.num_bytes for s in info.splits.values())
        self.infos[config] = info
        self.configs[config] = {"data_files": data_files}

    def card(self) -> None:
        card = DatasetCardData()
        DatasetInfosDict(self.infos).to_dataset_card_data(card)
        MetadataConfigs(self.configs).to_dataset_card_data(card)
        with open(os.path.join(self.dir, "README.md"), "w", encoding="utf-8") as f:
            f.write(f"---\n{card}\n---\n")
