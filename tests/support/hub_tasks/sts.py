"""Fixture mirrors of the hub repos of MIEB's VisualSTS tasks: STS12VisualSTS .. STS16VisualSTS and the four
aggregates VisualSTS17Eng, VisualSTS17Multilingual (sub-task STS17MultilingualVisualSTS) and VisualSTS-b-Eng,
VisualSTS-b-Multilingual (sub-task STSBenchmarkMultilingualVisualSTS); the two sub-tasks too, which MIEB(Img) runs
as they are.

`TASKS[name](root)` writes the task's repo (an aggregate: its sub-task's repo) under root/<metadata.dataset["path"]>
the way the hub serves it: parquet files whose schema carries the HF features (Image as {bytes, path}), and a
README.md whose YAML front matter declares `configs` (each config's data files per split) and `dataset_info`, so
that `datasets.load_dataset(<folder>, <config>)` resolves the folder as it resolves the hub repo and mteb's own
`load_data` reads it unchanged (support.mteb_tasks.redirect). `ROWS[name]` is {hf_subset: {split: rows}} of what
mteb evaluates (an aggregate: its sub-task's), for the test that mteb read the mirror.

What each layout rests on: mteb's AbsTaskSTS (columns sentence1, sentence2: Image, read as images because the task's
modalities are ["image"]; score normalised by (x - 0) / (5 - 0); load_data: every split of the default config, or
of each hf_subset's config for the multilingual ones), mteb's descriptive statistics (splits, subsets) and the cards
of the repos: mteb/rendered-sts13..16 and Pixel-Linguist/rendered-sts12 (one default config, data/<split>-*,
features sentence1 image, sentence2 image, score float64; rendered-sts12 also holds a train split), and
Pixel-Linguist/rendered-stsb (files <split>/<lang>.parquet for train, dev and test, a config per language plus a
default config of every language). Pixel-Linguist/rendered-sts17 is laid out like rendered-stsb (test/<pair>.parquet,
a config per language pair); its card's exact data_files were not seen, only its configs and splits.

The pictures are rendered sentences, as on the hub (448x448 there, small here): dark text on a seeded, tinted noise
ground, so no two different files embed alike and no two cosines tie. Every helper here is shared with
compositionality.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from datasets import DatasetInfo, Features, Image, Value
from PIL import Image as PILImage
from PIL import ImageDraw, ImageFont

from support.hub_tasks.repo import EXT, Repo, seed, stored

# ------------------------------------------------------------------------------------------------ pictures


def picture(key: tuple, size: tuple[int, int], text: str | None = None) -> PILImage.Image:
    """An RGB picture of `size` from a seeded RNG: a tinted noise ground, two filled shapes, and `text` (a rendered
    sentence) drawn over it in dark ink, wrapped to the width."""
    rng = np.random.default_rng(seed(*key))
    w, h = size
    ground = 0.6 * rng.integers(120, 256, 3) + 0.4 * rng.integers(0, 256, (h, w, 3))
    im = PILImage.fromarray(ground.astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(im)
    for _ in range(2):
        x0, x1 = sorted(int(v) for v in rng.integers(0, w, 2))
        y0, y1 = sorted(int(v) for v in rng.integers(0, h, 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1 + 2, y1 + 2], fill=colour)
    if text:
        font = ImageFont.load_default()
        lines, line = [], ""
        for word in text.split():
            if line and draw.textlength(f"{line} {word}", font=font) > w - 4:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}".strip()
        lines.append(line)
        for i, part in enumerate(lines):
            draw.text((2, 2 + 12 * i), part, fill=(10, 10, 30), font=font)
    return im


def image(key: tuple, size: tuple[int, int], kind: str = "png", text: str | None = None,
          name: str | None = None) -> dict:
    """An Image feature's value as a pushed dataset stores it: the file's bytes and (where the uploader had a file)
    its name; path None where the uploader pushed PIL images made in memory, as the rendered-STS repos did."""
    return {"bytes": stored(picture(key, size, text), kind), "path": None if name is None else f"{name}.{EXT[kind]}"}


# ------------------------------------------------------------------------------------------------ STS rows

FEATURES = Features({"sentence1": Image(), "sentence2": Image(), "score": Value("float64")})

_SUBJECTS = ["A man", "A woman", "The child", "Two dogs", "An old train", "The committee", "A small bird",
             "Three students", "The orchestra", "A cyclist", "The market", "Our neighbour"]
_VERBS = ["is playing", "is reading", "watches", "crosses", "repairs", "sells", "paints", "follows", "opens",
          "describes", "leaves", "finds"]
_OBJECTS = ["a flute.", "the newspaper.", "the river at dawn.", "an old bicycle.", "fresh bread.", "the red door.",
            "a long report on the budget.", "the mountain path.", "a letter from home.", "the evening news.",
            "the last bus.", "a blue umbrella."]


def sentence(key: tuple, lang: str = "en") -> str:
    """A short sentence, drawn from `key`; other languages than English are tagged with a word of their script
    (the default font draws no CJK or Hangul glyphs: those lines are blank boxes, the ground keeps them apart)."""
    rng = np.random.default_rng(seed("sentence", *key))
    text = f"{_SUBJECTS[rng.integers(12)]} {_VERBS[rng.integers(12)]} {_OBJECTS[rng.integers(12)]}"
    return text if lang == "en" else f"[{lang}] {_SCRIPT.get(lang, lang)} {text}"


_SCRIPT = {"ar": "مرحبا", "ko": "안녕하세요", "ru": "привет", "zh": "你好", "de": "Grüße", "es": "señor",
           "fr": "garçon", "it": "città", "nl": "één", "pl": "żółw", "pt": "ação", "tr": "çiçek"}


def sts_rows(key: tuple, n: int, langs: tuple[str, str] = ("en", "en"), kinds: dict[int, tuple[str, str]] = (),
             scores: list[float] | None = None) -> dict[str, list]:
    """`n` rows of rendered sentence pairs: sizes vary per row; kinds[i] the two files' kinds of row i (png for
    the rest); scores from 0 to 5 (both ends included, as the datasets hold them) unless given."""
    rng = np.random.default_rng(seed("rows", *key))
    kinds = dict(kinds)
    scores = scores if scores is not None else [float(s) for s in np.round(np.linspace(0, 5, n), 2)[rng.permutation(n)]]
    one, two = [], []
    for i in range(n):
        k1, k2 = kinds.get(i, ("png", "png"))
        size = (int(rng.integers(96, 160)), int(rng.integers(40, 72)))
        one.append(image((*key, i, 1), size, k1, sentence((*key, i, 1), langs[0])))
        two.append(image((*key, i, 2), size, k2, sentence((*key, i, 2), langs[1])))
    return {"sentence1": one, "sentence2": two, "score": scores}


def _single(root: str, path: str, splits: dict[str, dict[str, list]]) -> None:
    repo = Repo(root, path)
    repo.add("default", FEATURES, splits)
    repo.card()


# an image that STS12VisualSTS and STS13VisualSTS both hold (the same rendered sentence in two years' data): one
# file, two tasks, two rows
_SHARED = image(("shared", "sts12-13"), (128, 56), "png", "A man is playing a flute.")


def write_sts12(root: str) -> None:
    """mteb/rendered-sts12: default config, train (3 rows, never evaluated: eval_splits is test) and test (8)."""
    test = sts_rows(("sts12", "test"), 8, kinds={1: ("palette", "png"), 4: ("jpeg", "palette")},
                    scores=[0.0, 1.2, 2.5, 5.0, 3.75, 0.4, 4.6, 2.0])
    # a pair of the same file (the gold score 5.0): cosine 1, distance 0 on both sides of the comparison
    test["sentence2"][3] = test["sentence1"][3]
    test["sentence1"][6] = _SHARED
    _single(root, "mteb/rendered-sts12", {"train": sts_rows(("sts12", "train"), 3), "test": test})


def write_sts13(root: str) -> None:
    """mteb/rendered-sts13: default config, test (6 rows): an RGBA PNG, a greyscale JPEG, the file STS12 holds."""
    test = sts_rows(("sts13", "test"), 6, kinds={0: ("rgba", "png"), 2: ("png", "gray"), 5: ("gray", "rgba")})
    test["sentence2"][4] = _SHARED
    _single(root, "mteb/rendered-sts13", {"test": test})


def write_sts14(root: str) -> None:
    """mteb/rendered-sts14: default config, test (7 rows): one file in two rows (row 1's second image is row 4's
    first: embedded once by a content-keyed cache, twice by mteb), a CMYK JPEG."""
    test = sts_rows(("sts14", "test"), 7, kinds={3: ("cmyk", "png"), 6: ("png", "jpeg")})
    test["sentence1"][4] = test["sentence2"][1]
    _single(root, "mteb/rendered-sts14", {"test": test})


def write_sts15(root: str) -> None:
    """mteb/rendered-sts15: default config, test (6 rows): a JPEG with EXIF orientation 6 (datasets' decoder
    transposes it before the processor sees it), a greyscale PNG with alpha (LA)."""
    test = sts_rows(("sts15", "test"), 6, kinds={1: ("exif", "png"), 3: ("la", "jpeg")})
    _single(root, "mteb/rendered-sts15", {"test": test})


def write_sts16(root: str) -> None:
    """mteb/rendered-sts16: default config, test (6 rows), gold scores with ties (spearman's average ranks) and a
    tall and a wide picture (the processor resizes the short side, then centre-crops)."""
    test = sts_rows(("sts16", "test"), 6, kinds={2: ("palette", "rgba")}, scores=[4.0, 1.0, 4.0, 0.0, 2.5, 5.0])
    test["sentence1"][0] = image(("sts16", "tall"), (40, 180), "png", "A tall picture of a long sentence.")
    test["sentence2"][5] = image(("sts16", "wide"), (260, 36), "jpeg", "A wide picture of one long line of text.")
    _single(root, "mteb/rendered-sts16", {"test": test})


STS17_SUBSETS = ["ko-ko", "ar-ar", "en-ar", "en-de", "en-en", "en-tr", "es-en", "es-es", "fr-en", "it-en", "nl-en"]
# 3 to 6 rows: the subsets differ in size; en-en (VisualSTS17Eng's only subset) 7
STS17_ROWS = {sub: 7 if sub == "en-en" else 3 + i % 4 for i, sub in enumerate(STS17_SUBSETS)}
STSB_LANGS = ["en", "de", "es", "fr", "it", "nl", "pl", "pt", "ru", "zh"]
STSB_ROWS = {lang: {"train": 2, "dev": 3 + i % 3, "test": 4 + (i + 1) % 3} for i, lang in enumerate(STSB_LANGS)}

# a rendered sentence in both STS17's en-en and STS-b's en test (both tasks come from the same news and forum
# sentences): one file, two repos
_SHARED_STS17_STSB = image(("shared", "sts17-stsb"), (140, 60), "png", "A woman is slicing an onion.")


def write_sts17(root: str) -> None:
    """Pixel-Linguist/rendered-sts17: a config per language pair (test/<pair>.parquet, one test split, 3 to 6 rows)
    and a default config of all of them; mteb loads each hf_subset's config by name. The cross-lingual pairs render
    the two sentences in their two languages; every modes' file appears somewhere."""
    repo = Repo(root, "Pixel-Linguist/rendered-sts17")
    modes = ["png", "palette", "rgba", "gray", "jpeg", "la", "cmyk", "exif"]
    for i, sub in enumerate(STS17_SUBSETS):
        n = STS17_ROWS[sub]
        rows = sts_rows(("sts17", sub), n, langs=tuple(sub.split("-")),
                        kinds={0: (modes[i % 8], modes[(i + 3) % 8]), n - 1: (modes[(i + 5) % 8], "png")})
        if sub == "en-en":
            rows["sentence1"][1] = _SHARED_STS17_STSB
        repo.add(sub, FEATURES, {"test": rows}, files=lambda s, n, sub=sub: [f"{s}/{sub}.parquet"],
                 pattern=lambda s, sub=sub: f"{s}/{sub}.parquet")
    repo.configs["default"] = {"data_files": [{"split": "test", "path": "test/*.parquet"}]}
    repo.infos["default"] = DatasetInfo(features=FEATURES)
    repo.card()


def write_stsb(root: str) -> None:
    """Pixel-Linguist/rendered-stsb: files <split>/<lang>.parquet for train, dev and test, a config per language
    (mteb loads each hf_subset's config: every split, evaluates dev and test of the sub-task; the aggregates keep
    test) and a default config of every language."""
    repo = Repo(root, "Pixel-Linguist/rendered-stsb")
    modes = ["png", "rgba", "palette", "gray", "jpeg", "exif", "la", "cmyk"]
    for i, lang in enumerate(STSB_LANGS):
        splits = {}
        for j, (split, n) in enumerate(STSB_ROWS[lang].items()):
            splits[split] = sts_rows(("stsb", lang, split), n, langs=(lang, lang),
                                     kinds={n - 1: (modes[(i + j) % 8], modes[(i + 2 * j + 1) % 8])})
        if lang == "en":
            splits["test"]["sentence2"][0] = _SHARED_STS17_STSB
        repo.add(lang, FEATURES, splits, files=lambda s, n, lang=lang: [f"{s}/{lang}.parquet"],
                 pattern=lambda s, lang=lang: f"{s}/{lang}.parquet")
    repo.configs["default"] = {"data_files": [{"split": s, "path": f"{s}/*.parquet"} for s in ("train", "dev", "test")]}
    repo.infos["default"] = DatasetInfo(features=FEATURES)
    repo.card()


TASKS: dict[str, Callable[[str], None]] = {
    "STS12VisualSTS": write_sts12,
    "STS13VisualSTS": write_sts13,
    "STS14VisualSTS": write_sts14,
    "STS15VisualSTS": write_sts15,
    "STS16VisualSTS": write_sts16,
    "VisualSTS17Eng": write_sts17,
    "VisualSTS17Multilingual": write_sts17,
    "VisualSTS-b-Eng": write_stsb,
    "VisualSTS-b-Multilingual": write_stsb,
    "STS17MultilingualVisualSTS": write_sts17,
    "STSBenchmarkMultilingualVisualSTS": write_stsb,
}

_MULTI = ["ko-ko", "ar-ar", "en-ar", "en-de", "en-tr", "es-en", "es-es", "fr-en", "it-en", "nl-en"]
# {task: {hf_subset: {split: rows}}} of what mteb loads for the task's evaluation (an aggregate: its sub-task's)
ROWS: dict[str, dict[str, dict[str, int]]] = {
    "STS12VisualSTS": {"default": {"train": 3, "test": 8}},
    "STS13VisualSTS": {"default": {"test": 6}},
    "STS14VisualSTS": {"default": {"test": 7}},
    "STS15VisualSTS": {"default": {"test": 6}},
    "STS16VisualSTS": {"default": {"test": 6}},
    "VisualSTS17Eng": {"en-en": {"test": STS17_ROWS["en-en"]}},
    "VisualSTS17Multilingual": {sub: {"test": STS17_ROWS[sub]} for sub in _MULTI},
    "VisualSTS-b-Eng": {"en": STSB_ROWS["en"]},
    "VisualSTS-b-Multilingual": {lang: STSB_ROWS[lang] for lang in STSB_LANGS if lang != "en"},
    "STS17MultilingualVisualSTS": {sub: {"test": STS17_ROWS[sub]} for sub in STS17_SUBSETS},
    "STSBenchmarkMultilingualVisualSTS": STSB_ROWS,
}
