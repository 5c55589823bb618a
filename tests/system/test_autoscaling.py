"""Jobs on Ray's own autoscaler, from zero worker nodes (issue 38): a head that takes no work, CPU and GPU worker types
that the autoscaler adds and removes (tests/support/autoscaling.py). One short run through `ray job submit`: the build
brings up CPU nodes only and its pool grows onto them, the embed job on its output brings up GPU nodes and its pool
grows onto both (ray-project/ray#59144: Ray Data alone leaves a pool at one actor there), a GPU node SIGKILLed
mid-job (a spot machine reclaimed) loses and duplicates no row, the logs say what the cluster did, every node goes
once idle. A GPU type capped at 0 nodes is a one-line error, not a wait. The suite runs autoscaler v1 (what
cluster.yaml runs); bench/autoscaling.py runs v1 and v2 and the other jobs, and measures.

The jobs are `mieb-ray` from this checkout's venv, with no --working-dir (AutoscalingRay.submit says why);
tests/system/test_e2e.py submits with --working-dir to separate nodes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from support import autoscaling
from support.mirror import kept_rows
from support.paths import committed
from support.pictures import photo_table

from mieb_ray.io import embeddings
from mieb_ray.pipelines.embed import EmbedConfig, embed

IDLE_TIMEOUT = 6.0  # seconds a worker node may sit idle before the autoscaler removes it
# Ray's head declares a silent node dead after 5 missed health checks 3 s apart; here after 3 missed 1 s apart, so
# that the node killed mid-job costs this test 3 s of waiting rather than 15 (test_chaos.py does the same)
FAST_DETECTION = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}


@pytest.fixture
def start_cluster():
    """start_cluster(**autoscaling.start's settings): an autoscaling cluster on this machine, stopped after the
    test whatever happens."""
    started = []

    def start(**settings):
        tmp = tempfile.mkdtemp(prefix="mieb-as-", dir="/tmp")  # short: Ray's socket paths have a length limit
        started.append(tmp)
        cluster = autoscaling.start(tmp, FAST_DETECTION, idle_timeout_s=IDLE_TIMEOUT, **settings)
        started.append(cluster)
        return cluster

    yield start
    for item in reversed(started):
        if isinstance(item, str):
            shutil.rmtree(item, ignore_errors=True)
        else:
            item.stop()


def submit(cluster, *args: str) -> subprocess.CompletedProcess:
    """`ray job submit -- mieb-ray ARGS` to its end, with `.status` as the cluster reports it."""
    from ray.job_submission import JobSubmissionClient

    job = cluster.submit(*args)
    stdout, _ = job.communicate(timeout=300)
    done = subprocess.CompletedProcess(job.args, job.returncode, stdout, "")
    found = re.search(r"raysubmit_\w+", stdout)
    assert found, stdout[-3000:]
    info = JobSubmissionClient(cluster.dashboard_url).get_job_info(found.group())
    done.status = str(info.status.value)
    return done


@pytest.mark.timeout(300)
def test_build_and_embed_from_zero_workers_lose_nothing_when_a_node_goes(start_cluster, mirror, tiny_clip, tmp_path):
    """Autoscaler v1, as cluster.yaml runs it (bench/autoscaling.py runs v2 too, and the other jobs)."""
    root, written = mirror
    cluster = start_cluster(cpu_nodes=2, gpu_nodes=2)
    assert cluster.worker_nodes() == []  # from zero worker nodes

    # the build: CPU nodes added for its shard builders, every kept row of the mirror once
    train = str(tmp_path / "train")
    t0 = time.time()
    build = submit(cluster, "build", "--sources", root, "--out", train, "--rows-per-shard", "12")
    assert build.returncode == 0 and build.status == "SUCCEEDED", build.stdout[-3000:] + cluster.log()
    rows = pq.read_table([str(p) for p in Path(train).glob("*/*.parquet")], columns=["key"])
    assert rows.num_rows == len(set(rows.column("key").to_pylist())) == sum(kept_rows(written).values())
    built = cluster.worker_nodes()
    assert [n.kind for n in built] == [autoscaling.CPU_TYPE] * 2 and all(n.started > t0 for n in built), built
    # its pool sized to the CPU nodes alone (a build brings up no GPU node) and grown onto both
    assert "[build] shard builders: 4 actors x 1 CPU (0 CPUs up now, up to 4 on nodes without GPUs" in build.stdout
    assert "[build] cluster during the job: 2 nodes added, 0 removed; shard builders: 4 of 4 actors started" in \
        build.stdout, "\n".join(line for line in build.stdout.splitlines() if line.startswith("["))

    shards = embeddings.storage.read_manifest(train)["shards"]

    # the embed job on what the build made: GPU nodes added, its pool grown onto both (ray#59144), and one GPU node
    # SIGKILLed once a shard is committed (a spot machine reclaimed): every row still embedded exactly once, each
    # vector the one an uninterrupted run in this process gives. Its encoders paced (fake_cuda.paced_gpus_on_cpu) so
    # that one alone cannot finish before the autoscaler brings up the second's node
    out = tmp_path / "out"
    args = ["embed", "--input", train, "--out", str(out), "--model", tiny_clip, "--batch-size", "4",
            "--rows-per-shard", "12", "--decode", "cpu"]
    job = cluster.submit(*args, hook="support.fake_cuda.paced_gpus_on_cpu")
    victim = None
    try:
        deadline = time.time() + 180
        while victim is None and job.poll() is None and time.time() < deadline:
            # once a shard is committed and both encoders have started (a node killed while its encoder still
            # loads leaves the pool at '1 of 2 actors started', rightly): a GPU node holding one
            if committed(out, ".arrow") >= 1 and len(hosts := cluster.started_actor_nodes("EncodeStage")) == 2:
                gpu = [n.node_id for n in cluster.worker_nodes() if n.kind == autoscaling.GPU_TYPE and n.alive]
                victim = next((n for n in gpu if n in hosts), None)
            time.sleep(0.05)
        assert victim and committed(out, ".arrow") < len(shards), "the job was not mid-way at the kill"
        assert cluster.kill_node(victim) > 0
        output, _ = job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, output[-3000:] + cluster.log()
    keys, vectors = embeddings.read_all(str(out))
    assert len(keys) == len(set(keys)) == rows.num_rows and set(keys) == set(rows.column("key").to_pylist())
    reference = tmp_path / "reference"
    embed(EmbedConfig(train, str(reference), tiny_clip, batch_size=4, rows_per_shard=12, executor="local"),
          log=lambda _: None)
    ref_keys, ref_vectors = embeddings.read_all(str(reference))
    assert keys == ref_keys and np.allclose(vectors, ref_vectors, atol=1e-6)
    assert [(s["path"], s["rows"]) for s in embeddings.storage.read_manifest(str(out))["shards"]] == \
        [(s["path"], s["rows"]) for s in embeddings.storage.read_manifest(str(reference))["shards"]]
    assert ("[embed] encoders: 2 actors x 1 GPU + 1 CPU (0 GPUs up now, up to 2 as its autoscaler adds nodes (its "
            "autoscaler's config)") in output
    assert "[embed] node removed (2 CPU, 1 GPU)" in output and "encoders: 2 of 2 actors started" in output, output

    # and every node goes away once idle
    cluster.wait_until_no_workers(timeout=IDLE_TIMEOUT + 60)


@pytest.mark.timeout(120)
def test_a_gpu_type_capped_at_zero_is_one_line_at_once(start_cluster, tiny_clip, tmp_path):
    """No GPU node can ever come: the embed job fails in one line within 60 s of its submission, naming the cause,
    rather than wait for a GPU; and starts no node."""
    table = photo_table(tmp_path / "table", 2, 10)
    cluster = start_cluster(cpu_nodes=1, gpu_nodes=0)
    args = ["embed", "--input", table, "--model", tiny_clip, "--decode", "cpu"]
    t0 = time.time()
    job = submit(cluster, *args, "--out", str(tmp_path / "out"))
    assert job.returncode != 0 and job.status == "FAILED" and time.time() - t0 < 60
    # once in the tailed log, once in the status message
    lines = sorted({line for line in job.stdout.splitlines() if line.startswith("mieb-ray: error:")})
    assert lines == ["mieb-ray: error: the Ray cluster has no GPU (1 nodes) and its autoscaler can add none (its "
                     "autoscaler's config); pass --gpus-per-worker 0 to encode on CPUs, or give the cluster a GPU "
                     "node type"], job.stdout[-3000:]
    assert cluster.worker_nodes() == []
