"""Fixture mirrors of the hub repos of MIEB's retrieval tasks (mteb 2.26.24): the 43 Any2AnyRetrieval tasks but
SciMMIR's two, the 3 Any2AnyMultilingualRetrieval T2I tasks (WIT, XFlickr30kCo, XM3600) and the 10 ViDoRe
DocumentUnderstanding tasks.

`TASKS[name](root)` writes the task's repo under root/<metadata.dataset["path"]> as the hub serves it: parquet
files whose schema carries the HF features (Image as {bytes, path}) and a README.md whose front matter declares
`configs` and `dataset_info`, so that mteb's own `load_data`, pointed at the folder (support.mteb_tasks.redirect),
reads it unchanged. Tasks that share a hub repo share one writer (HatefulMemes, Memotion: I2T and T2I).
`ROWS[name]` is {hf_subset: {split: {"queries": n, "corpus": n}}}: what mteb's retrieval evaluator is handed
(RetrievalDatasetLoader keeps only the queries the qrels name, the evaluation drops those with no qrels line).

The layouts, each from the repo cards at the pinned revisions and the loaders that read them:
  v1      (JamieSJS/*, isaacchung/*, gowitheflow/*, MRBench/mbeir_* forked to mteb/ unchanged): configs `query`
          (split test), `corpus` (split `corpus`: the loader takes a config's only split), `qrels` (split test),
          files <config>-0000i-of-0000n.parquet at the repo's root. Columns id, modality, then text and/or image;
          the M-BEIR repos always carry all four (None where a side lacks the modality: Fashion200k-I2T's,
          NIGHTS' and VisualNews-I2T's dataset_transform drop those columns by name, so they must exist) and a Q0
          column in qrels; score int8. FORB's qrels carry `difficulty`, its rows image_url and path.
          -> every Any2AnyRetrieval task but HatefulMemes' and Memotion's (splits) and InfoSeekIT2IT (v2).
  v2      (mteb/InfoSeekIT2ITRetrieval, pushed by mteb's _push_dataset_to_hub): configs corpus, queries, qrels,
          split test each, files <config>/test-00000-of-00001.parquet.
  beir    (vidore/*_beir forked to mteb/): configs corpus (corpus-id int64, image), queries (query-id int64,
          query), qrels (query-id, corpus-id int64, score int64 or float64), split test, read by vidore_bench's
          own load_data.
  splits  a default config whose splits the custom loaders read: MMSoc_HatefulMemes (train/validation/test:
          id int64, text, image, label, split), MMSoc_Memotion_corrected (train/validation/test: image, text_ocr,
          text_corrected, humor, sarcasm, offensive, motivational, sentiment, split), wit (a split per language:
          image, image_id, captions), xflickrco (a split per language: sentences, id, image as a bare
          {bytes, path: null} struct, no Image feature) and xm3600 (a split per language: image_id, image_locale,
          captions, captions_tokenized, captions_tokenized_lowercase, image as a bare struct).
No task has a top_ranked or an instruction config (no card lists one, no custom loader builds one); no card or
loader shows a grade above 1, so the only grades here are 1 and r-Oxford/r-Paris' 0.

The pitfalls in the data, each where the real data has it (the comments at each say why):
  images of every mode a scraped set holds (palette PNG with a transparent entry, greyscale, RGBA, LA, CMYK, a
  JPEG with EXIF orientation 6), tiny, wide and tall ones, all-black and all-white ones (WIT); the same bytes as a
  query in one task and a document in another (MSCOCO, Flickr30k, Fashion200k, VisualNews I2T/T2I; the
  r-Oxford/r-Paris levels; HatefulMemes' and Memotion's shared repos) and in several subsets (XFlickr30kCo, XM3600,
  WIT); texts longer than CLIP's 77 tokens, non-Latin scripts, a whitespace-only caption (WIT), documents with
  surrounding whitespace (stripped by mteb's corpus mapping); fused queries and documents (it2i, it2t, t2it, it2it);
  qrels with several relevant documents, zero scores for judged negatives and no line for junk (r-Oxford,
  r-Paris), a relevant document missing from the corpus (InfoSeek, OVEN, HatefulMemes' text dedup), queries the
  qrels do not name, a query id equal to its own corpus id with skip_first_result (CUB200, SOP, Stanford Cars,
  RP2k), duplicated texts across splits (HatefulMemes' confounders), rows with no text (Memotion), sharded corpora.

Every picture is drawn from a seeded RNG (a noise ground, random shapes, random size), so no two files embed
alike and no two cosines tie; every text corpus holds distinct texts (CLIP lower-cases; no two share a
77-token prefix).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from datasets import Features, Image, List, Value
from PIL import Image as PILImage
from PIL import ImageDraw

from support.hub_tasks.repo import EXT, Repo, at_root, seed, stored

# ------------------------------------------------------------------------------------------------ pictures


# A family's salt re-draws its pictures and texts. The tiny CLIP (make_tiny_clip's default seed) puts texts and
# pictures close together, so two documents of a query can land within float noise of each other; these salts were
# chosen so that, under that model, no relevant and non-relevant document of any query are within 1e-4 in cosine
# (and no two documents of a query within 1e-5): a rounding difference cannot reorder them.
_SALTS: dict[str, int] = {"flickr30k-cap": 1, "mscoco-cap": 8, "infoseek-wiki": 6, "infoseek-it": 5, "sketchy-photo": 3}


def _salted(key: tuple) -> tuple:
    salt = _SALTS.get(key[0], 0)
    return (*key, salt) if salt else key


@dataclass(frozen=True)
class Pic:
    """A picture not drawn yet: `key` seeds its content, `kind` is how it is stored, `size` (w, h) or drawn from
    the key. The rows hold these; the writer turns each into an Image value ({bytes, path})."""

    key: tuple
    kind: str = "png"
    size: tuple[int, int] | None = None
    name: str | None = None  # the file name the uploader had, kept as the Image value's path; None: pushed from PIL


def _draw(key: tuple, size: tuple[int, int] | None) -> PILImage.Image:
    rng = np.random.default_rng(seed("picture", *_salted(key)))
    w, h = size or (int(rng.integers(36, 120)), int(rng.integers(36, 120)))
    ground = 0.5 * rng.integers(0, 256, 3) + 0.5 * rng.integers(0, 256, (h, w, 3))
    im = PILImage.fromarray(ground.astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(2, 6))):
        x0, x1 = sorted(int(v) for v in rng.integers(0, w, 2))
        y0, y1 = sorted(int(v) for v in rng.integers(0, h, 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        shape = int(rng.integers(3))
        if shape == 2:
            draw.line([x0, y0, x1, y1], fill=colour, width=int(rng.integers(1, 6)))
        else:
            (draw.ellipse if shape else draw.rectangle)([x0, y0, x1 + 2, y1 + 2], fill=colour)
    return im


@lru_cache(maxsize=None)
def encode(pic: Pic) -> bytes:
    """The stored file. The modes are there because datasets decodes each as stored (and turns an EXIF-rotated
    JPEG upright) and CLIP's processor converts to RGB its own way: RGBA, LA and a palette with a transparent entry
    composited onto white, CMYK and L converted."""
    return stored(_draw(pic.key, pic.size), pic.kind)


def image_value(pic: Pic | None) -> dict | None:
    if pic is None:
        return None
    return {"bytes": encode(pic), "path": None if pic.name is None else f"{pic.name}.{EXT[pic.kind]}"}


# the kinds dealt round a task's pictures (mostly plain, as the sets are): each task holds several of the others
_KINDS = ["jpeg", "png", "palette", "jpeg", "gray", "png", "rgba", "jpeg", "exif", "png", "cmyk", "jpeg", "la"]


def pic(family: str, i, kind: str | None = None, **kw) -> Pic:
    """Picture `i` of `family`: the same family and index are the same bytes in every task that holds them."""
    if kind is None:
        kind = _KINDS[seed("kind", family, i) % len(_KINDS)]
    return Pic((family, i), kind, **kw)


# ------------------------------------------------------------------------------------------------ texts

_WORDS = ("red blue green small large old young wooden metal bright dark quiet busy narrow wide tall short "
          "dog cat horse bird child woman man girl boy team crowd chef farmer pilot sailor dancer player "
          "street river bridge tower market garden kitchen station harbour mountain forest beach field road "
          "table chair window door bicycle train boat plane car bus truck umbrella kite ball guitar book "
          "runs sits stands walks holds carries watches crosses opens paints sells reads rides jumps waits "
          "near under beside behind above across inside along toward against with without over").split()


def sentence(key: tuple, words: tuple[int, int] = (5, 10)) -> str:
    rng = np.random.default_rng(seed("sentence", *_salted(key)))
    return " ".join(_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), int(rng.integers(*words))))


def long_text(key: tuple) -> str:
    """Well over CLIP's 77 tokens (the tiny CLIP's tokenizer is by character): truncated by the processor."""
    return sentence(key, (40, 60)) + "."


_SCRIPTS = {"ar": "قطة على الطاولة", "bg": "котка на масата", "bn": "টেবিলে বিড়াল", "el": "γάτα στο τραπέζι",
            "fa": "گربه روی میز", "he": "חתול על השולחן", "hi": "मेज़ पर बिल्ली", "ja": "テーブルの上の猫",
            "ko": "테이블 위의 고양이", "ru": "кошка на столе", "te": "బల్ల మీద పిల్లి", "th": "แมวบนโต๊ะ",
            "uk": "кіт на столі", "zh": "桌子上的猫", "da": "kat på bordet", "de": "Katze auf dem Tisch",
            "tr": "masada kedi", "vi": "con mèo trên bàn", "es": "gato en la mesa", "cs": "kočka na stole",
            "fr": "le chat sur la table"}


def caption(key: tuple, lang: str) -> str:
    """A caption in `lang`: its own script's words after a seeded run of Latin words (which keeps the captions of
    a subset apart for the char tokenizer, where the other scripts are all unknown tokens)."""
    return f"{sentence(key, (3, 6))} {_SCRIPTS.get(lang, lang)}"


def _columns(rows: list[dict], names: list[str]) -> dict[str, list]:
    return {n: [image_value(r.get(n)) if isinstance(r.get(n), Pic) else r.get(n) for r in rows] for n in names}


# ------------------------------------------------------------------------------------------------ the v1 layout


@dataclass
class V1:
    """A v1 repo (query/corpus/qrels configs) in memory. Rows: {"id", "text"?, "image"?, extra columns}; a side's
    text/image column exists when any row has it (the M-BEIR repos: always, None where absent)."""

    path: str
    queries: list[dict]
    corpus: list[dict]
    qrels: list[tuple]  # (query-id, corpus-id, score[, extra qrels columns...])
    mbeir: bool = False
    qrels_extra: tuple[str, ...] = ()
    corpus_shards: int = 1

    def side_columns(self, rows: list[dict]) -> list[str]:
        present = {k for r in rows for k, v in r.items() if v is not None}
        modal = [m for m in ("text", "image") if self.mbeir or m in present]
        extra = sorted(present - {"id", "text", "image"})
        return ["id", "modality", *modal, *extra]

    def features(self, names: list[str]) -> Features:
        return Features({n: Image() if n == "image" else Value("string") for n in names})

    def write(self, root: str) -> None:
        repo = Repo(root, self.path)
        qf = Features({"query-id": Value("string"), **({"Q0": Value("string")} if self.mbeir else {}),
                       "corpus-id": Value("string"), "score": Value("int8"),
                       **{n: Value("string") for n in self.qrels_extra}})
        qcols = {"query-id": [r[0] for r in self.qrels], "corpus-id": [r[1] for r in self.qrels],
                 "score": [r[2] for r in self.qrels]}
        if self.mbeir:
            qcols["Q0"] = ["Q0"] * len(self.qrels)
        for j, name in enumerate(self.qrels_extra):
            qcols[name] = [r[3 + j] for r in self.qrels]
        repo.add("qrels", qf, {"test": qcols}, **at_root("qrels"))
        for config, split, rows, shards in (("corpus", "corpus", self.corpus, self.corpus_shards),
                                            ("query", "test", self.queries, 1)):
            names = self.side_columns(rows)
            rows = [{**r, "modality": _modality(r)} for r in rows]
            repo.add(config, self.features(names), {split: _columns(rows, names)}, **at_root(config), shards=shards)
        repo.card()

    def rows(self) -> dict:
        named = {q for q, *_ in self.qrels}
        return {"default": {"test": {"queries": sum(r["id"] in named for r in self.queries),
                                     "corpus": len(self.corpus)}}}


def _modality(row: dict) -> str:
    return ",".join(m for m in ("image", "text") if row.get(m) is not None)


def q(id_: str, text: str | None = None, image: Pic | None = None, **extra) -> dict:
    return {"id": id_, "text": text, "image": image, **extra}


# ------------------------------------------------------------------------------------------------ the tasks
# Each builder returns the repo in memory (an object with write(root) and rows()); ids follow each source's style.


def _flickr_data():
    """Flickr30k (isaacchung/flickr30ki2t, /flickr30kt2i): 4 photos x 3 captions (5 on the hub), one caption long.
    The I2T queries are the T2I corpus: the same bytes, as both repos are cut from the same test set."""
    photos = [pic("flickr30k", i, name=f"{1000092795 + 17 * i}") for i in range(4)]
    caps = {(i, j): (long_text(("flickr30k-cap", i, j)) if (i, j) == (1, 2) else sentence(("flickr30k-cap", i, j)))
            for i in range(4) for j in range(3)}
    return photos, caps


def flickr_i2t() -> V1:
    photos, caps = _flickr_data()
    return V1("mteb/flickr30ki2t", [q(f"{i}", image=p) for i, p in enumerate(photos)],
              [q(f"{i}_{j}", text=t) for (i, j), t in caps.items()],
              [(f"{i}", f"{i}_{j}", 1) for (i, j) in caps])


def flickr_t2i() -> V1:
    photos, caps = _flickr_data()
    return V1("mteb/flickr30kt2i", [q(f"{i}_{j}", text=t) for (i, j), t in caps.items()],
              [q(f"{i}", image=p) for i, p in enumerate(photos)],
              [(f"{i}_{j}", f"{i}", 1) for (i, j) in caps])


def _mscoco_data():
    """MSCOCO (M-BEIR task 0 and 3): 4 photos, 4 or 5 captions each; one caption belongs to two photos (COCO has
    repeated captions: in T2I one query with two relevant images, in I2T one document relevant to two queries)."""
    photos = [pic("mscoco", i, name=f"COCO_val2014_{391895 + i:012d}") for i in range(4)]
    caps, owners = [], []
    for i in range(4):
        for j in range(5 if i % 2 == 0 else 4):
            caps.append(long_text(("mscoco-cap", i, j)) if (i, j) == (2, 0) else sentence(("mscoco-cap", i, j)))
            owners.append([i])
    caps.append(sentence(("mscoco", "shared")))
    owners.append([1, 3])
    return photos, caps, owners


def mscoco_i2t() -> V1:
    photos, caps, owners = _mscoco_data()
    return V1("mteb/mbeir_mscoco_task3", [q(f"9:{i + 1}", image=p) for i, p in enumerate(photos)],
              [q(f"9:{100 + c}", text=t) for c, t in enumerate(caps)],
              [(f"9:{i + 1}", f"9:{100 + c}", 1) for c, own in enumerate(owners) for i in own], mbeir=True)


def mscoco_t2i() -> V1:
    photos, caps, owners = _mscoco_data()
    return V1("mteb/mbeir_mscoco_task0", [q(f"9:{500 + c}", text=t) for c, t in enumerate(caps)],
              [q(f"9:{1000 + i}", image=p) for i, p in enumerate(photos)],
              [(f"9:{500 + c}", f"9:{1000 + i}", 1) for c, own in enumerate(owners) for i in own], mbeir=True)


def _fashion200k_data():
    """Fashion200k (M-BEIR task 0 and 3): 6 product photos, 4 descriptions; several photos share a description
    (I2T: 3,119 unique relevant texts for 4,889 queries; T2I: a text has up to 35 relevant photos)."""
    photos = [pic("fashion200k", i) for i in range(6)]
    descs = [sentence(("fashion200k", d), (3, 7)) for d in range(4)]
    owner = [0, 0, 1, 2, 2, 2]  # photo -> its description; description 3 describes none (a distractor)
    return photos, descs, owner


def fashion200k_i2t() -> V1:
    photos, descs, owner = _fashion200k_data()
    return V1("mteb/mbeir_fashion200k_task3", [q(f"3:{i}", image=p) for i, p in enumerate(photos)],
              [q(f"3:{100 + d}", text=t) for d, t in enumerate(descs)],
              [(f"3:{i}", f"3:{100 + owner[i]}", 1) for i in range(6)], mbeir=True)


def fashion200k_t2i() -> V1:
    photos, descs, owner = _fashion200k_data()
    return V1("mteb/mbeir_fashion200k_task0", [q(f"3:{500 + d}", text=t) for d, t in enumerate(descs[:3])],
              [q(f"3:{1000 + i}", image=p) for i, p in enumerate(photos)] +
              [q(f"3:{1100 + k}", image=pic("fashion200k-pool", k)) for k in range(3)],
              [(f"3:{500 + owner[i]}", f"3:{1000 + i}", 1) for i in range(6)], mbeir=True)


def _visualnews_data():
    """VisualNews (M-BEIR task 0 and 3): 5 news photos and their captions (news captions run past 77 tokens)."""
    photos = [pic("visualnews", i, "rgba" if i == 2 else None, name=f"bbc_{i:06d}") for i in range(5)]
    caps = [long_text(("visualnews", i)) if i % 2 else sentence(("visualnews", i), (8, 14)) for i in range(5)]
    return photos, caps


def visualnews_i2t() -> V1:
    photos, caps = _visualnews_data()
    return V1("mteb/mbeir_visualnews_task3", [q(f"0:{i}", image=p) for i, p in enumerate(photos[:4])],
              [q(f"0:{100 + i}", text=t) for i, t in enumerate(caps)] +
              [q(f"0:{200 + k}", text=sentence(("visualnews-pool", k), (8, 14))) for k in range(2)],
              [(f"0:{i}", f"0:{100 + i}", 1) for i in range(4)], mbeir=True)


def visualnews_t2i() -> V1:
    photos, caps = _visualnews_data()
    # one caption with two relevant photos (T2I: max 2 relevant per query on the hub)
    qrels = [(f"0:{500 + i}", f"0:{1000 + i}", 1) for i in range(4)] + [("0:503", "0:1004", 1)]
    return V1("mteb/mbeir_visualnews_task0", [q(f"0:{500 + i}", text=t) for i, t in enumerate(caps[:4])],
              [q(f"0:{1000 + i}", image=p) for i, p in enumerate(photos)] +
              [q(f"0:{1100 + k}", image=pic("visualnews-pool", k)) for k in range(3)], qrels, mbeir=True)


def gldv2_i2t() -> V1:
    """GLDv2-I2T (JamieSJS/gld-v2-i2t): landmark photos -> landmark names, 1 to 3 relevant names per photo."""
    names = ["Eiffel Tower", "Golden Gate Bridge", "Tower of London", "Sagrada Familia", "Charles Bridge"]
    rel = {0: [0], 1: [1], 2: [2, 0], 3: [3], 4: [1, 3, 4]}
    return V1("mteb/gld-v2-i2t", [q(f"q{i}", image=pic("gldv2-i2t", i)) for i in rel],
              [q(f"c{d}", text=n) for d, n in enumerate(names)],
              [(f"q{i}", f"c{d}", 1) for i, ds in rel.items() for d in ds])


def gldv2_i2i() -> V1:
    """GLDv2 (gowitheflow/gld-v2): landmark photos -> photos of the same landmark (1 to 168 relevant)."""
    rel = {0: [0, 1, 2], 1: [3], 2: [4, 5], 3: [6, 7, 8, 9]}
    return V1("mteb/gld-v2", [q(f"query_{i}", image=pic("gldv2-q", i)) for i in rel],
              # index_10 is a 9x7 thumbnail: the processor upsamples it
              [q(f"index_{d}", image=pic("gldv2-index", d, size=(9, 7) if d == 10 else None)) for d in range(11)],
              [(f"query_{i}", f"index_{d}", 1) for i, ds in rel.items() for d in ds])


def imagecode() -> V1:
    """ImageCoDe (JamieSJS/imagecode): a description -> one of the 10 frames of its video (3 frames here)."""
    return V1("mteb/imagecode", [q(f"{v}", text=long_text(("imagecode", v)) if v == 1 else
                                   sentence(("imagecode", v), (10, 16))) for v in range(3)],
              [q(f"{v}_{f}", image=pic("imagecode", (v, f))) for v in range(3) for f in range(3)],
              [(f"{v}", f"{v}_{(v + 1) % 3}", 1) for v in range(3)])


def tu_berlin() -> V1:
    """TU-Berlin (gowitheflow/tu-berlin): a class name -> its sketches (80 each on the hub, 3 here), greyscale."""
    classes = ["airplane", "alarm clock", "angel", "ant"]
    return V1("mteb/tu-berlin", [q(f"{c}", text=name) for c, name in enumerate(classes)],
              [q(f"{c}_{k}", image=pic("tu-berlin", (c, k), "gray" if k != 1 else "la")) for c in range(4)
               for k in range(3)],
              [(f"{c}", f"{c}_{k}", 1) for c in range(4) for k in range(3)])


def sketchy() -> V1:
    """Sketchy (JamieSJS/sketchy): a sketch -> the photos of its class (100 each on the hub, 4 here)."""
    return V1("mteb/sketchy", [q(f"sketch_{s}", image=pic("sketchy-sketch", s, "gray")) for s in range(4)],
              [q(f"photo_{c}_{k}", image=pic("sketchy-photo", (c, k), size=(28, 170) if (c, k) == (1, 3) else None))
               for c in range(2) for k in range(4)],  # one tall photo
              [(f"sketch_{s}", f"photo_{s % 2}_{k}", 1) for s in range(4) for k in range(4)])


def _self_retrieval(path: str, family: str, sizes: list[int]) -> V1:
    """The CUB200/SOP/Stanford Cars/RP2k shape: the queries are the corpus (same bytes, same ids), relevant = the
    other images of the class. The task sets skip_first_result (each query finds itself first) and not
    ignore_identical_ids: the self match is dropped by rank, not by id."""
    images, cls = [], []
    for c, n in enumerate(sizes):
        for k in range(n):
            images.append(q(f"{len(images)}", image=pic(family, (c, k))))
            cls.append(c)
    qrels = [(a["id"], b["id"], 1) for a, ca in zip(images, cls) for b, cb in zip(images, cls)
             if ca == cb and a is not b]
    return V1(path, images, images, qrels)


def met() -> V1:
    """The MET (JamieSJS/met): query photos of exhibits -> the exhibit's catalogue photos (1 to 9). The task sets
    skip_first_result though its queries are not in the corpus: mteb drops each query's first hit all the same."""
    rel = {0: [0, 1], 1: [2], 2: [3, 4, 5], 3: [6]}
    return V1("mteb/met", [q(f"q{i}", image=pic("met-query", i)) for i in rel],
              [q(f"{d}", image=pic("met-exhibit", d)) for d in range(9)],
              [(f"q{i}", f"{d}", 1) for i, ds in rel.items() for d in ds])


