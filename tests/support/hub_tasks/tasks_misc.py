"""Fixture mirrors of the hub repos of MIEB's VisionCentricQA tasks (BLINK's two multiple-choice tasks, CV-Bench's
four), three linear-probe tasks (FGVCAircraft, OxfordFlowersClassification, VOC2007), three image clustering tasks
(ImageNetDog15Clustering, ImageNet10Clustering, TinyImageNetClustering) and FGVCAircraftZeroShot.

`TASKS[name](root)` writes the task's repo under root/<metadata.dataset["path"]> the way the hub serves it: parquet
files whose schema carries the HF features (Image as {bytes, path}, ClassLabel names), a README.md whose YAML front
matter declares `configs` (the data files of each config and split) and `dataset_info`, so that
`datasets.load_dataset(<folder>, <config>, split=...)` resolves the folder as it resolves the hub repo and mteb's own
`load_data` reads it unchanged (support.mteb_tasks.redirect). The four CV-Bench tasks share one repo (mteb/CV-Bench:
one writer, one folder; each task keeps the rows of its own `task`). Tiny and deterministic: every picture is drawn
from a seeded RNG (noise, ellipses, rectangles, several sizes), so no two embeddings tie unless the bytes are equal.

What each layout rests on: mteb's loaders (the configs, splits and columns they read), mteb's descriptive statistics
of each task (mteb/descriptive_stats: splits, row counts, unique images, labels per row, candidate counts) and the
source repos' cards where known (JamieSJS/blink-*-multi: configs query/corpus/qrels, corpus split `corpus`, files at
the repo root; nyu-visionx/CV-Bench: one default config, one test split; HuggingFaceM4/FGVC-Aircraft: image, family,
manufacturer, variant as ClassLabels, train/validation/test; nelorth/oxford-flowers: image-folder class names;
zh-plus/tiny-imagenet: train/valid, wnid ClassLabel, 64x64 JPEGs some of them greyscale).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from datasets import ClassLabel, Features, Image, Sequence, Value
from PIL import Image as PILImage
from PIL import ImageDraw

from support.hub_tasks.repo import EXT, Repo, at_root, seed, stored

# ------------------------------------------------------------------------------------------------ pictures


def picture(key: tuple, size: tuple[int, int]) -> PILImage.Image:
    """An RGB picture of `size` drawn from a seeded RNG: a tinted noise ground and three filled shapes."""
    rng = np.random.default_rng(seed(*key))
    w, h = size
    ground = 0.55 * rng.integers(0, 256, 3) + 0.45 * rng.integers(0, 256, (h, w, 3))
    im = PILImage.fromarray(ground.astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(im)
    for _ in range(3):
        x0, x1 = sorted(int(v) for v in rng.integers(0, w, 2))
        y0, y1 = sorted(int(v) for v in rng.integers(0, h, 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1 + 2, y1 + 2], fill=colour)
    return im


def image(key: tuple, size: tuple[int, int], kind: str = "jpeg", name: str | None = None) -> dict:
    """An Image feature's value, as a pushed dataset stores it: the file's bytes and its original name."""
    return {"bytes": stored(picture(key, size), kind), "path": f"{name or '_'.join(map(str, key))}.{EXT[kind]}"}


def _size(rng: np.random.Generator, lo: int = 40, hi: int = 140) -> tuple[int, int]:
    return int(rng.integers(lo, hi)), int(rng.integers(lo, hi))


# ------------------------------------------------------------------------------------------------ BLINK

# longer than CLIP's 77 tokens: the tokenizer truncates it (mteb's CLIP wrapper passes truncation=True)
_LONG = (" Look carefully at every part of the picture, at the colours, the shapes, the textures, the light and the "
         "shadows, at the background as well as at the foreground, at the edges and at the corners, at what is "
         "large and at what is small, and answer with the single choice that fits the picture best of all the "
         "choices you are given here.")


def write_blink_it2i(root: str) -> None:
    """mteb/blink-it2i-multi: BLINK's image-answer subtasks as JamieSJS uploaded them. Configs query (test: id,
    modality 'image,text', text, image), corpus (one split named `corpus`: id, modality 'image', image), qrels
    (test: query-id, corpus-id, score int8, one row per candidate, 1 for the answer, 0 for the other). The files
    sit at the repo root (query-00000-of-00001.parquet). mteb reads the `query` config because it exists, takes the
    corpus's only split for `test`, and dataset_transform makes each query's top_ranked its qrels' candidates."""
    prompts = ["Which image is most similar to the reference image?",
               "Which image shows the same scene as the reference image?",
               "Which image is more likely to be a real photograph?" + _LONG]
    kinds = ["jpeg", "rgba", "palette", "png", "gray", "jpeg"]
    qids, qtext, qimage, cids, cimage, qrels = [], [], [], [], [], []
    rng = np.random.default_rng(1)
    for q in range(6):
        qids.append(f"val_Visual_Similarity_{q + 1}" if q < 4 else f"val_Forensic_Detection_{q + 1}")
        qtext.append(prompts[q % 3])
        qimage.append(image(("blink-it2i", "q", q), _size(rng), kinds[q]))
        for c, score in ((0, int(q % 2 == 0)), (1, int(q % 2 == 1))):  # the answer first for half the queries
            cid = f"{qids[-1]}_{'AB'[c]}"
            cids.append(cid)
            cimage.append(image(("blink-it2i", "c", q, c), _size(rng), kinds[(q + c + 1) % 6]))
            qrels.append((qids[-1], cid, score))
    # the same bytes twice in the corpus (803 unique images in its 804 rows): the wrong candidate of query 1 and the
    # answer of query 5, so equal embeddings never compete for one query
    cimage[11] = dict(cimage[2], path="dup.png")
    repo = Repo(root, "mteb/blink-it2i-multi")
    repo.add("query", Features({"id": Value("string"), "modality": Value("string"), "text": Value("string"),
                                "image": Image()}),
             {"test": {"id": qids, "modality": ["image,text"] * len(qids), "text": qtext, "image": qimage}},
             **at_root("query"))
    repo.add("corpus", Features({"id": Value("string"), "modality": Value("string"), "image": Image()}),
             {"corpus": {"id": cids, "modality": ["image"] * len(cids), "image": cimage}},
             **at_root("corpus"))
    repo.add("qrels", Features({"query-id": Value("string"), "corpus-id": Value("string"), "score": Value("int8")}),
             {"test": {"query-id": [r[0] for r in qrels], "corpus-id": [r[1] for r in qrels],
                       "score": [r[2] for r in qrels]}},
             **at_root("qrels"))
    repo.card()


