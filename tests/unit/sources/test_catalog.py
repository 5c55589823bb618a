"""The catalog: 23 sources adding up to mieb-train's 4,434,196 rows, their eval splits, pinned revisions, the
count check."""

import importlib.util
import json
import re
from pathlib import Path

import pytest
from support.mirror import hub_rows, kept_rows
from support.paths import ROOT

from mieb_ray.errors import UserError
from mieb_ray.evals import probe_tasks
from mieb_ray.io.reader import repo_root
from mieb_ray.pipelines.build import check_counts
from mieb_ray.sources import EVAL_TOTAL_ROWS, SOURCES, TOTAL_ROWS, by_slug, select
from mieb_ray.sources.catalog import MIEB_TRAIN_ROWS

PUBLISHED_ROWS = 4_434_196  # the size PumeTu/mieb-train states: the expectation, from outside the code
# train split sizes of the 4 sources without an mteb linear-probe task (whose descriptive stats give the other 19),
# as published upstream (../shared/reference/mieb-train-sources.md section 1)
NO_PROBE_TASK_TRAIN_ROWS = {"scimmir": 498_279,  # m-a-p/SciMMIR's card: train 498,279
                            "clevr": 63_000, "clevr_count": 63_000,  # VTAB: 90% of tfds clevr's 70,000 train images
                            "renderedsst2": 6_920}  # SST2's train split, as torchvision's RenderedSST2 renders it


def mteb_stats(kind: str) -> Path:
    """mteb's descriptive stats of one task type (ZeroShotClassification, ImageClassification): published
    split sizes, from the mteb wheel's files only (importing mteb takes seconds)."""
    spec = importlib.util.find_spec("mteb")
    if spec is None:
        pytest.skip("mteb is not installed")
    return Path(spec.submodule_search_locations[0]) / "descriptive_stats/Image" / kind


def test_the_23_sources_make_mieb_train():
    assert len(SOURCES) == 23 and len({s.slug for s in SOURCES}) == 23
    assert TOTAL_ROWS == PUBLISHED_ROWS and MIEB_TRAIN_ROWS == PUBLISHED_ROWS
    assert sum(s.rows for s in SOURCES) == PUBLISHED_ROWS
    assert all(re.fullmatch(r"[0-9a-f]{40}", s.revision) and s.split == "train" for s in SOURCES)
    # a full-scale mirror's rows (caltech101: 3,060 on the hub, 30 dropped) make the published size
    assert sum(kept_rows(hub_rows()).values()) == PUBLISHED_ROWS
    assert hub_rows()["caltech101"] == 3_060


def test_train_rows_are_the_published_split_sizes():
    """Each source's train split is the size mteb's descriptive stats (or, for the 4 sources without a linear-probe
    task, the upstream card) state; mieb-train leaves out caltech101's background_google rows only, as many as
    mteb's stats count of its label 4; and what is left is the published 4,434,196."""
    stats = mteb_stats("ImageClassification")
    published = dict(NO_PROBE_TASK_TRAIN_ROWS)
    for task in probe_tasks.TASKS:
        published[task.slug] = json.loads((stats / f"{task.name}.json").read_text())["train"]["num_samples"]
    assert len(published) == 23
    assert {s.slug: s.split_rows for s in SOURCES} == published
    caltech = json.loads((stats / "Caltech101.json").read_text())["train"]["label_statistics"]["labels"]
    background = caltech["4"]["count"]
    assert {s.slug: (s.drop, s.drop_rows) for s in SOURCES if s.drop or s.drop_rows} == {
        "caltech101": ({4: "background_google"}, background)}
    assert sum(published.values()) - background == PUBLISHED_ROWS
    assert {s.slug: s.rows for s in SOURCES} == {**published, "caltech101": published["caltech101"] - background}


def test_no_literal_totals_outside_the_catalog():
    """No source count or row total typed outside sources/catalog.py, in the package or the jobs."""
    root = ROOT
    pattern = re.compile(r"\b23\b|4,434,196|4_434_196|4434196")
    hits = [f"{p.relative_to(root)}:{n}: {line.strip()}"
            for p in [*(root / "mieb_ray").rglob("*.py"), *(root / "jobs").rglob("*.py")]
            if p.name != "catalog.py"
            for n, line in enumerate(p.read_text("utf-8").splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_eval_splits_are_mtebs():
    zero_shot = [s for s in SOURCES if s.slug != "scimmir"]
    assert sum(s.eval_rows for s in zero_shot) == 970_944  # the zero-shot tasks but SciMMIR
    assert sum(s.eval_rows for s in SOURCES) == EVAL_TOTAL_ROWS == 970_944 + 16_263
    assert {s.slug: s.eval_split for s in SOURCES if s.eval_split != "test"} == {"food101": "validation"}
    assert by_slug("ucf101").eval_rows == 697_222 and by_slug("caltech101").eval_rows == 6_084


def test_eval_rows_equal_mtebs_descriptive_stats():
    stats = mteb_stats("ZeroShotClassification")
    published = 0
    for s in SOURCES:
        splits = json.loads((stats / f"{s.mteb_task}.json").read_text())
        assert {k: v["num_samples"] for k, v in splits.items()} == {s.eval_split: s.eval_rows}, s.slug
        published += splits[s.eval_split]["num_samples"]
    assert EVAL_TOTAL_ROWS == published


def test_hub_reads_go_to_the_pinned_revision():
    assert repo_root(by_slug("cifar10"), "hf") == "hf://datasets/mteb/cifar10@69a62dd171e24a133d193073e73fda4dbb823266"
    assert repo_root(by_slug("cifar10"), "s3://b/mirror") == "s3://b/mirror/mteb/cifar10"


def test_count_check_names_the_dataset():
    expected = {s.slug: s.rows for s in SOURCES}
    check_counts(dict(expected), expected)
    with pytest.raises(UserError, match=r"^row count mismatch: cifar100: 49,999 rows, expected 50,000$"):
        check_counts({**expected, "cifar100": 49_999}, expected)
    with pytest.raises(UserError, match=r"gtsrb: 0 rows, expected 26,640"):
        check_counts({k: v for k, v in expected.items() if k != "gtsrb"}, expected)
    evals = {s.slug: s.eval_rows for s in SOURCES}
    check_counts(dict(evals), evals, EVAL_TOTAL_ROWS)
    with pytest.raises(UserError, match=r"^the 23 datasets have 987,207 rows, expected 4,434,196$"):
        check_counts(dict(evals), evals)


def test_select_keeps_catalog_order_and_rejects_unknown_names():
    assert [s.slug for s in select("dtd,cifar10")] == ["cifar10", "dtd"]
    with pytest.raises(UserError, match=r"^unknown dataset 'imagenet'; valid: ucf101, imagenet1k, "):
        select("imagenet")


def test_the_table_schema_is_what_datasets_writes():
    """table.SCHEMA spells out HF's features metadata; `datasets` itself must agree, metadata included."""
    import datasets

    from mieb_ray.formats import TRAIN_SCHEMA as SCHEMA

    features = datasets.Features({"key": datasets.Value("string"), "image": datasets.Image(),
                                  "text": datasets.Value("string"), "label": datasets.Value("int64"),
                                  "class_name": datasets.Value("string"), "dataset_name": datasets.Value("string")})
    assert SCHEMA.equals(features.arrow_schema, check_metadata=True)
    assert datasets.Features.from_arrow_schema(SCHEMA) == features
