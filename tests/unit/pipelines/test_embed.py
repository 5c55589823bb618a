"""The embed job on Ray: mieb-train shards (and any table) -> embedding shards, read back every way users do;
resume, error rows, S3, and the one-line errors before any work starts."""

from __future__ import annotations

import dataclasses
import glob
import io
import json
import os
import re
import shutil
import socket
import time

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from support import fakehub

from mieb_ray import storage
from mieb_ray.cli import main
from mieb_ray.encode.model import Encoder, load_info
from mieb_ray.encode.preprocess import ImageSpec, load_image, normalize
from mieb_ray.errors import UserError
from mieb_ray.io import embeddings
from mieb_ray.pipelines.embed import EmbedConfig, embed

pytestmark = pytest.mark.timeout(600)


def train_rows(root: str) -> dict[str, dict]:
    table = pq.read_table(sorted(glob.glob(f"{root}/*/*.parquet")))
    return {r["key"]: r for r in table.to_pylist()}


def output_rows(root: str) -> dict[str, tuple[np.ndarray, dict]]:
    out = {}
    for uri in embeddings.shard_uris(root):
        table = embeddings.open_shard(uri)
        for row, vector in zip(table.drop_columns(["embedding"]).to_pylist(), embeddings.matrix(table)):
            assert row["key"] not in out, row["key"]
            out[row["key"]] = (vector, row)
    return out


def centred_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A tiny random CLIP maps every image near one direction: compare what is left after the mean."""
    a, b = a - a.mean(0), b - b.mean(0)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def image_run(mieb_train, tiny_clip, tmp_path_factory):
    root, _ = mieb_train
    out = str(tmp_path_factory.mktemp("emb-images"))
    return out, embed(EmbedConfig(root, out, tiny_clip, carry_columns=["dataset_name", "label"], batch_size=16))


def test_image_embeddings_of_mieb_train(image_run, mieb_train, tiny_clip):
    out, manifest = image_run
    root, train_manifest = mieb_train
    source = train_rows(root)
    got = output_rows(out)
    assert set(got) == set(source) and manifest["counts"] == {"total": len(source), "errors": 0}
    assert manifest["precision"] == {"float32": len(source)}  # what the CPU encoder ran in (auto: the device's)
    assert [s["path"] for s in manifest["shards"]] == [s["path"].replace(".parquet", ".arrow")
                                                        for s in train_manifest["shards"]]
    for key, (_, row) in got.items():
        assert (row["dataset_name"], row["label"]) == (source[key]["dataset_name"], source[key]["label"])

    # the same images through the model's own processor and get_image_features, outside Ray
    from transformers import CLIPModel, CLIPProcessor

    processor, model = CLIPProcessor.from_pretrained(tiny_clip), CLIPModel.from_pretrained(tiny_clip).eval()
    keys = sorted(got)
    images = [Image.open(io.BytesIO(source[k]["image"]["bytes"])) for k in keys]
    import torch

    with torch.inference_mode():
        ref = model.get_image_features(**processor(images=images, return_tensors="pt")).pooler_output.numpy()
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    ours = np.stack([got[k][0] for k in keys])
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)
    assert centred_cosines(ours, ref).min() >= 0.95


def test_shards_open_every_way(image_run, ray_local):
    out, manifest = image_run
    path = os.path.join(out, manifest["shards"][0]["path"])
    table = pa.ipc.open_file(pa.memory_map(path)).read_all()
    vectors = table["embedding"].chunks[0].values.to_numpy(zero_copy_only=True)  # raises if a copy were needed
    assert table.num_rows == manifest["shards"][0]["rows"] and vectors.size == table.num_rows * manifest["dim"]
    meta = embeddings.model_metadata(table)
    assert meta["model"]["architecture"] == "CLIPModel" and meta["normalized"] and meta["preprocessing"]["height"]
    hf = datasets.load_dataset("arrow", data_files=embeddings.shard_uris(out), split="train")
    assert hf.num_rows == manifest["counts"]["total"] and len(hf[0]["embedding"]) == manifest["dim"]
    assert embeddings.read_ray(out).count() == manifest["counts"]["total"]
    for shard in manifest["shards"]:
        assert storage.file_stats(os.path.join(out, shard["path"]))["sha256"] == shard["sha256"]


def test_resume_finishes_an_interrupted_run_with_the_same_result(image_run, mieb_train, tiny_clip, tmp_path):
    """A run interrupted once its first shard is in leaves whole shards and their progress records; --resume
    encodes only the units without a record, and the output equals an uninterrupted run's."""
    out, manifest = image_run
    root, _ = mieb_train
    config = EmbedConfig(root, str(tmp_path / "out"), tiny_clip, carry_columns=("dataset_name", "label"),
                         batch_size=16)

    def ctrl_c_after_the_first_shard(line: str) -> None:
        if re.match(r"\[embed\] \d+/\d+ units", line):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        embed(config, log=ctrl_c_after_the_first_shard)
    assert not (tmp_path / "out" / "_manifest.json").exists()
    records = list((tmp_path / "out" / "_progress").rglob("*.json"))
    assert 0 < len(records) < len(manifest["shards"])
    with pytest.raises(UserError, match="holds an unfinished run of embed .*; pass --resume"):
        embed(config)
    lines = []
    again = embed(dataclasses.replace(config, resume=True), log=lines.append)
    # a commit task already running when the driver stopped may have finished since: its unit is done too
    done = int(re.search(r"(\d+) already done", lines[0]).group(1))
    assert len(records) <= done < len(manifest["shards"])
    # nothing encoded twice, nothing lost: the same shards, keys and vectors
    assert [(s["path"], s["rows"]) for s in again["shards"]] == [(s["path"], s["rows"]) for s in manifest["shards"]]
    keys, vectors = embeddings.read_all(str(tmp_path / "out"))
    ref_keys, ref_vectors = embeddings.read_all(out)
    assert keys == ref_keys and np.allclose(vectors, ref_vectors, atol=1e-6)
    assert not (tmp_path / "out" / "_progress").exists()  # the manifest replaces the records
    with pytest.raises(UserError, match="already holds complete embeddings"):
        embed(dataclasses.replace(config, resume=True))