def forb() -> V1:
    """FORB (isaacchung/forb_retrieval): flat objects, 1 relevant; qrels carry `difficulty`, rows image_url and path
    (extra columns mteb passes through)."""
    def row(id_, p):
        return q(id_, image=p, image_url=f"https://example.org/forb/{id_}.jpg", path=f"images/{id_}.jpg")
    return V1("mteb/forb_retrieval", [row(f"query_{i}", pic("forb-q", i)) for i in range(4)],
              [row(f"db_{d}", pic("forb-index", d)) for d in range(8)],
              [(f"query_{i}", f"db_{2 * i}", 1, ["easy", "medium", "hard", "easy"][i]) for i in range(4)],
              qrels_extra=("difficulty",))


def nights() -> V1:
    """NIGHTS (M-BEIR task 4): a reference -> the closer of two distortions (text columns all None: the task's
    dataset_transform drops them)."""
    return V1("mteb/mbeir_nights_task4", [q(f"4:{i}", image=pic("nights-ref", i)) for i in range(4)],
              [q(f"4:{100 + 2 * i + k}", image=pic("nights-distortion", (i, k))) for i in range(4) for k in range(2)],
              [(f"4:{i}", f"4:{100 + 2 * i + i % 2}", 1) for i in range(4)], mbeir=True)


