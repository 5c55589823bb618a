"""The run's page, OUT/report.html, and summary.json (evals/run_report.py): one table per mteb task type with its
tasks and means, the benchmarks' means; written by a run of several suites, and by a run of one suite that makes no
page of its own (the mteb suite), whose --results-dir mteb's ResultCache reads back whole."""

from __future__ import annotations

import json
import re

import numpy as np
from support.embedding_fixtures import write_embeddings
from support.hub_tasks import sts
from support.mteb_tasks import ours
from support.task_results import task_result, with_clean

from mieb_ray.demo_data.mirror import make_mirror
from mieb_ray.demo_data.models import make_tiny_clip
from mieb_ray.evals import registry, run_report
from mieb_ray.evals.job import evaluate
from mieb_ray.evals.summary import summarize


def _sections(page: str) -> dict[str, str]:
    """{an <h2> heading: its section}"""
    return dict(part.split("</h2>", 1) for part in page.split("<h2>")[1:])


def test_the_page_has_one_table_per_type_with_its_means():
    results = {"CIFAR100ZeroShot": with_clean(task_result("CIFAR100ZeroShot", 0.5), 0.375, 1234),
               "DTD": task_result("DTD", 0.75), "Food101ZeroShot": task_result("Food101ZeroShot", 0.25)}
    page = run_report.render_run(summarize(results), {"name": "org/model"}, {},
                                 {"CIFAR100ZeroShot": "zeroshot/report.html"})
    sections = _sections(page)
    assert list(sections) == ["Benchmarks", "ZeroShotClassification", "ImageClassification"]
    zeroshot = sections["ZeroShotClassification"]
    assert zeroshot.count("<tr><td>") == 2
    assert ("<tr><td><a href=\"zeroshot/report.html\">CIFAR100ZeroShot</a></td><td>0.5000</td><td>0.3750</td>"
            "<td>-0.1250</td><td>1,234</td></tr>") in zeroshot
    assert "<tr><td>Food101ZeroShot</td><td>0.2500</td><td>—</td><td>—</td><td>—</td></tr>" in zeroshot
    assert "<tfoot><tr><th>mean of 2</th><th>0.3750</th><th>0.3125</th><th>-0.0625</th>" in zeroshot
    assert "<tfoot><tr><th>mean of 1</th><th>0.7500</th><th>—</th><th>—</th>" in sections["ImageClassification"]
    # MIEB(lite): 3 of its 51 tasks; Mean (TaskType), Mean (Task), then the same clean
    assert re.search(r"<tr><td>MIEB\(lite\)</td><td>3 of 51</td><td>0\.5625</td><td>0\.5000</td><td>0\.5312</td>"
                     r"<td>0\.4583</td><td [^>]*><details><summary>48</summary>Country211, ", sections["Benchmarks"])


def test_a_run_of_several_suites_writes_the_page_the_summary_and_a_results_repo_mteb_reads(tmp_path):
    import mteb

    mirror = str(tmp_path / "mirror")
    make_mirror(mirror, rows=40, datasets=["cifar10"], files=1, eval_rows=30)
    keys = [f"cifar10/{i}" for i in range(40)] + [f"cifar10/test/{i}" for i in range(30)]
    images = str(tmp_path / "images")
    write_embeddings(images, keys, np.random.default_rng(0).normal(size=(len(keys), 8)).astype(np.float32),
                     "image", "float32", 1, {})
    out, cache = tmp_path / "out", tmp_path / "cache"
    results = evaluate(registry.select("CIFAR10,CIFAR10Clustering"), registry.Options(mirror), str(out),
                       images=images, executor="local", results_dir=str(cache / "results"), log=lambda *a: None)
    assert json.loads((out / "_manifest.json").read_text())["files"] == ["summary.json", "report.html"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == {"name": "fixture/biovita-random", "revision": None}
    assert {n: t["main_score"] for n, t in summary["tasks"].items()} == \
        {n: r["scores"]["test"][0]["main_score"] for n, r in results.items()}
    assert list(summary["types"]) == ["ImageClassification", "ImageClustering"]
    assert summary["benchmarks"]["MIEB(Img)"]["run"] == ["CIFAR10", "CIFAR10Clustering"]
    sections = _sections((out / "report.html").read_text())
    assert "<a href=\"linear_probe/report.html\">CIFAR10</a>" in sections["ImageClassification"]
    assert "<a href=\"clustering/report.html\">CIFAR10Clustering</a>" in sections["ImageClustering"]
    loaded = mteb.ResultCache(cache).load_results(models=["fixture/biovita-random"], tasks=list(results),
                                                  include_remote=False)
    [model] = loaded.model_results
    assert {r.task_name: r.get_score() for r in model.task_results} == \
        {n: t["main_score"] for n, t in summary["tasks"].items()}


def test_a_run_of_the_mteb_suite_alone_gets_the_page_too(tmp_path):
    """The mteb suite writes no page of its own: its run of two task types gets the run's page and summary.json."""
    root = str(tmp_path / "mirror")
    sts.write_sts13(root)
    sts.write_sts17(root)
    out = tmp_path / "out"
    results = ours(["STS13VisualSTS", "VisualSTS17Multilingual"], root, make_tiny_clip(str(tmp_path / "model")),
                   str(out))
    assert {"report.html", "summary.json"} <= set(json.loads((out / "_manifest.json").read_text())["files"])
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["types"]) == ["VisualSTS(eng)", "VisualSTS(multi)"]
    subsets = results["VisualSTS17Multilingual"]["scores"]["test"]  # mteb's score: the mean over its subsets
    assert np.isclose(summary["tasks"]["VisualSTS17Multilingual"]["main_score"],
                      np.mean([s["main_score"] for s in subsets]), rtol=0, atol=1e-12)
    assert list(_sections((out / "report.html").read_text())) == ["Benchmarks", "VisualSTS(eng)", "VisualSTS(multi)"]


def test_a_task_too_small_to_score_clean_says_why_under_its_table():
    error = "mteb cannot score STS13VisualSTS without the flagged rows: ValueError: too few pairs"
    results = {"STS13VisualSTS": {**task_result("STS13VisualSTS", 0.25),
                                  "mieb_ray": {"clean": {"left_out": {"eval": {"any": 9}}, "error": error}}}}
    section = _sections(run_report.render_run(summarize(results), {}, {}, {}))["VisualSTS(eng)"]
    assert "<tr><td>STS13VisualSTS</td><td>0.2500</td><td>—</td><td>—</td><td>9</td></tr>" in section
    assert section.endswith(f"</table></div><p class=meta>{error}</p>\n")
