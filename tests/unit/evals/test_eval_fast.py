"""`eval --fast`: the embed job's default computation (bf16 on a GPU, --decode auto) instead of mteb's (exact), on
the hand-built suites' path and on the mteb suite's; every TaskResult, the manifests and the run's page say which
computation made the embeddings, and the default stays exact."""

from __future__ import annotations

import json
import os

import pytest
import torch
from support.hub_tasks.sts import TASKS as STS
from support.mteb_tasks import assert_same_scores, mteb_result

from mieb_ray.cli import main
from mieb_ray.demo_data.mirror import make_mirror
from mieb_ray.evals import job, registry
from mieb_ray.pipelines import embed as embed_job

pytestmark = pytest.mark.timeout(600)
TASKS = ["CIFAR10ZeroShot", "STS12VisualSTS"]  # a hand-built suite's (protocol.plan) and mteb's (MtebSuite.embed_plan)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mirror"))
    make_mirror(root, rows=4, datasets=["cifar10"], eval_rows=20)
    STS["STS12VisualSTS"](root)
    return root


def _spied(monkeypatch) -> list[bool]:
    """The `exact` of every embed_table call, from every suite."""
    calls, real = [], embed_job.embed_table

    def spy(*args, exact=True, **kwargs):
        calls.append(exact)
        return real(*args, exact=exact, **kwargs)

    monkeypatch.setattr(embed_job, "embed_table", spy)  # the eval's cache imports it when it embeds
    return calls


@pytest.mark.parametrize("fast", [False, True])
def test_fast_reaches_embed_and_every_output_says_which_computation(mirror, tiny_clip, tmp_path, monkeypatch, fast):
    calls = _spied(monkeypatch)
    out = str(tmp_path / "out")
    results = job.evaluate(registry.select(",".join(TASKS)), registry.Options(mirror), out, log=lambda *a: None,
                           model=tiny_clip, executor="local", fast=fast)
    # one embed job per modality for the whole run: the images (zero-shot's and VisualSTS's), then the prompts
    assert len(calls) == 2 and set(calls) == {not fast}
    mode = "fast" if fast else "exact"
    # the precision the encoder ran in: under --fast its device's (an in-process encoder takes a GPU torch sees)
    made = {"mode": mode, "precision": "bfloat16" if fast and torch.cuda.is_available() else "float32",
            "decode": "auto" if fast else "cpu"}
    for task in TASKS:
        suite = "zeroshot" if task.startswith("CIFAR") else "mteb"
        written = json.loads(open(os.path.join(out, suite, f"{task}.json")).read())
        assert results[task]["mieb_ray"]["embeddings"] == written["mieb_ray"]["embeddings"] == made
        assert json.loads(open(os.path.join(out, suite, "_manifest.json")).read())["embeddings"] == made
    assert json.loads(open(os.path.join(out, "_manifest.json")).read())["embeddings"] == made
    page = open(os.path.join(out, "report.html")).read()
    zeroshot_page = open(os.path.join(out, "zeroshot", "report.html")).read()
    for text in (page, zeroshot_page):
        assert ("These scores are not mteb&#x27;s computation" in text) == fast
        assert ("bench/RESULTS.md" in text) == fast
    cache = os.listdir(os.path.join(out, "embeddings", "cache"))
    assert [c.endswith("-fast") for c in cache if not c.startswith("_")] == [fast]  # a cache of its own
    if not fast:  # the key beside mteb's leaves the comparison with mteb's TaskResult as it was
        assert_same_scores(results["STS12VisualSTS"], mteb_result("STS12VisualSTS", mirror, tiny_clip))


def test_the_flag_on_the_command_line(mirror, tiny_clip, tmp_path, monkeypatch, capsys):
    calls = _spied(monkeypatch)
    out = str(tmp_path / "out")
    assert main(["eval", "--tasks", "CIFAR10ZeroShot", "--sources", mirror, "--model", tiny_clip, "--out", out,
                 "--fast", "--executor", "local"]) == 0
    assert calls == [False, False]
    assert json.loads(open(os.path.join(out, "CIFAR10ZeroShot.json")).read())["mieb_ray"]["embeddings"]["mode"] \
        == "fast"
    assert main(["eval", "--tasks", "CIFAR10ZeroShot", "--sources", mirror, "--image-embeddings", out,
                 "--text-embeddings", out, "--out", str(tmp_path / "other"), "--fast"]) == 1
    assert "--fast is how --model embeds" in capsys.readouterr().err