def _revisited(path: str, family: str, level: str) -> V1:
    """r-Oxford / r-Paris at one level: the 3 levels' repos hold the same images (the same bytes in 3 tasks) and
    differ in their qrels: every judged corpus image of a query has a line, score 1 (positive) or 0 (negative);
    junk has none. easy: positives = easy, hard images are junk; medium: easy + hard; hard: hard, easy is junk."""
    corpus = [q(f"corpus_{d}", image=pic(family, d)) for d in range(12)]
    queries = [q(f"query_{i}", image=pic(f"{family}-query", i)) for i in range(3)]
    qrels = []
    for i in range(3):
        rng = np.random.default_rng(seed(family, "judgements", i))
        grade = rng.permutation(["easy"] * 3 + ["hard"] * 2 + ["junk"] * 2 + ["negative"] * 5)
        positive = {"easy": {"easy"}, "medium": {"easy", "hard"}, "hard": {"hard"}}[level]
        junk = {"easy": {"junk", "hard"}, "medium": {"junk"}, "hard": {"junk", "easy"}}[level]
        for d, g in enumerate(grade):
            if g not in junk:
                qrels.append((f"query_{i}", f"corpus_{d}", int(g in positive)))
    return V1(path, queries, corpus, qrels)


def blink_it2i() -> V1:
    """BLINK IT2I (JamieSJS/blink-it2i): a question with its image -> the right one of two candidate images."""
    return V1("mteb/blink-it2i",
              [q(f"val_{i}", text=sentence(("blink-it2i", i), (8, 14)), image=pic("blink-it2i-q", i))
               for i in range(4)],
              [q(f"val_{i}_{k}", image=pic("blink-it2i-c", (i, k))) for i in range(4) for k in range(2)],
              [(f"val_{i}", f"val_{i}_{i % 2}", 1) for i in range(4)])