def test_in_process_embed_equals_the_ray_run_and_resumes(image_run, mieb_train, tiny_clip, tmp_path):
    """--executor local runs the same stages in this process: the same shards, keys and vectors as the Ray run,
    and an interrupted run resumes to the same result."""
    out, manifest = image_run
    root, _ = mieb_train
    config = EmbedConfig(root, str(tmp_path / "out"), tiny_clip, carry_columns=("dataset_name", "label"),
                         batch_size=16, executor="local")

    def ctrl_c_after_the_first_shard(line: str) -> None:
        if re.match(r"\[embed\] \d+/\d+ units", line):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        embed(config, log=ctrl_c_after_the_first_shard)
    records = list((tmp_path / "out" / "_progress").rglob("*.json"))
    assert len(records) == 1  # in-process, the unit after it is not committed before the line is logged
    lines = []
    local = embed(dataclasses.replace(config, resume=True), log=lines.append)
    assert "1 already done" in lines[0] and lines[1].startswith("[embed] in this process (--executor local)")
    assert local["executor"] == "local" and manifest["executor"] == "ray"
    assert [(s["path"], s["rows"]) for s in local["shards"]] == [(s["path"], s["rows"]) for s in manifest["shards"]]
    keys, vectors = embeddings.read_all(str(tmp_path / "out"))
    ref_keys, ref_vectors = embeddings.read_all(out)
    assert keys == ref_keys and np.allclose(vectors, ref_vectors, atol=1e-5)
    assert output_rows(str(tmp_path / "out")).keys() == output_rows(out).keys()


