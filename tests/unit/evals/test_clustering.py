"""MIEB's image clustering (CIFAR10Clustering, CIFAR100Clustering): our TaskResult equals `mteb.evaluate`'s on the
same embeddings, the eval split read from a fixture mirror in the hub's layout."""

from __future__ import annotations

import os

import numpy as np
from support.embedding_fixtures import write_embeddings
from support.mteb_reference import mteb_clustering

from mieb_ray.demo_data.mirror import label_of, make_mirror
from mieb_ray.evals import clustering, registry
from mieb_ray.evals.job import evaluate

ROWS, DIM = 120, 8


def test_every_task_is_mtebs():
    import mteb

    for task in clustering.TASKS:
        theirs = mteb.get_task(task.name)
        assert (theirs.metadata.dataset["path"], theirs.metadata.dataset["revision"]) == \
            (task.source.repo, task.source.revision)
        assert theirs.metadata.eval_splits == [task.split] and theirs.metadata.main_score == "nmi"
        assert type(theirs).label_column_name == task.source.label_column


def test_each_task_equals_mteb(tmp_path):
    mirror = str(tmp_path / "mirror")
    make_mirror(mirror, rows=2, datasets=["cifar10", "cifar100"], eval_rows=ROWS)
    keys, rows, by_task = [], [], {}
    rng = np.random.default_rng(0)
    for task in clustering.TASKS:
        centres = rng.normal(size=(100, DIM))
        vectors = {i: (centres[label_of(task.source, i)] + 0.8 * rng.normal(size=DIM)).astype(np.float32)
                   for i in range(ROWS)}
        by_task[task.name] = vectors
        keys += [f"{task.slug}/{task.split}/{i}" for i in vectors] + [f"{task.slug}/{i}" for i in range(3)]
        rows += list(vectors.values()) + [np.ones(DIM, np.float32)] * 3  # train keys: ignored
    images = str(tmp_path / "images")
    order = rng.permutation(len(keys))
    write_embeddings(images, [keys[i] for i in order], np.stack(rows)[order], "image", "float32", 2, {})
    out = str(tmp_path / "out")
    results = evaluate(registry.select("CIFAR10Clustering,CIFAR100Clustering"),
                                      registry.Options(mirror), out, images=images, executor="local", log=print)
    for task in clustering.TASKS:
        theirs = mteb_clustering(task.name, os.path.join(mirror, task.source.repo), task.split, by_task[task.name])
        mine, ref = results[task.name]["scores"][task.split][0], theirs["scores"][task.split][0]
        assert mine == ref, task.name
        assert 0 < mine["nmi"] < 1


def test_results_dir_round_trips_through_mtebs_loader(tmp_path):
    """--results-dir: mteb's ResultCache loads the TaskResults back with the same scores; a model trained on
    mieb-train names the MIEB tasks of its sources as training data, so they are not zero-shot for it."""
    import mteb

    mirror = str(tmp_path / "mirror")
    make_mirror(mirror, rows=2, datasets=["cifar10"], eval_rows=30)
    task = clustering.BY_NAME["CIFAR10Clustering"]
    rng = np.random.default_rng(1)
    keys = [f"cifar10/test/{i}" for i in range(30)]
    images = str(tmp_path / "images")
    write_embeddings(images, keys, rng.normal(size=(30, DIM)).astype(np.float32), "image", "float32", 1, {})
    cache = tmp_path / "cache"
    results = evaluate(registry.select(task.name), registry.Options(mirror), str(tmp_path / "out"),
                                      images=images, executor="local", results_dir=str(cache / "results"),
                                      trained_on_mieb_train=True, log=print)
    folder = cache / "results" / "fixture__biovita-random" / "no_revision_available"
    assert sorted(p.name for p in folder.iterdir()) == ["CIFAR10Clustering.json", "model_meta.json"]
    loaded = mteb.ResultCache(cache).load_results(models=["fixture/biovita-random"], tasks=[task.name],
                                                  include_remote=False)
    [model] = loaded.model_results
    [result] = model.task_results
    assert result.task_name == task.name
    assert result.scores[task.split][0]["nmi"] == results[task.name]["scores"][task.split][0]["nmi"]
    from mteb.models.model_meta import ModelMeta

    meta = ModelMeta.model_validate_json((folder / "model_meta.json").read_text())
    assert task.name in meta.training_datasets and "CIFAR10ZeroShot" in meta.training_datasets
    assert meta.is_zero_shot_on([mteb.get_task("CIFAR10ZeroShot")]) is False


def test_clean_scores_equal_mteb_without_the_flagged_images(tmp_path):
    from support.contamination import audit_output

    mirror = str(tmp_path / "mirror")
    make_mirror(mirror, rows=2, datasets=["cifar10"], eval_rows=ROWS)
    task = clustering.BY_NAME["CIFAR10Clustering"]
    rng = np.random.default_rng(2)
    centres = rng.normal(size=(10, DIM))
    vectors = {i: (centres[label_of(task.source, i)] + 0.8 * rng.normal(size=DIM)).astype(np.float32)
               for i in range(ROWS)}
    images = str(tmp_path / "images")
    write_embeddings(images, [f"cifar10/test/{i}" for i in vectors], np.stack(list(vectors.values())), "image",
                     "float32", 1, {})
    gone = {3, 7, 50, 51}
    audit = audit_output(tmp_path / "audit", [(f"cifar10/{i}", f"cifar10/test/{i}", "pixels") for i in gone])
    results = evaluate(registry.select(task.name), registry.Options(mirror, exclude=audit),
                                      str(tmp_path / "out"), images=images, executor="local", log=print)
    theirs = mteb_clustering(task.name, os.path.join(mirror, task.source.repo), task.split, vectors,
                             drop={"eval": gone})["scores"][task.split][0]
    clean = results[task.name]["mieb_ray"]["clean"]
    assert {k: round(clean[k], 6) for k in ("nmi", "v_measure", "ari", "cluster_accuracy")} == \
        {k: theirs[k] for k in ("nmi", "v_measure", "ari", "cluster_accuracy")}
    assert clean["images"] == ROWS - 4 and clean["left_out"]["eval"] == {"any": 4, "pixels": 4}