def blink_it2t() -> V1:
    """BLINK IT2T (JamieSJS/blink-it2t): a question with its image -> one of a few answer texts (20 on the hub,
    shared by all 793 queries)."""
    answers = ["(A)", "(B)", "(C)", "yes", "no"]
    return V1("mteb/blink-it2t",
              [q(f"val_{i}", text=long_text(("blink-it2t", i)) if i == 2 else sentence(("blink-it2t", i), (8, 14)),
                 image=pic("blink-it2t", i)) for i in range(6)],
              [q(f"a{d}", text=a) for d, a in enumerate(answers)],
              [(f"val_{i}", f"a{[0, 1, 0, 3, 4, 2][i]}", 1) for i in range(6)])


def _composed(path: str, family: str, did: int, rel: dict[int, list[int]], extra_queries: int) -> V1:
    """CIRR / FashionIQ (M-BEIR task 7): a reference image and a modification text -> the target images. The
    reference images are in the candidate pool too (the same bytes as query and document); queries the qrels do
    not name are dropped by the loader."""
    # a wide panorama among the candidates: resized by its short side, then centre-cropped
    corpus = [q(f"{did}:{1000 + d}", image=pic(family, d, size=(220, 30) if d == 5 else None)) for d in range(9)]
    queries = [q(f"{did}:{i}", text=sentence((family, "mod", i), (6, 12)), image=pic(family, 8 - i))
               for i in range(len(rel) + extra_queries)]
    return V1(path, queries, corpus, [(f"{did}:{i}", f"{did}:{1000 + d}", 1) for i, ds in rel.items() for d in ds],
              mbeir=True)


