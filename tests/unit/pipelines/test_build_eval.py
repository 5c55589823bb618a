"""`build --split eval`: each source's MIEB eval split (test; validation for food101) in the mieb-train layout,
keyed `<slug>/<split>/<index>`, every row kept, read back with pyarrow, `datasets` and `webdataset`."""

from __future__ import annotations

import glob
import json
import os
import tarfile

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds

from mieb_ray.captions import class_table
from mieb_ray.cli import main
from mieb_ray.demo_data.mirror import hub_names, label_of, make_mirror
from mieb_ray.io.reader import unit_name
from mieb_ray.pipelines.build import BuildConfig, build
from mieb_ray.sources import PARQUET, by_slug

pytestmark = pytest.mark.timeout(600)
SLUGS = ["cifar100", "food101", "gtsrb", "caltech101", "scimmir"]
EVAL_ROWS = {"cifar100": 7, "food101": 5, "gtsrb": 11, "caltech101": 9, "scimmir": 4}


@pytest.fixture(scope="module")
def eval_mirror(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("eval-mirror"))
    make_mirror(root, rows=6, datasets=SLUGS, eval_rows=EVAL_ROWS)
    return root


def eval_source_rows(root: str, slug: str) -> dict[int, tuple[bytes, object]]:
    """index -> (image bytes, label) of the mirror's eval split, read without our readers."""
    source = by_slug(slug)
    if source.layout == PARQUET:
        files = sorted(glob.glob(f"{root}/{source.repo}/data/{source.eval_split}-*.parquet"))
        table = pa.concat_tables(pq.read_table(f) for f in files)
        return {i: (image["bytes"], label) for i, (image, label) in
                enumerate(zip(table[source.image_column].to_pylist(), table[source.label_column].to_pylist()))}
    out = {}
    for path in sorted(glob.glob(f"{root}/{source.repo}/{source.eval_split}/*.tar")):
        with tarfile.open(path) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        for name, data in members.items():
            key, ext = name.split(".", 1)
            if ext == source.image_ext:
                out[int(key[1:])] = (data, int(members[f"{key}.cls"]))
    return out


@pytest.fixture(scope="module")
def eval_build(ray_local, eval_mirror, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("eval-parquet"))
    return out, build(BuildConfig(eval_mirror, out, datasets=SLUGS, rows_per_shard=4, split="eval"))


def test_every_eval_row_is_kept_under_its_split_key(eval_build, eval_mirror):
    out, manifest = eval_build
    assert manifest["counts"]["datasets"] == EVAL_ROWS and manifest["counts"]["expected"] == {
        s: by_slug(s).eval_rows for s in SLUGS}
    assert manifest["counts"]["dropped"] == dict.fromkeys(SLUGS, 0) and manifest["config"]["split"] == "eval"
    assert {s: v["split"] for s, v in manifest["sources"].items()} == {
        "cifar100": "test", "food101": "validation", "gtsrb": "test", "caltech101": "test", "scimmir": "test"}
    for slug in SLUGS:
        source, split = by_slug(slug), manifest["sources"][slug]["split"]
        paths = [os.path.join(out, s["path"]) for s in manifest["shards"] if s["dataset"] == slug]
        assert all(os.path.relpath(p, out).startswith(f"{slug}/0000") for p in paths)  # the train layout
        rows = pq.read_table(paths).to_pylist()
        assert [r["key"] for r in rows] == [f"{slug}/{split}/{i}" for i in range(EVAL_ROWS[slug])]
        src, table = eval_source_rows(eval_mirror, slug), class_table(source, hub_names(slug))
        for i, r in enumerate(rows):
            image, label = src[i]
            assert r["image"]["bytes"] == image and r["dataset_name"] == slug
            if not source.caption_column:
                assert label == label_of(source, i)
                assert (r["label"], r["class_name"], r["text"]) == (label, table.class_name[label], table.text[label])


