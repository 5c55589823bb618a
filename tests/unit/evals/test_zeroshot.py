"""eval-zeroshot: prompts and scores equal mteb 2.26.24's zero-shot tasks, the fixed prompts beside them."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from support.embedding_fixtures import make_zeroshot_embeddings, write_embeddings, zeroshot_vectors
from support.evaluation import run_suite
from support.mteb_reference import mteb_zeroshot

from mieb_ray import storage
from mieb_ray.cli import main
from mieb_ray.demo_data.mirror import hub_names, make_mirror
from mieb_ray.errors import UserError
from mieb_ray.evals.zeroshot import ZeroShotSuite
from mieb_ray.evals.zeroshot_tasks import TASKS, select_tasks
from mieb_ray.io import embeddings

pytestmark = pytest.mark.timeout(600)

# a class with no test image (CIFAR100, 40 of 100 classes), exact ties (ImageNet's duplicate prompts; a zero
# image in every cosine task), both binary tasks (one per scorer), a validation split, Caltech's background,
# SciMMIR's class codes (mteb's class_code) and fixed candidate list
CHOSEN = ["Caltech101ZeroShot", "CIFAR100ZeroShot", "Food101ZeroShot", "Imagenet1kZeroShot", "PatchCamelyonZeroShot",
          "RenderedSST2", "SciMMIR"]
EVAL_ROWS = 40


def test_mteb_prompts_equal_get_candidate_labels_for_all_23():
    import mteb
    from datasets import ClassLabel, Dataset, Features

    assert len(TASKS) == 23
    for task in TASKS:
        theirs = mteb.get_task(task.name)
        assert theirs.metadata.eval_splits == [task.split], task.name
        assert theirs.metadata.dataset["revision"] == task.source.revision, task.name
        assert theirs.metadata.dataset["path"] == task.source.repo, task.name
        scorer = "softmax" if theirs.metadata.modalities == ["image", "text"] else "cosine"
        assert task.scorer == scorer, task.name
        names = hub_names(task.slug)
        if names:  # the label column's ClassLabel names are what mteb reads
            column = theirs.label_column_name
            theirs.dataset = {task.split: Dataset.from_dict({column: []}, features=Features({column: ClassLabel(
                names=names)}))}
        mine = task.mteb_prompts(names)
        assert mine == theirs.get_candidate_labels(), task.name
        fixed = task.fixed_prompts(names)
        assert len(fixed) == len(mine), task.name
        assert len(set(fixed)) == len(fixed) and not any("\n" in p or "  " in p for p in fixed), task.name


def test_fixed_prompts_fix_the_defects():
    imagenet = select_tasks("Imagenet1kZeroShot")[0]
    mteb_prompts, fixed = imagenet.mteb_prompts(None), imagenet.fixed_prompts(None)
    assert mteb_prompts[0] == "a photo of tench\n." and fixed[0] == "a photo of tench."
    assert mteb_prompts[657] == mteb_prompts[744]  # two classes, one prompt: mteb can never predict 744
    assert fixed[744] == "a photo of projectile." != fixed[657]
    clevr = select_tasks("CLEVRZeroShot")[0]
    assert clevr.mteb_prompts(None)[3] == " shapes." and clevr.fixed_prompts(None)[3] == "mid-distance shapes."


def test_unknown_task_lists_the_valid_ones():
    with pytest.raises(UserError, match=r"unknown zero-shot task 'CIFAR1000ZeroShot'; valid: BirdsnapZeroShot, .*"):
        select_tasks("CIFAR100ZeroShot,CIFAR1000ZeroShot")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("zs-mirror"))
    slugs = [t.slug for t in select_tasks(CHOSEN)]
    make_mirror(root, rows=4, datasets=slugs, files=1, eval_rows=EVAL_ROWS)
    return root


def _embed(tmp_path, tasks=CHOSEN, rows=EVAL_ROWS, **kw):
    images, texts = str(tmp_path / "img"), str(tmp_path / "txt")
    chosen = select_tasks(tasks)
    make_zeroshot_embeddings(chosen, {t.slug: rows for t in chosen}, images, texts, **kw)
    return images, texts


@pytest.mark.parametrize("where", ["ray", "local"])
def test_scores_equal_mteb_and_outputs(ray_local, data, tmp_path, where):
    images, texts = _embed(tmp_path)
    out = str(tmp_path / "out")
    lines = []
    results = run_suite(ZeroShotSuite(select_tasks(CHOSEN), data), out, images, texts, log=lines.append,
                           executor=where)
    chosen = select_tasks(CHOSEN)
    image_vectors, text_vectors = zeroshot_vectors(chosen, {t.slug: EVAL_ROWS for t in chosen})
    # exactly unit (or zero) vectors on a lattice: every cosine exact, so mteb's ties are ties on any CPU
    norms = {float((v.astype(np.float64) ** 2).sum()) for v in [*image_vectors.values(), *text_vectors.values()]}
    assert norms == {0.0, 1.0}
    for task in chosen:
        ours = json.loads(open(os.path.join(out, f"{task.name}.json")).read())
        assert ours == results[task.name]
        rows = np.stack([image_vectors[f"{task.key_prefix()}{i}"] for i in range(EVAL_ROWS)])
        theirs = mteb_zeroshot(task.name, os.path.join(data, task.source.repo), task.split, text_vectors, rows)
        mine, want = ours["scores"][task.split][0], theirs["scores"][task.split][0]
        assert set(mine) == set(want), task.name
        for key in want:
            assert mine[key] == want[key], (task.name, key)
        assert set(theirs) <= set(ours) and ours["dataset_revision"] == theirs["dataset_revision"]
        fixed = ours["mieb_ray"]["fixed_prompts"]
        assert fixed["accuracy"] - mine["accuracy"] == pytest.approx(ours["mieb_ray"]["difference"]["accuracy"])
    binary = {t: json.loads(open(os.path.join(out, f"{t}.json")).read())["scores"]["test"][0]
              for t in ("PatchCamelyonZeroShot", "RenderedSST2")}
    assert all(b["ap"] is not None for b in binary.values())

    predictions = pq.read_table(os.path.join(out, "predictions.parquet")).to_pylist()
    assert len(predictions) == EVAL_ROWS * len(CHOSEN)
    imagenet = [r for r in predictions if r["task"] == "Imagenet1kZeroShot"]
    # rows 0 and 2 of the fixture's ImageNet split are classes 744 and 657, whose mteb prompts are one text; their
    # images are that prompt's vector, so the two classes tie exactly (argmax: the first, 657), and mteb's prompts
    # can never predict 744
    assert [imagenet[0]["label"], imagenet[2]["label"]] == [744, 657]
    assert imagenet[0]["mteb_pred"] == imagenet[2]["mteb_pred"] == 657
    assert not any(r["mteb_pred"] == 744 for r in imagenet)
    cifar = [r for r in predictions if r["task"] == "CIFAR100ZeroShot"]
    assert cifar[0]["mteb_pred"] == 0 and cifar[0]["fixed_pred"] == 0  # the zero image: every class ties at 0

    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert [t["task"] for t in summary["tasks"]] == CHOSEN
    assert summary["tasks"][3]["mteb"]["accuracy"] == results["Imagenet1kZeroShot"]["scores"]["test"][0]["accuracy"]
    page = open(os.path.join(out, "report.html")).read()
    assert "Imagenet1kZeroShot" in page and "data:image" in page and "<svg" in page
    manifest = storage.read_manifest(out)
    assert set(manifest["files"]) >= {f"{t}.json" for t in CHOSEN} | {"summary.json", "report.html"}
    assert any("mean accuracy" in line for line in lines)


def test_in_process_equals_ray(ray_local, data, tmp_path):
    """executor local (the engine's tasks inline, no Ray) writes the same scores and predictions as Ray."""
    images, texts = _embed(tmp_path)
    outputs = {}
    for where in ("local", "ray"):
        out = tmp_path / where
        run_suite(ZeroShotSuite(select_tasks(CHOSEN), data), str(out), images, texts, log=lambda _: None,
                     executor=where)
        outputs[where] = ({t: json.loads((out / f"{t}.json").read_text())["scores"] for t in CHOSEN},
                          pq.read_table(out / "predictions.parquet").to_pylist(),
                          json.loads((out / "summary.json").read_text())["tasks"])
    assert outputs["local"] == outputs["ray"]


@pytest.mark.parametrize("where", ["ray", "local"])
def test_bad_input_is_one_line(ray_local, data, tmp_path, where):
    images, texts = _embed(tmp_path, rows=EVAL_ROWS - 3)  # the last 3 images of each task have no embedding
    suite = ZeroShotSuite(select_tasks("CIFAR10ZeroShot"), data)
    with pytest.raises(UserError, match=r"no cifar10 test files|mteb/cifar10"):  # a mirror without the repo
        run_suite(suite, str(tmp_path / "o1"), images, texts, executor=where)
    suite = ZeroShotSuite(select_tasks("CIFAR100ZeroShot"), data)
    with pytest.raises(UserError, match=r"CIFAR100ZeroShot: 3 of 40 images have no embedding in .*'cifar100/test/37'"):
        run_suite(suite, str(tmp_path / "o2"), images, texts, executor=where)
    assert storage.read_manifest(str(tmp_path / "o2")) is None

    images, texts = _embed(tmp_path / "b", tasks=["CIFAR100ZeroShot"])
    other, _ = _embed(tmp_path / "c", tasks=["CIFAR100ZeroShot"], dim=8)
    with pytest.raises(UserError, match="text embeddings have dim 16 but image embeddings dim 8"):
        run_suite(ZeroShotSuite(select_tasks("CIFAR100ZeroShot"), data), str(tmp_path / "o3"), other, texts,
                     executor=where)


def test_cli_with_embeddings(ray_local, data, tmp_path, capsys):
    """The command scores as mteb scores the same embeddings; a rerun into the same folder is refused without
    --overwrite and with it replaces its outputs whole: the second run's scores, nothing left of the first."""
    task = select_tasks("RenderedSST2")[0]
    out = str(tmp_path / "out")

    def run(images, texts, *flags) -> tuple[dict, dict]:
        """The command's TaskResult, and mteb's (the expectation) on the same embeddings."""
        assert main(["eval-zeroshot", "--tasks", task.name, "--data", data, "--image-embeddings", images,
                     "--text-embeddings", texts, "--out", out, *flags]) == 0
        vectors = dict(zip(*embeddings.read_all(images)))
        rows = np.stack([vectors[f"{task.key_prefix()}{i}"] for i in range(EVAL_ROWS)])
        theirs = mteb_zeroshot(task.name, os.path.join(data, task.source.repo), task.split,
                               dict(zip(*embeddings.read_all(texts))), rows)
        return json.loads(open(os.path.join(out, f"{task.name}.json")).read()), theirs

    images, texts = _embed(tmp_path, tasks=[task.name])
    first, theirs = run(images, texts)
    assert first["scores"][task.split][0] == theirs["scores"][task.split][0]
    assert main(["eval-zeroshot", "--tasks", "Nope", "--data", data, "--out", out, "--model", "x"]) == 1
    assert "unknown eval task 'Nope'; valid: all, BirdsnapZeroShot" in capsys.readouterr().err

    # a rerun on other embeddings replaces the outputs whole: the two classes' prompts swap vectors, so every image
    # is now scored nearer the wrong class (but the zero image, a tie)
    keys, vectors = embeddings.read_all(texts)
    swap = {}
    for prompts in (task.mteb_prompts(hub_names(task.slug)), task.fixed_prompts(hub_names(task.slug))):
        swap |= {prompts[0]: prompts[1], prompts[1]: prompts[0]}
    by_text = dict(zip(keys, vectors))
    swapped = str(tmp_path / "swapped")
    write_embeddings(swapped, list(keys), np.stack([by_text[swap.get(k, k)] for k in keys]), "text", "float32", 1, {})
    capsys.readouterr()
    assert main(["eval-zeroshot", "--tasks", task.name, "--data", data, "--image-embeddings", images,
                 "--text-embeddings", swapped, "--out", out]) == 1
    assert capsys.readouterr().err == (f"mieb-ray: error: {out} already holds complete eval results "
                                       "(_manifest.json); pass --overwrite to replace it\n")
    second, theirs = run(images, swapped, "--overwrite")
    assert second["scores"][task.split][0] == theirs["scores"][task.split][0]
    assert second["scores"][task.split][0]["accuracy"] < first["scores"][task.split][0]["accuracy"]
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert [t["mteb"]["accuracy"] for t in summary["tasks"]] == [second["scores"][task.split][0]["accuracy"]]
    manifest = storage.read_manifest(out)
    assert manifest["image_embeddings"] == images and manifest["text_embeddings"] == swapped
    assert sorted(os.listdir(out)) == sorted([*manifest["files"], storage.MANIFEST])  # nothing else, nothing stale


def test_cli_with_model_embeds_the_eval_splits_then_reuses_them(ray_local, data, tiny_clip, tmp_path, capsys):
    """--model: the eval splits are built through the build job, embedded with the model (images keyed
    <slug>/<split>/<index>, prompts keyed by their text), scored as mteb scores those same embeddings; a rerun
    finds every item in the run's cache."""
    chosen = ["CIFAR100ZeroShot", "RenderedSST2"]
    out = str(tmp_path / "out")
    argv = ["eval-zeroshot", "--tasks", ",".join(chosen), "--data", data, "--model", tiny_clip, "--out", out,
            "--workers", "1"]
    assert main(argv) == 0
    root = os.path.join(out, "embeddings")
    vectors = dict(zip(*embeddings.read_all(os.path.join(root, "images"))))
    prompts = dict(zip(*embeddings.read_all(os.path.join(root, "texts"))))
    assert len(vectors) == EVAL_ROWS * len(chosen)
    for task in select_tasks(chosen):
        assert set(task.mteb_prompts(hub_names(task.slug))) <= set(prompts)
        rows = np.stack([vectors[f"{task.key_prefix()}{i}"] for i in range(EVAL_ROWS)])
        theirs = mteb_zeroshot(task.name, os.path.join(data, task.source.repo), task.split, prompts, rows)
        ours = json.loads(open(os.path.join(out, f"{task.name}.json")).read())
        assert ours["scores"][task.split][0] == theirs["scores"][task.split][0], task.name
    capsys.readouterr()
    assert main([*argv, "--overwrite"]) == 0  # the results replaced, their embeddings and eval splits reused
    logged = capsys.readouterr().out
    (built,) = os.listdir(os.path.join(out, "eval-data"))  # the one eval-data build, reused
    reused = [line.split(": made from the same ")[0] for line in logged.splitlines() if " reusing " in line]
    assert reused == [f"[build] reusing {os.path.join(out, 'eval-data', built)}"]
    assert "[eval] every image is in the cache" in logged and "[eval] every text is in the cache" in logged
    assert " units, " not in logged  # nothing built or encoded again


def test_a_hub_model_without_a_revision_is_read_at_one_commit_for_the_whole_run(data, tiny_clip, tmp_path,
                                                                              monkeypatch, caplog):
    """The run resolves the hub's main once: its cache, its image and text embed jobs and its settings all name
    that commit (each resolved main anew, and a push to the model's repo mid-run would have split them), and the
    user is warned once that the model is not pinned."""
    from support import fakehub

    hub = fakehub.serve_models(monkeypatch, str(tmp_path / "hub"), {"someone/tiny-clip": tiny_clip})
    try:
        assert main(["eval-zeroshot", "--tasks", "CIFAR100ZeroShot", "--data", data, "--model", "someone/tiny-clip",
                     "--out", str(tmp_path / "out"), "--executor", "local"]) == 0
    finally:
        hub.stop()
    assert [path for _, path, _, _ in hub.requests if "/revision/" in path] == \
        ["/api/models/someone/tiny-clip/revision/main"]
    assert [r.getMessage() for r in caplog.records if "not pinned" in r.getMessage()] == \
        ["model someone/tiny-clip is not pinned: using the hub's current main (pass --revision to pin it)"]
    commit = fakehub.commit("someone/tiny-clip")
    for side in ("images", "texts"):
        made = storage.read_manifest(str(tmp_path / "out" / "embeddings" / side))
        assert made["model"]["revision"] == commit, side


def test_clean_scores_are_the_scores_of_the_images_the_audit_did_not_flag(data, tmp_path):
    """Each image's prediction stands alone, so mteb on the split without the flagged images scores what the
    official run predicted for the rest: the clean metrics are those, with the counts per detector."""
    from support.contamination import audit_output

    from mieb_ray.evals.zeroshot_scoring import metrics

    images, texts = _embed(tmp_path)
    task = select_tasks(CHOSEN)[0]
    gone = {1: "exact", 4: "near", 6: "exact"}
    audit = audit_output(tmp_path / "audit", [(f"{task.slug}/{i}", f"{task.key_prefix()}{i}", m)
                                              for i, m in gone.items()])
    out = tmp_path / "out"
    results = run_suite(ZeroShotSuite([task], data, exclude=audit), str(out), images, texts,
                           log=lambda _: None, executor="local")
    clean = results[task.name]["mieb_ray"]["clean"]
    rows = pq.read_table(out / "predictions.parquet").to_pylist()
    kept = [r for i, r in enumerate(rows) if i not in gone]
    want = metrics(np.array([r["label"] for r in kept]), np.array([r["mteb_pred"] for r in kept]),
                   np.zeros(len(kept)))
    assert clean["accuracy"] == want["accuracy"] and clean["f1"] == want["f1"]
    assert clean["images"] == EVAL_ROWS - 3 and clean["left_out"]["eval"] == {"any": 3, "exact": 2, "near": 1}


def test_text_embeddings_spread_over_several_outputs(data, tmp_path):
    """--text-embeddings takes several outputs, comma-separated, as --image-embeddings does (the prompts of one task
    in two embed outputs): the scores are mteb's on the same vectors."""
    task = select_tasks("RenderedSST2")[0]
    images, texts = _embed(tmp_path, tasks=[task.name])
    keys, vectors = embeddings.read_all(texts)
    half = len(keys) // 2
    parts = [str(tmp_path / "txt-a"), str(tmp_path / "txt-b")]
    for part, rows in zip(parts, (slice(0, half), slice(half, None))):
        write_embeddings(part, keys[rows], vectors[rows], "text", "float32", 1, {"fixture": "split"})
    out = str(tmp_path / "out")
    assert main(["eval", "--tasks", task.name, "--sources", data, "--image-embeddings", images,
                 "--text-embeddings", ",".join(parts), "--out", out]) == 0
    image_vectors = dict(zip(*embeddings.read_all(images)))
    rows = np.stack([image_vectors[f"{task.key_prefix()}{i}"] for i in range(EVAL_ROWS)])
    theirs = mteb_zeroshot(task.name, os.path.join(data, task.source.repo), task.split, dict(zip(keys, vectors)), rows)
    ours = json.loads(open(os.path.join(out, f"{task.name}.json")).read())
    assert ours["scores"][task.split][0] == theirs["scores"][task.split][0]
