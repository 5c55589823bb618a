"""Every flag of every command checked before any work (mieb_ray/flags.py): numbers against their range, local
paths for existence and kind, URIs for their scheme. A refusal is one line, exit 2, and leaves nothing behind.

The table runs in this process (the parser is the same); the three cases a new user hit run as real command
lines in fresh processes, with no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mieb_ray.cli import main

# (command line, the one line after "mieb-ray: error: "); {tmp}: a folder holding `file` (a file), `dir` (an
# empty folder) and nothing else
CASES = [
    (["build", "--sources", "{tmp}/missing", "--out", "{tmp}/o"], "argument --sources/--data: {tmp}/missing does not "
                                                                  "exist (see mieb-ray build --help)"),
    (["build", "--sources", "{tmp}/file", "--out", "{tmp}/o"], "argument --sources/--data: {tmp}/file is a file, not a "
                                                               "folder (see mieb-ray build --help)"),
    (["build", "--sources", "gs://bucket/m", "--out", "{tmp}/o"], "argument --sources/--data: gs://bucket/m: only "
                                                                  "local paths and s3:// URIs are supported, not gs:// "
                                                                  "(see mieb-ray build --help)"),
    (["build", "--out", "{tmp}/file"], "argument --out: {tmp}/file is a file, not a folder (see mieb-ray build "
                                       "--help)"),
    (["build", "--out", "hf://me/x"], "argument --out: hf://me/x: only local paths and s3:// URIs are supported, not "
                                      "hf:// (see mieb-ray build --help)"),
    (["build", "--out", "{tmp}/o", "--rows-per-shard", "0"], "argument --rows-per-shard: must be at least 1, not 0 "
                                                              "(see mieb-ray build --help)"),
    (["build", "--out", "{tmp}/o", "--exclude", "{tmp}/missing"], "argument --exclude: {tmp}/missing does not exist "
                                                                  "(see mieb-ray build --help)"),
    (["build", "--out", "{tmp}/o", "--max-error-rate", "-1"], "argument --max-error-rate: must be a fraction from 0 "
                                                              "to 1, not -1 (see mieb-ray build --help)"),
    (["build", "--out", "{tmp}/o", "--max-error-rate", "1.5"], "argument --max-error-rate: must be a fraction from 0 "
                                                               "to 1, not 1.5 (see mieb-ray build --help)"),
    (["build", "--out", "{tmp}/o", "--workers", "0"], "argument --workers: must be at least 1, not 0 (see mieb-ray "
                                                      "build --help)"),
    (["build", "--out", "{tmp}/o", "--workers", "two"], "argument --workers: a whole number is needed, not 'two' (see "
                                                        "mieb-ray build --help)"),
    (["build", "--out", "{tmp}/o", "--cpus-per-worker", "0"], "argument --cpus-per-worker: must be more than 0, not 0 "
                                                              "(see mieb-ray build --help)"),
    (["build", "--out", "{tmp}/o", "--format", "csv"], "argument --format: invalid choice: 'csv' (choose from "
                                                       "'parquet', 'webdataset') (see mieb-ray build --help)"),
    (["build", "--out", "{tmp}/o", "--resume", "--overwrite"], "--resume and --overwrite exclude each other: --resume "
                                                               "continues what is there, --overwrite replaces it"),
    (["check-sources", "--sources", "{tmp}/missing"], "argument --sources/--data: {tmp}/missing does not exist (see "
                                                      "mieb-ray check-sources --help)"),
    (["embed", "--input", "{tmp}/missing", "--out", "{tmp}/o", "--model", "m"],
     "argument --input: {tmp}/missing does not exist (see mieb-ray embed --help)"),
    (["embed", "--input", "{tmp}/dir", "--out", "{tmp}/file", "--model", "m"], "argument --out: {tmp}/file is a file, "
                                                                               "not a folder (see mieb-ray embed "
                                                                               "--help)"),
    (["embed", "--input", "{tmp}/dir", "--out", "{tmp}/o", "--model", "./my-clip"], "argument --model: ./my-clip does "
                                                                                    "not exist (see mieb-ray embed "
                                                                                    "--help)"),
    (["embed", "--input", "{tmp}/dir", "--out", "{tmp}/o", "--model", "{tmp}/file"], "argument --model: {tmp}/file is "
                                                                                     "a file, not a folder (see "
                                                                                     "mieb-ray embed --help)"),
    (["embed", "--input", "{tmp}/dir", "--out", "{tmp}/o", "--model", "m", "--batch-size", "0"],
     "argument --batch-size: must be at least 1, not 0 (see mieb-ray embed --help)"),
    (["embed", "--input", "{tmp}/dir", "--out", "{tmp}/o", "--model", "m", "--rows-per-shard", "-5"],
     "argument --rows-per-shard: must be at least 1, not -5 (see mieb-ray embed --help)"),
    (["embed", "--input", "{tmp}/dir", "--out", "{tmp}/o", "--model", "m", "--max-error-rate", "2"],
     "argument --max-error-rate: must be a fraction from 0 to 1, not 2 (see mieb-ray embed --help)"),
    (["embed", "--input", "{tmp}/dir", "--out", "{tmp}/o", "--model", "m", "--workers", "0"],
     "argument --workers: must be at least 1, not 0 (see mieb-ray embed --help)"),
    (["embed", "--input", "{tmp}/dir", "--out", "{tmp}/o", "--model", "m", "--gpus-per-worker", "2"],
     "argument --gpus-per-worker: must be from 0 to 1, not 2: an encoder uses one GPU at most (a fraction shares one; "
     "more --workers use more GPUs) (see mieb-ray embed --help)"),
    (["embed", "--input", "{tmp}/dir", "--out", "{tmp}/o", "--model", "m", "--gpus-per-worker", "-1"],
     "argument --gpus-per-worker: must be from 0 to 1, not -1: an encoder uses one GPU at most (a fraction shares "
     "one; more --workers use more GPUs) (see mieb-ray embed --help)"),
    (["embed", "--input", "{tmp}/dir", "--out", "{tmp}/o", "--model", "m", "--cpus-per-worker", "-1"],
     "argument --cpus-per-worker: must be more than 0, not -1 (see mieb-ray embed --help)"),
    (["embed", "--input", "{tmp}/dir", "--out", "{tmp}/o", "--model", "m", "--decode", "nvjpeg"],
     "argument --decode: invalid choice: 'nvjpeg' (choose from 'cpu', 'gpu', 'auto') (see mieb-ray embed --help)"),
    (["eval", "--image-embeddings", "{tmp}/missing", "--text-embeddings", "{tmp}/dir", "--out", "{tmp}/o"],
     "argument --image-embeddings: {tmp}/missing does not exist (see mieb-ray eval --help)"),
    (["eval", "--image-embeddings", "{tmp}/dir", "--text-embeddings", "{tmp}/missing", "--out", "{tmp}/o"],
     "argument --text-embeddings: {tmp}/missing does not exist (see mieb-ray eval --help)"),
    (["eval", "--model", "./missing-model", "--out", "{tmp}/o"],
     "argument --model: ./missing-model does not exist (see mieb-ray eval --help)"),
    (["eval", "--model", "m", "--out", "{tmp}/file"], "argument --out: {tmp}/file is a file, not a folder (see "
                                                      "mieb-ray eval --help)"),
    (["eval", "--model", "m", "--out", "{tmp}/o", "--query-block", "0"],
     "argument --query-block: must be at least 1, not 0 (see mieb-ray eval --help)"),
    (["eval", "--model", "m", "--out", "{tmp}/o", "--partitions", "0"],
     "argument --partitions: must be at least 1, not 0 (see mieb-ray eval --help)"),
    (["eval-biovita", "--model", "m", "--out", "{tmp}/o", "--workers", "0"],
     "argument --workers: must be at least 1, not 0 (see mieb-ray eval-biovita --help)"),
    (["eval-zeroshot", "--model", "m", "--out", "{tmp}/o", "--gpus-per-worker", "1.5"],
     "argument --gpus-per-worker: must be from 0 to 1, not 1.5: an encoder uses one GPU at most (a fraction shares "
     "one; more --workers use more GPUs) (see mieb-ray eval-zeroshot --help)"),
    (["audit", "--train", "{tmp}/missing", "--against", "mieb", "--out", "{tmp}/o"],
     "argument --train: {tmp}/missing does not exist (see mieb-ray audit --help)"),
    (["audit", "--train", "{tmp}/dir", "--against", "{tmp}/dir,{tmp}/missing", "--out", "{tmp}/o"],
     "argument --against: {tmp}/missing does not exist (see mieb-ray audit --help)"),
    (["audit", "--train", "{tmp}/dir", "--against", "mieb", "--out", "{tmp}/o", "--threshold", "0"],
     "argument --threshold: must be a cosine above 0 and at most 1, not 0 (see mieb-ray audit --help)"),
    (["audit", "--train", "{tmp}/dir", "--against", "mieb", "--out", "{tmp}/o", "--threshold", "1.2"],
     "argument --threshold: must be a cosine above 0 and at most 1, not 1.2 (see mieb-ray audit --help)"),
    (["audit", "--train", "{tmp}/dir", "--against", "mieb", "--out", "{tmp}/o", "--train-embeddings", "{tmp}/missing"],
     "argument --train-embeddings: {tmp}/missing does not exist (see mieb-ray audit --help)"),
    (["audit", "--train", "{tmp}/dir", "--against", "mieb", "--out", "{tmp}/o", "--against-embeddings",
      "{tmp}/missing"], "argument --against-embeddings: {tmp}/missing does not exist (see mieb-ray audit --help)"),
    (["audit", "--train", "{tmp}/dir", "--against", "mieb", "--out", "{tmp}/o", "--resume", "--overwrite"],
     "--resume and --overwrite exclude each other: --resume continues what is there, --overwrite replaces it"),
    (["demo", "--out", "{tmp}/file"], "argument --out: {tmp}/file is a file, not a folder (see mieb-ray demo --help)"),
]


def snapshot(root) -> dict:
    """Every file (with its size) and folder under root."""
    out = {}
    for d, dirs, files in os.walk(root):
        out.update({os.path.relpath(os.path.join(d, x), root) + "/": None for x in dirs})
        out.update({os.path.relpath(os.path.join(d, f), root): os.path.getsize(os.path.join(d, f)) for f in files})
    return out


@pytest.mark.parametrize("args, says", CASES, ids=[" ".join(a[:1] + [x for x in a if x.startswith("--")][-1:])
                                                   for a, _ in CASES])
def test_a_bad_flag_is_one_line_before_any_work(tmp_path, monkeypatch, capsys, args, says):
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "dir").mkdir()
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main([a.format(tmp=tmp_path) for a in args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    # argparse quotes the choices in some Python versions and not in others
    assert err.replace("'", "") == f"mieb-ray: error: {says.format(tmp=tmp_path)}\n".replace("'", "")
    assert snapshot(tmp_path) == before  # nothing written, nothing made


@pytest.mark.parametrize("args, says", [
    (["build", "--out", "{tmp}/file"], "argument --out: {tmp}/file is a file, not a folder"),
    (["build", "--out", "{tmp}/o", "--max-error-rate", "-1"], "argument --max-error-rate: must be a fraction from 0 "
                                                              "to 1, not -1"),
    (["build", "--out", "{tmp}/o", "--workers", "0"], "argument --workers: must be at least 1, not 0"),
])
def test_the_cases_a_new_user_hit_in_a_fresh_process(tmp_path, args, says):
    (tmp_path / "file").write_text("not a folder")
    done = subprocess.run([sys.executable, "-m", "mieb_ray", *[a.format(tmp=tmp_path) for a in args]],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"mieb-ray: error: {says.format(tmp=tmp_path)} (see mieb-ray build --help)\n"
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_version_and_help_say_what_it_is(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("mieb-ray 0.")
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "build the mieb-train CLIP training set" in text and "Start with `mieb-ray demo`" in text
    assert "logic" not in text


def test_every_flag_has_help():
    import argparse

    from mieb_ray.cli import parser

    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    missing = [f"{name} {action.option_strings[0]}" for name, command in commands.items()
               for action in command._actions if action.option_strings and not action.help]
    assert missing == []