def test_compile_gives_the_uncompiled_vectors(image_run, mieb_train, tiny_clip, tmp_path):
    """--compile (torch.compile's kernels for the image tower, for speed on GPUs) changes no vector: in float32
    here, the Ray run's within float rounding, a unit's short last batch included."""
    out, _ = image_run
    root, _ = mieb_train
    compiled = embed(EmbedConfig(root, str(tmp_path / "out"), tiny_clip, carry_columns=("dataset_name", "label"),
                                 batch_size=16, executor="local", compile=True), log=lambda line: None)
    keys, vectors = embeddings.read_all(str(tmp_path / "out"))
    ref_keys, ref_vectors = embeddings.read_all(out)
    assert compiled["counts"]["errors"] == 0 and keys == ref_keys
    assert np.abs(vectors - ref_vectors).max() < 1e-5
    with pytest.raises(UserError, match="drop --compile"):
        embed(EmbedConfig(root, str(tmp_path / "exact"), tiny_clip, exact=True, compile=True))


def test_the_encoder_reports_each_model_call_for_in_process_progress(tiny_clip):
    from mieb_ray.encode.stages import ERROR, EncodeStage

    stage = EncodeStage(tiny_clip, None, "text", "text", None, batch_size=2, device="cpu", threads=1)
    calls = []
    stage.on_rows = calls.append
    out = stage({"key": np.array(list("abcd"), dtype=object),
                 "text": np.array(["a cat", "a dog", "", "an owl"], dtype=object),
                 ERROR: np.array(["", "", "empty text", ""], dtype=object)})
    assert calls == [2, 1]  # the three good rows, in model calls of 2; the error row is not encoded
    assert not out["embedding"][2].any() and np.allclose(np.linalg.norm(out["embedding"][[0, 1, 3]], axis=1), 1)


def test_placement_runs_in_process_only_on_a_machine_alone(monkeypatch, tiny_clip):
    from mieb_ray.pipelines.embed import placement_of
    from mieb_ray.runtime import cluster, placement
    from mieb_ray.runtime.cluster import RunContext

    monkeypatch.setattr(placement, "ray_running", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = EmbedConfig("in", "out", tiny_clip)
    assert placement_of(config).mode == ("ray" if torch.cuda.is_available() else "local")
    assert placement_of(dataclasses.replace(config, workers=2)).mode == "ray"
    assert placement_of(dataclasses.replace(config, gpus_per_worker=1.0)).mode == "ray"
    assert placement_of(dataclasses.replace(config, executor="ray")).mode == "ray"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert placement_of(config).describe() == "on Ray (a cluster was asked for (RAY_ADDRESS))"
    assert placement_of(dataclasses.replace(config, executor="local")).mode == "local"
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(placement, "ray_running", lambda: True)
    assert placement_of(config).describe() == "on Ray (Ray already running in this process)"  # a caller's ray.init
    ours = RunContext(started_here=True)  # the one-node Ray this command started (demo's build)
    monkeypatch.setattr(cluster, "started_here", lambda ctx: ctx.started_here)  # no Ray here to count nodes of
    assert placement_of(config, ours).mode == ("ray" if torch.cuda.is_available() else "local")
    assert placement_of(config, RunContext(address="10.0.0.1:6379")).describe() == \
        "on Ray (a cluster was asked for (--address))"
    with pytest.raises(UserError, match="unknown --executor 'threads'"):
        embed(dataclasses.replace(config, executor="threads"))


def test_the_command_line_embeds_in_process_without_importing_ray(tiny_clip, tmp_path):
    """On a machine alone without a GPU, `mieb-ray embed` never imports Ray: no start-up, no actor processes."""
    import subprocess
    import sys

    pq.write_table(pa.table({"key": [f"k{i}" for i in range(6)], "image": [_jpeg((40 * i, 90, 30)) for i in range(6)]}),
                   tmp_path / "t.parquet")
    script = ("import sys; from mieb_ray.cli import main; rc = main(sys.argv[1:]); "
              "print('ray imported:', 'ray' in sys.modules); sys.exit(rc)")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", script, "embed", "--input", str(tmp_path / "t.parquet"), "--out",
                           str(tmp_path / "out"), "--model", tiny_clip], capture_output=True, text=True, env=env,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    if torch.cuda.is_available():
        pytest.skip("a machine with a GPU embeds on Ray")
    assert "[embed] in this process (no cluster: Ray not started)" in done.stdout
    assert "ray imported: False" in done.stdout
    assert json.loads((tmp_path / "out" / "_manifest.json").read_text())["counts"] == {"total": 6, "errors": 0}