def write_blink_it2t(root: str) -> None:
    """mteb/blink-it2t-multi: BLINK's text-answer subtasks, JamieSJS's layout (see write_blink_it2i). The corpus is
    the short answer texts (modality 'text'), shared by the queries: a text is one query's answer and another's
    wrong choice; queries have 2 to 4 candidates."""
    docs = ["(A)", "(B)", "(C)", "(D)", "yes", "no", "left", "right", "3", "a red ball on the table"]
    choices = [  # (candidate doc indices, the answer's position)
        ([0, 1], 0), ([0, 1, 2, 3], 2), ([4, 5], 1), ([6, 7], 0), ([8, 4, 5], 0), ([0, 1, 2], 1), ([9, 5], 0)]
    questions = ["Which point is closer to the camera?",
                 "Which of the four marked boxes contains the object shown in the first image?",
                 "Is the reflection in the mirror consistent with the scene?",
                 "Is the cup on the left or on the right of the plate?",
                 "How many birds are in the image?" + _LONG,
                 "Which point has the same colour as the point marked in the reference image?",
                 "What does the image show?"]
    kinds = ["jpeg", "png", "gray", "palette", "rgba", "cmyk", "jpeg"]
    rng = np.random.default_rng(2)
    qids, qimage, qrels = [], [], []
    for q, (cands, answer) in enumerate(choices):
        qids.append(f"val_it2t_{q}")
        qimage.append(image(("blink-it2t", "q", q), _size(rng), kinds[q]))
        qrels += [(qids[-1], f"corpus_{d}", int(i == answer)) for i, d in enumerate(cands)]
    repo = Repo(root, "mteb/blink-it2t-multi")
    repo.add("query", Features({"id": Value("string"), "modality": Value("string"), "text": Value("string"),
                                "image": Image()}),
             {"test": {"id": qids, "modality": ["image,text"] * len(qids), "text": questions, "image": qimage}},
             **at_root("query"))
    repo.add("corpus", Features({"id": Value("string"), "modality": Value("string"), "text": Value("string")}),
             {"corpus": {"id": [f"corpus_{d}" for d in range(len(docs))], "modality": ["text"] * len(docs),
                         "text": docs}},
             **at_root("corpus"))
    repo.add("qrels", Features({"query-id": Value("string"), "corpus-id": Value("string"), "score": Value("int8")}),
             {"test": {"query-id": [r[0] for r in qrels], "corpus-id": [r[1] for r in qrels],
                       "score": [r[2] for r in qrels]}},
             **at_root("qrels"))
    repo.card()


