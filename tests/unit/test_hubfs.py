"""The hub's filesystem (mieb_ray/hubfs.py): which errors are retried, the settings it reads, what Ray's workers get
from it; and huggingface_hub's own client through it, against a local HTTP server in the hub's image that cuts
ranges short, drops connections, rate-limits and fails (support/fakehub.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest
from support import fakehub

from mieb_ray import hubfs, hubgate, storage
from mieb_ray.errors import UserError
from mieb_ray.io import reader
from mieb_ray.sources import by_slug

pytestmark = pytest.mark.timeout(300)
TOKEN = "hf_TestTokenThatMustNeverBePrinted0123"


def test_what_is_retried(monkeypatch):
    import httpx2

    request = httpx2.Request("GET", "https://huggingface.co/x")
    for status, transient in [(429, True), (503, True), (500, True), (404, False), (401, False), (403, False)]:
        assert hubfs.classify(fakehub.http_error(status, "https://huggingface.co/x"))[0] is transient, status
    assert hubfs.classify(fakehub.http_error(429, "https://h/x", headers={"Retry-After": "7"})) == (True, 7.0)
    assert hubfs.classify(httpx2.ReadTimeout("t", request=request))[0]
    assert hubfs.classify(httpx2.ReadError("reset", request=request))[0]
    assert hubfs.classify(hubfs.TruncatedRead("short"))[0]
    assert not hubfs.classify(ValueError("a bad file"))[0]
    # no connection before the hub ever answered (in a fresh process): no network or a wrong endpoint, raised after
    # a few tries; once the hub has answered, a refused connection is an outage, waited out
    env = {**os.environ, hubfs.ENV_RETRY_WAIT: "0.01"}
    done = subprocess.run([sys.executable, "-c", FIRST_REQUESTS], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [f"raised after {hubfs.UNREACHED_TRIES}", "before an answer: False",
                                        "after an answer: True"]


FIRST_REQUESTS = """
import httpx2
from mieb_ray import hubfs

request = httpx2.Request("GET", "https://huggingface.co/x")
calls = []

def unreachable():
    calls.append(1)
    raise httpx2.ConnectError("[Errno -2] Name or service not known", request=request)

try:
    hubfs.call(unreachable, "hf://x")
except httpx2.ConnectError:  # as it is: storage makes it one line ("cannot list ...")
    print("raised after", len(calls))
