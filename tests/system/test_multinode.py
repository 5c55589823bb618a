"""A whole worker node lost mid-build, on a real three-node Ray cluster (tests/support/raycluster.py): its raylet,
object store and every worker SIGKILLed at once. The build finishes with every shard exactly once, and its output
equals an uninterrupted run's. (A GPU node lost mid-embed: tests/system/test_autoscaling.py, on an autoscaling
cluster.)"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from support.paths import committed

from mieb_ray.io import embeddings
from mieb_ray.pipelines.build import BuildConfig, build

pytestmark = pytest.mark.timeout(900)


def run_and_lose_a_node(cluster, args: list[str], out, suffix: str, marker: str, after: int) -> tuple[str, str]:
    """`mieb-ray ARGS` as a driver on the head; once `after` files are committed, SIGKILL the worker node
    running a `marker` actor. Returns the driver's output and the node killed; the node is started again."""
    driver = subprocess.Popen([sys.executable, "-m", "mieb_ray", "--address", cluster.address, *args],
                              env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, victim = time.time() + 300, None
    try:
        while victim is None and driver.poll() is None and time.time() < deadline:
            if committed(out, suffix) >= after:
                victim = next((n for n in ("node_b", "node_a")
                               if any(marker in p for p in cluster.processes(n))), None)
            time.sleep(0.05)
        assert victim, "no node was running the job when it was to be killed: the test did not test anything"
        cluster.nodes[victim].kill()
        output, _ = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
        if victim:
            cluster.restart(victim)
    assert driver.returncode == 0, output[-3000:]
    return output, victim


def test_build_finishes_when_a_whole_node_dies(cluster, mirror, tmp_path):
    root, _ = mirror
    datasets = "cifar10,mnist,dtd,gtsrb,scimmir,caltech101"
    reference = build(BuildConfig(root, str(tmp_path / "ref"), datasets=datasets, rows_per_shard=1, executor="local"),
                      log=lambda _: None)
    out = tmp_path / "out"
    run_and_lose_a_node(cluster, ["build", "--sources", root, "--out", str(out), "--datasets", datasets,
                                  "--rows-per-shard", "1", "--cpus-per-worker", "0.5"],
                        out, ".parquet", "ShardBuilder", after=5)
    manifest = embeddings.storage.read_manifest(str(out))
    assert [(s["path"], s["rows"], s["sha256"]) for s in manifest["shards"]] == \
        [(s["path"], s["rows"], s["sha256"]) for s in reference["shards"]]  # the same bytes, each shard once
    assert manifest["counts"] == reference["counts"]