def edis() -> V1:
    """EDIS (M-BEIR task 2): a news query -> image + headline documents (fused), 1 to 8 relevant; the corpus in
    two shards (four on the hub)."""
    corpus = [q(f"2:{1000 + d}", text=sentence(("edis", "headline", d), (6, 12)), image=pic("edis", d))
              for d in range(10)]
    rel = {0: [0, 1, 2], 1: [3], 2: [4, 5], 3: [6]}
    return V1("mteb/mbeir_edis_task2", [q(f"2:{i}", text=sentence(("edis", "q", i), (5, 9))) for i in rel], corpus,
              [(f"2:{i}", f"2:{1000 + d}", 1) for i, ds in rel.items() for d in ds], mbeir=True, corpus_shards=2)


def webqa_t2it() -> V1:
    """WebQA T2IT (M-BEIR task 2): a question -> image + caption documents (fused), 1 or 2 relevant; 2 shards.
    One caption carries surrounding whitespace (mteb strips a document's text before encoding)."""
    corpus = [q(f"1:{1000 + d}", text=(f"  {sentence(('webqa-it', d))}\n" if d == 3 else sentence(("webqa-it", d))),
                image=pic("webqa-it", d)) for d in range(8)]
    rel = {0: [0, 1], 1: [2], 2: [3, 4], 3: [5]}
    return V1("mteb/mbeir_webqa_task2", [q(f"1:{i}", text=sentence(("webqa-it", "q", i), (6, 12))) for i in rel],
              corpus, [(f"1:{i}", f"1:{1000 + d}", 1) for i, ds in rel.items() for d in ds], mbeir=True,
              corpus_shards=2)


def webqa_t2t() -> V1:
    """WebQA T2T (M-BEIR task 1): a question -> text snippets (long ones), 1 to 4 relevant."""
    corpus = [q(f"1:{2000 + d}", text=long_text(("webqa-t", d)) if d % 3 == 0 else sentence(("webqa-t", d), (10, 20)))
              for d in range(9)]
    rel = {0: [0, 1, 2, 3], 1: [4], 2: [5, 6], 3: [7]}
    return V1("mteb/mbeir_webqa_task1", [q(f"1:{i}", text=sentence(("webqa-t", "q", i), (6, 12))) for i in rel],
              corpus, [(f"1:{i}", f"1:{2000 + d}", 1) for i, ds in rel.items() for d in ds], mbeir=True)


def _knowledge(path: str, family: str, did: int, fused_docs: bool, v1: bool = True):
    """InfoSeek / OVEN (M-BEIR task 6: image + question -> Wikipedia texts; task 8 and mteb's InfoSeekIT2IT:
    -> image + text documents): many relevant entries, and qrels lines naming documents the corpus lacks (941 of
    InfoSeek-IT2T's, 13,372 of OVEN-IT2IT's): judged relevant, never retrievable."""
    corpus = [q(f"{did}:{1000 + d}", text=long_text((family, "doc", d)) if d % 2 == 0 else
                sentence((family, "doc", d), (8, 16)), image=pic(family, d) if fused_docs else None)
              for d in range(9)]
    queries = [q(f"{did}:{i}", text=sentence((family, "question", i), (6, 10)), image=pic(f"{family}-query", i))
               for i in range(4)]
    rel = {0: [0, 1, 2], 1: [3, 99], 2: [4, 5], 3: [6, 7, 98]}  # 98, 99: not in the corpus
    qrels = [(f"{did}:{i}", f"{did}:{1000 + d}", 1) for i, ds in rel.items() for d in ds]
    if v1:
        return V1(path, queries, corpus, qrels, mbeir=True)
    return V2(path, queries, corpus, qrels)


def vqa(path: str, family: str, n_queries: int, answers: list[str], rel: list[int]) -> V1:
    """VizWiz / VQA2 (JamieSJS): a photo and its question -> the answer text, answers shared by many queries."""
    return V1(path, [q(f"{i}", text=sentence((family, i), (5, 10)) + "?", image=pic(family, i))
                     for i in range(n_queries)],
              [q(f"ans_{d}", text=a) for d, a in enumerate(answers)],
              [(f"{i}", f"ans_{rel[i]}", 1) for i in range(n_queries)])


# ------------------------------------------------------------------------------------------------ the v2 layout


