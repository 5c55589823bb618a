"""The fixture mirror, checked with the real readers: HF `datasets`, `webdataset`, Pillow."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from PIL import Image
from support.mirror import hub_rows, kept_rows

from mieb_ray.demo_data.mirror import (
    DEFAULT_ROWS,
    INTERESTING,
    SCIMMIR_NO_CAPTION,
    TEST_ROWS,
    hub_names,
    label_of,
    make_mirror,
)
from mieb_ray.sources import PARQUET, SOURCES, TOTAL_ROWS, by_slug, read_labels

FORMATS = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory):
    """Keep `datasets` out of ~/.cache: the env for anything started later, the config for this process."""
    cache = tmp_path_factory.mktemp("hf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HOME", str(cache))
        mp.setenv("HF_DATASETS_CACHE", str(cache / "datasets"))
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", cache / "datasets")
        yield str(cache / "datasets")


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    root = tmp_path_factory.mktemp("mirror")
    start = time.perf_counter()
    written = make_mirror(root)
    print(f"\nmake_mirror of {len(written)} sources x {DEFAULT_ROWS} rows: {time.perf_counter() - start:.2f}s")
    return root, written


def parquet_files(root: Path, slug: str, split: str = "train") -> list[str]:
    return sorted(str(p) for p in (root / by_slug(slug).repo / "data").glob(f"{split}-*.parquet"))


def tars(root: Path, slug: str, split: str = "train") -> list[str]:
    return sorted(str(p) for p in (root / by_slug(slug).repo / split).glob("*.tar"))


def first_images(root: Path, slug: str) -> list[bytes]:
    source = by_slug(slug)
    if source.layout == PARQUET:
        table = pq.read_table(parquet_files(root, slug)[0], columns=[source.image_column])
        return [cell["bytes"] for cell in table.column(0).to_pylist()]
    with tarfile.open(tars(root, slug)[0]) as tar:
        return [tar.extractfile(m).read() for m in tar if m.name.endswith("." + source.image_ext)]


def train_labels(root: Path, slug: str) -> list:
    source = by_slug(slug)
    if source.layout == PARQUET:
        return [v for f in parquet_files(root, slug) for v in pq.read_table(f).column(source.label_column).to_pylist()]
    return [int(sample["cls"]) for sample in wds.WebDataset(tars(root, slug), shardshuffle=False)]


def test_layout_of_every_source(mirror):
    root, written = mirror
    assert written == {s.slug: DEFAULT_ROWS for s in SOURCES}
    for s in SOURCES:
        repo = root / s.repo
        if s.layout == PARQUET:
            assert [Path(f).name for f in parquet_files(root, s.slug)] == [
                "train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
            assert pq.read_metadata(repo / f"data/{s.eval_split}-00000-of-00001.parquet").num_rows == TEST_ROWS
            assert "configs:" in (repo / "README.md").read_text()
        else:
            assert [Path(f).name for f in tars(root, s.slug)] == ["0.tar", "1.tar"]
            assert (repo / "train/nshards.txt").read_text() == "2\n"
            assert (repo / "test/nshards.txt").read_text() == "1\n" and (repo / "test/0.tar").is_file()
            assert s.eval_split == "test"
            assert (repo / "classnames.txt").read_bytes() == "".join(f"{n}\n" for n in read_labels(s.names)).encode()
            assert "{c}" in (repo / "zeroshot_classification_templates.txt").read_text()
        # what `huggingface-cli download --local-dir` records: the revision of every file
        meta = repo / ".cache/huggingface/download"
        assert {p.read_text().split("\n")[0] for p in meta.rglob("*.metadata")} == {s.revision}
    assert (root / "mteb/wds_vtab-clevr_closest_object_distance/classnames.txt").read_text().splitlines()[3] == ""


def test_first_rows_meet_every_fix(mirror):
    root, _ = mirror
    for slug, first in INTERESTING.items():
        assert train_labels(root, slug)[:len(first)] == first, slug
    names = {slug: hub_names(slug) for slug in INTERESTING}
    assert names["cifar100"][26] == "cra" and names["sun397"][95] == "/c/church/outdoor"
    assert names["sun397"][367] == "/u/utility_room" and names["ucf101"][36] == "HandstandPushups"
    assert names["stanfordcars"][98].startswith("fiat") and names["stanfordcars"][25].startswith("bmw")
    assert names["birdsnap"][172].startswith("Eurasian") and names["caltech101"][4] == "background_google"
    assert read_labels("Imagenet1k_labels.txt")[744] == read_labels("Imagenet1k_labels.txt")[657] == "missile"
    assert read_labels("clevr.txt")[3] == ""


def test_labels_cycle_every_class_and_drops_are_counted(mirror):
    _, written = mirror
    caltech = by_slug("caltech101")
    assert sorted(label_of(caltech, i) for i in range(102)) == list(range(102))
    assert kept_rows(written)["caltech101"] == DEFAULT_ROWS - 1  # row 0 is background_google
    assert kept_rows({"caltech101": 3060}) == {"caltech101": 3030}
    assert hub_rows()["caltech101"] == 3060 and sum(kept_rows(hub_rows()).values()) == TOTAL_ROWS


def test_images_are_encoded_like_the_source(mirror):
    root, _ = mirror
    for s in SOURCES:
        images = [Image.open(io.BytesIO(b)) for b in first_images(root, s.slug)]
        assert {im.format for im in images} == {FORMATS[s.image_ext]}, s.slug
        assert {im.mode for im in images} == ({"L"} if s.slug in ("mnist", "fer2013") else {"RGB"}), s.slug
    sizes = {slug: {Image.open(io.BytesIO(b)).size for b in first_images(root, slug)}
             for slug in ("cifar100", "mnist", "fer2013", "clevr", "ucf101", "imagenet1k")}
    assert sizes["cifar100"] == {(32, 32)} and sizes["mnist"] == {(28, 28)} and sizes["fer2013"] == {(48, 48)}
    assert sizes["clevr"] == {(480, 320)} and sizes["ucf101"] == {(320, 240)}
    assert len(sizes["imagenet1k"]) > 1  # photos come in varied sizes and aspect ratios
    assert len(set(first_images(root, "imagenet1k"))) == DEFAULT_ROWS // 2


def test_webp_is_lossless(mirror):
    root, _ = mirror
    for slug in ("patchcamelyon", "clevr", "clevr_count", "gtsrb"):
        for data in first_images(root, slug):
            assert data[:4] == b"RIFF" and data[8:16] == b"WEBPVP8L", slug  # VP8L = the lossless bitstream
            assert Image.open(io.BytesIO(data)).format == "WEBP"


def test_parquet_reads_back_with_datasets(mirror, hf_cache):
    root, _ = mirror
    ds = datasets.load_dataset("parquet", data_files={"train": parquet_files(root, "cifar100")}, split="train",
                               cache_dir=hf_cache)
    assert ds.column_names == ["img", "fine_label", "coarse_label"] and len(ds) == DEFAULT_ROWS
    assert ds.features["fine_label"].names == hub_names("cifar100") and ds.features["fine_label"].names[26] == "cra"
    assert ds.features["coarse_label"].num_classes == 20
    image = ds[0]["img"]
    assert isinstance(image, Image.Image) and image.size == (32, 32) and image.mode == "RGB"

    ucf = datasets.load_dataset("parquet", data_files={"train": parquet_files(root, "ucf101")}, split="train",
                                cache_dir=hf_cache)
    assert ucf.column_names == ["image", "video_id", "clip_id", "frame", "label"]
    assert ucf[1]["video_id"].startswith("v_HandStandPushups_") and ucf[0]["image"].size == (320, 240)

    pets = datasets.load_dataset("parquet", data_files={"train": parquet_files(root, "oxfordpets")}, split="train",
                                 cache_dir=hf_cache)
    assert pets.features["species"].names == ["Cat", "Dog"] and pets[0]["id"] == "Abyssinian_1"

    birds = datasets.load_dataset("parquet", data_files={"train": parquet_files(root, "birdsnap")}, split="train",
                                  cache_dir=hf_cache)
    assert birds.features["common"].num_classes == 500 and birds.column_names == ["image", "common"]


def test_scimmir_columns(mirror, hf_cache):
    root, _ = mirror
    ds = datasets.load_dataset("parquet", data_files={"train": parquet_files(root, "scimmir")}, split="train",
                               cache_dir=hf_cache)
    assert ds.column_names == ["image", "text", "file_name_index", "class", "super_class", "sub_class", "split"]
    assert set(ds["class"]) == set(read_labels("scimmir.txt")) and set(ds["split"]) == {"train"}
    texts = ds["text"]
    assert [texts[i] for i in SCIMMIR_NO_CAPTION] == list(SCIMMIR_NO_CAPTION.values())  # one null, one blank
    real = [t for t in texts if t and t.strip()]
    assert any("\n" in t for t in real) and any("  " in t for t in real) and any("_" in t for t in real)


def test_repo_folder_loads_by_its_readme(mirror, hf_cache):
    root, _ = mirror
    dd = datasets.load_dataset(str(root / "mteb/food101"), cache_dir=hf_cache)
    assert {k: len(v) for k, v in dd.items()} == {"train": DEFAULT_ROWS, "validation": TEST_ROWS}  # mteb's eval split
    assert dd["train"].features["label"].names[0] == "apple_pie"


def test_webdataset_reads_back(mirror):
    root, _ = mirror
    samples = list(wds.WebDataset(tars(root, "gtsrb"), shardshuffle=False).decode("pil"))
    assert [s["__key__"] for s in samples] == ["s%07d" % i for i in range(DEFAULT_ROWS)]  # keys go on across tars
    assert [s["cls"] for s in samples] == [label_of(by_slug("gtsrb"), i) for i in range(DEFAULT_ROWS)]
    assert all(isinstance(s["webp"], Image.Image) for s in samples)


def test_webdataset_reads_back_with_datasets(mirror, hf_cache):
    root, _ = mirror
    ds = datasets.load_dataset("webdataset", data_files={"train": tars(root, "imagenet1k")}, split="train",
                               cache_dir=hf_cache)
    assert set(ds.column_names) == {"__key__", "__url__", "jpg", "cls"} and len(ds) == DEFAULT_ROWS
    assert ds[0]["cls"] == 744 and ds[0]["jpg"].format == "JPEG"


def test_rows_files_and_image_override(tmp_path):
    def tiny(source, index):
        return b"\xff\xd8\xff" + index.to_bytes(4, "big")

    written = make_mirror(tmp_path, rows={"dtd": 450, "clevr": 450}, datasets=["dtd", "clevr", "mnist"], files=3,
                          image_bytes=tiny)
    assert written == {"dtd": 450, "clevr": 450, "mnist": DEFAULT_ROWS}
    files = parquet_files(tmp_path, "dtd")
    assert [pq.read_metadata(f).num_rows for f in files] == [150, 150, 150]
    assert [pq.read_metadata(files[0]).row_group(i).num_rows for i in range(2)] == [100, 50]  # HF: 100-row groups
    assert pq.read_table(files[1]).column("image")[0].as_py() == {"bytes": tiny(None, 150), "path": "150.jpg"}
    firsts = []
    for path in tars(tmp_path, "clevr"):
        with tarfile.open(path) as tar:
            firsts.append(tar.next().name)
    assert firsts == ["s0000000.cls", "s0000150.cls", "s0000300.cls"]

    make_mirror(tmp_path, rows=5, datasets=["dtd"], files=1)  # rewrites the repo: no stale files left
    assert [Path(f).name for f in parquet_files(tmp_path, "dtd")] == ["train-00000-of-00001.parquet"]


def test_either_layout_for_a_source(tmp_path, hf_cache):
    """layouts= writes a source as the other kind of repo: the same rows, labels and image bytes."""
    from mieb_ray.sources import WEBDATASET

    make_mirror(tmp_path, rows=7, datasets=["gtsrb", "cifar100", "scimmir"], files=2,
                layouts={"gtsrb": PARQUET, "cifar100": WEBDATASET, "scimmir": WEBDATASET})
    gtsrb = datasets.load_dataset("parquet", data_files={"train": parquet_files(tmp_path, "gtsrb")}, split="train",
                                  cache_dir=hf_cache)
    assert gtsrb.column_names == ["__key__", "__url__", "webp", "cls"] and gtsrb["cls"] == [
        label_of(by_slug("gtsrb"), i) for i in range(7)]
    assert gtsrb[0]["__key__"] == "s0000000" and gtsrb[0]["webp"].format == "WEBP"
    assert not tars(tmp_path, "gtsrb") and (tmp_path / "mteb/wds_gtsrb/data/test-00000-of-00001.parquet").is_file()
    samples = list(wds.WebDataset(tars(tmp_path, "cifar100"), shardshuffle=False))
    assert [int(s["cls"]) for s in samples] == [label_of(by_slug("cifar100"), i) for i in range(7)]
    assert Image.open(io.BytesIO(samples[0]["png"])).size == (32, 32)
    assert (tmp_path / "mteb/cifar100/classnames.txt").read_text().splitlines() == hub_names("cifar100")
    assert (tmp_path / "mteb/cifar100/test/0.tar").is_file() and not parquet_files(tmp_path, "cifar100")
    scimmir = list(wds.WebDataset(tars(tmp_path, "scimmir"), shardshuffle=False))
    assert {"txt", "cls", "png"} <= set(scimmir[0]) and scimmir[5]["txt"] == b""  # a null caption: empty
    assert scimmir[0]["txt"].decode().startswith(("Fig", "Table"))


def test_eval_split_sizes_and_labels(tmp_path):
    make_mirror(tmp_path, rows=4, datasets=["caltech101", "food101", "gtsrb"], eval_rows={"caltech101": 5, "gtsrb": 7})
    caltech = pq.read_table(parquet_files(tmp_path, "caltech101", "test"))
    assert caltech["label"].to_pylist() == [label_of(by_slug("caltech101"), i) for i in range(5)]
    assert caltech["label"][0].as_py() == 4  # background_google: the eval split keeps it
    assert [pq.read_metadata(f).num_rows for f in parquet_files(tmp_path, "food101", "validation")] == [TEST_ROWS]
    assert not parquet_files(tmp_path, "food101", "test")
    samples = list(wds.WebDataset(tars(tmp_path, "gtsrb", "test"), shardshuffle=False))
    assert [s["__key__"] for s in samples] == [f"s{i:07d}" for i in range(7)]
    assert [int(s["cls"]) for s in samples] == [label_of(by_slug("gtsrb"), i) for i in range(7)]
    assert len(train_labels(tmp_path, "gtsrb")) == 4

    make_mirror(tmp_path, rows=4, datasets=["dtd"], eval_rows=9)
    assert [pq.read_metadata(f).num_rows for f in parquet_files(tmp_path, "dtd", "test")] == [9]


def test_no_sklearn_or_skimage_at_runtime(tmp_path):
    code = ("import sys; from mieb_ray.demo_data.mirror import make_mirror; make_mirror(sys.argv[1], rows=2); "
            "assert not [m for m in sys.modules if m.split('.')[0] in ('sklearn', 'skimage')]")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)
