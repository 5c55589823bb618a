"""Faults lose nothing: a killed worker, an S3 outage mid-write, an interrupted driver; and every kind of bad
input gives an error row or a one-line failure, never a silent drop."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from support.paths import committed
from support.pictures import encode, i16_png, palette_png, photo_table, picture, png_claiming, with_orientation

from mieb_ray import formats, storage
from mieb_ray.errors import UserError
from mieb_ray.io import embeddings
from mieb_ray.pipelines.build import BuildConfig, build
from mieb_ray.pipelines.embed import EmbedConfig, embed

pytestmark = pytest.mark.timeout(900)
DATASETS = ["cifar10", "mnist", "dtd", "gtsrb", "scimmir", "caltech101"]


def shards(manifest: dict) -> list[tuple]:
    return [(s["path"], s["rows"], s["sha256"]) for s in manifest["shards"]]


def same_embeddings(out: str, reference: str) -> None:
    """Same keys, each once, and the same vectors: equal to float32 rounding, as a different batching of the
    rows may change the last bit of a matrix product."""
    keys, vectors = embeddings.read_all(out)
    ref_keys, ref_vectors = embeddings.read_all(reference)
    assert keys == ref_keys and len(set(keys)) == len(keys)
    assert np.allclose(vectors, ref_vectors, atol=1e-6)


def kill_worker_when(marker: str, ready, stop: threading.Event) -> threading.Thread:
    """In the background: once `ready()` says the job is under way, SIGKILL one Ray worker running `marker`."""
    def run():
        while not stop.is_set():
            if ready():
                for proc in psutil.process_iter(["cmdline"]):
                    if marker in " ".join(proc.info["cmdline"] or []):
                        proc.kill()
                        killed.append(proc.pid)
                        return
            time.sleep(0.05)

    killed: list[int] = []
    thread = threading.Thread(target=run, daemon=True)
    thread.killed = killed
    thread.start()
    return thread


def test_build_finishes_when_a_worker_is_killed(ray_local, mirror, tmp_path):
    root, _ = mirror
    reference = build(BuildConfig(root, str(tmp_path / "ref"), datasets=DATASETS, rows_per_shard=1, executor="local"),
                      log=lambda _: None)
    out = tmp_path / "out"
    stop = threading.Event()
    killer = kill_worker_when("ShardBuilder", lambda: committed(out, ".parquet") >= 3, stop)
    manifest = build(BuildConfig(root, str(out), datasets=DATASETS, rows_per_shard=1, workers=2, cpus_per_worker=0.5),
                     log=lambda _: None)
    stop.set()
    assert killer.killed, "no worker was killed: the test did not test anything"
    assert shards(manifest) == shards(reference) and manifest["counts"] == reference["counts"]


def test_embed_finishes_when_an_encoder_is_killed(ray_local, tiny_clip, tmp_path):
    root = photo_table(tmp_path / "table", 8, 200)  # long enough to be killed in the middle
    reference = embed(EmbedConfig(root, str(tmp_path / "ref"), tiny_clip, batch_size=64, executor="local"),
                      log=lambda _: None)
    out = tmp_path / "out"
    stop = threading.Event()
    killer = kill_worker_when("EncodeStage", lambda: committed(out, ".arrow") >= 1, stop)
    manifest = embed(EmbedConfig(root, str(out), tiny_clip, batch_size=2), log=lambda _: None)
    stop.set()
    assert killer.killed, "no encoder was killed: the test did not test anything"
    assert [s["rows"] for s in manifest["shards"]] == [s["rows"] for s in reference["shards"]]
    same_embeddings(str(out), str(tmp_path / "ref"))


def outage_when(s3, prefix: str, objects: int, done: threading.Event) -> threading.Thread:
    """In the background: once `objects` objects are under `prefix`, stop the S3 server for 4 s, mid-write
    (`thread.mid_job` says whether the job was still running then)."""
    client = s3.client()

    def run():
        while client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("KeyCount", 0) < objects:
            time.sleep(0.05)
        thread.mid_job = not done.is_set()
        s3.stop(kill=True)  # at once: a graceful shutdown would go on serving the job for a while
        time.sleep(4)
        s3.restart()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def run_through_outage(s3, prefix: str, objects: int, job, rerun):
    """`job()` while S3 goes down: it completes (retries), or fails with a clear one-line error leaving no
    manifest, and then `rerun()` completes. The manifest of the run that completed."""
    done = threading.Event()
    thread = outage_when(s3, prefix, objects, done)
    out = f"s3://{s3.bucket}/{prefix}"
    try:
        manifest = job(out)
    except UserError as exc:  # retries ran out: a clear one-line failure, and the output is not complete
        done.set()
        assert "\n" not in str(exc) and s3.secret_key not in str(exc)
        thread.join()
        assert storage.read_manifest(out) is None
        manifest = rerun(out)
    done.set()
    thread.join()
    assert thread.mid_job, "the job ended before the outage: the test did not test anything"
    return manifest


def test_s3_outage_mid_build_then_rerun_gives_the_same_output(ray_local, s3, mirror, tmp_path):
    root, _ = mirror
    reference = build(BuildConfig(root, str(tmp_path / "ref"), datasets=DATASETS, rows_per_shard=1, executor="local"),
                      log=lambda _: None)
    prefix = "outage/train"
    manifest = run_through_outage(
        s3, prefix, 3,
        lambda out: build(BuildConfig(root, out, datasets=DATASETS, rows_per_shard=1, workers=2, cpus_per_worker=0.5),
                          log=lambda _: None),
        lambda out: build(BuildConfig(root, out, datasets=DATASETS, rows_per_shard=1),  # run it again
                          log=lambda _: None))
    assert shards(manifest) == shards(reference)  # same keys, same bytes as an uninterrupted run
    listed = {o["Key"] for o in s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=prefix)["Contents"]}
    assert {f"{prefix}/{p}" for p, _, _ in shards(manifest)} <= listed


@pytest.fixture(scope="module")
def reference(ray_local, mieb_train, tiny_clip, tmp_path_factory) -> tuple[str, dict]:
    """mieb_train's embeddings from an uninterrupted run, in-process (another batch size and executor: the same
    vectors to float32 rounding): what every interrupted run must end with. (folder, manifest)"""
    out = str(tmp_path_factory.mktemp("reference"))
    return out, embed(EmbedConfig(mieb_train[0], out, tiny_clip, batch_size=64, executor="local"), log=lambda _: None)


def test_s3_outage_mid_embed_then_resume_gives_the_same_embeddings(ray_local, s3, mieb_train, tiny_clip, reference):
    root, _ = mieb_train
    ref, reference = reference
    manifest = run_through_outage(
        s3, "outage/embeddings", 2,
        lambda out: embed(EmbedConfig(root, out, tiny_clip, batch_size=4), log=lambda _: None),
        lambda out: embed(EmbedConfig(root, out, tiny_clip, batch_size=4, resume=True), log=lambda _: None))
    assert manifest["counts"] == reference["counts"]
    same_embeddings(f"s3://{s3.bucket}/outage/embeddings", ref)


def interrupt_cli(ray_local, args: list[str], out, suffix: str, shards: int) -> None:
    """Run `mieb-ray ARGS` and SIGTERM it (what `ray job stop` does) once `shards` shards are committed."""
    address = ray_local.get_runtime_context().gcs_address
    driver = subprocess.Popen([sys.executable, "-m", "mieb_ray", "--address", address, *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while committed(out, suffix) < shards and driver.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert driver.poll() is None, "the run ended before it could be interrupted"
    driver.send_signal(signal.SIGTERM)
    printed, err = driver.communicate(timeout=120)
    assert driver.returncode == 130 and "run again with --resume" in err.strip().splitlines()[-1], \
        (driver.returncode, printed[-2000:], err[-4000:])
    # only the job's own lines, before and after the interruption: none of Ray's (its executor's end, its retries)
    assert [line for line in (printed + err).splitlines()
            if line.strip() and not re.match(r"^(\[(build|embed)\] |mieb-ray: )", line)] == []
    assert not (out / "_manifest.json").exists()


HELD = """
import sys, time
import ray, ray._private.worker
from mieb_ray.cli import main

