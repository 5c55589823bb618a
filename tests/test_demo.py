"""`mieb-ray demo`: build, embed and eval from fixtures made on the spot, as the README's first command runs it."""

import os

import pytest

from mieb_ray.demo import demo


@pytest.mark.timeout(600)
def test_demo_builds_and_embeds(ray_local, tmp_path):
    lines = []
    outputs = demo(str(tmp_path / "demo"), rows=10, log=lines.append)
    built = outputs["mieb-train"]
    assert built["counts"]["total"] == 23 * 10 - 1  # caltech101's first row is background_google
    for modality in ("image", "text"):
        m = outputs[str(tmp_path / "demo" / f"embeddings-{modality}")]
        assert m["counts"] == {"total": built["counts"]["total"], "errors": 0}
        assert os.path.exists(tmp_path / "demo" / f"embeddings-{modality}" / "_manifest.json")
    assert any(line.startswith("[demo] outputs:") for line in lines)
    scored = outputs[str(tmp_path / "demo" / "biovita-eval")]
    assert 0 <= scored["mieb_ray"]["task_score"] <= 1
    assert os.path.exists(tmp_path / "demo" / "biovita-eval" / "report.html")
    zeroshot = outputs[str(tmp_path / "demo" / "zeroshot-eval")]
    assert 0 <= zeroshot["scores"]["test"][0]["accuracy"] <= 1
    assert 0 <= zeroshot["mieb_ray"]["fixed_prompts"]["accuracy"] <= 1
    assert os.path.exists(tmp_path / "demo" / "zeroshot-eval" / "report.html")
    assert any("CIFAR10ZeroShot on 100 test images" in line for line in lines)