@pytest.mark.parametrize("where", ["ray", "local"])
def test_a_corrupt_input_file_is_one_line_from_the_worker_that_reads_it(mieb_train, tiny_clip, tmp_path, where):
    root, train = mieb_train
    table = tmp_path / "table"
    pa.fs.copy_files(root, str(table))  # its manifest gives the row counts: no footer is read before the run
    victim = table / train["shards"][-1]["path"]
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.raises(UserError, match=r"^unreadable parquet file .*000002\.parquet: Parquet magic bytes"):
        embed(EmbedConfig(str(table), str(tmp_path / "out"), tiny_clip, executor=where), log=lambda _: None)


def test_text_embeddings_equal_the_encoder(mieb_train, tiny_clip, tmp_path):
    root, _ = mieb_train
    manifest = embed(EmbedConfig(root, str(tmp_path), tiny_clip, modality="text", batch_size=32))
    got = output_rows(str(tmp_path))
    source = train_rows(root)
    assert set(got) == set(source) and manifest["config"]["modality"] == "text"
    encoder = Encoder(tiny_clip, load_info(tiny_clip, tiny_clip, None, modality="text"), device="cpu")
    keys = sorted(got)
    ref = encoder.encode_texts([source[k]["text"] for k in keys])
    assert np.allclose(np.stack([got[k][0] for k in keys]), ref, atol=1e-5)


def _jpeg(color) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(buf, "JPEG")
    return buf.getvalue()


@pytest.mark.parametrize("where", ["ray", "local"])
def test_bad_images_become_error_rows(ray_local, tiny_clip, tmp_path, where):
    good = [_jpeg((i * 40, 100, 200 - i * 30)) for i in range(5)]
    png = io.BytesIO()
    Image.new("RGB", (50, 50), "red").save(png, "PNG")
    bad = {"corrupt": good[0][:20] + os.urandom(500), "truncated": png.getvalue()[:60], "empty": b"",
           "text": b"this is not an image\n"}
    keys = [f"good/{i}" for i in range(5)] + [f"bad/{k}" for k in bad]
    images = good + list(bad.values())
    table = pa.table({"id": keys, "img": pa.array(images, pa.binary())})  # any table: raw bytes, other names
    pq.write_table(table, tmp_path / "table.parquet")
    out = str(tmp_path / "out")
    with pytest.raises(UserError, match=r"^4 of 9 rows could not be encoded, more than --max-error-rate 0.01"):
        embed(EmbedConfig(str(tmp_path / "table.parquet"), out, tiny_clip, image_column="img", key_column="id",
                          executor=where))
    manifest = embed(EmbedConfig(str(tmp_path / "table.parquet"), out, tiny_clip, image_column="img", key_column="id",
                     max_error_rate=0.5, resume=True, executor=where))
    assert manifest["counts"] == {"total": 5, "errors": 4}
    assert set(output_rows(out)) == {f"good/{i}" for i in range(5)}
    errors = pa.ipc.open_file(os.path.join(out, manifest["error_files"][0])).read_all().to_pylist()
    assert sorted(e["key"] for e in errors) == sorted(f"bad/{k}" for k in bad)
    assert all(e["error"] for e in errors)