# ------------------------------------------------------------------------------------------------ CV-Bench

_CV_FEATURES = Features({
    "idx": Value("int32"), "type": Value("string"), "task": Value("string"), "image": Image(),
    "question": Value("string"), "choices": Sequence(Value("string")), "answer": Value("string"),
    "prompt": Value("string"), "filename": Value("string"), "source": Value("string"),
    "source_dataset": Value("string"), "source_filename": Value("string"), "target_class": Value("string"),
    "target_size": Value("int64"), "bbox": Sequence(Value("float32"))})

# (task, question, choices, answer letter, picture kind). Rows of the four tasks interleave, as in the real file: each
# task keeps its own with `task == <name>`. Count has 4 to 6 choices ("(F)" answers one), the others 2; the choice
# texts repeat across questions (mteb's corpus is the split's distinct choice texts) and one question repeats with
# another picture.
_CV_ROWS = [
    ("Count", "How many chairs are in the image?", ["3", "2", "1", "0", "4", "5"], "(F)", "jpeg"),
    ("Relation", "Considering the relative positions of the lamp (annotated by the red box) and the bed (annotated by "
     "the blue box) in the image provided, where is the lamp (annotated by the red box) located with respect to the "
     "bed (annotated by the blue box)?", ["left", "right"], "(A)", "png"),
    ("Depth", "Which object is closer to the camera taking this photo, the chair (highlighted by a red box) or the "
     "table (highlighted by a blue box)?", ["chair", "table"], "(B)", "jpeg"),
    ("Distance", "Estimate the real-world distances between objects in this image. Which object is closer to the "
     "lamp (highlighted by a red box), the sofa (highlighted by a blue box) or the table (highlighted by a green "
     "box)?" + _LONG, ["sofa", "table"], "(A)", "rgba"),
    ("Count", "How many cars are in the image?", ["1", "2", "0", "3"], "(B)", "gray"),
    ("Relation", "Considering the relative positions of the cup (annotated by the red box) and the plate (annotated "
     "by the blue box) in the image provided, where is the cup (annotated by the red box) located with respect to "
     "the plate (annotated by the blue box)?", ["above", "below"], "(B)", "palette"),
    ("Count", "How many chairs are in the image?", ["2", "3", "4", "1", "0"], "(A)", "png"),
    ("Depth", "Which object is closer to the camera taking this photo, the box (highlighted by a red box) or the "
     "bottle (highlighted by a blue box)?", ["box", "bottle"], "(A)", "cmyk"),
    ("Distance", "Estimate the real-world distances between objects in this image. Which object is closer to the "
     "door (highlighted by a red box), the table (highlighted by a blue box) or the shelf (highlighted by a green "
     "box)?", ["table", "shelf"], "(B)", "jpeg"),
    ("Relation", "Considering the relative positions of the dog (annotated by the red box) and the person (annotated "
     "by the blue box) in the image provided, where is the dog (annotated by the red box) located with respect to "
     "the person (annotated by the blue box)?", ["left", "right"], "(B)", "jpeg"),
    ("Count", "How many people are in the image?", ["0", "1", "2", "3"], "(D)", "rgba"),
    ("Depth", "Which object is closer to the camera taking this photo, the table (highlighted by a red box) or the "
     "chair (highlighted by a blue box)?", ["table", "chair"], "(A)", "png"),
    ("Distance", "Estimate the real-world distances between objects in this image. Which object is closer to the "
     "sofa (highlighted by a red box), the lamp (highlighted by a blue box) or the table (highlighted by a green "
     "box)?", ["lamp", "table"], "(A)", "palette"),
]


