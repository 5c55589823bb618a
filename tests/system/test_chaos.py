"""Chaos (issue 29): a build on a real three-node Ray cluster (tests/support/raycluster.py) while its worker nodes are
SIGKILLed again and again, at random points of the job, and started again. Every key once, every file
byte-identical to an uninterrupted run's, nothing left behind. bench/chaos.py does the same at length (build and
embed, more kills, a killed driver); the checks are its own."""

from __future__ import annotations

import random
import shutil
import sys
import tempfile

import pytest
from support import raycluster
from support.paths import ROOT

from mieb_ray.pipelines.build import BuildConfig, build

sys.path.append(str(ROOT))  # the repository: bench/
from bench.chaos import kill_points, node_chaos, verify_build  # noqa: E402

# Ray's head declares a silent node dead after 5 missed health checks 3 s apart, which would make each kill cost
# this test 15 s; here after 3 missed 0.5 s apart
FAST_DETECTION = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3"}
DATASETS = "cifar10,mnist,dtd,gtsrb,scimmir,caltech101"  # parquet and WebDataset sources: 72 one-row shards


@pytest.fixture(scope="module")
def chaos_cluster():
    """As conftest's `cluster` (a head that takes no work, worker nodes `node_a` and `node_b` of 2 CPUs), with
    the fast failure detection; stopped whatever happens."""
    tmp = tempfile.mkdtemp(prefix="mieb-chaos-", dir="/tmp")  # short: Ray's socket paths have a length limit
    try:
        nodes = raycluster.start(tmp, FAST_DETECTION, {"node_a": 2, "node_b": 2})
        try:
            yield nodes
        finally:
            nodes.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.timeout(300)
def test_build_survives_worker_nodes_killed_again_and_again(chaos_cluster, mirror, tmp_path):
    root, _ = mirror
    ref, out = str(tmp_path / "ref"), str(tmp_path / "out")
    shards = len(build(BuildConfig(root, ref, datasets=DATASETS, rows_per_shard=1, executor="local"),
                       log=lambda _: None)["shards"])
    rng = random.Random(29)  # kills in the first half (shards 5, 19 and one more)
    _, kills = node_chaos(chaos_cluster, ["build", "--sources", root, "--out", out, "--datasets", DATASETS,
                                          "--rows-per-shard", "1", "--workers", "2", "--cpus-per-worker", "0.5"],
                          out, ".parquet", rng, kill_points(rng, shards, 3, within=0.5), pause=(0.2, 1.0))
    # The first two kills land for sure: the second takes the last node up, so the job stalls until both are back.
    # The third races the job's tail (its last sources commit 12 one-row shards at once) and usually lands.
    assert sum(k.landed for k in kills) >= 2, f"kills that missed the job: {kills}"
    assert verify_build(out, ref) == []
