"""The MIEB zero-shot sources of mieb-train: where each lives on the hub and how to caption it.

Pure data, and the one place that knows how many sources there are and how many rows they make: everything
else derives totals and "all sources" from SOURCES. Adding a source is one entry here, its class list in
labels/ and its fixture. Revisions are the ones mteb 2.26.24 pins in each task's `TaskMetadata.dataset`;
`layout` is what the repo held when the catalog was written (the readers detect it; check-sources says when
it changed); `rows` counts the train rows mieb-train keeps (../shared/reference/mieb-train-sources.md
section 1; the source split holds `drop_rows` more), `eval_rows` the task's MIEB eval
split (mteb's `eval_splits`, sizes from its descriptive stats). Templates are mteb's
wording with `{a}` where mteb hard-codes an article, so that a/an can agree with the name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PARQUET = "parquet"
WEBDATASET = "webdataset"

# Where a source's class names come from.
HUB = "hub"  # the ClassLabel names in the parquet `huggingface` schema metadata

# How a raw class name becomes words (see captions.py).
AS_IS = "as_is"
SNAKE = "snake"  # apple_pie -> apple pie
CAMEL = "camel"  # ApplyEyeMakeup -> apply eye makeup
PATH = "path"  # /c/church/outdoor -> church outdoor
CASED = "cased"  # lowercased hub names -> the cased list in `cased_file`, matched by lower()


@dataclass(frozen=True)
class Source:
    slug: str
    repo: str
    revision: str
    layout: str  # PARQUET or WEBDATASET: what the repo held at `revision` (a hint: the readers detect it)
    image_column: str  # parquet column, or the tar member extension for WebDataset
    label_column: str
    template: str  # "{name}" is the class name, "{a}" the article agreeing with it
    rows: int  # train rows in mieb-train (after `drop`)
    eval_rows: int  # rows of the eval split, all kept
    names: str = HUB  # HUB or a file in sources/labels/
    style: str = AS_IS
    cased_file: str | None = None  # for style CASED
    # label id -> (name in the source, fixed name); the source name is checked so a moved list fails loudly
    renames: dict[int, tuple[str, str]] = field(default_factory=dict)
    drop: dict[int, str] = field(default_factory=dict)  # label id -> name: train rows not in mieb-train
    drop_rows: int = 0  # how many train rows of the source split have a `drop` label
    caption_column: str | None = None  # caption from this row column instead of the template
    image_ext: str = "jpg"  # WebDataset member extension of the images
    split: str = "train"
    eval_split: str = "test"  # the split mteb scores the task on
    mteb_task: str = ""

    @property
    def uses_row_captions(self) -> bool:
        return self.caption_column is not None

    @property
    def split_rows(self) -> int:
        """Rows of the source's train split as the repo holds it: mieb-train's rows and the dropped ones."""
        return self.rows + self.drop_rows


A_PHOTO = "a photo of {a} {name}."

SOURCES: tuple[Source, ...] = (
    Source("ucf101", "mteb/ucf101", "e0618988874f6ffbf90af69fa6dccecb9be3deb3", PARQUET, "image", "label",
           "a photo of {name}", 1_786_096, style=CAMEL, eval_rows=697_222, mteb_task="UCF101ZeroShot"),
    Source("imagenet1k", "mteb/wds_imagenet1k", "b54c9af96641d8a2cba5d1144629c724de94ef76", WEBDATASET, "jpg", "cls",
           "a photo of {name}.", 1_281_167, names="Imagenet1k_labels.txt",
           # duplicates told apart by WordNet synset: n04008634 projectile, n04355933 sunglass (burning glass)
           renames={744: ("missile", "projectile"), 836: ("sunglasses", "sunglass")},
           eval_rows=50_000, mteb_task="Imagenet1kZeroShot"),
    Source("scimmir", "mteb/SciMMIR", "2a10b6b1f93cac7084aa809512749272cf0a893a", PARQUET, "image", "class",
           "{a} {name}", 498_279, names="scimmir.txt", caption_column="text", image_ext="png",
           # the `class` column holds these codes (mteb's class_code order); captions come from `text`
           renames={0: ("fig_result", "figure of results"), 1: ("fig_illustration", "figure of an illustration"),
                    2: ("fig_architecture", "figure of an architecture"),
                    3: ("table_parameter", "table of parameters"), 4: ("table_result", "table of results")},
           eval_rows=16_263, mteb_task="SciMMIR"),
    Source("patchcamelyon", "mteb/wds_vtab-pcam", "6544d35f2235ed00e2ac8494c09ff107f8af353c", WEBDATASET, "webp", "cls",
           "histopathology image of {name}", 262_144, names="PatchCamelyon_labels.txt", image_ext="webp",
           eval_rows=32_768, mteb_task="PatchCamelyonZeroShot"),
    Source("sun397", "mteb/sun397", "c684cff33166060e2ae05525a5c4abdf5e6d7bce", PARQUET, "image", "label",
           A_PHOTO, 76_127, style=PATH, eval_rows=21_750, mteb_task="SUN397ZeroShot"),
    Source("food101", "mteb/food101", "7cca05bfde8fdad4a9b39ed14a881c800cc1dca2", PARQUET, "image", "label",
           "a photo of {name}, a type of food.", 75_750, style=SNAKE,
           eval_rows=25_250, eval_split="validation", mteb_task="Food101ZeroShot"),
    Source("clevr", "mteb/wds_vtab-clevr_closest_object_distance", "d2777bb7428d8d74d951b57de0bc2ca5408c4fd4",
           WEBDATASET, "webp", "cls", "{name} shapes.", 63_000, names="clevr.txt",
           # VTAB bin 3 is 9.0-9.5 units away, between "near" and "distant"; mteb's list leaves it blank
           renames={3: ("", "mid-distance")}, image_ext="webp", eval_rows=15_000, mteb_task="CLEVRZeroShot"),
    Source("clevr_count", "mteb/wds_vtab-clevr_count_all", "2e31935f1deb7d22306d3bcb02b76c7cd87a10b3", WEBDATASET,
           "webp", "cls", "a picture of {name} objects", 63_000, names="clevr_count.txt", image_ext="webp",
           eval_rows=15_000, mteb_task="CLEVRCountZeroShot"),
    Source("mnist", "mteb/mnist", "cf6afcbae72cc3bb1fc07a9480fe0d8e0b615fcd", PARQUET, "image", "label",
           "a photo of the number: '{name}'.", 60_000, image_ext="png", eval_rows=10_000, mteb_task="MNISTZeroShot"),
    Source("cifar10", "mteb/cifar10", "69a62dd171e24a133d193073e73fda4dbb823266", PARQUET, "img", "label",
           A_PHOTO, 50_000, image_ext="png", eval_rows=10_000, mteb_task="CIFAR10ZeroShot"),
    Source("cifar100", "mteb/cifar100", "ac5511f885f65fb75d31a9d8810a8440913f7721", PARQUET, "img", "fine_label",
           A_PHOTO, 50_000, style=SNAKE, renames={26: ("cra", "crab")}, image_ext="png",
           eval_rows=10_000, mteb_task="CIFAR100ZeroShot"),
    Source("country211", "mteb/wds_country211", "c3875324cab4803fa6d3afcd5947a97c84fad4c6", WEBDATASET, "jpg", "cls",
           "a photo showing the country of {name}.", 31_650, names="Country211_labels.txt",
           eval_rows=21_100, mteb_task="Country211ZeroShot"),
    Source("fer2013", "mteb/wds_fer2013", "d9cabab388cb32bc071a1601ef68cb2f70ca0ba7", WEBDATASET, "jpg", "cls",
           "a photo of {a} {name} looking face.", 28_709, names="fer2013.txt",
           # mteb's nouns read "a disgust looking face"; the adjectives are CLIP_benchmark's, same order
           renames={1: ("disgust", "disgusted"), 2: ("fear", "fearful"), 6: ("surprise", "surprised")},
           eval_rows=7_178, mteb_task="FER2013ZeroShot"),
    Source("gtsrb", "mteb/wds_gtsrb", "a8f4bb6c8b6f76f4bdc548a7f2979057e546ab44", WEBDATASET, "webp", "cls",
           "a close up photo of {a} '{name}' traffic sign.", 26_640, names="GTSRB_labels.txt",
           renames={17: ("red circle with white horizonal stripe no entry",
                         "red circle with white horizontal stripe no entry"),
                    29: ("red and white triangle with bicyle warning",
                         "red and white triangle with bicycle warning")},
           image_ext="webp", eval_rows=12_630, mteb_task="GTSRBZeroShot"),
    Source("resisc45", "mteb/resisc45", "a5b7c0d47eb6544fb2ef0d380b9c105f3c6dc259", PARQUET, "image", "label",
           "satellite imagery of {name}.", 18_900, style=SNAKE, eval_rows=6_300, mteb_task="RESISC45ZeroShot"),
    # the hub's ClassLabel names (AnnualCrop, ...) are not what mteb prompts with: its own list, index-aligned
    Source("eurosat", "mteb/eurosat-rgb", "da02b77448e750b3b034e0b5da008167b9706571", PARQUET, "image", "label",
           "a centered satellite photo of {name}.", 16_200, names="eurosat.txt", eval_rows=5_400,
           mteb_task="EuroSATZeroShot"),
    Source("birdsnap", "mteb/birdsnap", "fd23015508be94f0b5b59d61630e4ea2536509e4", PARQUET, "image", "common",
           "a photo of {a} {name}, a type of bird.", 16_000, eval_rows=1_851, mteb_task="BirdsnapZeroShot"),
    Source("stanfordcars", "mteb/StanfordCars", "09ffe9bc7864d3f1e851529e5c4b7e05601a04fb", PARQUET, "image", "label",
           A_PHOTO, 8_144, style=CASED, cased_file="stanfordcars_cased.txt", eval_rows=8_041,
           mteb_task="StanfordCarsZeroShot"),
    Source("renderedsst2", "mteb/wds_renderedsst2", "c10537bc389e9741a27f7b14767bd42f2b77476b", WEBDATASET, "png",
           "cls", "{a} {name} review of a movie", 6_920, names="renderedsst2.txt", image_ext="png",
           eval_rows=1_821, mteb_task="RenderedSST2"),
    Source("stl10", "mteb/stl10", "2da456fe65204f88c2cb5e5ff17f85f442ef3eaa", PARQUET, "image", "label",
           A_PHOTO, 5_000, image_ext="png", eval_rows=8_000, mteb_task="STL10ZeroShot"),
    Source("dtd", "mteb/dtd", "96726183040de9e64a590d08eaac8de940dfcbdf", PARQUET, "image", "label",
           "a photo of {name} texture.", 3_760, eval_rows=1_880, mteb_task="DTDZeroShot"),
    Source("oxfordpets", "mteb/OxfordPets", "557b480fae8d69247be74d9503b378a09425096f", PARQUET, "image", "label",
           "a photo of {a} {name}, a type of pet.", 3_680, style=CASED, cased_file="oxfordpets_cased.txt",
           eval_rows=3_669, mteb_task="OxfordPetsZeroShot"),
    Source("caltech101", "mteb/Caltech101", "011e51e5fb01f0c820824734edb7a539ab8e6650", PARQUET, "image", "label",
           A_PHOTO, 3_030, style=SNAKE, drop={4: "background_google"}, drop_rows=30,  # 30 train rows per class
           # folder names, not English: plurals after "a", a misspelling, and OpenAI's words for the two faces and
           # the background class (dropped from train; the eval split keeps its rows, so it needs a caption)
           renames={1: ("airplanes", "airplane"), 4: ("background_google", "background"),
                    37: ("faces", "off-center face"), 38: ("faces_easy", "centered face"),
                    57: ("leopards", "leopard"), 66: ("motorbikes", "motorbike"), 96: ("water_lilly", "water lily")},
           eval_rows=6_084, mteb_task="Caltech101ZeroShot"),
)

MIEB_TRAIN_ROWS = 4_434_196  # the size PumeTu/mieb-train states; tests check that the sources add up to it
TOTAL_ROWS = sum(s.rows for s in SOURCES)  # mieb-train: every source's train rows, after the drops
EVAL_TOTAL_ROWS = sum(s.eval_rows for s in SOURCES)  # the zero-shot tasks' eval splits and SciMMIR's test split