def write_cv_bench(root: str) -> None:
    """mteb/CV-Bench (nyu-visionx/CV-Bench's test file): one default config, one `test` split
    (data/test-00000-of-00001.parquet), all four tasks' rows in it. mteb's own _load_data (cv_bench.py) loads the
    whole repo, keeps `task == <subtask>`, maps the answer letter "(A)".."(F)" to an index, drops the source
    columns, and builds the corpus itself from the choice texts. The 3D rows leave target_class, target_size and
    bbox null: columns mteb drops, nulls included."""
    rng = np.random.default_rng(3)
    cols: dict[str, list] = {k: [] for k in _CV_FEATURES}
    for i, (task, question, choices, answer, kind) in enumerate(_CV_ROWS):
        is_2d = task in ("Count", "Relation")
        source = "ADE20K" if i % 2 else "COCO"
        filename = f"img/{'2D' if is_2d else '3D'}/{task.lower()}/{source.lower() if is_2d else 'omni3d'}_{i}.png"
        prompt = question + " Select from the following choices.\n" + "\n".join(
            f"({'ABCDEF'[j]}) {c}" for j, c in enumerate(choices))
        row = {"idx": i, "type": "2D" if is_2d else "3D", "task": task,
               "image": image(("cv-bench", i), _size(rng, 60, 200), kind), "question": question,
               "choices": choices, "answer": answer, "prompt": prompt, "filename": filename,
               "source": source if is_2d else "Omni3D",
               "source_dataset": f"{source} Validation" if is_2d else "SUNRGBD",
               "source_filename": f"{i:08d}.jpg", "target_class": choices[0] if task == "Count" else None,
               "target_size": int(rng.integers(500, 5000)) if is_2d else None,
               "bbox": [float(v) for v in rng.integers(0, 200, 4)] if is_2d else None}
        for k, v in row.items():
            cols[k].append(v)
    repo = Repo(root, "mteb/CV-Bench")
    repo.add("default", _CV_FEATURES, {"test": cols})
    repo.card()


# ------------------------------------------------------------------------------------------------ FGVC-Aircraft

FGVC_VARIANTS = [
    "707-320", "727-200", "737-200", "737-300", "737-400", "737-500", "737-600", "737-700", "737-800", "737-900",
    "747-100", "747-200", "747-300", "747-400", "757-200", "757-300", "767-200", "767-300", "767-400", "777-200",
    "777-300", "A300B4", "A310", "A318", "A319", "A320", "A321", "A330-200", "A330-300", "A340-200", "A340-300",
    "A340-500", "A340-600", "A380", "ATR-42", "ATR-72", "An-12", "BAE 146-200", "BAE 146-300", "BAE-125",
    "Beechcraft 1900", "Boeing 717", "C-130", "C-47", "CRJ-200", "CRJ-700", "CRJ-900", "Cessna 172", "Cessna 208",
    "Cessna 525", "Cessna 560", "Challenger 600", "DC-10", "DC-3", "DC-6", "DC-8", "DC-9-30", "DH-82", "DHC-1",
    "DHC-6", "DHC-8-100", "DHC-8-300", "DR-400", "Dornier 328", "E-170", "E-190", "E-195", "EMB-120", "ERJ 135",
    "ERJ 145", "Embraer Legacy 600", "Eurofighter Typhoon", "F-16A/B", "F/A-18", "Falcon 2000", "Falcon 900",
    "Fokker 100", "Fokker 50", "Fokker 70", "Global Express", "Gulfstream IV", "Gulfstream V", "Hawk T1", "Il-76",
    "L-1011", "MD-11", "MD-80", "MD-87", "MD-90", "Metroliner", "Model B200", "PA-28", "SR-20", "Saab 2000",
    "Saab 340", "Spitfire", "Tornado", "Tu-134", "Tu-154", "Yak-42"]
