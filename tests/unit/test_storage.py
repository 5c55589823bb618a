"""storage.py against the local disk and a real S3 server (SeaweedFS), cross-checked with boto3; its one-line
errors, and what they never hold (a secret)."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
from support import fakehub, s3server

from mieb_ray import hubfs, storage


@pytest.fixture
def fresh_clients():
    """storage makes its S3 and hub clients once per process; tests that change the environment need new ones."""
    storage.reset_clients()
    yield
    storage.reset_clients()


def test_local_commit_is_a_rename_and_leaves_no_staging_file(tmp_path):
    dest = str(tmp_path / "out" / "cifar10" / "000000.parquet")
    local = storage.staging_path(dest)
    assert os.path.dirname(local) == os.path.dirname(dest) and os.path.basename(local).startswith(".")
    with open(local, "wb") as f:
        f.write(b"shard")
    assert not os.path.exists(dest)  # invisible until committed
    storage.commit(local, dest)
    assert open(dest, "rb").read() == b"shard" and os.listdir(os.path.dirname(dest)) == ["000000.parquet"]


def test_a_killed_runs_staging_files_are_removed_even_as_one_goes_meanwhile(tmp_path, monkeypatch):
    """An interrupted run's task may still commit its staging file while the next run clears them."""
    shard = tmp_path / "cifar10" / "000000.arrow"
    shard.parent.mkdir()
    shard.write_bytes(b"shard")
    left, going = storage.staging_path(str(shard)), storage.staging_path(str(tmp_path / "cifar10" / "000001.arrow"))
    for path in (left, going):
        open(path, "wb").close()
    real = os.walk

    def walk_then_commit(root):  # the listing holds both; the other run commits `going` right after
        listed = list(real(root))
        os.rename(going, tmp_path / "cifar10" / "000001.arrow")
        return listed

    monkeypatch.setattr(os, "walk", walk_then_commit)
    storage.remove_staging(str(tmp_path))
    assert sorted(os.listdir(shard.parent)) == ["000000.arrow", "000001.arrow"]


def test_file_stats_are_size_and_sha256(tmp_path):
    (tmp_path / "f").write_bytes(b"abcdef")
    assert storage.file_stats(str(tmp_path / "f")) == {"bytes": 6, "sha256": hashlib.sha256(b"abcdef").hexdigest()}


def test_s3_round_trip_agrees_with_boto3(s3, fresh_clients):
    client = s3.client()
    root = f"s3://{s3.bucket}/storage-test"
    storage.write_bytes(f"{root}/a/1.bin", b"one")
    storage.write_manifest(root, {"format": "x", "rows": 3})
    client.put_object(Bucket=s3.bucket, Key="storage-test/a/b/2.bin", Body=b"two")
    assert client.get_object(Bucket=s3.bucket, Key="storage-test/a/1.bin")["Body"].read() == b"one"
    assert storage.list_files(f"{root}/a") == [f"{root}/a/1.bin", f"{root}/a/b/2.bin"]
    assert storage.read_text(f"{root}/a/b/2.bin") == "two"
    assert storage.read_manifest(root) == {"format": "x", "rows": 3}
    assert storage.exists(f"{root}/a/1.bin") and not storage.exists(f"{root}/a/3.bin")
    storage.delete(f"{root}/a/1.bin")
    assert storage.list_files(f"{root}/a") == [f"{root}/a/b/2.bin"]
    assert storage.list_files(f"s3://{s3.bucket}/nothing-here") == []


def test_a_local_output_that_cannot_be_made_is_one_clear_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(storage.StorageError) as err:
        storage.check_output(str(tmp_path / "file" / "out"))
    assert str(err.value) == f"cannot make the output folder {tmp_path / 'file' / 'out'}: Not a directory"


def test_missing_bucket_is_one_clear_line(s3, fresh_clients, tmp_path):
    with pytest.raises(storage.StorageError) as err:
        storage.check_output("s3://no-such-bucket/out")
    assert str(err.value) == f"bucket 'no-such-bucket' does not exist at {s3.endpoint}"


