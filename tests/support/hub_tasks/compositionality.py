"""Fixture mirrors of the hub repos of MIEB's Compositionality tasks (AbsTaskImageTextPairClassification):
AROCocoOrder, AROFlickrOrder, AROVisualAttribution, AROVisualRelation, SugarCrepe, Winoground, ImageCoDe.

`TASKS[name](root)` writes the task's repo under root/<metadata.dataset["path"]> the way the hub serves it (parquet
files carrying the HF features, a README.md whose front matter declares `configs` and `dataset_info`: see
repo.Repo), so that mteb's own `load_data` reads it unchanged (support.mteb_tasks.redirect). `ROWS[name]` is
{hf_subset: {split: rows}} of what mteb evaluates.

What mteb does with them (mteb/abstasks/image/image_text_pair_classification.py and its evaluator): each row's
images (images_column_names) and texts (texts_column_names) are flattened row by row; every image is decoded and,
if its mode is not RGB, converted with PIL's convert("RGB") (alpha dropped, not composited onto white as CLIP's
processor does for the VisualSTS tasks); texts are embedded in batches with truncation to CLIP's 77 tokens; per row
the (images x texts) cosine matrix: text_acc counts rows whose every image's argmax is its own text (torch's argmax:
the first of equal maxima), image_acc rows whose every text's argmax is its own image. With one image and several
texts (ARO, SugarCrepe) image_acc is 0 by construction; with one text and ten images (ImageCoDe) text_acc is 0.

What each layout rests on: the tasks' loaders, mteb's descriptive statistics (row counts, unique images: every task
but Winoground repeats images across rows) and the repos' cards where seen: gowitheflow/ARO-COCO-order (images,
correct_caption, hard_text_1..4; test; data/test-*), mteb/ARO-Visual-Relation (image, true_caption, false_caption,
relation_name, bbox {x, y, w, h} float32; test in 7 shards), JamieSJS/imagecode-multi (configs query/corpus/qrels,
files at the repo root, the corpus's one split named `corpus`), yjkimstats/SUGARCREPE_fmt (one `train` split: mteb
renames it test). ARO-Flickr-Order is taken to be laid out as ARO-COCO-order, ARO-Visual-Attribution as
ARO-Visual-Relation with `attributes` (a list of strings) for relation_name, and facebook/winoground's parquet as
its loading script's features (id, image_0, image_1, caption_0, caption_1, tag, secondary_tag, num_main_preds,
collapsed_tag): those cards were not seen.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from datasets import Features, Image, Sequence, Value

from support.hub_tasks.repo import Repo, seed
from support.hub_tasks.sts import image

# longer than CLIP's 77 tokens: the tokenizer truncates it (mteb's CLIP wrapper passes truncation=True), so two
# captions that differ only after the 77th token embed alike, and a cache keyed by the whole text still holds one
_LONG = (" and behind them a long row of small houses with red roofs, white walls, green doors and wooden fences, a "
         "narrow street where a few people walk their dogs past parked cars and bicycles, shop windows full of "
         "bread, flowers and newspapers, street lamps, a church tower, a park with tall trees and a pond with ducks, "
         "and far away the hills under a grey sky with a few clouds")


def _shuffle(caption: str, key: tuple) -> str:
    """ARO's order negatives: the caption's words in another order (never the same order)."""
    words = caption.rstrip(".").split()
    rng = np.random.default_rng(seed("shuffle", *key))
    for _ in range(50):
        out = " ".join(words[i] for i in rng.permutation(len(words)))
        if out != caption.rstrip("."):
            return out
    raise ValueError(caption)


_COCO = ["a man riding a wave on top of a surfboard", "two giraffes standing next to a tall tree",
         "a plate of food with broccoli and rice", "a red double decker bus driving down the street",
         "a cat sleeping on the keyboard of a laptop", "a kitchen with a stove and a white refrigerator"]
_FLICKR = ["a young boy in a blue shirt jumps into the pool", "two women are sitting on a bench in the park",
           "a dog runs through the snow with a stick", "a man in a red jacket climbs a rock wall",
           "people are walking down a busy city street", "a girl in a yellow dress holds a balloon",
           "an old man reads a newspaper on the train", "three children play football on the beach"]

# one COCO photo in both AROCocoOrder and SugarCrepe (both draw on COCO's validation images): one file, two tasks
_COCO_SHARED = image(("coco", "shared"), (96, 72), "jpeg", name="COCO_val2014_000000000042")
# one Visual Genome photo in both AROVisualRelation and AROVisualAttribution (both are built on Visual Genome)
_VG_SHARED = image(("vg", "shared"), (120, 90), "jpeg", name="2345678")
# one JPEG in both AROCocoOrder and ImageCoDe: ARO's embeds the file as decoded, ImageCoDe's embeds the file after
# mteb's load_data has passed it through Dataset.map (decoded, returned as a PIL image, and re-encoded by datasets
# as a JPEG at Pillow's default quality 75): the same stored bytes, two different pictures
_JPEG_SHARED = image(("shared", "aro-imagecode"), (64, 64), "jpeg", name="shared")

_ORDER_FEATURES = Features({"images": Image(), "correct_caption": Value("string"), "hard_text_1": Value("string"),
                            "hard_text_2": Value("string"), "hard_text_3": Value("string"),
                            "hard_text_4": Value("string")})


def _order_rows(key: str, captions: list[str], kinds: list[str]) -> dict[str, list]:
    rng = np.random.default_rng(seed(key))
    rows = {name: [] for name in _ORDER_FEATURES}
    for i, (caption, kind) in enumerate(zip(captions, kinds, strict=True)):
        rows["images"].append(image((key, i), (int(rng.integers(48, 140)), int(rng.integers(40, 120))), kind,
                                    name=f"{key}_{i}"))
        rows["correct_caption"].append(caption)
        for h in range(1, 5):
            rows[f"hard_text_{h}"].append(_shuffle(caption, (key, i, h)))
    return rows


def write_aro_coco_order(root: str) -> None:
    """mteb/ARO-COCO-order: default config, test (7 rows) in data/test-00000-of-00001.parquet."""
    captions = _COCO + [_COCO[0]]
    rows = _order_rows("aro-coco", captions, ["jpeg", "palette", "rgba", "gray", "cmyk", "exif", "jpeg"])
    # COCO holds five captions per photo (25010 rows, 5000 photos): rows 0 and 6 are one photo with two captions
    rows["images"][6] = rows["images"][0]
    rows["correct_caption"][6] = "a surfer riding a large wave on a white surfboard"
    for h in range(1, 5):
        rows[f"hard_text_{h}"][6] = _shuffle(rows["correct_caption"][6], ("aro-coco", 6, h))
    # a caption past 77 tokens (its negatives reorder its first words and keep the long tail): the tail is cut
    rows["correct_caption"][1] = _COCO[1] + _LONG
    for h in range(1, 5):
        rows[f"hard_text_{h}"][1] = _shuffle(_COCO[1], ("aro-coco", 1, h)) + _LONG
    # a negative equal to the caption (a word order the shuffle can give back; 5% of ARO's texts are repeats):
    # an exact tie, which torch's argmax gives to the first, the correct caption
    rows["hard_text_3"][3] = rows["correct_caption"][3]
    rows["images"][4] = _COCO_SHARED
    rows["images"][5] = _JPEG_SHARED
    repo = Repo(root, "mteb/ARO-COCO-order")
    repo.add("default", _ORDER_FEATURES, {"test": rows})
    repo.card()


def write_aro_flickr_order(root: str) -> None:
    """mteb/ARO-Flickr-Order: default config, test (8 rows)."""
    rows = _order_rows("aro-flickr", _FLICKR, ["jpeg", "jpeg", "la", "png", "jpeg", "jpeg", "cmyk", "jpeg"])
    rows["images"][4] = rows["images"][1]  # Flickr30k's five captions per photo: 5000 rows, 1000 photos
    repo = Repo(root, "mteb/ARO-Flickr-Order")
    repo.add("default", _ORDER_FEATURES, {"test": rows})
    repo.card()


_BBOX = {"x": Value("float32"), "y": Value("float32"), "w": Value("float32"), "h": Value("float32")}


def _vg_rows(key: str, pairs: list[tuple[str, str]], kinds: list[str]) -> dict[str, list]:
    rng = np.random.default_rng(seed(key))
    rows = {"image": [], "true_caption": [], "false_caption": [], "bbox": []}
    for i, ((true, false), kind) in enumerate(zip(pairs, kinds, strict=True)):
        rows["image"].append(image((key, i), (int(rng.integers(48, 160)), int(rng.integers(40, 160))), kind,
                                   name=f"{key}_{i}"))
        rows["true_caption"].append(true)
        rows["false_caption"].append(false)
        rows["bbox"].append({k: float(v) for k, v in zip("xywh", rng.integers(0, 300, 4), strict=True)})
    return rows


def write_aro_visual_relation(root: str) -> None:
    """mteb/ARO-Visual-Relation: default config, test (6 rows) in two shards (the hub's is in seven:
    data/test-0000i-of-00007.parquet), read in shard order; relation_name and bbox columns mteb does not read."""
    pairs = [("the horse is eating the grass", "the grass is eating the horse"),
             ("the man is riding the bike", "the bike is riding the man"),
             ("the cup is on the table", "the table is on the cup"),
             ("the dog is chasing the cat", "the cat is chasing the dog"),
             ("the plane is above the clouds", "the clouds is above the plane"),
             ("the woman is holding the umbrella", "the umbrella is holding the woman")]
    rows = _vg_rows("aro-vgr", pairs, ["jpeg", "rgba", "jpeg", "gray", "jpeg", "palette"])
    rows["relation_name"] = ["eating", "riding", "on", "chasing", "above", "holding"]
    rows["image"][4] = rows["image"][0]  # Visual Genome: several relations in one photo (23937 rows, 5316 photos)
    rows["image"][2] = _VG_SHARED
    features = Features({"image": Image(), "true_caption": Value("string"), "false_caption": Value("string"),
                         "relation_name": Value("string"), "bbox": _BBOX})
    repo = Repo(root, "mteb/ARO-Visual-Relation")
    repo.add("default", features, {"test": rows}, shards=2)
    repo.card()


def write_aro_visual_attribution(root: str) -> None:
    """mteb/ARO-Visual-Attribution: default config, test (6 rows); attributes and bbox columns mteb does not
    read."""
    pairs = [("the white horse and the brown fence", "the brown horse and the white fence"),
             ("the red car and the green tree", "the green car and the red tree"),
             ("the wooden table and the metal chair", "the metal table and the wooden chair"),
             ("the small dog and the large ball", "the large dog and the small ball"),
             ("the open door and the closed window", "the closed door and the open window"),
             ("the black shirt and the blue jeans", "the blue shirt and the black jeans")]
    rows = _vg_rows("aro-vga", pairs, ["jpeg", "jpeg", "cmyk", "jpeg", "la", "exif"])
    rows["attributes"] = [[p[0].split()[1], p[0].split()[-2]] for p in pairs]
    rows["image"][3] = rows["image"][1]  # Visual Genome: several attribute pairs in one photo
    rows["image"][5] = _VG_SHARED
    features = Features({"image": Image(), "true_caption": Value("string"), "false_caption": Value("string"),
                         "attributes": Sequence(Value("string")), "bbox": _BBOX})
    repo = Repo(root, "mteb/ARO-Visual-Attribution")
    repo.add("default", features, {"test": rows})
    repo.card()


def write_sugar_crepe(root: str) -> None:
    """mteb/SUGARCREPE_fmt: default config with one split, `train` (6 rows, data/train-00000-of-00001.parquet):
    mteb's SugarCrepe.load_data loads every split and evaluates `train` as `test`."""
    pairs = [("a man riding a wave on top of a surfboard", "a man riding a wave on top of a skateboard"),
             ("a cat sleeping on a laptop", "a laptop sleeping on a cat"),  # swap_obj: the same words reordered
             ("a red bus next to a white car", "a white bus next to a red car"),  # swap_att
             ("a plate of rice with broccoli" + _LONG, "a plate of rice without broccoli" + _LONG),
             ("two giraffes near a tree", "two giraffes near a tree and a fence"),
             ("a kitchen with a white refrigerator", "a kitchen with a black refrigerator")]
    rng = np.random.default_rng(seed("sugarcrepe"))
    images = [image(("sugarcrepe", i), (int(rng.integers(48, 140)), int(rng.integers(40, 120))), kind,
                    name=f"sugarcrepe_{i}")
              for i, kind in enumerate(["jpeg", "jpeg", "palette", "jpeg", "rgba", "gray"])]
    images[0] = _COCO_SHARED
    images[4] = images[2]  # 7511 rows over 1560 COCO photos
    rows = {"images": images, "caption": [p[0] for p in pairs], "negative_caption": [p[1] for p in pairs]}
    features = Features({"images": Image(), "caption": Value("string"), "negative_caption": Value("string")})
    repo = Repo(root, "mteb/SUGARCREPE_fmt")
    repo.add("default", features, {"train": rows})
    repo.card()