FGVC_FAMILIES = [
    "A300", "A310", "A320", "A330", "A340", "A380", "ATR-42", "ATR-72", "An-12", "BAE 146", "BAE-125",
    "Beechcraft 1900", "Boeing 707", "Boeing 717", "Boeing 727", "Boeing 737", "Boeing 747", "Boeing 757",
    "Boeing 767", "Boeing 777", "C-130", "C-47", "CRJ-200", "CRJ-700", "Cessna 172", "Cessna 208", "Cessna Citation",
    "Challenger 600", "DC-10", "DC-3", "DC-6", "DC-8", "DC-9", "DH-82", "DHC-1", "DHC-6", "DR-400", "Dash 8",
    "Dornier 328", "EMB-120", "Embraer E-Jet", "Embraer ERJ 145", "Embraer Legacy 600", "Eurofighter Typhoon",
    "F-16", "F/A-18", "Falcon 2000", "Falcon 900", "Fokker 100", "Fokker 50", "Fokker 70", "Global Express",
    "Gulfstream", "Hawk T1", "Il-76", "King Air", "L-1011", "MD-11", "MD-80", "MD-90", "Metroliner", "PA-28",
    "SR-20", "Saab 2000", "Saab 340", "Spitfire", "Tornado", "Tu-134", "Tu-154", "Yak-42"]
FGVC_MANUFACTURERS = [
    "ATR", "Airbus", "Antonov", "Beechcraft", "Boeing", "Bombardier Aerospace", "British Aerospace", "Canadair",
    "Cessna", "Cirrus Aircraft", "Dassault Aviation", "Dornier", "Douglas Aircraft Company", "Embraer",
    "Eurofighter", "Fairchild", "Fokker", "Gulfstream Aerospace", "Ilyushin", "Lockheed Corporation",
    "Lockheed Martin", "McDonnell Douglas", "Panavia", "Piper", "Robin", "Saab", "Supermarine", "Tupolev",
    "Yakovlev", "de Havilland"]
# the variants the mirror holds, with their family and manufacturer. Fokker 50, Fokker 70 and CRJ-900 are where the
# tiny test CLIP's (make_tiny_clip, seed 0) zero-shot predictions fall: with them FGVCAircraftZeroShot's accuracy and
# f1 are neither 0 nor 1, so they tell implementations apart (with 100 candidates and other variants every metric is
# 0 whatever the ranking). F/A-18 has a slash, Eurofighter Typhoon is the longest name (the longest prompt).
_FGVC_USED = [("Fokker 50", "Fokker 50", "Fokker"), ("Fokker 70", "Fokker 70", "Fokker"),
              ("CRJ-900", "CRJ-700", "Canadair"), ("F/A-18", "F/A-18", "McDonnell Douglas"),
              ("Eurofighter Typhoon", "Eurofighter Typhoon", "Eurofighter")]
_FGVC_FEATURES = Features({"image": Image(), "family": ClassLabel(names=FGVC_FAMILIES),
                           "manufacturer": ClassLabel(names=FGVC_MANUFACTURERS),
                           "variant": ClassLabel(names=FGVC_VARIANTS)})
# rows per used variant and split: 17 > samples_per_label (16) train rows for two variants, so that the five
# experiments draw different rows; 5, 3 and 2 for the others, all of which every experiment takes
_FGVC_ROWS = {"train": [17, 17, 5, 3, 2], "validation": [1, 1, 1, 1, 1], "test": [4, 4, 3, 2, 2]}


def _fgvc_repo(root: str, path: str) -> None:
    rng = np.random.default_rng(4)
    splits = {}
    for split, counts in _FGVC_ROWS.items():
        cols: dict[str, list] = {"image": [], "family": [], "manufacturer": [], "variant": []}
        order = [u for u, n in enumerate(counts) for _ in range(n)]
        rng.shuffle(order)  # labels interleaved, as the real files are
        for i, u in enumerate(order):
            variant, family, maker = _FGVC_USED[u]
            # the real photos are 800-1600 wide with a copyright banner; any size will do, the processor resizes
            kind = "gray" if i % 11 == 5 else "cmyk" if i % 13 == 7 else "jpeg"
            cols["image"].append(image(("fgvc", split, i), _size(rng, 60, 160), kind, name=f"{1000000 + i:07d}"))
            cols["family"].append(FGVC_FAMILIES.index(family))
            cols["manufacturer"].append(FGVC_MANUFACTURERS.index(maker))
            cols["variant"].append(FGVC_VARIANTS.index(variant))
        splits[split] = cols
    repo = Repo(root, path)
    repo.add("default", _FGVC_FEATURES, splits)
    repo.card()


