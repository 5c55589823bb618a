"""The eval job equals mteb 2.26.24 on BLINK's and CV-Bench's multiple-choice tasks (VisionCentricQA), FGVCAircraft,
OxfordFlowersClassification, VOC2007 (multilabel), ImageNetDog15/ImageNet10/TinyImageNet clustering and
FGVCAircraftZeroShot: each task's fixture mirror (support.hub_tasks.tasks_misc, in the layout of the task's hub
repo) is read by mteb's own loaders and scored by `mteb.evaluate` with mteb's CLIP wrapper on the tiny CLIP
(support.mteb_tasks.mteb_result), and by the eval job on the same mirror and model (support.mteb_tasks.ours):
every metric of every split and subset agrees within 1e-6. The mirrors hold the data's pitfalls (modes other than
RGB, texts over CLIP's 77 tokens, repeated image bytes, one and several labels per row) and are what mteb reads."""

from __future__ import annotations

import glob
import io
import math
import os

import pyarrow.parquet as pq
import pytest
from PIL import Image
from support.hub_tasks.tasks_misc import TASKS
from support.mteb_tasks import assert_same_scores, mteb_result, redirect

NAMES = list(TASKS)
# the TaskResult's keys that are not scores: when and how long it ran, the phases' timings
NOT_SCORES = {"evaluation_time", "date", "evaluation_phases", "kg_co2_emissions"}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Every task's mirror under one root (the four CV-Bench tasks share one repo: written once)."""
    root = str(tmp_path_factory.mktemp("hub-misc"))
    for write in dict.fromkeys(TASKS.values()):
        write(root)
    return root


@pytest.fixture(scope="module")
def theirs(root, tiny_clip):
    return {name: mteb_result(name, root, tiny_clip) for name in NAMES}


@pytest.fixture(scope="module")
def ours(root, tiny_clip, tmp_path_factory):
    from support.mteb_tasks import ours as eval_job  # the eval job's results for all the tasks, in one call

    return eval_job(NAMES, root, tiny_clip, str(tmp_path_factory.mktemp("ours")))


# ------------------------------------------------------------------------------------------------ the scores


@pytest.mark.parametrize("name", NAMES)
def test_scores_equal_mtebs(name, theirs, ours):
    assert set(ours) == set(NAMES)
    assert_same_scores(ours[name], theirs[name])


def test_mtebs_scores_tell_implementations_apart(theirs):
    """Each task's reference has scores strictly between 0 and 1 (an all-0 or all-1 task would pass whatever the
    ranking or the predictions), and the classification tasks' experiments differ (the draws matter)."""
    for name, result in theirs.items():
        for entries in result["scores"].values():
            for entry in entries:
                values = [v for v in entry.values() if isinstance(v, float) and not math.isnan(v)]
                assert any(0 < v < 1 for v in values), name
                if "scores_per_experiment" in entry:
                    assert len({str(e) for e in entry["scores_per_experiment"]}) > 1, name


# ------------------------------------------------------------------------------------------------ the mirrors


def _table(repo: str, pattern: str) -> list[dict]:
    """The rows of the repo's files matching `pattern`, as pyarrow reads them (not `datasets`)."""
    files = sorted(glob.glob(os.path.join(repo, pattern)))
    assert files, (repo, pattern)
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def _mteb_loaded(name: str, root: str):
    import mteb

    task = redirect(mteb.get_task(name), root)
    assert task.metadata.dataset["path"].startswith(root)
    task.load_data()
    if hasattr(task, "convert_v1_dataset_format_to_v2"):
        task.convert_v1_dataset_format_to_v2(None)
    return task


def _check_blink(task, repo: str) -> None:
    data = task.dataset["default"]["test"]
    queries, corpus = _table(repo, "query-*.parquet"), _table(repo, "corpus-*.parquet")
    qrels = {}
    for row in _table(repo, "qrels-*.parquet"):
        qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = row["score"]
    assert list(data["queries"]["id"]) == [r["id"] for r in queries]
    assert list(data["queries"]["text"]) == [r["text"] for r in queries]
    assert list(data["corpus"]["id"]) == [r["id"] for r in corpus]
    assert data["relevant_docs"] == qrels
    assert {q: sorted(c) for q, c in data["top_ranked"].items()} == {q: sorted(c) for q, c in qrels.items()}


