"""The command line's promises that hold for every job: a check that needs no Ray fails before Ray starts, and a
failed run leaves no empty output folder behind."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mieb_ray.cli import main

pytestmark = pytest.mark.timeout(300)


def test_a_failed_run_leaves_no_folder_it_made(ray_local, tmp_path, capsys):
    for empty in ("empty", "x", "y"):
        (tmp_path / empty).mkdir()
    out = tmp_path / "new" / "out"
    assert main(["build", "--sources", str(tmp_path / "empty"), "--out", str(out), "--datasets", "mnist"]) == 1
    assert "mieb-ray: error:" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()

    # a folder that was there before is the user's: it stays, even empty
    kept = tmp_path / "kept"
    kept.mkdir()
    assert main(["eval-biovita", "--data", str(tmp_path / "empty"), "--image-embeddings", str(tmp_path / "x"),
                 "--text-embeddings", str(tmp_path / "y"), "--out", str(kept)]) == 1
    assert kept.is_dir() and not os.listdir(kept)


@pytest.mark.parametrize("args, says", [
    (["build", "--sources", "{tmp}/empty", "--datasets", "mnist", "--out", "{tmp}/o"], "mnist: no files under"),
    (["embed", "--input", "{tmp}/table", "--model", "org/not-cached", "--out", "{tmp}/o"], "org/not-cached"),
    (["eval-biovita", "--data", "{tmp}/empty", "--image-embeddings", "{tmp}/table", "--text-embeddings",
      "{tmp}/table", "--out", "{tmp}/o"], "{tmp}/"),
    (["eval-zeroshot", "--data", "{tmp}/empty", "--image-embeddings", "{tmp}/table", "--text-embeddings",
      "{tmp}/table", "--tasks", "CIFAR10ZeroShot", "--out", "{tmp}/o"], "{tmp}/"),
    (["audit", "--train", "{tmp}/table", "--against", "{tmp}/table", "--out", "{tmp}/done"], "complete"),
])
def test_checks_that_need_no_ray_fail_before_ray_starts(tmp_path, args, says):
    """RAY_ADDRESS names no cluster: had the job started (or joined) Ray first, it would fail on that instead."""
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "_manifest.json").write_text('{"shards": [], "counts": {}}')
    (tmp_path / "table").mkdir()
    (tmp_path / "empty").mkdir()
    pq.write_table(pa.table({"key": ["a"], "image": [b"not read"]}), tmp_path / "table" / "data.parquet")
    args = [a.format(tmp=tmp_path) for a in args]
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:9"}
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "mieb_ray", *args], env=env, capture_output=True, text=True,
                          timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and lines and lines[-1].startswith("mieb-ray: error: "), done.stderr[-2000:]
    assert says.format(tmp=tmp_path) in lines[-1] and "Ray" not in lines[-1], lines[-1]
    assert time.time() - t0 < 30


def test_a_cluster_address_that_takes_no_connection_is_one_line(mirror, tmp_path):
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:9"}  # the discard port: nothing listens
    done = subprocess.run([sys.executable, "-m", "mieb_ray", "build", "--sources", mirror[0], "--datasets", "mnist",
                           "--out", str(tmp_path / "o")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == \
        "mieb-ray: error: cannot reach the Ray cluster at 127.0.0.1:9: Connection refused"
    assert not (tmp_path / "o").exists()


def test_an_interrupted_command_is_told_to_resume_only_if_it_can(monkeypatch, tmp_path, capsys):
    """build, embed, audit and eval take --resume; the demo does not, so its interrupt line must not send the user
    there."""
    from mieb_ray import cli

    def interrupted(args):
        raise KeyboardInterrupt

    for name in ("run_build", "run_eval", "run_demo"):
        monkeypatch.setattr(cli, name, interrupted)
    for argv in (["build", "--sources", str(tmp_path), "--out", str(tmp_path / "b")],
                 ["eval", "--tasks", "CIFAR10ZeroShot", "--out", str(tmp_path / "e")]):
        assert main(argv) == 130
        assert capsys.readouterr().err.strip() == "mieb-ray: interrupted; what was committed is complete, run " \
                                                  "again with --resume to finish"
    assert main(["demo", "--out", str(tmp_path / "d")]) == 130
    assert capsys.readouterr().err.strip() == "mieb-ray: interrupted; demo has no --resume: run it again"


@pytest.fixture(scope="module")
def outputs(tiny_clip, tmp_path_factory) -> dict[str, str]:
    """One output of each command that reads another's: a build (mieb-train), its image embeddings, an audit of it
    against itself; and the mirror the build read."""
    from mieb_ray.demo_data.mirror import make_mirror

    root = tmp_path_factory.mktemp("outputs")
    made = {name: str(root / name) for name in ("mirror", "train", "emb", "audit")}
    make_mirror(made["mirror"], rows=3, datasets=["dtd"], eval_rows=2)
    local = ("--executor", "local")
    assert main(["build", "--sources", made["mirror"], "--out", made["train"], "--datasets", "dtd", *local]) == 0
    assert main(["embed", "--input", made["train"], "--out", made["emb"], "--model", tiny_clip, *local]) == 0
    assert main(["audit", "--train", made["train"], "--against", "self", "--out", made["audit"], *local]) == 0
    return made


def files(outputs: dict[str, str]) -> dict:
    return {p: open(p, "rb").read() for name in ("train", "emb", "audit")
            for p in glob.glob(f"{outputs[name]}/**/*", recursive=True) if os.path.isfile(p)}


def test_overwrite_never_replaces_another_commands_output(outputs, tiny_clip, capsys):
    """--overwrite replaces a command's own earlier output. Pointed at another command's (an embed's --out at the
    table it encodes, an eval's at the embeddings it would read), it is refused in one line and nothing there is
    touched: it used to delete the manifest and files of whatever was there, then write beside the rest."""
    train, emb, before = outputs["train"], outputs["emb"], files(outputs)
    shard = sorted(glob.glob(f"{train}/*/*.parquet"))[0]  # a table of its own (an --out inside an input is refused)
    capsys.readouterr()
    for argv, there, theirs, ours in (
            (["embed", "--input", shard, "--out", train, "--model", tiny_clip], train, "build (mieb-train)", "embed"),
            (["build", "--sources", outputs["mirror"], "--out", emb, "--datasets", "dtd"], emb,
             "embed (mieb-embeddings)", "build"),
            (["audit", "--train", shard, "--against", "self", "--out", train], train, "build (mieb-train)", "audit"),
            (["eval", "--tasks", "DTDZeroShot", "--sources", outputs["mirror"], "--model", tiny_clip, "--out", emb],
             emb, "embed (mieb-embeddings)", "eval")):
        assert main([*argv, "--overwrite", "--executor", "local"]) == 1, argv
        assert capsys.readouterr().err == (f"mieb-ray: error: {there} holds the output of mieb-ray {theirs}, not of "
                                           f"mieb-ray {ours}: choose another --out (--overwrite never replaces "
                                           "another command's output)\n")
    assert files(outputs) == before and before


def test_an_output_given_where_another_commands_is_read_is_named_as_such(outputs, tiny_clip, tmp_path, capsys):
    """Embeddings given as a table, a table as embeddings or as an audit: one line saying whose output it is,
    before any work (they failed as "no .parquet or .tar files under ...", as an audit's duplicates.parquet without
    an image column, as "not an Arrow IPC file" after the eval had built its split, as "no _manifest.json of
    mieb-ray audit")."""
    train, emb, audit, mirror = outputs["train"], outputs["emb"], outputs["audit"], outputs["mirror"]
    table = "not a table of images or texts (a build's output, or Parquet files or WebDataset tars)"
    out, local = str(tmp_path / "out"), ("--executor", "local")
    for argv, says in (
            (["embed", "--input", emb, "--model", tiny_clip], f"{emb} holds the output of mieb-ray embed "
                                                               f"(mieb-embeddings), {table}"),
            (["embed", "--input", audit, "--model", tiny_clip], f"{audit} holds the output of mieb-ray audit "
                                                                 f"(mieb-audit), {table}"),
            (["audit", "--train", train, "--against", emb], f"{emb} holds the output of mieb-ray embed "
                                                             f"(mieb-embeddings), {table}"),
            (["eval", "--tasks", "CIFAR10Clustering", "--sources", mirror, "--image-embeddings", train],
             f"{train} holds the output of mieb-ray build (mieb-train), not embeddings (mieb-ray embed's)"),
            (["build", "--sources", mirror, "--exclude", emb], f"--exclude {emb} holds the output of mieb-ray embed "
                                                                "(mieb-embeddings), not of mieb-ray audit")):
        assert main([*argv, "--out", out, *local]) == 1, argv
        assert capsys.readouterr().err == f"mieb-ray: error: {says}\n"
        assert not os.path.exists(out)


def test_an_s3_input_in_a_bucket_that_does_not_exist_is_named_as_such(s3, mirror, tiny_clip, tmp_path, capsys):
    """A mistyped bucket is the likeliest reason an S3 input holds nothing: every command says so, in one line,
    before any work (it said "no files under s3://...", that the mirror held no data of a task, or that --exclude
    was not an audit output)."""
    from mieb_ray import storage

    storage.reset_clients()  # made once per process: these use the S3 server's settings
    gone, out, local = "s3://no-such-bucket/x", str(tmp_path / "out"), ("--executor", "local")
    zeroshot = ["eval", "--tasks", "CIFAR10ZeroShot", "--out", out]
    for argv in (["build", "--sources", gone, "--out", out],
                 ["embed", "--input", gone, "--model", tiny_clip, "--out", out],
                 ["audit", "--train", gone, "--against", "self", "--out", out],
                 [*zeroshot, "--sources", gone, "--model", tiny_clip],
                 ["eval", "--tasks", "STS13VisualSTS", "--sources", gone, "--model", tiny_clip, "--out", out],
                 [*zeroshot, "--sources", mirror[0], "--model", gone],
                 [*zeroshot, "--sources", mirror[0], "--model", tiny_clip, "--exclude", gone]):
        assert main([*argv, *local]) == 1, argv
        assert capsys.readouterr().err == f"mieb-ray: error: bucket 'no-such-bucket' does not exist at {s3.endpoint}\n"
        assert not os.path.exists(out)


def test_a_second_run_into_an_output_being_written_is_refused_and_the_first_finishes_whole(outputs, tiny_clip,
                                                                                          tmp_path, capsys):
    """`ray job submit` stopped with Ctrl-C leaves its job running; the user submits again with --overwrite or
    --resume. That run used to delete what the first had committed while the first went on writing: now it is
    refused in one line, and the first (paused meanwhile, then let go) ends with every row once, each file as its
    manifest says."""
    images = [r for f in sorted(glob.glob(f"{outputs['train']}/**/*.parquet", recursive=True))
              for r in pq.read_table(f, columns=["image"])["image"].to_pylist()]
    keys, table = [f"k{i:02d}" for i in range(60)], tmp_path / "table"
    table.mkdir()
    for n, key in enumerate(keys):  # a file a unit: many units, each committed on its own
        pq.write_table(pa.table({"key": [key], "image": [images[n % len(images)]]}), table / f"{key}.parquet")
    out, argv = tmp_path / "emb", ["--input", str(table), "--model", tiny_clip, "--executor", "local"]
    first = subprocess.Popen([sys.executable, "-m", "mieb_ray", "embed", "--out", str(out), *argv],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while not glob.glob(f"{out}/_progress/*.json") and first.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        first.send_signal(signal.SIGSTOP)  # a unit committed, more to come
        assert first.poll() is None and glob.glob(f"{out}/_progress/*.json")
        before = {p: open(p, "rb").read() for p in glob.glob(f"{out}/**/*", recursive=True) if os.path.isfile(p)}
        capsys.readouterr()
        for flag in ("--overwrite", "--resume"):  # the second run: this process
            assert main(["embed", "--out", str(out), *argv, flag]) == 1
            assert re.fullmatch(
                rf"mieb-ray: error: {re.escape(str(out))} is being written by another run of mieb-ray embed \(pid "
                rf"{first.pid} on this machine, since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC\): wait for it to end, or "
                r"stop it \(ray job stop, or kill its process\); --resume and --overwrite leave an output alone while "
                r"another run writes it\n", capsys.readouterr().err)
        assert {p: open(p, "rb").read() for p in before} == before  # untouched
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=120) == 0, first.stdout.read()[-2000:]
    manifest = json.loads((out / "_manifest.json").read_text())
    embedded = [k for s in manifest["shards"] for k in pa.ipc.open_file(str(out / s["path"])).read_all()["key"]
                .to_pylist()]
    assert sorted(embedded) == keys
    for shard in manifest["shards"]:
        assert hashlib.sha256((out / shard["path"]).read_bytes()).hexdigest() == shard["sha256"]
    assert sorted(os.listdir(out)) == sorted({"_manifest.json", *{s["path"].split("/")[0] for s in
                                                                     manifest["shards"]}})


def test_a_disk_that_refuses_a_write_is_one_line_naming_the_file(outputs, tmp_path):
    """A full disk (or a file size limit) under a local output was an OSError traceback from pyarrow's writer; now
    one line naming the file. Here the limit is the kernel's (RLIMIT_FSIZE: the write fails with EFBIG)."""
    limited = ("import resource, signal, sys; from mieb_ray.cli import main; "
               "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000)); sys.exit(main(sys.argv[1:]))")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", limited, "build", "--sources", outputs["mirror"], "--datasets", "dtd",
                           "--out", str(out), "--executor", "local"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and re.fullmatch(
        rf"mieb-ray: error: cannot write {re.escape(str(out))}/dtd/000000\.parquet: OSError: .*File too large",
        done.stderr.splitlines()[-1]), done.stderr[-3000:]
