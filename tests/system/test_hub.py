"""Jobs reading the hub through a fake hub (support/fakehub.py) plugged in where the real client is: faults injected
into every process of a build, an embed or an audit change nothing in its output; permanent errors are one line and
fast; the token reaches every worker and no log, message or manifest; a 429 pauses every process of the job, and one
bound holds across every process of a three-node cluster. The filesystem and the gate alone: tests/unit/test_hubfs.py,
test_hubgate.py."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

import pytest
from support import fakehub

from mieb_ray import hubfs, hubgate, storage
from mieb_ray.errors import UserError
from mieb_ray.io import reader
from mieb_ray.pipelines.build import BuildConfig, build
from mieb_ray.sources import by_slug

pytestmark = pytest.mark.timeout(300)
DATASETS = ("cifar10", "imagenet1k")  # parquet and WebDataset tars
TOKEN = "hf_TestTokenThatMustNeverBePrinted0123"


@pytest.fixture
def hub(tmp_path_factory, monkeypatch):
    """`configure(**settings)` plugs the fake hub in here and, through the file conftest's ray_local names, in
    the Ray workers; it returns the path of the fake's fault log. Unplugged afterwards."""
    config = str(tmp_path_factory.getbasetemp() / "fakehub.json")  # conftest.fake_hub_config
    log = str(tmp_path_factory.mktemp("fakehub") / "faults.log")

    def configure(**settings) -> str:
        fakehub.write_config(config, log=log, **settings)
        monkeypatch.setenv(hubfs.ENV_FS, fakehub.FACTORY)
        monkeypatch.setenv(fakehub.ENV_CONFIG, config)
        monkeypatch.setenv(hubfs.ENV_RETRY_WAIT, "0.01")
        storage.reset_clients()
        hubgate.reset(hubfs.bound())  # this test's bound, its counts from zero
        return log

    yield configure
    if os.path.exists(config):
        os.unlink(config)
    storage.reset_clients()
    hubgate.reset(hubfs.bound())


def shards(manifest: dict) -> list[tuple]:
    return [(s["path"], s["rows"], s["sha256"]) for s in manifest["shards"]]


def test_a_build_through_a_faulty_hub_equals_a_clean_build(ray_local, mirror, hub, tmp_path):
    root, _ = mirror
    clean = build(BuildConfig(root, str(tmp_path / "clean"), datasets=DATASETS, rows_per_shard=5, executor="local"),
                  log=lambda _: None)
    log = hub(root=root, every=3)  # every 3rd request of each process: 429, timeout, truncated range, reset, 503
    faulty = build(BuildConfig("hf", str(tmp_path / "hub"), datasets=DATASETS, rows_per_shard=5,
                               check_counts=False), log=lambda _: None)
    assert shards(faulty) == shards(clean) and faulty["counts"]["datasets"] == clean["counts"]["datasets"]
    faults = [line.split() for line in open(log)]
    kinds = {kind for _, kind, _ in faults}
    assert {"429", "timeout", "truncate", "reset", "503"} <= kinds, kinds
    assert {pid for pid, _, _ in faults} - {str(os.getpid())}, "no fault in a worker: the test tested the driver only"


def test_an_outage_that_outlasts_the_local_retries_is_retried_by_ray(ray_local, mirror, hub, tmp_path):
    root, _ = mirror
    clean = build(BuildConfig(root, str(tmp_path / "clean"), datasets=["cifar10"], rows_per_shard=5, executor="local"),
                  log=lambda _: None)
    # in each worker, the first 6 requests for that file fail: as many as the local tries
    log = hub(root=root, flaky={"train-00000-of": int(os.environ.get(hubfs.ENV_RETRIES) or hubfs.DEFAULT_TRIES)},
              calm_pid=os.getpid())
    out = build(BuildConfig("hf", str(tmp_path / "hub"), datasets=["cifar10"], rows_per_shard=5, check_counts=False),
                log=lambda _: None)
    assert shards(out) == shards(clean)
    assert [line.split()[1] for line in open(log)].count("flaky") >= hubfs.DEFAULT_TRIES