def write_fgvc_aircraft(root: str) -> None:
    """mteb/FGVCAircraft: default config, train/validation/test (data/<split>-*.parquet), columns image, family,
    manufacturer, variant (ClassLabels of 70, 30 and 100 names). mteb classifies `variant` (train -> test)."""
    _fgvc_repo(root, "mteb/FGVCAircraft")


def write_fgvc_aircraft_zeroshot(root: str) -> None:
    """mteb/FGVCAircraftZeroShot: the same data as mteb/FGVCAircraft (mteb's statistics of the two test splits are
    identical). The candidate labels are "a photo of a {name}, a type of aircraft." for all 100 names of the
    `variant` ClassLabel (the test split's features), not only the variants the rows use; dataset_transform drops
    the splits other than test."""
    _fgvc_repo(root, "mteb/FGVCAircraftZeroShot")


# ------------------------------------------------------------------------------------------------ Oxford flowers

# nelorth/oxford-flowers was made by `datasets`' image folder from folders named 1..102: the ClassLabel's names are
# those folder names in string order, so class 2 is "100" and the names are not the class numbers
FLOWER_NAMES = sorted((str(i) for i in range(1, 103)))


def write_oxford_flowers(root: str) -> None:
    """mteb/oxford-flowers: default config, train/test (data/<split>-*.parquet), columns image, label (ClassLabel
    of 102 digit-string names). The train split repeats some photos byte for byte (7169 rows, 7165 distinct)."""
    rng = np.random.default_rng(5)
    # 17 > samples_per_label (16) rows for two classes: the five experiments draw different rows; 5 for the third
    labels = {"train": [0, 2] * 17 + [57] * 5, "test": [0, 2, 57] * 3}
    splits = {}
    for split, ys in labels.items():
        ys = list(ys)
        rng.shuffle(ys)
        kinds = ["jpeg"] * len(ys)
        kinds[3], kinds[7] = "png", "gray"
        imgs = [image(("flowers", split, i), _size(rng, 60, 160), kinds[i], name=f"image_{i:05d}")
                for i in range(len(ys))]
        if split == "train":  # the same photo twice: under the same label, as in the real split
            twin = next(i for i in range(1, len(ys)) if ys[i] == ys[0])
            imgs[twin] = dict(imgs[0])
        splits[split] = {"image": imgs, "label": ys}
    repo = Repo(root, "mteb/oxford-flowers")
    repo.add("default", Features({"image": Image(), "label": ClassLabel(names=FLOWER_NAMES)}), splits)
    repo.card()


# ------------------------------------------------------------------------------------------------ VOC2007

VOC_CLASSES = ["aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
               "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor"]


def _voc_labels(n: int) -> list[list[int]]:
    """n label lists over four VOC classes (car 6, chair 8, dog 11, person 14): one label or several (up to three,
    in no sorted order), every class present and absent in every experiment's draw."""
    pool = [[14], [6], [11], [8], [14, 8], [11, 14], [6, 14], [8, 11, 14], [6], [14], [11], [8, 6]]
    return [list(pool[i % len(pool)]) if i % 5 else list(reversed(pool[i % len(pool)])) for i in range(n)]


def write_voc2007(root: str) -> None:
    """mteb/VOC2007: default config, train/test (data/<split>-*.parquet), columns image and classes (a list of class
    indices: one for most rows, up to five in the real data). One train photo appears twice (2501 rows, 2500
    distinct). The task's classifier is mteb's multilabel default, a 5-nearest-neighbour one: VOC2007Classification
    sets `evaluator = MultiOutputClassifier(LogisticRegression())`, a name AbsTaskMultilabelClassification never
    reads (it fits `evaluator_model`), so lrap is computed on the k-NN's 0/1 predictions."""
    rng = np.random.default_rng(6)
    splits = {}
    for split, n in (("train", 30), ("test", 12)):
        ys = _voc_labels(n)
        order = rng.permutation(n)
        ys = [ys[i] for i in order]
        kinds = ["jpeg"] * n
        kinds[1], kinds[4] = "rgba", "gray"
        imgs = [image(("voc", split, i), _size(rng, 80, 200), kinds[i], name=f"{i:06d}") for i in range(n)]
        if split == "train":  # the same photo twice with its labels: equal embeddings tie in the k-NN, and with
            imgs[n - 1], ys[n - 1] = dict(imgs[2]), list(ys[2])  # equal labels the tie's order cannot matter
        splits[split] = {"image": imgs, "classes": ys}
    repo = Repo(root, "mteb/VOC2007")
    repo.add("default", Features({"image": Image(), "classes": Sequence(Value("int64"))}), splits)
    repo.card()