print("before an answer:", hubfs.classify(httpx2.ConnectError("Connection refused", request=request))[0])
hubfs.call(lambda: None, "hf://x")  # the hub answers
print("after an answer:", hubfs.classify(httpx2.ConnectError("Connection refused", request=request))[0])
"""


def test_a_hub_setting_that_is_not_a_number_is_one_line(monkeypatch):
    monkeypatch.setenv(hubfs.ENV_RETRIES, "six")
    with pytest.raises(UserError, match="^MIEB_RAY_HUB_RETRIES='six' is not an integer$"):
        hubfs.call(lambda: None, "hf://x")
    monkeypatch.setenv(hubfs.ENV_RETRIES, "2")
    monkeypatch.setenv(hubfs.ENV_RETRY_WAIT, "soon")
    with pytest.raises(UserError, match="^MIEB_RAY_HUB_RETRY_WAIT='soon' is not a number$"):
        hubfs.call(lambda: None, "hf://x")
    monkeypatch.setenv(hubfs.ENV_RETRY_WAIT, "0.05")  # seconds: a fraction is one
    failures = [hubfs.TruncatedRead("short")]

    def once():
        if failures:
            raise failures.pop()
        return "read"

    t0 = time.monotonic()
    assert hubfs.call(once, "hf://x") == "read" and 0.02 <= time.monotonic() - t0 < 2
    monkeypatch.setenv(hubfs.ENV_CONCURRENCY, "many")
    with pytest.raises(UserError, match="^MIEB_RAY_HUB_CONCURRENCY='many' is not an integer$"):
        hubfs.bound()


def test_worker_runtime_env(monkeypatch):
    for name in list(os.environ):
        if name in hubfs.WORKER_ENV or name.startswith(hubfs.WORKER_ENV_PREFIX):
            monkeypatch.delenv(name)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert hubfs.worker_runtime_env() is None
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv(hubfs.ENV_CONCURRENCY, "4")
    env = hubfs.worker_runtime_env()
    assert list(env) == ["worker_process_setup_hook"] and TOKEN not in repr(env)
    monkeypatch.delenv("HF_TOKEN")
    env["worker_process_setup_hook"]()  # what a worker runs first
    assert os.environ["HF_TOKEN"] == TOKEN
    # a submitted job that sets the token itself keeps it; one with its own setup hook keeps that
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", '{"runtime_env": {"env_vars": {"HF_TOKEN": "x", '
                                                      '"MIEB_RAY_HUB_CONCURRENCY": "4"}}}')
    assert hubfs.worker_runtime_env() is None
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", '{"runtime_env": {"worker_process_setup_hook": "m.f"}}')
    assert hubfs.worker_runtime_env() is None


def test_the_real_hub_client_through_a_local_http_hub(mirror, monkeypatch):
    """huggingface_hub's own HfFileSystem, as used on the real hub, against an HTTP server in the hub's image that
    cuts ranges short, drops connections, rate-limits and fails: the rows read equal the mirror's, and every
    request carried the token."""
    import huggingface_hub.constants
    import pyarrow as pa

    root, _ = mirror
    server = fakehub.HttpHub(root, every=4, token=TOKEN)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv(hubfs.ENV_RETRY_WAIT, "0.01")
    monkeypatch.setenv(hubfs.ENV_FS, fakehub.HTTP_FACTORY)  # huggingface_hub's HfFileSystem at the server's url
    monkeypatch.setenv(fakehub.ENV_HTTP, server.url)
    storage.reset_clients()
    try:
        for slug in ("cifar10", "imagenet1k"):
            source = by_slug(slug)

            def rows(where):
                units, _ = reader.plan_source(source, where, 5)
                table = pa.concat_tables(chunk for unit in units
                                         for chunk in reader.read(unit, list(reader.source_columns(source).values())))
                return table.select(["index", "image", "label"]).to_pylist()

            assert rows("hf") == rows(root), slug
    finally:
        server.stop()
        storage.reset_clients()
    hub_requests = [r for r in server.requests if not r[1].startswith("/api/agent-harnesses")]
    assert {auth for _, _, auth, _ in hub_requests} == {f"Bearer {TOKEN}"}
    assert {fault for *_, fault in hub_requests} >= {"429", "truncate", "503", "drop"}


@pytest.mark.parametrize("bounded", [False, True], ids=["alone", "in-bounded-client"])
def test_the_hub_clients_own_retries_of_a_429_pause_the_gate_and_are_counted(mirror, monkeypatch, bounded):
    """huggingface_hub retries a refused byte range itself, inside one of our requests: every 429 the hub sent,
    those too, pauses the job's gate and counts in the build's closing line. Inside `bounded_client` too (mteb's
    loads beside a build in one process), with the bound at 1: a request of ours holds the one slot and its
    client's requests pass (no second slot asked: no deadlock), each 429 counted once."""
    import huggingface_hub.constants

    root, _ = mirror
    server = fakehub.HttpHub(root, every=3, faults=("429",), token=TOKEN)
    if bounded:
        fakehub.as_the_hub(monkeypatch, server.url)  # bounded_client gates the hub's host
        monkeypatch.setenv(hubfs.ENV_CONCURRENCY, "1")
        hubgate.reset(1)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv(hubfs.ENV_FS, fakehub.HTTP_FACTORY)  # huggingface_hub's HfFileSystem at the server's url
    monkeypatch.setenv(fakehub.ENV_HTTP, server.url)
    storage.reset_clients()
    before = hubfs.requests_so_far()
    try:
        with hubfs.bounded_client() if bounded else contextlib.nullcontext():
            source = by_slug("cifar10")
            units, _ = reader.plan_source(source, "hf", 5)
            image = reader.source_columns(source)["image"]
            rows = sum(len(chunk) for unit in units for chunk in reader.read(unit, [image]))
        after = hubfs.requests_so_far()
    finally:
        server.stop()
        storage.reset_clients()
        monkeypatch.undo()
        hubgate.reset(hubfs.bound())
    refused = [path for _, path, _, fault in server.requests if fault == "429"]
    assert rows == 12 and any("/resolve/" in path for path in refused)  # some retried by the client itself
    assert after["throttled"] - before["throttled"] == len(refused)


def test_bounded_client_holds_the_bound_in_every_thread(tmp_path, monkeypatch):
    """Inside `bounded_client`, huggingface_hub's requests from any thread of the process (datasets downloads a
    split's files 16 at once, in a pool) each hold a slot of the job's gate until their body is read: 16 downloads
    from 8 threads at once, bound 1, and a server in the hub's image answers one at a time, every request counted;
    the same downloads outside the block went 2 or more at once."""
    from concurrent.futures import ThreadPoolExecutor

    from huggingface_hub import hf_hub_download

    repo = tmp_path / "hub" / "org" / "files"
    repo.mkdir(parents=True)
    for i in range(16):
        (repo / f"f{i:02d}.bin").write_bytes(os.urandom(4096))
    server = fakehub.HttpHub(str(tmp_path / "hub"), delay=0.02)
    fakehub.as_the_hub(monkeypatch, server.url)
    monkeypatch.setenv(hubfs.ENV_CONCURRENCY, "1")
    hubgate.reset(1)

    def download_all(cache: str) -> None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: hf_hub_download("org/files", f"f{i:02d}.bin", repo_type="dataset",
                                                    revision="0" * 40, cache_dir=str(tmp_path / cache)), range(16)))

    try:
        download_all("unbounded")
        unbounded, server.peak, seen = server.peak, 0, len(server.requests)
        before = hubfs.requests_so_far()
        with hubfs.bounded_client():
            download_all("bounded")
        after = hubfs.requests_so_far()
    finally:
        server.stop()
        monkeypatch.undo()
        hubgate.reset(hubfs.bound())
    assert unbounded >= 2 and server.peak == 1
    assert after["requests"] - before["requests"] == len(server.requests) - seen >= 32  # a HEAD and a GET a file
