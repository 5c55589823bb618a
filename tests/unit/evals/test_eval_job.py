"""`mieb-ray eval --tasks`: mteb's task names dispatched through one registry to their suites, several suites from
one set of embeddings, each suite's outputs equal to its own command's (eval-biovita, eval-zeroshot)."""

from __future__ import annotations

import glob
import json
import os
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
from support.embedding_fixtures import make_biovita_embeddings, make_zeroshot_embeddings, write_embeddings

from mieb_ray.cli import main
from mieb_ray.demo_data.biovita import make_biovita_mirror
from mieb_ray.demo_data.mirror import make_mirror
from mieb_ray.errors import UserError
from mieb_ray.evals import registry
from mieb_ray.evals.zeroshot import GALLERY_IMAGES
from mieb_ray.evals.zeroshot_tasks import select_tasks
from mieb_ray.io import embeddings

pytestmark = pytest.mark.timeout(600)
ZS = "CIFAR100ZeroShot"


def test_task_names_select_their_suites():
    biovita, zeroshot, probe, clusters, retrieval, rest = registry.SUITES
    chosen = registry.select(f"{ZS},BioVITAT2IReranking,RenderedSST2")
    assert [(s.name, names) for s, names in chosen] == [("biovita", ["BioVITAT2IReranking"]),
                                                        ("zeroshot", ["CIFAR100ZeroShot", "RenderedSST2"])]
    assert [len(names) for _, names in registry.select("all")] == [1, 23, 19, 2, 2, 87]  # 87: through mteb's code
    assert registry.select("CIFAR10,CIFAR10ZeroShot")[1][0].name == "linear_probe"  # the probe's name is mteb's
    assert registry.select(None, (zeroshot,))[0][1] == list(zeroshot.tasks)
    with pytest.raises(UserError, match=r"^unknown eval task 'CIFAR1000ZeroShot' \(did you mean CIFAR100ZeroShot\?\); "
                                        r"valid: all, MIEB\(Multilingual\), MIEB\(eng\), MIEB\(lite\), MIEB\(Img\), "
                                        r"BioVITAT2IReranking, "):
        registry.select("CIFAR1000ZeroShot")
    for typed, meant in (("MIEB(Lite)", "MIEB(lite)"), ("cifar10zeroshot", "CIFAR10ZeroShot"),
                         ("MIEB lite", "MIEB(lite)")):
        with pytest.raises(UserError, match=rf"^unknown eval task '{re.escape(typed)}' \(did you mean "
                                            rf"{re.escape(meant)}\?\); valid: "):
            registry.select(typed)
    with pytest.raises(UserError, match=r"^unknown eval task 'Nope'; valid: "):  # nothing close: no guess
        registry.select("Nope")
    with pytest.raises(UserError, match="unknown eval task 'BioVITAT2IReranking'"):  # eval-zeroshot's own tasks only
        registry.select("BioVITAT2IReranking", (zeroshot,))