def _check_cv_bench(task, repo: str, subtask: str) -> None:
    data = task.dataset["default"]["test"]
    rows = [r for r in _table(repo, "data/test-*.parquet") if r["task"] == subtask]
    docs = list(dict.fromkeys(c for r in rows for c in r["choices"]))
    qrels = {f"query-test-{i}": {f"corpus-test-{docs.index(c)}": int(c == r["choices"]["ABCDEF".index(r["answer"][1])])
                                 for c in r["choices"]} for i, r in enumerate(rows)}
    assert rows and list(data["queries"]["text"]) == [r["question"] for r in rows]
    assert list(data["corpus"]["text"]) == docs
    assert data["relevant_docs"] == qrels
    assert {q: sorted(c) for q, c in data["top_ranked"].items()} == {q: sorted(c) for q, c in qrels.items()}


def _check_labels(task, repo: str) -> None:
    """Every split written is loaded (a zero-shot task keeps only its eval split), each with its rows' labels."""
    name, label = task.metadata.name, type(task).label_column_name
    written = {os.path.basename(f).split("-")[0] for f in glob.glob(os.path.join(repo, "data", "*.parquet"))}
    zero_shot = task.metadata.type == "ZeroShotClassification"
    assert set(task.dataset) == (set(task.metadata.eval_splits) if zero_shot else written), (name, sorted(task.dataset))
    if task.metadata.type == "ImageClassification":
        assert type(task).train_split in task.dataset, name
    for split, ds in task.dataset.items():
        assert list(ds[label]) == [r[label] for r in _table(repo, f"data/{split}-*.parquet")], (name, split)


@pytest.mark.parametrize("name", NAMES)
def test_mteb_reads_the_mirror(name, root):
    """mteb's own load_data (and dataset_transform) on the redirected task loads exactly the rows written."""
    task = _mteb_loaded(name, root)
    repo = task.metadata.dataset["path"]
    if name.startswith("BLINK"):
        _check_blink(task, repo)
    elif name.startswith("CVBench"):
        _check_cv_bench(task, repo, name.removeprefix("CVBench"))
    else:
        _check_labels(task, repo)


def _images(repo: str, column: str = "image") -> list[bytes]:
    return [r[column]["bytes"] for f in sorted(glob.glob(os.path.join(repo, "**", "*.parquet"), recursive=True))
            for r in pq.read_table(f).to_pylist() if r.get(column)]


def test_the_mirrors_hold_the_pitfalls(root, tiny_clip):
    from transformers import AutoTokenizer

    repo = lambda path: os.path.join(root, path)  # noqa: E731
    repos = ("blink-it2i-multi", "blink-it2t-multi", "CV-Bench", "FGVCAircraft", "oxford-flowers", "VOC2007",
             "imagenet-dog-15", "imagenet-10", "tiny-imagenet")
    every = [b for p in repos for b in _images(repo(f"mteb/{p}"))]
    modes = set()
    for data in every:
        with Image.open(io.BytesIO(data)) as im:
            modes.add((im.mode, "transparency" in im.info))
    assert {("RGB", False), ("L", False), ("RGBA", False), ("P", True), ("CMYK", False)} <= modes
    for path in ("mteb/blink-it2i-multi", "mteb/oxford-flowers", "mteb/VOC2007", "mteb/imagenet-dog-15"):
        images = _images(repo(path))
        assert len(set(images)) < len(images), path  # the same bytes twice
    classes = [len(r["classes"]) for r in _table(repo("mteb/VOC2007"), "data/*.parquet")]
    assert 1 in classes and max(classes) >= 3
    tokenizer = AutoTokenizer.from_pretrained(tiny_clip)
    for path, pattern, column in (("mteb/blink-it2i-multi", "query-*", "text"), ("mteb/blink-it2t-multi", "query-*",
                                  "text"), ("mteb/CV-Bench", "data/*", "question")):
        texts = [r[column] for r in _table(repo(path), pattern + ".parquet")]
        assert max(len(tokenizer(t)["input_ids"]) for t in texts) > 77, path