def test_s3_in_and_out_with_a_model_on_s3(ray_local, s3, mieb_train, tiny_clip):
    root, _ = mieb_train
    client = s3.client()
    for base, prefix in ((root, "emb-test/train"), (tiny_clip, "emb-test/model")):
        for path in glob.glob(f"{base}/**/*", recursive=True):
            if os.path.isfile(path):
                client.upload_file(path, s3.bucket, f"{prefix}/{os.path.relpath(path, base)}")
    out = f"s3://{s3.bucket}/emb-test/out"
    manifest = embed(EmbedConfig(f"s3://{s3.bucket}/emb-test/train", out, f"s3://{s3.bucket}/emb-test/model",
                     carry_columns=["dataset_name"]))
    listed = {o["Key"] for o in client.list_objects_v2(Bucket=s3.bucket, Prefix="emb-test/out/")["Contents"]}
    assert {f"emb-test/out/{s['path']}" for s in manifest["shards"]} | {"emb-test/out/_manifest.json"} <= listed
    assert json.loads(client.get_object(Bucket=s3.bucket, Key="emb-test/out/_manifest.json")["Body"].read()) \
        == manifest
    assert sum(embeddings.open_shard(u).num_rows for u in embeddings.shard_uris(out)) == len(train_rows(root))
    with pytest.raises(UserError, match="^bucket 'no-such-bucket' does not exist"):
        embed(EmbedConfig(f"s3://{s3.bucket}/emb-test/train", "s3://no-such-bucket/out", tiny_clip))


def test_a_hub_model_is_downloaded_where_it_encodes_and_a_reused_output_downloads_no_weights(
        mieb_train, tiny_clip, tmp_path, monkeypatch):
    """The job's driver (a cluster's head) reads a hub model's small files; the weights are downloaded where the
    encoders run, here in this process, once. eval --model (reuse) on a machine that never loaded the model finds
    its embeddings done without downloading the weights."""
    root, _ = mieb_train
    hub = fakehub.serve_models(monkeypatch, str(tmp_path / "hub"), {"someone/tiny-clip": tiny_clip})
    try:
        config = EmbedConfig(root, str(tmp_path / "out"), "someone/tiny-clip", executor="local", batch_size=16,
                             reuse=True)
        manifest = embed(config, log=lambda line: None)
        assert manifest["counts"] == {"total": len(train_rows(root)), "errors": 0}
        files = sorted(f for f in os.listdir(tiny_clip) if f.endswith((".json", ".safetensors")))
        assert hub.downloads() == files  # each once: the driver's small files serve the encoder too
        assert manifest["model"]["revision"] == fakehub.commit("someone/tiny-clip")

        shutil.rmtree(tmp_path / "hub" / "cache")  # another machine
        seen, lines = len(hub.requests), []
        assert embed(config, log=lines.append) == manifest
        assert lines[-1].startswith("[embed] reusing")
        assert hub.downloads(seen) == [f for f in files if f.endswith(".json")]
    finally:
        hub.stop()


def test_webdataset_input_with_json_fields(ray_local, mirror, tiny_clip, tmp_path):
    from mieb_ray.pipelines.build import BuildConfig, build

    train = str(tmp_path / "wds")
    build(BuildConfig(mirror[0], train, datasets=["gtsrb", "stl10"], fmt="webdataset", executor="local"))  # the input
    manifest = embed(EmbedConfig(train, str(tmp_path / "out"), tiny_clip, carry_columns=["dataset_name", "label"]))
    got = output_rows(str(tmp_path / "out"))
    assert len(got) == manifest["counts"]["total"] == 24
    assert {row["dataset_name"] for _, row in got.values()} == {"gtsrb", "stl10"}
    assert all(key.split("/")[0] == row["dataset_name"] for key, (_, row) in got.items())
    # in-process, the tars are counted and indexed inline: the same rows and vectors
    local = embed(EmbedConfig(train, str(tmp_path / "local"), tiny_clip, carry_columns=["dataset_name", "label"],
                              executor="local"))
    assert local["executor"] == "local" and local["counts"] == manifest["counts"]
    mine = output_rows(str(tmp_path / "local"))
    assert mine.keys() == got.keys() and all(mine[k][1] == got[k][1] for k in got)
    assert np.allclose(np.stack([mine[k][0] for k in got]), np.stack([got[k][0] for k in got]), atol=1e-5)


