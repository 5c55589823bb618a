"""The command line's promises that hold for every job: a failed run leaves no empty output folder behind."""

from __future__ import annotations

import os

import pytest

from mieb_ray.cli import main

pytestmark = pytest.mark.timeout(300)


def test_a_failed_run_leaves_no_folder_it_made(ray_local, tmp_path, capsys):
    out = tmp_path / "new" / "out"
    assert main(["build", "--sources", str(tmp_path / "missing"), "--out", str(out), "--datasets", "mnist"]) == 1
    assert "mieb-ray: error:" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()

    # a folder that was there before is the user's: it stays, even empty
    kept = tmp_path / "kept"
    kept.mkdir()
    assert main(["eval-biovita", "--data", str(tmp_path / "missing"), "--image-embeddings", str(tmp_path / "x"),
                 "--text-embeddings", str(tmp_path / "y"), "--out", str(kept)]) == 1
    assert kept.is_dir() and not os.listdir(kept)
