"""`eval --model` against mteb's own run of the model (mteb.evaluate with mteb's CLIP wrapper: AutoProcessor,
float32, raw vectors) on the same hub-layout mirror: a task of each hand-built suite that scores from the 23
sources' splits. The linear probe's logistic regression and k-means see the vectors' lengths, so they are given the
model's raw vectors as mteb's wrapper gives them; the cosine scorers are the same either way."""

from __future__ import annotations

import pytest
from support.mteb_tasks import assert_same_scores, mteb_result, ours

from mieb_ray.demo_data.mirror import make_mirror
from mieb_ray.demo_data.models import make_tiny_clip

TASKS = ["CIFAR10ZeroShot", "CIFAR10", "CIFAR10Clustering"]


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mirror"))
    make_mirror(root, rows=60, datasets=["cifar10"], eval_rows=80)
    model = make_tiny_clip(str(tmp_path_factory.mktemp("model")))
    return root, model, ours(TASKS, root, model, str(tmp_path_factory.mktemp("out")))


@pytest.mark.parametrize("task", TASKS)
def test_eval_with_a_model_equals_mtebs_own_run_of_it(scored, task):
    root, model, results = scored
    assert_same_scores(results[task], mteb_result(task, root, model))
