"""MIEB's Compositionality tasks scored by the eval job equal mteb's own run, metric by metric: AROCocoOrder,
AROFlickrOrder, AROVisualAttribution, AROVisualRelation, SugarCrepe, Winoground, ImageCoDe, on fixture mirrors of
their hub repos (support/hub_tasks/compositionality.py: SugarCrepe's train split, ARO-Visual-Relation's shards,
ImageCoDe's query/corpus/qrels configs and its frames re-encoded by mteb's loader, pictures in palette, RGBA, LA,
greyscale, CMYK and EXIF-rotated files, one photo in several rows and in two tasks, captions past CLIP's 77 tokens, a
negative equal to its caption) with a tiny CLIP; mteb's run is mteb.evaluate with
mteb's own CLIP wrapper (support/mteb_tasks.py)."""

from __future__ import annotations

import math

import pytest
from support.hub_tasks import compositionality
from support.mteb_tasks import mteb_result, ours, redirect

from mieb_ray.demo_data.models import make_tiny_clip

NAMES = list(compositionality.TASKS)
# mteb's TaskResult rounds each score to 6 decimals: two scores a hair apart can round one step apart, and that
# step, 1e-6, computes as 1.000000000001e-06 in floating point; hence the 1e-12 of slack
TOL = 1e-6


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """Every task's repo under one root, and a tiny CLIP."""
    root = tmp_path_factory.mktemp("compositionality-mirror")
    for write in compositionality.TASKS.values():
        write(str(root))
    return str(root), make_tiny_clip(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def ours_results(mirror, tmp_path_factory):
    """The eval job's TaskResults of all the file's tasks, from one run."""
    root, model = mirror
    return ours(NAMES, root, model, str(tmp_path_factory.mktemp("out")))


@pytest.fixture(scope="module")
def theirs(mirror):
    """mteb's TaskResult of a task, run once per module."""
    root, model = mirror
    done: dict[str, dict] = {}

    def result(name: str) -> dict:
        if name not in done:
            done[name] = mteb_result(name, root, model)
        return done[name]

    return result


def assert_same_scores(got: dict, want: dict, tol: float = TOL) -> None:
    """The same splits, the same hf_subsets in each, the same metric keys in each; each float within `tol`
    (NaN only where the other is NaN), every other value equal."""
    assert got["task_name"] == want["task_name"]
    got_scores, want_scores = got["scores"], want["scores"]
    assert sorted(got_scores) == sorted(want_scores), "splits"
    for split, want_entries in want_scores.items():
        got_by = {e["hf_subset"]: e for e in got_scores[split]}
        want_by = {e["hf_subset"]: e for e in want_entries}
        assert len(got_by) == len(got_scores[split]), f"{split}: an hf_subset twice"
        assert sorted(got_by) == sorted(want_by), f"{split}: hf_subsets"
        for subset, want_entry in want_by.items():
            got_entry = got_by[subset]
            assert sorted(got_entry) == sorted(want_entry), f"{split}/{subset}: metric keys"
            for key, value in want_entry.items():
                mine, where = got_entry[key], f"{split}/{subset}/{key}: ours {got_entry[key]!r}, mteb {value!r}"
                if isinstance(value, float) or isinstance(mine, float):
                    assert isinstance(mine, (int, float)) and isinstance(value, (int, float)), where
                    if math.isnan(value) or math.isnan(mine):
                        assert math.isnan(value) and math.isnan(mine), where
                    else:
                        assert abs(mine - value) <= tol + 1e-12, where
                else:
                    assert mine == value, where


@pytest.mark.parametrize("name", NAMES)
def test_scores_equal_mtebs(name, ours_results, theirs):
    assert_same_scores(ours_results[name], theirs(name))


def test_mteb_scores_the_mirror(theirs):
    """Not vacuous: every task has a non-zero metric (the accuracies are counts of rows: with a random tiny CLIP
    some are 0 by construction, image_acc of one image against several texts, or by the model)."""
    for name in NAMES:
        (entry,) = theirs(name)["scores"]["test"]
        assert entry["hf_subset"] == "default"
        assert max(entry[k] for k in ("image_acc", "text_acc", "accuracy")) > 0, name


def _loaded_rows(task) -> dict[str, dict[str, int]]:
    """{hf_subset: {split: rows}} of what the task's load_data read (then unloaded), each row with every image and
    text column the evaluator reads."""
    task.load_data()
    try:
        columns = [*task.images_column_names, *task.texts_column_names]
        for ds in task.dataset.values():
            assert set(columns) <= set(ds.column_names)
        return {"default": {split: ds.num_rows for split, ds in task.dataset.items()}}
    finally:
        task.unload_data()


@pytest.mark.parametrize("name", NAMES)
def test_mteb_reads_every_row_of_the_mirror(name, mirror):
    """mteb's own load_data (ImageCoDe's and SugarCrepe's their own), pointed at the mirror, reads the rows
    written."""
    import mteb

    root, _ = mirror
    assert _loaded_rows(redirect(mteb.get_task(name), root)) == compositionality.ROWS[name]
