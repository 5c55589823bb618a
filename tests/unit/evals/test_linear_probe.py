"""MIEB's linear probe (mteb's ImageClassification tasks): our TaskResult equals `mteb.evaluate`'s on the same
embeddings, task by task, with the data read from a fixture mirror in the hub's layout: Parquet and WebDataset
sources, labels as ids and as names (Birdsnap), a binary task (PatchCamelyon: mteb's ap), STL10's 8 x 10
sampling, and Caltech101's background class (in mteb's train split, not in mieb-train)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from support.contamination import audit_output
from support.embedding_fixtures import write_embeddings
from support.mteb_reference import load_like_mteb, mteb_probe

from mieb_ray.demo_data.mirror import label_of, make_mirror
from mieb_ray.errors import UserError
from mieb_ray.evals import probe_tasks, registry
from mieb_ray.evals.job import evaluate
from mieb_ray.evals.probe_tasks import BY_NAME, samples

TASKS = ["CIFAR10", "Birdsnap", "GTSRB", "Caltech101", "PatchCamelyon", "STL10"]
TRAIN, EVAL, DIM = 50, 24, 16


def test_every_task_is_mtebs():
    """Name, repo, revision, splits, label column, sampling and classifier, against mteb's own task objects."""
    import mteb

    for task in probe_tasks.TASKS:
        theirs = mteb.get_task(task.name)
        source = task.source
        assert (theirs.metadata.dataset["path"], theirs.metadata.dataset["revision"]) == (source.repo, source.revision)
        assert theirs.metadata.eval_splits == [task.split] and type(theirs).train_split == "train"
        assert type(theirs).label_column_name == source.label_column
        assert (theirs.samples_per_label, theirs.n_experiments, theirs.seed) == \
            (task.samples_per_label, task.experiments, probe_tasks.SEED)
        assert theirs.evaluator_model.get_params()["max_iter"] == probe_tasks.MAX_ITER
        assert ("dataset_transform" in type(theirs).__dict__) == bool(task.drop_train), task.name
    assert len(probe_tasks.TASKS) == 19


@pytest.mark.parametrize("labels", [[0, 1, 0, 2, 1, 0, 3] * 9, ["b", "a", "c"] * 20 + ["d"]])
def test_sampling_is_mtebs(labels):
    """probe_tasks.samples against mteb's own `_undersample_data` loop."""
    import datasets
    import mteb

    task = mteb.get_task("CIFAR10")
    data = datasets.Dataset.from_dict({"label": labels})
    idxs, theirs = None, []
    for i in range(task.n_experiments):
        _, idxs, selected = task._undersample_data(data, i, idxs)
        theirs.append(selected)
    assert samples(labels, task.samples_per_label, task.n_experiments) == theirs
    assert samples(labels, 2, 3) != samples(labels, 2, 3, seed=7)


def vector(kind: str, slug: str, index: int) -> np.ndarray:
    """A fixed random vector per row, near its class's centre so the probe learns something."""
    rng = np.random.default_rng(abs(hash((kind, slug, index))) % 2**32)
    return rng.normal(size=DIM).astype(np.float32)


@pytest.fixture(scope="module")
def probe_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    mirror = str(root / "mirror")
    slugs = [BY_NAME[t].slug for t in TASKS]
    make_mirror(mirror, rows=TRAIN, datasets=slugs, eval_rows=EVAL)
    keys, rows, train, evaluated = [], [], {}, {}
    centres = {}
    for name in TASKS:
        task = BY_NAME[name]
        for i in range(TRAIN):
            c = label_of(task.source, i)
            centres.setdefault((task.slug, c), np.random.default_rng(len(centres)).normal(size=DIM))
            train[task.slug, i] = (centres[task.slug, c] + vector("t", task.slug, i)).astype(np.float32)
            keys.append(task.train_key(i))
            rows.append(train[task.slug, i])
        for i in range(EVAL):
            c = label_of(task.source, i)
            centres.setdefault((task.slug, c), np.random.default_rng(len(centres)).normal(size=DIM))
            evaluated[task.slug, i] = (centres[task.slug, c] + vector("e", task.slug, i)).astype(np.float32)
            keys.append(f"{task.key_prefix()}{i}")
            rows.append(evaluated[task.slug, i])
    keys += ["other/3", "cifar10/train/5", "prompt text"]  # keys of no task's: ignored
    rows += [np.ones(DIM, np.float32)] * 3
    order = np.random.default_rng(0).permutation(len(keys))  # shuffled across shards and two outputs
    half = len(order) // 2
    outputs = [str(root / "a"), str(root / "b")]
    for out, part in zip(outputs, (order[:half], order[half:])):
        write_embeddings(out, [keys[i] for i in part], np.stack(rows)[part], "image", "float32", 2, {})
    return mirror, ",".join(outputs), train, evaluated