def write_winoground(root: str) -> None:
    """facebook/winoground: default config, test (8 rows): two images and two captions of the same words per row;
    image_0 goes with caption_0. Sizes from tall to wide; RGBA, palette, greyscale and CMYK files among them."""
    captions = [("a dog chasing a cat", "a cat chasing a dog"),
                ("the person with the ponytail packs the stuff", "the stuff with the ponytail packs the person"),
                ("there is less milk than coffee", "there is less coffee than milk"),
                ("a plant is in the pot on the left", "a pot is in the plant on the left"),
                ("the red book is above the blue book", "the blue book is above the red book"),
                ("someone is drinking while the other is eating", "someone is eating while the other is drinking"),
                ("the white wall is behind the black chair", "the black wall is behind the white chair"),
                ("a bird flies over the boat", "a boat flies over the bird")]
    kinds = [("jpeg", "jpeg"), ("rgba", "png"), ("palette", "jpeg"), ("gray", "cmyk"), ("jpeg", "exif"),
             ("jpeg", "jpeg"), ("la", "jpeg"), ("png", "jpeg")]
    sizes = [((120, 80), (80, 120)), ((140, 60), (60, 140)), ((90, 90), (100, 70)), ((64, 48), (150, 100)),
             ((72, 96), (96, 72)), ((100, 75), (100, 75)), ((88, 66), (66, 88)), ((120, 90), (90, 120))]
    rows = {"id": [], "image_0": [], "image_1": [], "caption_0": [], "caption_1": [], "tag": [],
            "secondary_tag": [], "num_main_preds": [], "collapsed_tag": []}
    tags = ["Object", "Relation", "Relation", "Object", "Both", "Relation", "Object", "Relation"]
    for i, ((c0, c1), (k0, k1), (s0, s1)) in enumerate(zip(captions, kinds, sizes, strict=True)):
        rows["id"].append(i)
        rows["image_0"].append(image(("winoground", i, 0), s0, k0, name=f"ex_{i}_img_0"))
        rows["image_1"].append(image(("winoground", i, 1), s1, k1, name=f"ex_{i}_img_1"))
        rows["caption_0"].append(c0)
        rows["caption_1"].append(c1)
        rows["tag"].append(tags[i])
        rows["secondary_tag"].append("Symbolic" if i == 2 else "")
        rows["num_main_preds"].append(1 + i % 2)
        rows["collapsed_tag"].append(tags[i])
    features = Features({"id": Value("int32"), "image_0": Image(), "image_1": Image(), "caption_0": Value("string"),
                         "caption_1": Value("string"), "tag": Value("string"), "secondary_tag": Value("string"),
                         "num_main_preds": Value("int32"), "collapsed_tag": Value("string")})
    repo = Repo(root, "facebook/winoground")
    repo.add("default", features, {"test": rows})
    repo.card()


