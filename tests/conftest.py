"""Session fixtures: one S3 server, one local Ray, one fixture mirror of the 23 sources.

Every cache (Ray, HF, mieb-ray's) stays inside pytest's temp dir. The S3 environment is set before Ray starts
so that Ray's workers inherit it.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from support import s3server
from support.gpu import need

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# before any test module imports `datasets`, which reads its cache's place once, at import: a cache outside the
# session would serve a folder's old contents to a test that rewrote it (its fingerprint does not see the files)
HF_HOME = tempfile.mkdtemp(prefix="mieb-ray-tests-hf-")
os.environ.update(HF_HOME=HF_HOME, HF_DATASETS_CACHE=os.path.join(HF_HOME, "datasets"), HF_HUB_OFFLINE="1",
                  XDG_CACHE_HOME=os.path.join(HF_HOME, "xdg"))  # mieb-ray's copies of S3 models and mirrors
# the tests' support package (tests/support/: the fake hub, the GPU stand-ins) importable in every process the tests
# start: Ray's nodes and workers, the command-line runs
TESTS = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))


def pytest_collection_modifyitems(items):
    """The package's shape first (repo/test_layers.py: seconds, so a layer violation fails at once); the tests on the
    multi-node `cluster` last, together: it stays up from its first test to the session's end, and its 30 idle
    processes take about 0.15 of a core, which the other tests on 2 cores would lose."""
    items.sort(key=lambda item: (item.module.__name__ != "test_layers", "cluster" in getattr(item, "fixturenames", ())))


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    server = s3server.start(str(tmp_path_factory.mktemp("seaweedfs")))
    os.environ.update(server.env)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session", autouse=True)
def hf_home():
    yield HF_HOME
    shutil.rmtree(HF_HOME, ignore_errors=True)


def fake_hub_config(tmp_path_factory) -> str:
    """Where system/test_hub.py writes the fake hub's settings (support/fakehub.py)."""
    return str(tmp_path_factory.getbasetemp() / "fakehub.json")


@pytest.fixture(scope="session")
def ray_local(request, tmp_path_factory):
    import ray
    from support import fakehub

    # the S3 server's settings reach every worker; bench/gpu_check.sh's GPU machine has no SeaweedFS binary (it
    # would not fit the device's carry limit beside Ray) and runs no S3 test
    s3_env = {} if os.environ.get("MIEB_NO_S3") else request.getfixturevalue("s3").env

    # the fake hub of system/test_hub.py in the workers too: it serves hf:// only while its config file exists
    from mieb_ray.runtime.cluster import worker_soft_limit

    hub = {"MIEB_RAY_HUB_FS": fakehub.FACTORY, "MIEB_RAY_HUB_FAKE": fake_hub_config(tmp_path_factory),
           "MIEB_RAY_HUB_RETRY_WAIT": "0.01"}
    # 4 logical CPUs on 2 cores: an actor pool that reserves every CPU cannot starve the rest (platform notes)
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir=str(tmp_path_factory.mktemp("ray")),
             logging_level="WARNING", runtime_env={"env_vars": {**s3_env, **hub}},
             _system_config={"num_workers_soft_limit": worker_soft_limit(4)})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def mirror(tmp_path_factory):
    """The fixture mirror of all 23 sources in the hub's layout: (root, rows written per dataset)."""
    from mieb_ray.demo_data.mirror import make_mirror

    root = str(tmp_path_factory.mktemp("mirror"))
    return root, make_mirror(root)


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory):
    """A tiny random CLIP saved with save_pretrained: loaded back through the code path of a real model."""
    from mieb_ray.demo_data.models import make_tiny_clip

    return make_tiny_clip(str(tmp_path_factory.mktemp("tiny-clip")))


@pytest.fixture(scope="session")
def mieb_train(ray_local, mirror, tmp_path_factory):
    """A small mieb-train (Parquet, 5 rows per shard) of a few sources with varied images: (root, manifest)."""
    from mieb_ray.pipelines.build import BuildConfig, build

    out = str(tmp_path_factory.mktemp("mieb-train"))
    return out, build(BuildConfig(mirror[0], out, datasets=["imagenet1k", "cifar100", "mnist", "fer2013", "scimmir"],
                      rows_per_shard=5))


@pytest.fixture(scope="session")
def cluster(s3):
    """A real multi-node Ray cluster on this machine (support/raycluster.py): a head that takes no work and two
    worker nodes of 2 CPUs, `node_a` and `node_b`, each with its own object store, joined with `ray start
    --address`; the S3 settings in the nodes' environment, as on AWS. Stopped whatever happens."""
    from support import raycluster

    tmp = tempfile.mkdtemp(prefix="mieb-ray-", dir="/tmp")  # short: Ray's socket paths have a length limit
    try:
        nodes = raycluster.start(tmp, s3.env, {"node_a": 2, "node_b": 2})  # a failed start stops what it started
        try:
            nodes.wait_for_jobs()
            yield nodes
        finally:
            nodes.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def cuda():
    """A CUDA device: the test skips without one, and fails under MIEB_REQUIRE_GPU=1 (support/gpu.py)."""
    import torch

    need(None if torch.cuda.is_available() else "torch sees no CUDA device")
    return "cuda"


@pytest.fixture
def torchvision():
    """torchvision's decode_jpeg importable: the test skips without it, and fails under MIEB_REQUIRE_GPU=1."""
    from mieb_ray.encode.gpu_decode import torchvision_problem

    need(torchvision_problem())


@pytest.fixture
def torchvision_standin(monkeypatch):
    """support/torchvision_standin.py in place of torchvision for one test (our decoder's logic, on any machine)."""
    from support import torchvision_standin

    return torchvision_standin.install(monkeypatch)