def test_bad_setup_fails_in_one_line_before_any_work(mieb_train, tiny_clip, tmp_path, capsys):
    from transformers import BertConfig, BertModel

    root, _ = mieb_train
    bert = tmp_path / "bert"
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                         vocab_size=99)).save_pretrained(bert)
    cases = [
        (["--model", str(bert)], "(BertModel) cannot embed images: it has no get_image_features"),
        (["--model", tiny_clip, "--image-column", "picture"], "has no column picture"),
        (["--model", tiny_clip, "--input", str(tmp_path / "empty")], "no .parquet or .tar files under"),
        # the test Ray's 4 CPUs held by encoders: no read task could ever run (it waited forever)
        (["--model", tiny_clip, "--workers", "4"], "4 encoders x 1 CPU would hold all 4 CPUs the Ray cluster has"),
    ]
    (tmp_path / "empty").mkdir()
    for flags, message in cases:
        args = ["embed", "--input", root, "--out", str(tmp_path / "out"), *flags]
        if "--input" in flags:
            args = ["embed", "--out", str(tmp_path / "out"), *flags]
        assert main(args) == 1
        err = capsys.readouterr().err.strip().splitlines()[-1]  # after any library's progress bars
        assert err.startswith("mieb-ray: error:") and message in err, err
    assert not os.path.exists(tmp_path / "out" / "_manifest.json")


def test_spec_round_trips_through_the_manifest(image_run):
    _, manifest = image_run
    spec = ImageSpec(**manifest["preprocessing"])
    pixels = load_image(_jpeg((10, 20, 30)), spec)
    assert pixels.shape == (spec.height, spec.width, 3)
    assert normalize(torch.from_numpy(pixels[None]), spec).shape == (1, 3, spec.height, spec.width)


def test_a_table_of_image_files_embeds_them_and_names_a_file_it_cannot_read(tiny_clip, tmp_path):
    """A table that holds its images by path (a column of paths relative to it, or `datasets`' to_parquet of local
    files) embeds as the same images held as bytes; a file that is not there is an error row naming it."""
    from support.pictures import encode, picture

    photos = {"a": encode(picture("coffee.jpg")), "b": encode(picture("rocket.jpg"))}
    for key, data in photos.items():
        (tmp_path / "files").mkdir(exist_ok=True)
        (tmp_path / "files" / f"{key}.jpg").write_bytes(data)
    pq.write_table(pa.table({"key": list(photos), "image": list(photos.values())}), tmp_path / "bytes.parquet")
    pq.write_table(pa.table({"key": ["a", "b", "c"], "image": ["a.jpg", "b.jpg", "c.jpg"]}),
                   tmp_path / "files" / "t.parquet")
    runs = {}
    for name, table in (("bytes", tmp_path / "bytes.parquet"), ("files", tmp_path / "files" / "t.parquet")):
        embed(EmbedConfig(str(table), str(tmp_path / f"out-{name}"), tiny_clip, executor="local",
                          max_error_rate=0.5), log=lambda _: None)
        runs[name] = dict(zip(*embeddings.read_all(str(tmp_path / f"out-{name}"))))
    assert sorted(runs["files"]) == ["a", "b"]
    for key in photos:
        np.testing.assert_allclose(runs["files"][key], runs["bytes"][key], rtol=0, atol=1e-6)
    errors = pa.ipc.open_file(glob.glob(str(tmp_path / "out-files" / "_errors" / "*"))[0]).read_all().to_pylist()
    assert errors == [{"key": "c", "error": "cannot read its image file c.jpg"}]