def held(*args, **kwargs):  # signals that the command got here, then waits for the SIGTERM
    open(sys.argv[3], "w").close()
    time.sleep(60)

setattr(sys.modules[sys.argv[1]], sys.argv[2], held)
sys.exit(main(sys.argv[4:]))
"""


def sigterm_at(module: str, name: str, ray_local, root: str, out) -> tuple[int, str, str]:
    """A build of mnist, SIGTERMed once it calls `module.name` (held there): its exit code, stdout and stderr."""
    flag = out.parent / f"{name}-called"
    driver = subprocess.Popen([sys.executable, "-c", HELD, module, name, str(flag), "--address",
                               ray_local.get_runtime_context().gcs_address, "build", "--sources", root, "--out",
                               str(out), "--datasets", "mnist"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    deadline = time.time() + 240
    while not flag.exists() and driver.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert flag.exists(), driver.communicate()
    driver.send_signal(signal.SIGTERM)
    printed, err = driver.communicate(timeout=60)
    return driver.returncode, printed, err


def test_an_interrupt_while_ray_connects_is_an_interrupt(ray_local, mirror, tmp_path):
    """`ray job stop` in a job's first seconds: ray.init's own handler (sys.exit(15) until ray_up puts the command's
    back) made it exit with 15 and no word. Here Ray's connect, which comes after that handler, is held."""
    out = tmp_path / "out"
    code, _, err = sigterm_at("ray._private.worker", "connect", ray_local, mirror[0], out)
    assert code == 130, (code, err[-3000:])
    assert err.strip() == "mieb-ray: interrupted; what was committed is complete, run again with --resume to finish"
    assert not out.exists()  # nothing was committed: the folder it made is gone