def test_the_biovita_cards_task_name_selects_mteb_s_task(tmp_path, capsys):
    """The card's `mteb.get_task("BioVITAT2IRetrieval")` names a task mteb 2.26.24 calls BioVITAT2IReranking."""
    biovita, zeroshot, *_ = registry.SUITES
    chosen = registry.select(f"BioVITAT2IRetrieval,{ZS}")
    assert [(s.name, names) for s, names in chosen] == [("biovita", list(biovita.tasks)), ("zeroshot", [ZS])]
    assert capsys.readouterr().out.splitlines() == [f"[eval] BioVITAT2IRetrieval is mteb's {biovita.tasks[0]} "
                                                    "(the name on its dataset card)"]
    with pytest.raises(UserError, match="^unknown eval task 'BioVITAT2IRetrieval'; "):  # not a zero-shot task
        registry.select("BioVITAT2IRetrieval", (zeroshot,))
    # through the command: the name passes the task check (the next refusal is the missing embeddings); a
    # misspelt one is still refused in one line, before anything runs
    out = str(tmp_path / "out")
    assert main(["eval", "--tasks", "BioVITAT2IRetrieval", "--out", out]) == 1
    seen = capsys.readouterr()
    assert f"BioVITAT2IRetrieval is mteb's {biovita.tasks[0]}" in seen.out
    assert seen.err.startswith("mieb-ray: error: give either --model, or --image-embeddings")
    assert main(["eval", "--tasks", "BioVITAT2IRetreival", "--out", out]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mieb-ray: error: unknown eval task 'BioVITAT2IRetreival'; valid: all, ")
    assert err.count("\n") == 1 and "BioVITAT2IRetrieval" not in err


def _merged(parts: list[str], out: str, modality: str) -> str:
    """One embed output holding the rows of several."""
    keys, vectors = zip(*(embeddings.read_all(p) for p in parts))
    write_embeddings(out, [k for ks in keys for k in ks], np.concatenate(vectors), modality, "float32", 2, {})
    return out


def test_one_command_scores_several_suites_as_their_own_commands_do(ray_local, tmp_path):
    data = str(tmp_path / "mirror")
    task = select_tasks(ZS)[0]
    make_mirror(data, rows=2, datasets=[task.slug], files=1, eval_rows=20)
    make_biovita_mirror(data)  # both benchmarks in one mirror
    bio, zs = tmp_path / "bio", tmp_path / "zs"
    make_biovita_embeddings(data, str(bio / "img"), str(bio / "txt"), dim=16)
    make_zeroshot_embeddings([task], {task.slug: 20}, str(zs / "img"), str(zs / "txt"), dim=16)
    images = _merged([str(bio / "img"), str(zs / "img")], str(tmp_path / "images"), "image")
    texts = _merged([str(bio / "txt"), str(zs / "txt")], str(tmp_path / "texts"), "text")
    flags = ["--sources", data, "--image-embeddings", images, "--text-embeddings", texts]
    out = tmp_path / "eval"
    assert main(["eval", "--tasks", f"BioVITAT2IReranking,{ZS}", *flags, "--out", str(out)]) == 0
    assert main(["eval-biovita", *flags, "--out", str(tmp_path / "biovita")]) == 0
    assert main(["eval-zeroshot", "--tasks", ZS, "--data", data, *flags[2:], "--out", str(tmp_path / "zeroshot")]) == 0

    def scores(path) -> dict:
        return json.loads(open(path).read())["scores"]

    assert scores(out / "biovita" / "BioVITAT2IReranking.json") == \
        scores(tmp_path / "biovita" / "BioVITAT2IReranking.json")
    assert scores(out / "zeroshot" / f"{ZS}.json") == scores(tmp_path / "zeroshot" / f"{ZS}.json")
    # the report's gallery: how many of the misclassified images it shows; chance beside the accuracies
    predictions = pq.read_table(out / "zeroshot" / "predictions.parquet").to_pylist()
    wrong = sum(r["mteb_pred"] != r["label"] for r in predictions if r["task"] == ZS)
    html = (out / "zeroshot" / "report.html").read_text()
    shown = html.split(f"<h3>{ZS} (", 1)[1].split("</h3>", 1)[0]
    assert 0 < wrong and shown == f"{min(wrong, GALLERY_IMAGES)} of {wrong} shown)", shown
    summary = json.loads((out / "zeroshot" / "summary.json").read_text())["tasks"][0]
    assert summary["misclassified"] == wrong
    assert f"<td>{summary['classes']}</td><td>{100 / summary['classes']:.2f}%</td>" in html  # 1 / classes
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["format"] == "mieb-eval" and manifest["tasks"] == ["BioVITAT2IReranking", ZS]
    assert sorted(os.listdir(out / "biovita")) == sorted(os.listdir(tmp_path / "biovita"))
    # one suite: its outputs in OUT itself, as eval-biovita writes them
    assert main(["eval", "--tasks", "BioVITAT2IReranking", *flags, "--out", str(tmp_path / "one")]) == 0
    assert sorted(os.listdir(tmp_path / "one")) == sorted(os.listdir(tmp_path / "biovita"))


def test_missing_embeddings_are_named_in_one_line(tmp_path, capsys):
    """Precomputed inputs: what a chosen task lacks is named before anything is read."""
    images = str(tmp_path / "img")
    write_embeddings(images, ["a"], np.ones((1, 2), np.float32), "image", "float32", 1, {})

    def error(*flags: str) -> str:
        assert main(["eval", *flags, "--sources", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1
        return lines[0]

    assert error("--tasks", "CIFAR10", "--text-embeddings", images) == "mieb-ray: error: --image-embeddings is needed"
    assert error("--tasks", f"CIFAR10,{ZS}", "--text-embeddings", images) == (
        f"mieb-ray: error: --image-embeddings is needed (and --text-embeddings: {ZS} needs both)")
    assert error("--tasks", f"CIFAR10,{ZS}", "--image-embeddings", images) == (
        f"mieb-ray: error: {ZS} needs --text-embeddings too")


@pytest.fixture
def two_suites(tmp_path):
    """A mirror of cifar10 and image embeddings for two image-only suites: CIFAR10 (linear probe) and
    CIFAR10Clustering, keyed as mieb-train and the eval splits key their rows."""
    mirror = str(tmp_path / "mirror")
    make_mirror(mirror, rows=40, datasets=["cifar10"], files=1, eval_rows=30)
    keys = [f"cifar10/{i}" for i in range(40)] + [f"cifar10/test/{i}" for i in range(30)]
    vectors = np.random.default_rng(0).normal(size=(len(keys), 8)).astype(np.float32)
    images = str(tmp_path / "images")
    write_embeddings(images, keys, vectors, "image", "float32", 2, {})
    return mirror, images


def eval_argv(mirror: str, images: str, out, tasks: str = "CIFAR10,CIFAR10Clustering") -> list[str]:
    return ["eval", "--tasks", tasks, "--data", mirror, "--image-embeddings", images, "--out", str(out),
            "--executor", "local"]


def test_an_interrupted_eval_resumes_the_suites_it_had_not_scored(two_suites, tmp_path, monkeypatch, capsys):
    """The one job lifecycle: a run stopped after its first suite is unfinished (refused without --resume or
    --overwrite); --resume scores the other suite only, and ends where an uninterrupted run ends."""
    from mieb_ray.evals import protocol

    mirror, images = two_suites
    whole = tmp_path / "whole"
    assert main(eval_argv(mirror, images, whole)) == 0
    score, scored = protocol.score, []

    def stop_at_the_second(suite, *args, **kwargs):
        if scored:
            raise KeyboardInterrupt
        scored.append(suite.kind.name)
        return score(suite, *args, **kwargs)

    monkeypatch.setattr(protocol, "score", stop_at_the_second)
    out = tmp_path / "out"
    assert main(eval_argv(mirror, images, out)) == 130
    assert not (out / "_manifest.json").exists() and (out / "linear_probe" / "CIFAR10.json").exists()
    capsys.readouterr()
    assert main(eval_argv(mirror, images, out)) == 1
    assert capsys.readouterr().err.startswith(f"mieb-ray: error: {out} holds an unfinished run of eval (")
    monkeypatch.setattr(protocol, "score", score)
    assert main([*eval_argv(mirror, images, out), "--resume"]) == 0
    logged = capsys.readouterr().out
    assert "[eval] linear_probe: scored by the run being resumed (CIFAR10)" in logged
    assert logged.count("[eval] in this process") == 1  # one suite scored: the clustering
    for name in ("linear_probe/CIFAR10.json", "clustering/CIFAR10Clustering.json"):
        assert json.loads((out / name).read_text())["scores"] == json.loads((whole / name).read_text())["scores"]
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["suites"] == {"linear_probe": "linear_probe", "clustering": "clustering"}
    assert not (out / "_progress").exists()


def test_a_rerun_with_other_tasks_leaves_none_of_the_old_ones(two_suites, tmp_path, capsys):
    """--overwrite replaces a complete output whole: a task the new run does not score is gone, not left stale."""
    mirror, images = two_suites
    out = tmp_path / "out"
    assert main(eval_argv(mirror, images, out, "CIFAR10")) == 0
    assert (out / "CIFAR10.json").exists()
    assert main([*eval_argv(mirror, images, out, "CIFAR10Clustering"), "--overwrite"]) == 0
    assert sorted(os.listdir(out)) == ["CIFAR10Clustering.json", "_manifest.json", "report.html", "summary.json"]


def test_an_eval_first_says_what_it_will_score(two_suites, tmp_path, capsys):
    """Before anything slow: mteb's import, Ray's start and the model's info took 15 s before the first step's line
    (MIEB(lite) on a local Ray)."""
    mirror, images = two_suites
    assert main(eval_argv(mirror, images, tmp_path / "out")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"[eval] 2 tasks (linear_probe 1, clustering 1) -> {tmp_path / 'out'}"
    assert lines[-1].startswith("[eval] 2 tasks in ")


def test_a_results_dir_that_cannot_be_made_fails_before_the_scoring(two_suites, tmp_path, capsys):
    """--results-dir is written last: a folder under a file is one line at the start, and the run leaves no OUT."""
    mirror, images = two_suites
    (tmp_path / "file").write_text("")
    argv = eval_argv(mirror, images, tmp_path / "out") + ["--results-dir", str(tmp_path / "file" / "results")]
    assert main(argv) == 1
    seen = capsys.readouterr()
    assert seen.err == f"mieb-ray: error: cannot make the output folder {tmp_path / 'file' / 'results'}: " \
                       "Not a directory\n"
    assert "[eval] mean" not in seen.out and not (tmp_path / "out").exists()


def test_what_a_suites_plan_runs_on_its_own_starts_before_any_suite_plans(tiny_clip, tmp_path):
    """With --model, the mteb suite's task loads (tasks, on Ray: start_plan) are submitted before any suite plans,
    so that on a cluster they run while the hand-built suites build their eval splits from the driver; then each
    suite's plan in turn (the mteb suite's waits for its loads)."""
    from mieb_ray.evals import job, protocol
    from mieb_ray.runtime.cluster import RunContext

    events = []

    class Building:  # a hand-built suite's shape: its plan is the driver's work
        name = "building"

        def embed_plan(self, out, cache, log, executor="auto", ctx=None):
            events.append(f"{self.name}: plan")
            return protocol.Plan({"images": [], "texts": []}, lambda indexes: (self.name, None))

    class Loading(Building):  # the mteb suite's: its loads submitted first, waited for in its plan
        name = "loading"

        def start_plan(self, out, cache, executor="auto", ctx=None):
            events.append(f"{self.name}: start")

    config = job.EvalConfig(out=str(tmp_path / "out"), model=tiny_clip)
    todo = [("building", Building()), ("loading", Loading())]
    got = job._embedded(config, todo, {name: str(tmp_path / name) for name, _ in todo}, print, RunContext())
    assert events == ["loading: start", "building: plan", "loading: plan"]
    assert got == {"building": ("building", None), "loading": ("loading", None)}


def test_a_task_left_with_nothing_to_score_clean_says_why_and_the_run_goes_on(tiny_clip, tmp_path):
    """An audit that flagged every eval image of the tasks mieb-ray scores by hand (zero-shot, linear probe,
    clustering, SciMMIR retrieval): nothing is left to score them clean (mteb fails on an empty split), so each
    clean block is an error line beside the images left out, the task's own scores are those of a run without
    --exclude, and the run ends (it ended in sklearn's traceback, after all the embedding). A linear probe whose
    train rows the audit left of one label only cannot be fit clean either."""
    from support.contamination import audit_output

    mirror = str(tmp_path / "mirror")
    make_mirror(mirror, rows=20, eval_rows=5, datasets=["cifar10", "scimmir"])
    names = ("CIFAR10ZeroShot", "CIFAR10", "CIFAR10Clustering", "SciMMIRI2TRetrieval", "SciMMIRT2IRetrieval")

    out = tmp_path / "out"

    def run(*flags: str, tasks: tuple = names) -> dict:  # one output: the embeddings of the first run are reused
        assert main(["eval", "--tasks", ",".join(tasks), "--sources", mirror, "--model", tiny_clip, "--out", str(out),
                     "--executor", "local", "--overwrite", *flags]) == 0
        return {p.stem: json.loads(p.read_text()) for p in out.glob("**/*.json") if p.stem in names}

    official = run()
    every = audit_output(tmp_path / "audit-every", [(f"elsewhere/{i}", f"{slug}/test/{i}", "exact") for i in range(5)
                                              for slug in ("cifar10", "scimmir")])
    flagged = run("--exclude", every)
    assert sorted(flagged) == sorted(names)
    for name, result in flagged.items():
        assert result["scores"] == official[name]["scores"], name
        clean = result["mieb_ray"]["clean"]
        rows = "rows" if name.startswith("SciMMIR") else "eval images"
        assert clean["error"] == f"cannot score {name} without the flagged rows: the audit flagged all 5 {rows}"
        assert clean["left_out"]["eval"] == {"any": 5, "exact": 5} and "main_score" not in clean, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"]["CIFAR10"]["clean_error"] == \
        "cannot score CIFAR10 without the flagged rows: the audit flagged all 5 eval images"

    labels = [y for path in sorted(glob.glob(f"{mirror}/mteb/cifar10/data/train-*.parquet"))
              for y in pq.read_table(path)["label"].to_pylist()]
    one_label = audit_output(tmp_path / "audit-one-label", [(f"cifar10/{i}", "elsewhere/0", "pdq")
                                                      for i, y in enumerate(labels) if y != labels[0]])
    clean = run("--exclude", one_label, tasks=("CIFAR10",))["CIFAR10"]["mieb_ray"]["clean"]
    assert clean["error"] == "cannot score CIFAR10 without the flagged rows: the audit left train rows of one label " \
                             "(a logistic regression needs two)"
    assert clean["left_out"]["train"] == {"any": len(labels) - labels.count(labels[0]), "pdq": 18}
