"""A model under an s3:// prefix (SeaweedFS, the tests' S3 server): downloaded once per machine and version of its
files, one weight format only; a prefix with no model is one line. Storage, not the encoder: apart from
test_model.py, which bench/gpu_check.sh also runs on a GPU machine that has no S3 server."""

from __future__ import annotations

import os

import pytest

from mieb_ray import storage
from mieb_ray.demo_data.models import make_tiny_clip
from mieb_ray.encode.model import default_cache_dir, describe, load_info, resolve
from mieb_ray.errors import UserError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_clip(str(tmp_path_factory.mktemp("tiny-clip")))


def test_resolve_from_s3_downloads_once(s3, tiny, tmp_path, monkeypatch):
    storage.reset_clients()  # made for this server's environment
    client = s3.client()
    for name in os.listdir(tiny):
        client.upload_file(os.path.join(tiny, name), s3.bucket, f"models/tiny/{name}")
    # a second weight format the repo also carries: never downloaded beside the safetensors
    client.put_object(Bucket=s3.bucket, Key="models/tiny/pytorch_model.bin", Body=b"not used")
    uri = f"s3://{s3.bucket}/models/tiny"
    cache = str(tmp_path / "cache")

    path = resolve(uri, cache_dir=cache)
    assert os.path.dirname(path) == cache and sorted(os.listdir(cache)) == [".locks", os.path.basename(path)]
    assert set(os.listdir(path)) == set(os.listdir(tiny))
    for name in os.listdir(tiny):
        assert open(os.path.join(path, name), "rb").read() == open(os.path.join(tiny, name), "rb").read()
    info = load_info(path, uri, None)
    assert info.name == uri and info.revision is None and info.dim == 32

    def offline(*args, **kwargs):
        raise AssertionError("the second resolve must not touch S3")

    weights = os.path.join(path, "model.safetensors")
    before = os.stat(weights).st_mtime_ns
    monkeypatch.setattr(storage, "list_files", offline)
    monkeypatch.setattr(storage, "open_input", offline)
    assert resolve(uri + "/", cache_dir=cache) == path
    assert os.stat(weights).st_mtime_ns == before


def test_s3_prefix_without_a_model_is_a_user_error(s3, tmp_path):
    storage.reset_clients()
    for uri, says in ((f"s3://{s3.bucket}/models/nothing-here", "no model files (*.safetensors or pytorch_model*.bin) "
                       f"at s3://{s3.bucket}/models/nothing-here"),
                      ("s3://no-such-bucket-mieb/model",
                       f"bucket 'no-such-bucket-mieb' does not exist at {s3.endpoint}")):
        with pytest.raises(UserError) as caught:
            resolve(uri, cache_dir=str(tmp_path))
        assert str(caught.value) == says


def test_a_model_that_cannot_be_copied_to_this_machine_is_one_line(s3, tiny, tmp_path):
    """A cache this machine cannot write (here a file where its folder would go), as a full disk: one line naming
    the model and the cache, and no folder taken for a complete copy."""
    storage.reset_clients()
    client = s3.client()
    for name in os.listdir(tiny):
        client.upload_file(os.path.join(tiny, name), s3.bucket, f"models/nowhere/{name}")
    (tmp_path / "file").write_text("")
    uri, cache = f"s3://{s3.bucket}/models/nowhere", str(tmp_path / "file" / "cache")
    with pytest.raises(UserError) as caught:
        resolve(uri, cache_dir=cache)
    assert str(caught.value).startswith(f"cannot copy {uri} into {cache}: NotADirectoryError: ")
    assert "\n" not in str(caught.value)


def test_a_job_describes_an_s3_model_from_its_small_files_and_knows_when_its_weights_change(s3, tiny, tmp_path,
                                                                                          monkeypatch):
    """The driver (a cluster's head) reads the config, tokenizer and processor files; the model's identity is its
    files' sizes and times, as an input table's: the weights are downloaded only where they encode."""
    storage.reset_clients()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    client = s3.client()
    for name in os.listdir(tiny):
        client.upload_file(os.path.join(tiny, name), s3.bucket, f"models/described/{name}")
    uri = f"s3://{s3.bucket}/models/described"

    info, made_by = describe(uri)
    (folder,) = set(os.listdir(default_cache_dir())) - {".locks"}
    small = {f for f in os.listdir(tiny) if f.endswith(".json")}
    assert set(os.listdir(os.path.join(default_cache_dir(), folder))) == small
    assert info == load_info(tiny, uri, None)
    assert describe(uri)[1] == made_by  # nothing changed: the same identity
    client.put_object(Bucket=s3.bucket, Key="models/described/README.md", Body=b"a card: not a file it loads")
    assert describe(uri)[1] == made_by
    client.put_object(Bucket=s3.bucket, Key="models/described/model.safetensors", Body=b"other weights")
    assert describe(uri)[1] != made_by  # overwritten: another model


def test_the_encoders_of_one_node_download_an_s3_model_once_between_them(s3, tiny, tmp_path, monkeypatch):
    """Eight GPU encoders on a node start at once: one downloads the model, the others wait for it (each
    downloaded all of it, and seven copies were thrown away)."""
    import threading
    import time

    storage.reset_clients()
    client = s3.client()
    for name in os.listdir(tiny):
        client.upload_file(os.path.join(tiny, name), s3.bucket, f"models/shared/{name}")
    uri, cache = f"s3://{s3.bucket}/models/shared", str(tmp_path / "cache")
    opened, real_open = [], storage.open_input

    def slow_open(path):  # a download long enough for every encoder to start meanwhile
        opened.append(path)
        time.sleep(0.3)
        return real_open(path)

    monkeypatch.setattr(storage, "open_input", slow_open)
    paths = []
    encoders = [threading.Thread(target=lambda: paths.append(resolve(uri, cache_dir=cache))) for _ in range(4)]
    for encoder in encoders:
        encoder.start()
    for encoder in encoders:
        encoder.join()
    assert len(paths) == 4 and len(set(paths)) == 1
    assert sorted(os.path.basename(p) for p in opened) == sorted(os.listdir(tiny))  # each file once