def test_an_interrupt_after_the_job_is_done_is_a_success(ray_local, mirror, tmp_path):
    """A SIGTERM while the command lets Ray go (ray.shutdown held), its output complete: it said "run again with
    --resume", and --resume refuses a complete output."""
    out = tmp_path / "out"
    code, printed, err = sigterm_at("ray", "shutdown", ray_local, mirror[0], out)
    assert code == 0 and err == "", (code, err[-3000:])
    assert printed.strip().splitlines()[-1].startswith("[build] done: ") and (out / "_manifest.json").exists()


def test_interrupted_build_resumes_with_the_units_it_had_not_built(ray_local, mirror, tmp_path):
    root, _ = mirror
    reference = build(BuildConfig(root, str(tmp_path / "ref"), datasets=DATASETS, rows_per_shard=1, executor="local"),
                      log=lambda _: None)
    out = tmp_path / "out"
    interrupt_cli(ray_local, ["build", "--sources", root, "--out", str(out), "--datasets", ",".join(DATASETS),
                              "--rows-per-shard", "1", "--workers", "1"], out, ".parquet", 20)
    lines = []
    manifest = build(BuildConfig(root, str(out), datasets=DATASETS, rows_per_shard=1, resume=True),
                     log=lines.append)
    resumed = next(line for line in lines if "resuming" in line)
    done, total = map(int, re.match(r"\[build\] resuming: (\d+) of (\d+) units", resumed).groups())
    assert 0 < done < total, resumed
    assert shards(manifest) == shards(reference) and manifest["counts"] == reference["counts"]
    assert committed(out, ".parquet") == len(reference["shards"]) and not (out / "_progress").exists()


def test_interrupted_driver_leaves_only_complete_shards_and_resume_finishes(ray_local, mieb_train, tiny_clip,
                                                                           reference, tmp_path):
    root, train = mieb_train
    ref, reference = reference
    out = tmp_path / "out"
    interrupt_cli(ray_local, ["embed", "--input", root, "--out", str(out), "--model", tiny_clip, "--batch-size", "4"],
                  out, ".arrow", 2)
    rows = {s["path"].replace(".parquet", ".arrow"): s["rows"] for s in train["shards"]}
    for name in [os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs
                 if f.endswith(".arrow") and not f.startswith(".")]:
        assert embeddings.open_shard(str(out / name)).num_rows == rows[name]  # what is visible is whole
    manifest = embed(EmbedConfig(root, str(out), tiny_clip, batch_size=4, resume=True), log=lambda _: None)
    assert manifest["counts"] == reference["counts"]
    same_embeddings(str(out), ref)
    assert not [f for _, _, fs in os.walk(out) for f in fs if f.endswith(".tmp")]