def test_a_run_whose_output_was_taken_over_commits_nothing_more(mieb_train, tiny_clip, tmp_path):
    """A run that went unheard for lease.STALE_SECONDS (a driver on another machine) was taken for dead and
    another run took its output over: its next unit is refused before any file of it is committed, so the other
    run's files are never mixed with its own, and it never writes over the other's lease."""
    root, _ = mieb_train
    out = tmp_path / "out"
    other = {"job": "embed", "run": "other", "host": "gpu-7", "pid": 12, "started_at": 1.0, "since": time.time(),
             "seen": time.time()}

    def taken_over_after_the_first_unit(line: str) -> None:
        if re.match(r"\[embed\] 1/\d+ units", line):
            (out / storage.LEASE).write_text(json.dumps(other))

    config = EmbedConfig(root, str(out), tiny_clip, batch_size=16, executor="local")
    with pytest.raises(UserError, match=rf"^{re.escape(str(out))} was taken over by another run of mieb-ray embed "
                                        r"\(pid 12 on host gpu-7, last heard from \d+ s ago, since .*\) while this "
                                        r"run's hold on it lapsed: unit \S+ was not committed$"):
        embed(config, log=taken_over_after_the_first_unit)
    assert len(list(out.rglob("*.arrow"))) == len(list((out / "_progress").rglob("*.json"))) == 1
    assert json.loads((out / storage.LEASE).read_text()) == other


def test_a_local_model_missing_where_an_encoder_runs_names_that_node(ray_local, mieb_train, tiny_clip, tmp_path):
    """A local --model is read by the driver, then by each encoder on its own node: on a cluster without a shared
    disk one may lack it. Here the folder goes after the driver read it; the error names the node."""
    root, _ = mieb_train
    model = tmp_path / "model"
    shutil.copytree(tiny_clip, model)

    def gone_once_planned(line: str) -> None:
        if re.match(r"\[embed\] \d+ shards from", line):
            model.rename(tmp_path / "elsewhere")

    with pytest.raises(UserError, match=rf"^model path {re.escape(str(model))} does not exist on "
                                        rf"{re.escape(socket.gethostname())}, a node where this job encodes: a local "
                                        r"--model must be at that path on every node that encodes \(or give it as "
                                        r"s3:// or a hub name\)$"):
        embed(EmbedConfig(root, str(tmp_path / "out"), str(model), batch_size=16, executor="ray"),
              log=gone_once_planned)


def test_a_row_without_a_key_is_an_error_row_that_says_where_it_is(tiny_clip, tmp_path):
    """A null key named nothing: its embedding was written under the key "None". Now it is an error row giving its
    row and file; the other rows are embedded."""
    photo = [_jpeg((200, 30, 30)), _jpeg((30, 200, 30)), _jpeg((30, 30, 200))]
    pq.write_table(pa.table({"key": ["a", None, "c"], "image": photo}), tmp_path / "t.parquet")
    manifest = embed(EmbedConfig(str(tmp_path / "t.parquet"), str(tmp_path / "out"), tiny_clip, executor="local",
                                 max_error_rate=1.0), log=lambda line: None)
    assert embeddings.read_all(str(tmp_path / "out"))[0] == ["a", "c"]
    errors = [pa.ipc.open_file(str(tmp_path / "out" / e)).read_all().to_pylist() for e in manifest["error_files"]]
    assert errors == [[{"key": None, "error": f"null key (column key): row 1 of {tmp_path / 't.parquet'}"}]]


def test_an_out_inside_the_input_is_refused_before_anything_is_written(tiny_clip, tmp_path):
    """An --out inside the --input folder: the run went through, and every later run of that input read the
    output's tables as rows (or refused them). Now refused at once, nothing made there."""
    table = tmp_path / "table"
    table.mkdir()
    pq.write_table(pa.table({"key": ["a"], "image": [_jpeg((200, 30, 30))]}), table / "t.parquet")
    with pytest.raises(UserError, match=rf"^--out {re.escape(str(table / 'emb'))} is inside the input "
                                        rf"{re.escape(str(table))}: its files would be read as the input's rows; "
                                        r"choose an --out outside it$"):
        embed(EmbedConfig(str(table), str(table / "emb"), tiny_clip, executor="local"), log=lambda line: None)
    assert sorted(p.name for p in table.iterdir()) == ["t.parquet"]
