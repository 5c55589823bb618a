"""`mieb-ray demo`: build, embed and eval from fixtures made on the spot, as the README's first command runs it:
the command itself, in a fresh process that brings up its own Ray."""

import json
import os
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
    # the build ran on the Ray it brought up; the six embed jobs and both evals in its process, beside that Ray
    executors = [line for line in lines if line.startswith(("[embed] in this process", "[embed] on Ray"))]
    assert len(executors) == 6 and all(line == "[embed] in this process (no cluster and no GPU: not on the one-node "
                                       "Ray this job started)" for line in executors), executors
    assert sum(line.startswith("[eval] in-process") for line in lines) == 2
    assert any(line.startswith("[demo] outputs:") for line in lines)
    scored = read(out / "biovita-eval" / "BioVITAT2IReranking.json")
    assert 0 <= scored["mieb_ray"]["task_score"] <= 1
    assert os.path.exists(out / "biovita-eval" / "report.html")
    zeroshot = read(out / "zeroshot-eval" / "CIFAR10ZeroShot.json")
    assert 0 <= zeroshot["scores"]["test"][0]["accuracy"] <= 1
    assert 0 <= zeroshot["mieb_ray"]["fixed_prompts"]["accuracy"] <= 1
    assert os.path.exists(out / "zeroshot-eval" / "report.html")
    assert any("CIFAR10ZeroShot on 100 test images" in line for line in lines)