def _bad_and_good_images() -> tuple[dict[str, bytes], dict[str, bytes]]:
    jpeg = encode(picture("chelsea.jpg"), "JPEG", quality=90)
    png = encode(picture("coffee.jpg").resize((80, 60)), "PNG")
    gif = io.BytesIO()
    frames = [picture("coins.jpg").convert("P").resize((40, 30)), picture("brick.jpg").convert("P").resize((40, 30))]
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:])
    bad = {"corrupt-jpeg": jpeg[:200] + os.urandom(2000), "truncated-png": png[: len(png) // 2], "zero-bytes": b"",
           "text-file": b"not an image, a text file\n", "bomb-30000x30000": png_claiming(30000, 30000)}
    good = {"1x1": encode(Image.new("RGB", (1, 1), "red"), "PNG"), "16-bit-png": i16_png(),
            "cmyk-jpeg": encode(picture("flower.jpg").convert("CMYK"), "JPEG"), "palette-transparent": palette_png(),
            "animated-gif": gif.getvalue(), "exif-rotated": with_orientation(picture("rocket.jpg"), "JPEG", 6),
            "plain-jpeg": jpeg}
    return bad, good


def test_every_bad_image_is_an_error_row_and_nothing_else_is_lost(ray_local, tiny_clip, tmp_path):
    bad, good = _bad_and_good_images()
    images = {**good, **bad}
    pq.write_table(pa.table({"key": list(images), "image": pa.array(list(images.values()), pa.binary())}),
                   tmp_path / "in.parquet")
    manifest = embed(EmbedConfig(str(tmp_path / "in.parquet"), str(tmp_path / "out"), tiny_clip, max_error_rate=0.5),
                     log=lambda _: None)
    assert manifest["counts"] == {"total": len(good), "errors": len(bad)}
    table = embeddings.open_shard(str(tmp_path / "out" / manifest["shards"][0]["path"]))
    assert set(table["key"].to_pylist()) == set(good)
    assert np.isfinite(embeddings.matrix(table)).all()
    errors = pa.ipc.open_file(str(tmp_path / "out" / manifest["error_files"][0])).read_all().to_pylist()
    reasons = {e["key"]: e["error"] for e in errors}
    assert set(reasons) == set(bad)
    assert reasons["zero-bytes"] == "empty image" and reasons["text-file"] == "not an image"
    assert reasons["truncated-png"] == "truncated image" and reasons["bomb-30000x30000"].startswith("image too large")


def test_texts_that_are_not_utf8_or_empty_are_error_rows(ray_local, tiny_clip, tmp_path):
    import webdataset as wds

    with wds.TarWriter(str(tmp_path / "texts.tar"), encoder=False) as sink:
        for key, text in [("a", "a photo of a crab.".encode()), ("b", b"caf\xe9 \xff"), ("c", b"   "),
                          ("d", "a photo of an airplane.".encode())]:
            sink.write({"__key__": key, "txt": text})
    manifest = embed(EmbedConfig(str(tmp_path / "texts.tar"), str(tmp_path / "out"), tiny_clip, modality="text",
                     max_error_rate=0.6), log=lambda _: None)
    assert manifest["counts"] == {"total": 2, "errors": 2}
    errors = pa.ipc.open_file(str(tmp_path / "out" / manifest["error_files"][0])).read_all().to_pylist()
    assert {e["key"]: e["error"] for e in errors} == {"b": "text is not valid UTF-8", "c": "empty text"}


def test_an_embedding_output_with_two_dimensions_is_refused(tmp_path):
    for n, dim in enumerate((16, 32)):
        schema = formats.embedding_schema(dim, "float32", None, {"model": {}})
        embeddings.write_ipc(str(tmp_path / f"{n}.arrow"), embeddings.shard_table(
            schema, [f"k{n}"], np.ones((1, dim), np.float32), {}))
    storage.write_manifest(str(tmp_path), {"shards": [{"path": "0.arrow"}, {"path": "1.arrow"}]})
    with pytest.raises(UserError, match=r"mixes embedding dimensions \[16, 32\]"):
        embeddings.read_all(str(tmp_path))