def test_wrong_credentials_fail_without_leaking_the_secret(s3, fresh_clients, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value-1234")
    with pytest.raises(storage.StorageError) as err:
        storage.check_output(f"s3://{s3.bucket}/out")
    local = tmp_path / "shard"
    local.write_bytes(b"x" * 100_000)
    with pytest.raises(storage.StorageError) as err2:
        storage.commit(str(local), f"s3://{s3.bucket}/out/shard")
    assert not local.exists()  # the staging file is cleaned up either way
    for message in (str(err.value), str(err2.value)):
        assert "\n" not in message and "wrong-secret-value-1234" not in message and s3.secret_key not in message
    assert str(err.value).startswith(f"cannot reach bucket '{s3.bucket}'")
    assert str(err2.value).startswith(f"cannot write s3://{s3.bucket}/out/shard: ")
    assert "Contents" not in s3.client().list_objects_v2(Bucket=s3.bucket, Prefix="out/")  # nothing half-written


def test_display_drops_credentials_from_uris():
    assert storage.display("s3://key:secret@bucket/p") == "s3://bucket/p"
    assert storage.display("/data/mirror") == "/data/mirror"


@pytest.mark.parametrize("endpoint, reason", [
    ("http://127.0.0.1:{port}", "connection refused"),  # nothing listens there
    ("http://nonexistent.invalid:8333", "unknown host 'nonexistent.invalid'"),  # the name does not resolve
])
def test_an_unreachable_s3_endpoint_is_one_line_in_seconds(fresh_clients, monkeypatch, tmp_path, endpoint, reason):
    """Not after the SDK's 10 retries (72-105 s): nothing can succeed, so say it now."""
    endpoint = endpoint.format(port=s3server.free_port())
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    t0 = time.monotonic()
    with pytest.raises(storage.StorageError) as err:
        storage.check_output("s3://bucket/out")
    assert str(err.value).startswith(f"cannot reach S3 endpoint {endpoint}: {reason}") and "\n" not in str(err.value)
    if "unknown host" in reason:  # every S3 call, not only the output check: the host is resolved first
        storage.reset_clients()
        with pytest.raises(storage.StorageError, match="unknown host"):
            storage.list_files("s3://bucket/in")
        (tmp_path / "shard").write_bytes(b"x")
        with pytest.raises(storage.StorageError, match="unknown host"):  # a worker's commit (boto3)
            storage.commit(str(tmp_path / "shard"), "s3://bucket/out/shard")
    assert time.monotonic() - t0 < 2 * storage.PROBE_TIMEOUT


def test_a_reachable_s3_endpoint_passes_the_probe(s3, fresh_clients):
    t0 = time.monotonic()
    storage.probe_s3()
    storage.check_output(f"s3://{s3.bucket}/probe")
    assert time.monotonic() - t0 < 2


def test_messages_never_hold_a_secret(fresh_clients, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefSECRET")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "awsSECRET123")
    assert storage.redact("401: Bearer hf_abcdefSECRET, key awsSECRET123") == "401: Bearer ***, key ***"
    # a hub whose transport fails saying the token, on two lines: the error names the path, its first line, no token
    config = fakehub.write_config(str(tmp_path / "hub.json"), root=str(tmp_path),
                                  error="bad token hf_abcdefSECRET\nmore")
    monkeypatch.setenv(hubfs.ENV_FS, fakehub.FACTORY)
    monkeypatch.setenv(fakehub.ENV_CONFIG, config)
    storage.reset_clients()
    with pytest.raises(storage.StorageError) as err:
        storage.list_files("hf://datasets/org/private/data")
    message = str(err.value)
    assert message == "cannot list hf://datasets/org/private/data: bad token ***"


def test_copies_of_remote_files_make_room_for_a_new_one_least_recently_used_first(tmp_path, monkeypatch):
    """A sweep over checkpoints on S3 made one copy of each on every node, until the disk was full: a new copy now
    removes the copies used least recently while the disk has less than CACHE_RESERVE free, never one used within
    the hour, nor one on a disk with room."""
    def checkpoint(name: str) -> str:
        root = tmp_path / "bucket" / name
        root.mkdir(parents=True)
        (root / "model.safetensors").write_bytes(name.encode() * 1000)
        return str(root)

    def copy(source: str) -> str:
        return storage.local_copy(source, storage.files_under(source), str(tmp_path / "cache"))

    second = checkpoint("step-2")
    old, recent = copy(checkpoint("step-1")), copy(second)
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))  # last used two hours ago
    cut_short = tmp_path / "cache" / ".download-x"
    cut_short.mkdir()
    os.utime(cut_short, (hours_ago, hours_ago))
    assert copy(checkpoint("step-3")) and os.path.isdir(old)  # room on this disk: nothing goes
    assert storage.unused_copies([("a", 10.0), ("b", 5.0), ("c", 9000.0)], 9000.0 + 60) == ["b", "a"]
    monkeypatch.setattr(storage, "CACHE_RESERVE", 1.0)  # a disk never free enough: every unused copy goes
    new = copy(checkpoint("step-4"))
    assert open(os.path.join(new, "model.safetensors"), "rb").read() == b"step-4" * 1000
    assert not os.path.exists(old) and not cut_short.exists()
    assert os.path.isdir(recent) and len([e for e in os.listdir(tmp_path / "cache") if not e.startswith(".")]) == 3
    os.utime(recent, (hours_ago, hours_ago))
    assert copy(second) == recent  # found, and its use noted
    copy(checkpoint("step-5"))
    assert os.path.isdir(recent)  # used just now: kept, though the disk is short


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_conditional_write_lands_only_over_the_version_it_read(where, tmp_path, request):
    """storage.write_if / delete_if (what a run's lease is written with): a write or delete lands only while the
    file is as the writer last saw it, and a retried write that had landed counts as landed; on S3 read back with
    boto3 (SeaweedFS's conditional PUT and DELETE)."""
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        request.getfixturevalue("fresh_clients")
        uri = f"s3://{s3.bucket}/cas-test/{tmp_path.name}/lease.json"
        client, key = s3.client(), f"cas-test/{tmp_path.name}/lease.json"

        def content():
            try:
                return client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
            except client.exceptions.NoSuchKey:
                return None
    else:
        uri = str(tmp_path / "lease.json")

        def content():
            return open(uri, "rb").read() if os.path.exists(uri) else None

    assert storage.read_versioned(uri) == (None, None)
    first = storage.write_if(uri, b"run a", None)
    assert first and content() == b"run a"
    assert storage.write_if(uri, b"run b", None) is None and content() == b"run a"  # it exists now
    assert storage.write_if(uri, b"run a", None) == first  # a retry of the write that landed: landed
    second = storage.write_if(uri, b"run a, later", first)
    assert second not in (None, first) and content() == b"run a, later"
    assert storage.write_if(uri, b"run b", first) is None and content() == b"run a, later"  # it changed since
    assert storage.read_versioned(uri) == (b"run a, later", second)
    assert not storage.delete_if(uri, first) and content() == b"run a, later"
    assert storage.delete_if(uri, second) and content() is None
    assert storage.write_if(uri, b"run b", second) is None and content() is None  # nothing to write over