@dataclass
class V2:
    """mteb's own push (_push_dataset_to_hub): configs corpus, queries, qrels, split test each."""

    path: str
    queries: list[dict]
    corpus: list[dict]
    qrels: list[tuple]

    def write(self, root: str) -> None:
        repo = Repo(root, self.path)
        side = Features({"id": Value("string"), "modality": Value("string"), "text": Value("string"),
                         "image": Image()})
        for config, rows in (("queries", self.queries), ("corpus", self.corpus)):
            rows = [{**r, "modality": _modality(r)} for r in rows]
            repo.add(config, side, {"test": _columns(rows, list(side))})
        qf = Features({"query-id": Value("string"), "corpus-id": Value("string"), "score": Value("int64")})
        repo.add("qrels", qf, {"test": {"query-id": [r[0] for r in self.qrels], "corpus-id": [r[1] for r in self.qrels],
                                        "score": [r[2] for r in self.qrels]}})
        repo.card()

    def rows(self) -> dict:
        named = {r[0] for r in self.qrels}
        return {"default": {"test": {"queries": sum(r["id"] in named for r in self.queries),
                                     "corpus": len(self.corpus)}}}


# ------------------------------------------------------------------------------------------------ ViDoRe (beir)


@dataclass
class Beir:
    """A ViDoRe BEIR repo: corpus (corpus-id int64, image), queries (query-id int64, query), qrels (query-id,
    corpus-id int64, score), split test, files <config>/test-00000-of-00001.parquet. vidore_bench's load_data
    reads each config's test split and keeps every query (the evaluation drops those without qrels)."""

    path: str
    queries: list[str]
    pages: list[Pic]
    qrels: list[tuple[int, int, float]]
    score: str = "int64"

    def write(self, root: str) -> None:
        repo = Repo(root, self.path)
        repo.add("corpus", Features({"corpus-id": Value("int64"), "image": Image()}),
                 {"test": {"corpus-id": list(range(len(self.pages))), "image": [image_value(p) for p in self.pages]}})
        qrels = Features({"query-id": Value("int64"), "corpus-id": Value("int64"), "score": Value(self.score)})
        repo.add("qrels", qrels,
                 {"test": {"query-id": [r[0] for r in self.qrels], "corpus-id": [r[1] for r in self.qrels],
                           "score": [r[2] for r in self.qrels]}})
        repo.add("queries", Features({"query-id": Value("int64"), "query": Value("string")}),
                 {"test": {"query-id": list(range(len(self.queries))), "query": self.queries}})
        repo.card()

    def rows(self) -> dict:  # the evaluation drops the queries no qrels line names
        return {"default": {"test": {"queries": len({r[0] for r in self.qrels}), "corpus": len(self.pages)}}}


def vidore(path: str, family: str, rel: dict[int, list[int]], n_pages: int, score: str = "int64",
           unjudged: int = 0, lang: str = "en") -> Beir:
    """Pages are pictures of assorted sizes; one question runs past 77 tokens; French sets end in French words."""
    queries = []
    for i in range(len(rel) + unjudged):
        text = long_text((family, i)) if i == 1 else sentence((family, i), (6, 12)) + "?"
        queries.append(text if lang == "en" else f"{text} {_SCRIPTS.get(lang, lang)}")
    pages = [pic(f"vidore-{family}", p, size=(48 + 7 * (p % 3), 64 + 5 * (p % 4))) for p in range(n_pages)]
    if family == "docvqa":  # a full-size scan (the hub's pages are ~1700x2200): downscaled by the processor
        pages[0] = pic(f"vidore-{family}", 0, "jpeg", size=(340, 440))
    return Beir(path, queries, pages, [(i, p, 1.0 if score == "float64" else 1) for i, ps in rel.items() for p in ps],
                score)


# ------------------------------------------------------------------------------------------------ the split layout


@dataclass
class Splits:
    """A default config whose splits are read by a custom load_data: {split: rows}, `features` the columns."""

    path: str
    features: Features
    splits: dict[str, list[dict]]
    shards: dict[str, int] = field(default_factory=dict)
    counts: dict = field(default_factory=dict)

    def write(self, root: str) -> None:
        repo = Repo(root, self.path)
        repo.add("default", self.features, {s: _columns(rows, list(self.features)) for s, rows in self.splits.items()},
                 shards=self.shards)
        repo.card()

    def rows(self) -> dict:
        return self.counts


def hateful_memes() -> Splits:
    """Ahren09/MMSoc_HatefulMemes forked to mteb/: splits train (2 shards here, 6 there), validation, test; columns
    id (int64), image, text, label, split. Both tasks build one corpus of every split's memes, deduplicated by text
    (polars arg_unique: the first row of each text, in the order test, validation, train). The set holds
    'confounders', memes with the same text and another image: the test pair m1/m2 shares a text, so m2's own
    document is dropped and its query keeps a relevant document the corpus lacks; a train meme repeats a test
    meme's text and is dropped too."""
    texts = {s: [sentence(("hateful", s, i), (4, 9)) for i in range(n)]
             for s, n in (("test", 5), ("validation", 2), ("train", 4))}
    texts["test"][2] = texts["test"][1]  # confounders
    texts["train"][3] = texts["test"][4]
    texts["test"][0] = long_text(("hateful", "test", 0))
    ids = {"test": [16395, 37405, 94180, 1765, 53046], "validation": [8291, 46971],
           "train": [42953, 23058, 13894, 37408]}
    splits = {s: [{"id": ids[s][i], "image": pic("hateful", (s, i), name=f"img/{ids[s][i]:05d}"), "text": t,
                   "label": (ids[s][i] % 2), "split": s} for i, t in enumerate(texts[s])]
              for s in ("train", "validation", "test")}
    features = Features({"id": Value("int64"), "image": Image(), "text": Value("string"), "label": Value("int64"),
                         "split": Value("string")})
    unique = len(set(texts["test"] + texts["validation"] + texts["train"]))
    return Splits("mteb/MMSoc_HatefulMemes", features, splits, {"train": 2},
                  {"default": {"test": {"queries": 5, "corpus": unique}}})