def test_caltech101_keeps_its_background_rows(eval_build):
    out, _ = eval_build
    rows = pq.read_table(sorted(glob.glob(f"{out}/caltech101/*.parquet"))).to_pylist()
    background = [r for r in rows if r["label"] == 4]
    assert background and {r["key"] for r in background} >= {"caltech101/test/0"}  # label_of(caltech101, 0) == 4
    assert {(r["text"], r["class_name"]) for r in background} == {("a photo of a background.", "background")}


def test_datasets_reads_the_eval_output_under_the_split_name(eval_build):
    out, _ = eval_build
    food = datasets.load_dataset(out, "food101")
    assert list(food) == ["validation"] and food["validation"].num_rows == EVAL_ROWS["food101"]
    assert food["validation"][0]["key"] == "food101/validation/0"
    assert isinstance(food["validation"].features["image"], datasets.Image)
    cifar = datasets.load_dataset(out, "cifar100")
    assert list(cifar) == ["test"] and cifar["test"].num_rows == EVAL_ROWS["cifar100"]
    every = datasets.load_dataset(out, "all")
    assert {k: v.num_rows for k, v in every.items()} == {"test": sum(EVAL_ROWS.values()) - EVAL_ROWS["food101"],
                                                         "validation": EVAL_ROWS["food101"]}


def test_webdataset_eval_build(ray_local, eval_mirror, tmp_path):
    out = str(tmp_path / "eval-wds")
    manifest = build(BuildConfig(eval_mirror, out, datasets=["gtsrb", "caltech101"], fmt="webdataset",
                                 rows_per_shard=5, split="eval"))
    assert [s["path"] for s in manifest["shards"]] == [
        "caltech101/caltech101-000000.tar", "caltech101/caltech101-000001.tar", "gtsrb/gtsrb-000000.tar",
        "gtsrb/gtsrb-000001.tar", "gtsrb/gtsrb-000002.tar"]
    for slug in ("gtsrb", "caltech101"):
        source, src = by_slug(slug), eval_source_rows(eval_mirror, slug)
        samples = list(wds.WebDataset(sorted(glob.glob(f"{out}/{slug}/*.tar")), shardshuffle=False))
        assert [s["__key__"] for s in samples] == [f"{slug}/test/{i}" for i in range(EVAL_ROWS[slug])]
        for i, sample in enumerate(samples):
            assert sample[source.image_ext] == src[i][0] and int(sample["cls"]) == src[i][1]
            assert json.loads(sample["json"])["key"] == sample["__key__"]


def test_check_counts_against_the_catalogs_eval_rows(ray_local, eval_mirror, tmp_path, capsys):
    assert main(["build", "--sources", eval_mirror, "--out", str(tmp_path / "a"), "--datasets", "food101,gtsrb",
                 "--split", "eval", "--check-counts"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("mieb-ray: error: row count mismatch: food101: 5 rows, expected 25,250; "
                   "gtsrb: 11 rows, expected 12,630")
    assert not os.path.exists(tmp_path / "a" / "_manifest.json")


def test_unknown_split_is_one_line(tmp_path, capsys):
    assert main(["build", "--sources", str(tmp_path), "--out", str(tmp_path / "a"), "--split", "dev"]) == 1
    err = capsys.readouterr().err
    assert err == "mieb-ray: error: unknown split 'dev'; valid: train, eval\n"


def test_missing_eval_split_names_it(ray_local, tmp_path, capsys):
    make_mirror(tmp_path / "m", rows=3, datasets=["dtd"])
    os.remove(tmp_path / "m/mteb/dtd/data/test-00000-of-00001.parquet")
    assert main(["build", "--sources", str(tmp_path / "m"), "--out", str(tmp_path / "a"), "--datasets", "dtd",
                 "--split", "eval"]) == 1
    assert capsys.readouterr().err.endswith("mteb/dtd: no files for its test split (patterns: data/test-*)\n")


def test_progress_names_and_keys_never_meet_the_train_splits():
    assert (unit_name("dtd", "train", 10), unit_name("dtd", "test", 10)) == ("dtd/000000000010",
                                                                             "dtd/test/000000000010")
