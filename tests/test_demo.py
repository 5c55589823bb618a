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
    # nothing but the job's own lines: no progress bars, no Ray or library log lines
    own = re.compile(r"^(\[(demo|build|embed|eval)\] |  /)")
    assert done.stderr == "" and [line for line in lines if not own.match(line)] == []
    # the summary lists every output, says why the table has a row less, and gives chance levels
    summary = "\n".join(lines[lines.index("[demo] outputs:"):])
    for name in ("mirror", "mieb-train", "tiny-clip", "embeddings-image", "embeddings-text", "eval/biovita",
                 "eval/zeroshot"):
        assert f"{out}/{name}: " in summary, name
    assert "1 fewer than the mirror's: rows of classes mieb-train leaves out (caltech101: 1" in summary
    assert "(chance: about 0.010/0.050/0.100, one right taxon among 100 candidates;" in summary
    assert "(chance: 0.100, 10 classes" in summary

    # run again into the same folder: refused, nothing touched
    before = tree(out)
    again = subprocess.run([sys.executable, "-m", "mieb_ray", "demo", "--out", str(out)], capture_output=True,
                           text=True, env=env, timeout=120)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr == (f"mieb-ray: error: {out} already holds mirror, mieb-train, tiny-clip, embeddings-image, "
                            "embeddings-text, eval (an earlier run's?); pass --overwrite to replace them, or another "
                            "--out\n")
    assert tree(out) == before


def tree(root) -> dict:
    """Every file under root and its sha256: what a refusal must leave byte for byte."""
    import hashlib

    return {os.path.relpath(os.path.join(d, f), root): hashlib.sha256(open(os.path.join(d, f), "rb").read()).digest()
            for d, _, files in os.walk(root) for f in files}


def test_the_demo_never_replaces_a_build_it_did_not_make(mirror, tmp_path):
    """A real build at DIR/mieb-train: `demo --out DIR` refuses, and the build stays byte for byte."""
    from mieb_ray.pipelines.build import BuildConfig, build

    out = tmp_path / "mine"
    build(BuildConfig(mirror[0], str(out / "mieb-train"), datasets="mnist,dtd", executor="local"),
          log=lambda line: None)
    before = tree(out)
    done = subprocess.run([sys.executable, "-m", "mieb_ray", "demo", "--out", str(out)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [f"mieb-ray: error: {out} already holds mieb-train (an earlier run's?); "
                                        "pass --overwrite to replace them, or another --out"]
    assert tree(out) == before