@pytest.fixture(scope="module")
def mteb_results(probe_data):
    """{task: the TaskResult JSON mteb.evaluate writes} on probe_data's embeddings: the expectation."""
    mirror, _, train, evaluated = probe_data
    return {name: mteb_probe(name, os.path.join(mirror, BY_NAME[name].source.repo), BY_NAME[name].split,
                             {i: v for (s, i), v in train.items() if s == BY_NAME[name].slug},
                             {i: v for (s, i), v in evaluated.items() if s == BY_NAME[name].slug})
            for name in TASKS}


def assert_scores_equal(ours: dict, theirs: dict, name: str) -> None:
    """A TaskResult's scores equal mteb's, key by key (NaN where mteb has NaN)."""
    split = BY_NAME[name].split
    assert ours["task_name"] == theirs["task_name"] and ours["dataset_revision"] == theirs["dataset_revision"]
    mine, ref = ours["scores"][split][0], theirs["scores"][split][0]
    assert set(mine) == set(ref), name
    for key in ref:
        assert mine[key] == ref[key] or (mine[key] != mine[key] and ref[key] != ref[key]), (name, key)


def mteb_draws(name: str, repo: str, tmp: str) -> tuple:
    """The train rows mteb's own undersampling loop draws over a task's experiments (AbsTaskClassification's
    `_undersample_data`, as its evaluate() calls it), and the train split as `datasets` loads it."""
    import mteb

    task = mteb.get_task(name)
    data = load_like_mteb(repo, tmp)["train"]
    idxs, drawn = None, set()
    for i in range(task.n_experiments):
        _, idxs, selected = task._undersample_data(data, i, idxs)
        drawn.update(int(j) for j in selected)
    return drawn, data


def test_each_task_equals_mteb(probe_data, mteb_results, tmp_path):
    mirror, images, _, _ = probe_data
    out = str(tmp_path / "out")
    results = evaluate(registry.select(",".join(TASKS)), registry.Options(mirror), out,
                                      images=images, executor="local", log=print)
    for name in TASKS:
        assert_scores_equal(results[name], mteb_results[name], name)
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    accuracies = [mteb_results[name]["scores"][BY_NAME[name].split][0]["accuracy"] for name in TASKS]
    assert len(summary["tasks"]) == len(TASKS)
    assert {t["task"]: t["accuracy"] for t in summary["tasks"]} == dict(zip(TASKS, accuracies))
    assert summary["mean_accuracy"] == pytest.approx(sum(accuracies) / len(accuracies), abs=1e-12)


def test_missing_train_rows_are_one_line_naming_them(probe_data, tmp_path):
    """Caltech101's background rows are sampled by mteb but are not in mieb-train's embeddings: the message counts
    them among the rows mteb's own loop draws, and names them (the first five)."""
    mirror, images, train, evaluated = probe_data
    caltech = BY_NAME["Caltech101"]
    drawn, data = mteb_draws(caltech.name, os.path.join(mirror, caltech.source.repo), str(tmp_path / "hf"))
    label = data.features["label"].str2int("background_google")
    background = [i for i, y in enumerate(data["label"]) if y == label]
    missing = sorted(drawn & set(background))
    assert missing and len(missing) < len(drawn)
    keys = [caltech.train_key(i) for i in range(TRAIN) if i not in background] + \
        [f"{caltech.key_prefix()}{i}" for i in range(EVAL)]
    vectors = np.stack([train["caltech101", i] for i in range(TRAIN) if i not in background]
                       + [evaluated["caltech101", i] for i in range(EVAL)])
    partial = str(tmp_path / "partial")
    write_embeddings(partial, keys, vectors, "image", "float32", 1, {})
    examples = ", ".join(f"'caltech101/{i}'" for i in missing[:5])
    with pytest.raises(UserError, match=rf"^Caltech101: {len(missing)} of the {len(drawn)} train rows it samples have "
                                        rf"no embedding in .*partial \(e\.g\. {examples}\)$"):
        evaluate(registry.select("Caltech101"), registry.Options(mirror), str(tmp_path / "o"),
                                images=partial, executor="local", log=print)