def memotion() -> Splits:
    """Ahren09/MMSoc_Memotion (the corrected texts, forked to mteb/MMSoc_Memotion_corrected): splits train,
    validation, test. Rows whose text_corrected is None are dropped first and the ids are the positions after the
    drop (corpus-<split>-<i>, query-test-<i>): a test row with no text shifts the ids of the rows after it. The
    corpus is every split's rows (texts for I2T, images for T2I), the queries the test rows."""
    labels = ["funny", "very_funny", "not_funny", "hilarious"]
    splits = {}
    for s, n in (("train", 4), ("validation", 2), ("test", 5)):
        rows = []
        for i in range(n):
            text = None if (s, i) in {("test", 1), ("train", 2)} else (
                long_text(("memotion", s, i)) if (s, i) == ("test", 3) else sentence(("memotion", s, i), (4, 10)))
            rows.append({"image": pic("memotion", (s, i), name=f"image_{s}_{i}"),
                         "text_ocr": None if (s, i) == ("test", 4) else sentence(("memotion-ocr", s, i)).upper(),
                         "text_corrected": text, "humor": labels[i % 4], "sarcasm": "general",
                         "offensive": "not_offensive", "motivational": "not_motivational",
                         "sentiment": "positive", "split": s})
        splits[s] = rows
    features = Features({"image": Image(), **{c: Value("string") for c in (
        "text_ocr", "text_corrected", "humor", "sarcasm", "offensive", "motivational", "sentiment", "split")}})
    kept = {s: sum(r["text_corrected"] is not None for r in rows) for s, rows in splits.items()}
    return Splits("mteb/MMSoc_Memotion_corrected", features, splits, {},
                  {"default": {"test": {"queries": kept["test"], "corpus": sum(kept.values())}}})


WIT_LANGS = ["ar", "bg", "da", "el", "et", "id", "ko", "ja", "tr", "vi", "en"]
XFLICKR_LANGS = ["de", "en", "es", "id", "ja", "ru", "tr", "zh"]
XM3600_LANGS = ["ar", "bn", "cs", "da", "de", "el", "en", "es", "fa", "fi", "fil", "fr", "he", "hi", "hr", "hu",
                "id", "it", "ja", "ko", "mi", "nl", "no", "pl", "pt", "quz", "ro", "ru", "sv", "sw", "te", "th",
                "tr", "uk", "vi", "zh"]
STRUCT = {"bytes": Value("binary"), "path": Value("null")}  # the pinned xflickrco/xm3600 parquet: no Image feature


def wit() -> Splits:
    """mteb/wit: a split per language (image as an Image feature, image_id, captions). The T2I loader makes one
    query per caption, query-<image_id>-<i>, whitespace-only ones included (the I2T loader drops them: they occur);
    pictures repeat across languages (one Commons file on several Wikipedias) and one language holds an all-black
    and an all-white one."""
    splits, counts = {}, {}
    for li, lang in enumerate(WIT_LANGS):
        rows = []
        for k in range(3):
            shared = k == 0 and li % 3 == 0  # the same picture in every third language
            p = pic("wit", "shared" if shared else (lang, k), name=f"commons_{li}_{k}")
            if lang == "en" and k > 0:
                p = pic("wit", (lang, k), "black" if k == 1 else "white", size=(40 + k, 30))
            caps = [caption(("wit", lang, k, j), lang) for j in range(1 + (li + k) % 2)]
            if (lang, k) == ("da", 2):
                caps.append("   ")
            rows.append({"image": p, "image_id": f"{lang}_{7000 + 10 * li + k}", "captions": caps})
        splits[lang] = rows
        counts[lang] = {"test": {"queries": sum(len(r["captions"]) for r in rows), "corpus": len(rows)}}
    features = Features({"image": Image(), "image_id": Value("string"), "captions": List(Value("string"))})
    return Splits("mteb/wit", features, splits, {}, counts)


def xflickrco() -> Splits:
    """floschne/xflickrco forked to mteb/: a split per language (sentences, id, image as a bare {bytes, path}
    struct: the T2I loader casts it to Image); the same 4 pictures in every language, one caption each."""
    splits = {lang: [{"sentences": caption(("xflickrco", lang, k), lang), "id": f"{36979 + k}",
                      "image": pic("xflickrco", k)} for k in range(4)]
              for lang in XFLICKR_LANGS}
    splits["en"][2]["sentences"] = long_text(("xflickrco", "en", 2))
    features = Features({"sentences": Value("string"), "id": Value("string"), "image": STRUCT})
    return Splits("mteb/xflickrco", features, splits, {},
                  {lang: {"test": {"queries": 4, "corpus": 4}} for lang in XFLICKR_LANGS})


def xm3600() -> Splits:
    """floschne/xm3600 forked to mteb/: a split per language (image_id, image_locale, captions, captions_tokenized,
    captions_tokenized_lowercase, image as a bare struct); the same 3 pictures in all 36 languages, 1 or 2
    captions each (one query per caption: query-<image_id>-<i>). The split 'no' is a YAML boolean unquoted."""
    splits, counts = {}, {}
    for li, lang in enumerate(XM3600_LANGS):
        rows = []
        for k in range(3):
            caps = [caption(("xm3600", lang, k, j), lang) for j in range(1 + (li + k) % 2)]
            rows.append({"image_id": f"{k:016x}", "image_locale": lang, "captions": caps,
                         "captions_tokenized": [c.lower() for c in caps],
                         "captions_tokenized_lowercase": [c.lower() for c in caps],
                         "image": pic("xm3600", k)})
        splits[lang] = rows
        counts[lang] = {"test": {"queries": sum(len(r["captions"]) for r in rows), "corpus": 3}}
    features = Features({"image_id": Value("string"), "image_locale": Value("string"),
                         "captions": List(Value("string")), "captions_tokenized": List(Value("string")),
                         "captions_tokenized_lowercase": List(Value("string")), "image": STRUCT})
    return Splits("mteb/xm3600", features, splits, {}, counts)


# ------------------------------------------------------------------------------------------------ the table

