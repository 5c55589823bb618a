"""MIEB's Compositionality tasks scored by the eval job equal mteb's own run, metric by metric: AROCocoOrder,
AROFlickrOrder, AROVisualAttribution, AROVisualRelation, SugarCrepe, Winoground, ImageCoDe, on fixture mirrors of
their hub repos (support/hub_tasks/compositionality.py: SugarCrepe's train split, ARO-Visual-Relation's shards,
ImageCoDe's query/corpus/qrels configs and its frames re-encoded by mteb's loader, pictures in palette, RGBA, LA,
greyscale, CMYK and EXIF-rotated files, one photo in several rows and in two tasks, captions past CLIP's 77 tokens, a
negative equal to its caption) with a tiny CLIP; mteb's run is mteb.evaluate with
mteb's own CLIP wrapper (support/mteb_tasks.py)."""

from __future__ import annotations

import functools

import pytest
from support.hub_tasks import compositionality
from support.mteb_tasks import assert_same_scores, mteb_result, ours, redirect

NAMES = list(compositionality.TASKS)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory, tiny_clip):
    """Every task's repo under one root, and a tiny CLIP."""
    root = tmp_path_factory.mktemp("compositionality-mirror")
    for write in compositionality.TASKS.values():
        write(str(root))
    return str(root), tiny_clip


@pytest.fixture(scope="module")
def ours_results(mirror, tmp_path_factory):
    """The eval job's TaskResults of all the file's tasks, from one run."""
    root, model = mirror
    return ours(NAMES, root, model, str(tmp_path_factory.mktemp("out")))


@pytest.fixture(scope="module")
def theirs(mirror):
    """mteb's TaskResult of a task, run once per module."""
    root, model = mirror
    return functools.cache(lambda name: mteb_result(name, root, model))


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