IMAGECODE_QUERIES = 6


def write_imagecode(root: str) -> None:
    """mteb/imagecode-multi: configs query (test: id, modality, text), corpus (one split `corpus`: id, modality,
    image) and qrels (test: query-id, corpus-id, score int8; ten rows per query, 1 for the described frame), files
    at the repo root (<config>-00000-of-00001.parquet). mteb's ImageCoDe.load_data reads the three configs by name
    itself (not AbsTask.load_data), maps each query's qrels to correct_image and false_image_1..9 in qrels order
    (Dataset.map with num_proc=4, which re-encodes every frame: see _JPEG_SHARED), and evaluates one text against
    ten images. Queries 1 and 2 describe two frames of the same video: their twenty corpus rows hold ten files
    (23020 corpus rows, 10359 distinct frames on the hub); the described frame sits anywhere in the qrels, and the
    corpus is in another order than the qrels."""
    texts = ["nothing moves: the room is empty and the light stays the same",
             "the man has just lifted his left hand and the ball is still in the air",
             "the woman turns her head to the camera, the door behind her is closed",
             "a",  # the hub's shortest query is one character
             "the dog is halfway through the jump over the fence" + _LONG,
             "the car has left the frame, only its shadow is visible on the road"]
    kinds = ["jpeg", "jpeg", "png", "jpeg", "palette", "jpeg", "rgba", "jpeg", "exif", "gray"]
    videos = ["static-room-0001_5e5e", "open-images-1054_0a1b", "open-images-1054_0a1b",
              "video-storytelling-videowedding_3c5d", "msr-vtt-video7031_9e2f", "year-in-review-2018_77aa"]
    # the described frame's position among the candidates; queries 0 and 3's are the frames the seed-0 tiny CLIP
    # ranks first by a clear margin, so that image_acc is not 0 in every run (a comparison of zeros proves nothing)
    answers = [7, 3, 7, 4, 9, 5]
    qids, cids, cimages, qrels = [], [], [], []
    frames: dict[tuple[str, int], dict] = {}
    for q, (video, answer) in enumerate(zip(videos, answers, strict=True)):
        qids.append(f"{video}_q{q}")
        for f in range(10):
            # no two frames of a query alike: ten equal scores would tie, and which wins then depends on the last
            # bits of a matrix product (BLAS rounds rows by their position), in mteb's run as in any other
            key = (video, f)
            if key not in frames:
                frames[key] = image(("imagecode", *key), (56, 56), kinds[(f + q) % 10], name=f"{video}/img{f}")
            cid = f"{video}_q{q}_img{f}"
            cids.append(cid)
            cimages.append(frames[key])
            qrels.append((qids[-1], cid, int(f == answer)))
    cimages[cids.index("msr-vtt-video7031_9e2f_q4_img2")] = _JPEG_SHARED
    order = np.random.default_rng(seed("imagecode-corpus")).permutation(len(cids))
    repo = Repo(root, "mteb/imagecode-multi")
    repo.add("query", Features({"id": Value("string"), "modality": Value("string"), "text": Value("string")}),
             {"test": {"id": qids, "modality": ["text"] * len(qids), "text": texts}},
             files=lambda s, n: ["query-00000-of-00001.parquet"], pattern=lambda s: "query-*")
    repo.add("corpus", Features({"id": Value("string"), "modality": Value("string"), "image": Image()}),
             {"corpus": {"id": [cids[i] for i in order], "modality": ["image"] * len(cids),
                         "image": [cimages[i] for i in order]}},
             files=lambda s, n: ["corpus-00000-of-00001.parquet"], pattern=lambda s: "corpus-*")
    repo.add("qrels", Features({"query-id": Value("string"), "corpus-id": Value("string"), "score": Value("int8")}),
             {"test": {"query-id": [r[0] for r in qrels], "corpus-id": [r[1] for r in qrels],
                       "score": [r[2] for r in qrels]}},
             files=lambda s, n: ["qrels-00000-of-00001.parquet"], pattern=lambda s: "qrels-*")
    repo.card()


TASKS: dict[str, Callable[[str], None]] = {
    "AROCocoOrder": write_aro_coco_order,
    "AROFlickrOrder": write_aro_flickr_order,
    "AROVisualAttribution": write_aro_visual_attribution,
    "AROVisualRelation": write_aro_visual_relation,
    "SugarCrepe": write_sugar_crepe,
    "Winoground": write_winoground,
    "ImageCoDe": write_imagecode,
}

# {task: {hf_subset: {split: rows}}} of what mteb loads for the task's evaluation
ROWS: dict[str, dict[str, dict[str, int]]] = {
    "AROCocoOrder": {"default": {"test": 7}},
    "AROFlickrOrder": {"default": {"test": 8}},
    "AROVisualAttribution": {"default": {"test": 6}},
    "AROVisualRelation": {"default": {"test": 6}},
    "SugarCrepe": {"default": {"test": 6}},
    "Winoground": {"default": {"test": 8}},
    "ImageCoDe": {"default": {"test": IMAGECODE_QUERIES}},
}