_BUILDERS: dict[str, Callable[[], object]] = {
    "BLINKIT2IRetrieval": blink_it2i,
    "BLINKIT2TRetrieval": blink_it2t,
    "CIRRIT2IRetrieval": lambda: _composed("mteb/mbeir_cirr_task7", "cirr", 7, {0: [0, 1, 2], 1: [3], 2: [4],
                                                                                  3: [5, 6]}, extra_queries=1),
    "CUB200I2IRetrieval": lambda: _self_retrieval("mteb/cub200_retrieval", "cub200", [3, 2, 4]),
    "EDIST2ITRetrieval": edis,
    "Fashion200kI2TRetrieval": fashion200k_i2t,
    "Fashion200kT2IRetrieval": fashion200k_t2i,
    "FashionIQIT2IRetrieval": lambda: _composed("mteb/mbeir_fashioniq_task7", "fashioniq", 7,
                                                {0: [0], 1: [1], 2: [2, 3], 3: [4]}, extra_queries=0),
    "Flickr30kI2TRetrieval": flickr_i2t,
    "Flickr30kT2IRetrieval": flickr_t2i,
    "FORBI2IRetrieval": forb,
    "GLDv2I2IRetrieval": gldv2_i2i,
    "GLDv2I2TRetrieval": gldv2_i2t,
    "HatefulMemesI2TRetrieval": hateful_memes,
    "HatefulMemesT2IRetrieval": hateful_memes,
    "ImageCoDeT2IRetrieval": imagecode,
    "InfoSeekIT2ITRetrieval": lambda: _knowledge("mteb/InfoSeekIT2ITRetrieval", "infoseek-it", 8, True, v1=False),
    "InfoSeekIT2TRetrieval": lambda: _knowledge("mteb/mbeir_infoseek_task6", "infoseek-wiki", 6, False),
    "MemotionI2TRetrieval": memotion,
    "MemotionT2IRetrieval": memotion,
    "METI2IRetrieval": met,
    "MSCOCOI2TRetrieval": mscoco_i2t,
    "MSCOCOT2IRetrieval": mscoco_t2i,
    "NIGHTSI2IRetrieval": nights,
    "OVENIT2ITRetrieval": lambda: _knowledge("mteb/mbeir_oven_task8", "oven-it", 8, True),
    "OVENIT2TRetrieval": lambda: _knowledge("mteb/mbeir_oven_task6", "oven", 6, False),
    "ROxfordEasyI2IRetrieval": lambda: _revisited("mteb/r-oxford-easy-multi", "roxford", "easy"),
    "ROxfordMediumI2IRetrieval": lambda: _revisited("mteb/r-oxford-medium-multi", "roxford", "medium"),
    "ROxfordHardI2IRetrieval": lambda: _revisited("mteb/r-oxford-hard-multi", "roxford", "hard"),
    "RP2kI2IRetrieval": lambda: _self_retrieval("mteb/rp2k", "rp2k", [2, 3, 1, 2]),
    "RParisEasyI2IRetrieval": lambda: _revisited("mteb/r-paris-easy-multi", "rparis", "easy"),
    "RParisMediumI2IRetrieval": lambda: _revisited("mteb/r-paris-medium-multi", "rparis", "medium"),
    "RParisHardI2IRetrieval": lambda: _revisited("mteb/r-paris-hard-multi", "rparis", "hard"),
    "SketchyI2IRetrieval": sketchy,
    "SOPI2IRetrieval": lambda: _self_retrieval("mteb/stanford-online-products", "sop", [2, 2, 3]),
    "StanfordCarsI2IRetrieval": lambda: _self_retrieval("mteb/stanford_cars_retrieval", "stanford-cars", [3, 3, 2]),
    "TUBerlinT2IRetrieval": tu_berlin,
    "VisualNewsI2TRetrieval": visualnews_i2t,
    "VisualNewsT2IRetrieval": visualnews_t2i,
    "VizWizIT2TRetrieval": lambda: vqa("mteb/vizwiz", "vizwiz", 6, ["unanswerable", "blue", "a can of soup", "no"],
                                       [0, 1, 0, 2, 3, 0]),
    "VQA2IT2TRetrieval": lambda: vqa("mteb/vqa-2", "vqa2", 5, ["2", "yes", "no", "red", "tennis"], [1, 2, 0, 3, 4]),
    "WebQAT2ITRetrieval": webqa_t2it,
    "WebQAT2TRetrieval": webqa_t2t,
    "WITT2IRetrieval": wit,
    "XFlickr30kCoT2IRetrieval": xflickrco,
    "XM3600T2IRetrieval": xm3600,
    # ViDoRe: arxivqa and the synthetic sets hold float64 scores; DocVQA and TAT-DQA several relevant pages
    "VidoreArxivQARetrieval": lambda: vidore("mteb/arxivqa_test_subsampled_beir", "arxivqa",
                                             {i: [i] for i in range(4)}, 6, "float64"),
    "VidoreDocVQARetrieval": lambda: vidore("mteb/docvqa_test_subsampled_beir", "docvqa",
                                            {0: [0], 1: [1, 2], 2: [3], 3: [4]}, 6),
    "VidoreInfoVQARetrieval": lambda: vidore("mteb/infovqa_test_subsampled_beir", "infovqa",
                                             {0: [0], 1: [1], 2: [2, 5], 3: [3]}, 6, unjudged=1),
    "VidoreTabfquadRetrieval": lambda: vidore("mteb/tabfquad_test_subsampled_beir", "tabfquad",
                                              {0: [0], 1: [0], 2: [1], 3: [1], 4: [2]}, 4, lang="fr"),
    "VidoreTatdqaRetrieval": lambda: vidore("mteb/tatdqa_test_beir", "tatdqa", {0: [0, 1, 2], 1: [3], 2: [3], 3: [4]},
                                            6),
    "VidoreShiftProjectRetrieval": lambda: vidore("mteb/shiftproject_test_beir", "shiftproject",
                                                  {i: [i] for i in range(4)}, 6, lang="fr"),
    "VidoreSyntheticDocQAAIRetrieval": lambda: vidore("mteb/syntheticDocQA_artificial_intelligence_test_beir",
                                                      "synth-ai", {0: [0], 1: [1], 2: [1], 3: [2]}, 5, "float64"),
    "VidoreSyntheticDocQAEnergyRetrieval": lambda: vidore("mteb/syntheticDocQA_energy_test_beir", "synth-energy",
                                                          {i: [i] for i in range(4)}, 5, "float64"),
    "VidoreSyntheticDocQAGovernmentReportsRetrieval": lambda: vidore(
        "mteb/syntheticDocQA_government_reports_test_beir", "synth-gov", {0: [0], 1: [2], 2: [2], 3: [3]}, 5,
        "float64"),
    "VidoreSyntheticDocQAHealthcareIndustryRetrieval": lambda: vidore(
        "mteb/syntheticDocQA_healthcare_industry_test_beir", "synth-health", {i: [i + 1] for i in range(4)}, 5,
        "float64"),
}


@lru_cache(maxsize=None)
def build(name: str):
    """The task's repo in memory (pictures drawn when written)."""
    return _BUILDERS[name]()


def _writer(name: str) -> Callable[[str], None]:
    def write(root: str) -> None:
        build(name).write(root)

    write.__doc__ = f"Write {name}'s repo under root/<its hub path>."
    return write


TASKS: dict[str, Callable[[str], None]] = {name: _writer(name) for name in _BUILDERS}


# {task: {hf_subset: {split: {"queries": n, "corpus": n}}}}: what mteb's retrieval evaluator is handed
ROWS: dict[str, dict[str, dict[str, dict[str, int]]]] = {name: build(name).rows() for name in _BUILDERS}
# {task: its hub path}: tasks that share a repo name it twice
PATHS: dict[str, str] = {name: build(name).path for name in _BUILDERS}