def _pictures_on_the_hub(root) -> str:
    """A table of 6 JPEGs (key, image) in the fake hub's layout at `root`; its path under `root`."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    images = []
    for i in range(6):
        buf = io.BytesIO()
        Image.new("RGB", (40 + i, 30), (40 * i, 90, 200 - 30 * i)).save(buf, "JPEG")
        images.append(buf.getvalue())
    (root / "someone/pictures/data").mkdir(parents=True)
    pq.write_table(pa.table({"key": [f"k{i}" for i in range(6)], "image": images}),
                   root / "someone/pictures/data/table.parquet")
    return "someone/pictures/data/table.parquet"


def _flaky(hub, root) -> str:
    """In each Ray worker, the first 6 requests for the table fail: as many as the local tries. The fault log."""
    tries = int(os.environ.get(hubfs.ENV_RETRIES) or hubfs.DEFAULT_TRIES)
    return hub(root=str(root), flaky={"table.parquet": tries}, calm_pid=os.getpid())


def test_an_embed_through_an_outage_that_outlasts_the_local_retries_is_retried_by_ray(ray_local, hub, tiny_clip,
                                                                                      tmp_path):
    """A table on the hub (as BioVITA is for eval-biovita --model): the read tasks' requests fail as many times
    as the local tries, Ray runs those units again, and the embeddings equal those of a clean run (in-process,
    which equals a Ray run to float rounding: tests/unit/pipelines/test_embed.py)."""
    import numpy as np

    from mieb_ray.io import embeddings
    from mieb_ray.pipelines.embed import EmbedConfig, embed

    path = _pictures_on_the_hub(tmp_path / "hub")
    clean = embed(EmbedConfig(str(tmp_path / "hub" / path), str(tmp_path / "clean"), tiny_clip, rows_per_shard=3,
                              executor="local"), log=lambda _: None)
    log = _flaky(hub, tmp_path / "hub")
    out = embed(EmbedConfig(f"hf://datasets/{path}", str(tmp_path / "flaky"), tiny_clip, rows_per_shard=3,
                            executor="ray"), log=lambda _: None)
    assert [(s["path"], s["rows"]) for s in out["shards"]] == [(s["path"], s["rows"]) for s in clean["shards"]]
    assert len(out["shards"]) == 2 and out["counts"] == {"total": 6, "errors": 0}
    (keys, vectors), (clean_keys, clean_vectors) = (embeddings.read_all(str(tmp_path / d)) for d in ("flaky", "clean"))
    assert keys == clean_keys == [f"k{i}" for i in range(6)] and np.allclose(vectors, clean_vectors, atol=1e-5)
    assert [line.split()[1] for line in open(log)].count("flaky") >= hubfs.DEFAULT_TRIES


def test_an_audit_against_a_table_on_the_hub_through_an_outage_is_retried_by_ray(ray_local, hub, tmp_path):
    import pyarrow.parquet as pq

    from mieb_ray.audit.job import AuditConfig, audit

    path = _pictures_on_the_hub(tmp_path / "hub")
    train = str(tmp_path / "hub" / path)  # the same images: every row is an exact duplicate
    log = _flaky(hub, tmp_path / "hub")
    audit(AuditConfig(train, (f"hf://datasets/{path}",), str(tmp_path / "audit")), log=lambda _: None)
    rows = pq.read_table(tmp_path / "audit" / "contamination.parquet").to_pylist()
    exact = {(r["train_key"], r["eval_key"]) for r in rows if r["method"] == "exact"}
    assert exact == {(f"k{i}", f"k{i}") for i in range(6)}
    assert [line.split()[1] for line in open(log)].count("flaky") >= hubfs.DEFAULT_TRIES


def test_an_outage_that_outlasts_the_retries_is_one_transient_line(mirror, hub):
    root, _ = mirror
    hub(root=root, fail=["train-00000-of"])  # every request for that file: 503
    source = by_slug("cifar10")
    t0 = time.monotonic()
    with pytest.raises(storage.TransientStorageError) as err:
        reader.plan_source(source, "hf", 5)
    assert time.monotonic() - t0 < 10
    message = str(err.value)
    assert "\n" not in message and message.startswith("the hub kept failing on hf://datasets/mteb/cifar10@")
    assert "6 tries" in message and "503" in message and isinstance(err.value, UserError)


@pytest.mark.parametrize("case", ["missing repo", "wrong revision", "denied"])
def test_a_permanent_error_is_one_line_at_once(mirror, hub, monkeypatch, tmp_path, case):
    root, _ = mirror
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub(root=str(tmp_path) if case == "missing repo" else root, deny=["mteb/cifar10"] if case == "denied" else [])
    source = by_slug("cifar10")
    where = reader.repo_root(source, "hf")
    if case == "wrong revision":
        where = where.split("@")[0] + "@" + "0" * 40
    t0 = time.monotonic()
    with pytest.raises(UserError) as err:
        files = storage.list_files(where)
        assert files == []  # the hub's 404: nothing there, which the readers name
        storage.open_input(where + "/data/train-00000-of-00002.parquet")
    assert time.monotonic() - t0 < 2, "a permanent error was retried"
    message = str(err.value)
    assert "\n" not in message and TOKEN not in message
    assert message.startswith("no such file" if case != "denied" else "cannot list"), message


def test_the_token_reaches_every_worker_and_no_log(ray_local, mirror, hub, tmp_path, tmp_path_factory):
    """A driver that joins a running cluster (whose workers never had HF_TOKEN) builds from a hub that answers
    401 to any other token: its workers got it. It is in no output, message or Ray log."""
    root, _ = mirror
    hub(root=root, token=TOKEN, every=4)
    env = {**os.environ, "HF_TOKEN": TOKEN}
    out = tmp_path / "out"
    address = ray_local.get_runtime_context().gcs_address
    done = subprocess.run([sys.executable, "-m", "mieb_ray", "build", "--sources", "hf", "--out", str(out),
                           "--datasets", "cifar10,imagenet1k", "--rows-per-shard", "5", "--no-check-counts",
                           "--address", address], env=env, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert TOKEN not in done.stdout + done.stderr
    leaks = [p for p in glob.glob(str(tmp_path_factory.getbasetemp() / "**"), recursive=True)
             if os.path.isfile(p) and not p.endswith(".json") or p.endswith("_manifest.json")]
    assert [p for p in leaks if TOKEN.encode() in open(p, "rb").read()] == []

    # the same driver with a wrong token: a 401, one line, fast, without either token
    env["HF_TOKEN"] = "hf_WrongTokenAlsoNeverPrinted"
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mieb_ray", "build", "--sources", "hf", "--out", str(tmp_path / "o2"),
                           "--datasets", "cifar10", "--address", address], env=env, capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("mieb-ray: error: ")
    assert "401" in done.stderr and env["HF_TOKEN"] not in done.stdout + done.stderr
    assert time.monotonic() - t0 < 60


def test_a_429_pauses_every_process_of_the_job(ray_local, mirror, hub):
    """A worker is refused with Retry-After: 2; a request of the driver meanwhile waits out the rest of it too,
    without being refused itself."""
    root, _ = mirror
    log = hub(root=root, throttle={"README.md": 1}, retry_after=2, calm_pid=os.getpid())
    readme, other = (reader.repo_root(by_slug(s), "hf") + "/README.md" for s in ("cifar10", "imagenet1k"))
    fs, _ = storage.filesystem(readme)
    fs.get_file_info(other[len("hf://"):])  # the driver's first request: the job's gate is up

    @ray_local.remote(num_cpus=0)
    def read(uri: str) -> None:
        storage.filesystem(uri)[0].get_file_info(uri[len("hf://"):])

    refused = read.remote(readme)
    deadline = time.monotonic() + 60
    while hubgate.stats(hubfs.DEFAULT_CONCURRENCY)["throttled"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # the worker was refused and told the job's gate
    t0 = time.monotonic()
    fs.get_file_info(other[len("hf://"):])
    assert time.monotonic() - t0 >= 1.0  # without a shared gate: at once
    ray_local.get(refused)
    assert [line.split()[1] for line in open(log)] == ["throttle"]  # the driver was not refused
    assert hubgate.stats(hubfs.DEFAULT_CONCURRENCY)["throttled"] == 1


@pytest.mark.timeout(600)
def test_one_bound_for_every_process_of_a_build_across_three_nodes(cluster, mirror, tmp_path):
    """The fake hub refuses a second request at once from anyone; a build with the bound 1, its shard builders on
    two worker nodes and its driver on the head, is never refused, and says so."""
    root, written = mirror
    log, out = tmp_path / "hub.log", tmp_path / "out"
    config = fakehub.write_config(str(tmp_path / "hub.json"), root=root, limit=1, slots=str(tmp_path / "slots"),
                                  delay=0.02, retry_after=0.5, log=str(log))
    env = {**cluster.env, hubfs.ENV_FS: fakehub.FACTORY, fakehub.ENV_CONFIG: config, hubfs.ENV_CONCURRENCY: "1"}
    done = subprocess.run([sys.executable, "-m", "mieb_ray", "--address", cluster.address, "build", "--sources", "hf",
                           "--out", str(out), "--datasets", ",".join(DATASETS), "--rows-per-shard", "5",
                           "--no-check-counts", "--executor", "ray"], env=env, capture_output=True, text=True,
                          timeout=500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    entries = [line.split() for line in open(log)]
    slots = [int(e[2]) for e in entries if e[1] == "slot"]
    assert [e for e in entries if e[1] == "busy"] == []  # refused: none
    assert max(slots) == 0  # one at a time
    assert len({pid for pid, *_ in entries}) >= 3  # the driver and shard builders on both nodes shared the bound
    hub_line = next(line for line in done.stdout.splitlines() if line.startswith("[build] the hub: "))
    assert hub_line == (f"[build] the hub: {len(slots):,} requests, at most 1 at once (bound 1, the whole job), "
                        "0 refused with 429 and waited out")
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["counts"]["datasets"] == {s: written[s] for s in DATASETS}