# ------------------------------------------------------------------------------------------------ clustering


def write_imagenet_dog15(root: str) -> None:
    """mteb/imagenet-dog-15: default config, one `test` split (data/test-*.parquet), columns image (224x224 JPEGs)
    and label (int64 class index, not a ClassLabel). One photo appears twice (1076 rows, 1075 distinct)."""
    rng = np.random.default_rng(7)
    ys = [0, 1, 2, 3] * 4
    rng.shuffle(ys)
    imgs = [image(("dog15", i), (224, 224), "gray" if i == 5 else "jpeg") for i in range(len(ys))]
    imgs[-1] = dict(imgs[0])
    ys[-1] = ys[0]  # the duplicate under its own label
    repo = Repo(root, "mteb/imagenet-dog-15")
    repo.add("default", Features({"image": Image(), "label": Value("int64")}), {"test": {"image": imgs, "label": ys}})
    repo.card()


def write_imagenet10(root: str) -> None:
    """mteb/imagenet-10: default config, one `test` split, columns image (224x224) and label (int64)."""
    rng = np.random.default_rng(8)
    ys = [0, 1, 2] * 5
    rng.shuffle(ys)
    kinds = ["jpeg"] * len(ys)
    kinds[2], kinds[9] = "cmyk", "palette"
    imgs = [image(("imagenet10", i), (224, 224), kinds[i]) for i in range(len(ys))]
    repo = Repo(root, "mteb/imagenet-10")
    repo.add("default", Features({"image": Image(), "label": Value("int64")}), {"test": {"image": imgs, "label": ys}})
    repo.card()


TINY_WNIDS = ["n01443537", "n01629819", "n01641577", "n01644900", "n01698640", "n01742172", "n01768244", "n01770393"]


def write_tiny_imagenet(root: str) -> None:
    """mteb/tiny-imagenet (zh-plus/tiny-imagenet): default config, splits train and valid (no test: the task
    evaluates `valid`), columns image (64x64 JPEGs, some greyscale: mode L) and label (ClassLabel of wnids; the
    real one has 200)."""
    rng = np.random.default_rng(9)
    splits = {}
    for split, ys in (("train", [0, 1, 2, 3] * 2), ("valid", [0, 1, 2, 3, 4] * 4)):
        ys = list(ys)
        rng.shuffle(ys)
        imgs = [image(("tiny", split, i), (64, 64), "gray" if i % 6 == 1 else "jpeg",
                      name=f"{split}_{i}") for i in range(len(ys))]
        splits[split] = {"image": imgs, "label": ys}
    repo = Repo(root, "mteb/tiny-imagenet")
    repo.add("default", Features({"image": Image(), "label": ClassLabel(names=TINY_WNIDS)}), splits)
    repo.card()


TASKS: dict[str, Callable[[str], None]] = {
    "BLINKIT2IMultiChoice": write_blink_it2i,
    "BLINKIT2TMultiChoice": write_blink_it2t,
    "CVBenchCount": write_cv_bench,
    "CVBenchRelation": write_cv_bench,
    "CVBenchDepth": write_cv_bench,
    "CVBenchDistance": write_cv_bench,
    "FGVCAircraft": write_fgvc_aircraft,
    "OxfordFlowersClassification": write_oxford_flowers,
    "VOC2007": write_voc2007,
    "ImageNetDog15Clustering": write_imagenet_dog15,
    "ImageNet10Clustering": write_imagenet10,
    "TinyImageNetClustering": write_tiny_imagenet,
    "FGVCAircraftZeroShot": write_fgvc_aircraft_zeroshot,
}
