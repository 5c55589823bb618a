"""`eval --model` against mteb's own run of the model (mteb.evaluate with mteb's CLIP wrapper: AutoProcessor,
float32, raw vectors) on the same hub-layout mirror: a task of each hand-built suite that scores from the 23
sources' splits. The linear probe's logistic regression and k-means see the vectors' lengths, so they are given the
model's raw vectors as mteb's wrapper gives them; the cosine scorers are the same either way."""

from __future__ import annotations

import glob
import hashlib
import os

import pyarrow.parquet as pq
import pytest
from support.mteb_tasks import assert_same_scores, mteb_result, ours

from mieb_ray.demo_data.mirror import make_mirror
from mieb_ray.demo_data.models import make_tiny_clip
from mieb_ray.io import embeddings
from mieb_ray.pipelines import embed as embed_job

TASKS = ["CIFAR10ZeroShot", "CIFAR10", "CIFAR10Clustering"]


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mirror"))
    make_mirror(root, rows=60, datasets=["cifar10"], eval_rows=80)
    model = make_tiny_clip(str(tmp_path_factory.mktemp("model")))
    out = str(tmp_path_factory.mktemp("out"))
    return root, model, ours(TASKS, root, model, out), out


@pytest.mark.parametrize("task", TASKS)
def test_eval_with_a_model_equals_mtebs_own_run_of_it(scored, task):
    root, model, results, _ = scored
    assert_same_scores(results[task], mteb_result(task, root, model))


def _split(root: str, split: str) -> list[bytes]:
    """The mirror's image bytes of a split, in the hub's row order."""
    files = sorted(glob.glob(os.path.join(root, "mteb", "cifar10", "data", f"{split}-*.parquet")))
    return [v["bytes"] for f in files for v in pq.read_table(f, columns=["img"])["img"].to_pylist()]


def test_each_image_is_encoded_once_across_the_suites_and_never_again(scored, monkeypatch):
    """The three suites read the same 80 test images (and the probe its drawn train rows): the run's cache holds
    each distinct picture once, by the sha256 of the mirror's bytes, and a second run encodes nothing."""
    root, model, results, out = scored
    cache = os.path.join(out, "embeddings", "cache")
    (folder,) = [os.path.join(cache, d) for d in os.listdir(cache) if not d.startswith("_")]
    encoded = [k for d in sorted(os.listdir(folder)) if d.startswith("images-")
               for k in embeddings.read_all(os.path.join(folder, d))[0]]
    drawn = embeddings.read_all(os.path.join(out, "linear_probe", "embeddings", "images"))[0]  # <slug>/<row>
    train = _split(root, "train")
    wanted = set(_split(root, "test")) | {train[int(k.rsplit("/", 1)[1])] for k in drawn}
    assert sorted(encoded) == sorted(f"sha256:{hashlib.sha256(b).hexdigest()}" for b in wanted)
    served = sum(len(embeddings.read_all(os.path.join(out, suite, "embeddings", images))[0])
                 for suite, images in (("zeroshot", "images"), ("linear_probe", "images-1"), ("clustering", "images")))
    assert served == 3 * 80  # each suite read every test row, keyed its own way

    calls = []
    monkeypatch.setattr(embed_job, "embed_table", lambda *a, **k: calls.append(a))
    again = ours(TASKS, root, model, out, overwrite=True)
    assert calls == []
    assert {t: again[t]["scores"] for t in TASKS} == {t: results[t]["scores"] for t in TASKS}
