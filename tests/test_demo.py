"""`mieb-ray demo`: build, embed and eval from fixtures made on the spot, as the README's first command runs it:
the command itself, in a fresh process."""

import json
import os
import re
import subprocess
import sys

import pytest


def read(path) -> dict:
    return json.loads(open(path).read())


@pytest.mark.timeout(600)
def test_the_demo_command_builds_embeds_and_scores(tmp_path):
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a laptop: no cluster named
    done = subprocess.run([sys.executable, "-m", "mieb_ray", "demo", "--out", str(out)], capture_output=True,
                          text=True, env=env, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    built = read(out / "mieb-train" / "_manifest.json")
    assert built["counts"]["total"] == 23 * 40 - 1  # caltech101's first row is background_google
    for modality in ("image", "text"):
        m = read(out / f"embeddings-{modality}" / "_manifest.json")
        assert m["counts"] == {"total": built["counts"]["total"], "errors": 0}
    # small work on a machine alone: the build, the six embed jobs and both evals in its process, Ray never started
    placed = [line for line in lines if re.match(r"\[(build|embed|eval)\] (in this process|on Ray) \(", line)]
    assert len(placed) == 10 and all(" in this process (" in line and line.endswith("Ray not started)")
                                    for line in placed), placed
    assert any(line.startswith("[demo] outputs:") for line in lines)
    # one eval command, two suites: each in its folder, the folders listed by the manifest written last
    assert read(out / "eval" / "_manifest.json")["suites"] == {"biovita": "biovita", "zeroshot": "zeroshot"}
    scored = read(out / "eval" / "biovita" / "BioVITAT2IReranking.json")
    assert 0 <= scored["mieb_ray"]["task_score"] <= 1
    assert os.path.exists(out / "eval" / "biovita" / "report.html")
    zeroshot = read(out / "eval" / "zeroshot" / "CIFAR10ZeroShot.json")
    assert 0 <= zeroshot["scores"]["test"][0]["accuracy"] <= 1
    assert 0 <= zeroshot["mieb_ray"]["fixed_prompts"]["accuracy"] <= 1
    assert os.path.exists(out / "eval" / "zeroshot" / "report.html")
    assert any("CIFAR10ZeroShot on 100 test images" in line for line in lines)