def test_the_command_line_scores_from_several_outputs(probe_data, mteb_results, tmp_path, capsys):
    from mieb_ray.cli import main

    mirror, images, _, _ = probe_data
    out = tmp_path / "cli"
    assert main(["eval", "--tasks", "CIFAR10,STL10", "--sources", mirror, "--image-embeddings", images, "--out",
                 str(out), "--executor", "local"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["CIFAR10.json", "STL10.json", "_manifest.json", "report.html",
                                                     "summary.json"]
    for name in ("CIFAR10", "STL10"):
        assert_scores_equal(json.loads((out / f"{name}.json").read_text()), mteb_results[name], name)
    mean = sum(mteb_results[n]["scores"]["test"][0]["accuracy"] for n in ("CIFAR10", "STL10")) / 2
    assert f"[eval] mean linear-probe accuracy over 2 tasks: {mean:.4f} -> {out}" in capsys.readouterr().out


def test_with_a_model_it_embeds_only_the_drawn_rows_and_the_eval_splits(tiny_clip, tmp_path):
    """--model: the drawn train rows (Caltech101's background ones too, read from the source) and the eval splits
    embedded, then scored: the same scores as from those embeddings given precomputed."""
    mirror = str(tmp_path / "mirror")
    rows = {"cifar10": 400, "caltech101": TRAIN, "gtsrb": TRAIN}  # 400: more than mteb draws
    make_mirror(mirror, rows=rows, datasets=list(rows), eval_rows=EVAL)
    names = "CIFAR10,Caltech101,GTSRB"
    out = tmp_path / "out"
    first = evaluate(registry.select(names), registry.Options(mirror), str(out), model=tiny_clip,
                                    executor="local", log=print)
    train_emb, eval_emb = str(out / "embeddings" / "images"), str(out / "embeddings" / "images-1")
    from mieb_ray.io import embeddings

    train_vectors, eval_vectors = (dict(zip(*embeddings.read_all(e))) for e in (train_emb, eval_emb))
    caltech = BY_NAME["Caltech101"]
    background = {caltech.train_key(i) for i in range(TRAIN) if label_of(caltech.source, i) in caltech.source.drop}
    assert background and background <= set(train_vectors)  # mteb samples them: embedded from the source
    drawn = {}
    for name in names.split(","):
        task = BY_NAME[name]
        drawn[name] = mteb_draws(name, os.path.join(mirror, task.source.repo), str(tmp_path / "hf"))[0]
    # only the train rows mteb's loop draws, and every eval image
    assert set(train_vectors) == {BY_NAME[n].train_key(i) for n, rows_drawn in drawn.items() for i in rows_drawn}
    assert len(set(train_vectors)) < sum(rows.values())
    assert set(eval_vectors) == {f"{BY_NAME[n].key_prefix()}{i}" for n in drawn for i in range(EVAL)}
    for name in names.split(","):  # the model's embeddings scored as mteb scores them
        task = BY_NAME[name]
        theirs = mteb_probe(name, os.path.join(mirror, task.source.repo), task.split,
                            {i: train_vectors[task.train_key(i)] for i in drawn[name]},
                            {i: eval_vectors[f"{task.key_prefix()}{i}"] for i in range(EVAL)})
        assert_scores_equal(first[name], theirs, name)
    again = evaluate(registry.select(names), registry.Options(mirror), str(tmp_path / "again"),
                                    images=f"{train_emb},{eval_emb}", executor="local", log=print)
    for name in names.split(","):
        split = BY_NAME[name].split
        assert json.dumps(first[name]["scores"][split]) == json.dumps(again[name]["scores"][split])  # NaN == NaN


@pytest.mark.timeout(600)
def test_on_ray_as_in_process(ray_local, probe_data, tmp_path):
    """The label reads, shard reads, gathers and fits as Ray tasks: the same TaskResults."""
    mirror, images, _, _ = probe_data
    names = "CIFAR10,Birdsnap,GTSRB"
    runs = {where: evaluate(registry.select(names), registry.Options(mirror), str(tmp_path / where),
                                           images=images, executor=where, log=print) for where in ("ray", "local")}
    for name in names.split(","):
        split = BY_NAME[name].split
        assert json.dumps(runs["ray"][name]["scores"][split]) == json.dumps(runs["local"][name]["scores"][split])


def test_clean_scores_equal_mteb_on_the_filtered_splits(probe_data, tmp_path):
    """--exclude: each task also scored without the flagged eval images and, for the probe, without the flagged
    train rows before mteb's undersampling: equal to mteb on the splits without them."""
    mirror, images, train, evaluated = probe_data
    cifar, gtsrb = BY_NAME["CIFAR10"], BY_NAME["GTSRB"]
    pairs = [(cifar.train_key(3), f"{cifar.key_prefix()}0", "exact"),
             (cifar.train_key(17), f"{cifar.key_prefix()}5", "pixels"),
             (cifar.train_key(40), f"{cifar.key_prefix()}9", "exact"),
             (gtsrb.train_key(1), f"{gtsrb.key_prefix()}2", "near")]
    audit = audit_output(tmp_path / "audit", pairs)
    results = evaluate(registry.select("CIFAR10,GTSRB"), registry.Options(mirror, exclude=audit),
                                      str(tmp_path / "out"), images=images, executor="local", log=print)
    for name in ("CIFAR10", "GTSRB"):
        task = BY_NAME[name]
        gone_train = {int(t.split("/")[-1]) for t, _, _ in pairs if t.startswith(task.train_key(""))}
        gone_eval = {int(e.split("/")[-1]) for _, e, _ in pairs if e.startswith(task.key_prefix())}
        theirs = mteb_probe(name, os.path.join(mirror, task.source.repo), task.split,
                            {i: v for (s, i), v in train.items() if s == task.slug},
                            {i: v for (s, i), v in evaluated.items() if s == task.slug},
                            drop={"train": gone_train, "eval": gone_eval})["scores"][task.split][0]
        clean = results[name]["mieb_ray"]["clean"]
        for key in ("accuracy", "f1", "recall_weighted", "scores_per_experiment"):
            assert json.dumps(round_all(clean[key])) == json.dumps(theirs[key]), (name, key)
        assert clean["left_out"]["eval"]["any"] == len(gone_eval) and clean["eval_images"] == EVAL - len(gone_eval)
        assert clean["left_out"]["train"]["any"] == len(gone_train)
    assert results["CIFAR10"]["mieb_ray"]["clean"]["left_out"]["eval"] == {"any": 3, "exact": 2, "pixels": 1}


def round_all(value):
    """As mteb's TaskResult.to_disk writes floats."""
    if isinstance(value, dict):
        return {k: round_all(v) for k, v in value.items()}
    if isinstance(value, list):
        return [round_all(v) for v in value]
    return round(value, 6) if isinstance(value, float) else value


def test_one_page_for_the_whole_run(probe_data, tmp_path):
    """Several task types: OUT/report.html has a section per type, each task's score beside its clean score and
    what the audit left out, and links to each type's page."""
    mirror, images, _, _ = probe_data
    cifar = BY_NAME["CIFAR10"]
    audit = audit_output(tmp_path / "audit", [(cifar.train_key(1), f"{cifar.key_prefix()}{i}", "exact")
                                              for i in (2, 3)])
    out = tmp_path / "out"
    results = evaluate(registry.select("CIFAR10,Birdsnap"), registry.Options(mirror, exclude=audit),
                                      str(out), images=images, executor="local", log=print)
    page = (out / "report.html").read_text()
    assert "<h1>MIEB eval run</h1>" in page and "Linear probe" in page
    clean = results["CIFAR10"]["mieb_ray"]["clean"]["main_score"]
    assert f"<td>CIFAR10</td><td>{results['CIFAR10']['scores']['test'][0]['main_score']:.4f}</td>" \
        f"<td>{clean:.4f}</td>" in page
    assert "<td>2</td></tr>" in page  # CIFAR10's two flagged eval images
