"""Jobs on Ray's own autoscaler, from zero worker nodes (issue 38): a head that takes no work, CPU and GPU worker types
that the autoscaler (v1 and v2) adds and removes (tests/support/autoscaling.py). The embed job through `ray job
submit`: every row embedded once, GPU nodes added for its encoders and its pool grown onto both (ray-project/ray#59144:
Ray Data alone leaves a GPU pool at one actor there), every node removed after the idle timeout; a GPU type capped
at 0 nodes is a one-line error, not a wait.

The job is `mieb-ray embed` from this checkout's venv, with no --working-dir: the fake provider starts every node
with the head's temp dir, so a working dir would be unpacked by several nodes into one folder at once (a worker then
imports a half-written package); tests/system/test_e2e.py submits with --working-dir to separate nodes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time

import pyarrow.parquet as pq
import pytest
from support import autoscaling
from support.pictures import photo_table
from support.raycluster import BIN

from mieb_ray.io import embeddings

IDLE_TIMEOUT = 6.0  # seconds a worker node may sit idle before the autoscaler removes it


@pytest.fixture
def start_cluster():
    """start_cluster(**autoscaling.start's settings): an autoscaling cluster on this machine, stopped after the
    test whatever happens."""
    started = []

    def start(**settings):
        tmp = tempfile.mkdtemp(prefix="mieb-as-", dir="/tmp")  # short: Ray's socket paths have a length limit
        started.append(tmp)
        cluster = autoscaling.start(tmp, {}, idle_timeout_s=IDLE_TIMEOUT, **settings)
        started.append(cluster)
        return cluster

    yield start
    for item in reversed(started):
        if isinstance(item, str):
            shutil.rmtree(item, ignore_errors=True)
        else:
            item.stop()


def submit(cluster, *args: str) -> subprocess.CompletedProcess:
    """`ray job submit -- mieb-ray ARGS`; the encoders given a declared GPU run on the CPU (support.fake_cuda).
    Sets `.status`, `.ray_job_id` and `.ended` (seconds since the epoch) as the cluster reports them."""
    from ray.job_submission import JobSubmissionClient

    hook = {"worker_process_setup_hook": "support.fake_cuda.gpus_on_cpu"}
    done = subprocess.run([str(BIN / "ray"), "job", "submit", "--address", cluster.dashboard_url, "--runtime-env-json",
                           json.dumps(hook), "--", "mieb-ray", *args], env=cluster.env, capture_output=True, text=True,
                          timeout=300)
    found = re.search(r"raysubmit_\w+", done.stdout + done.stderr)
    assert found, done.stdout[-3000:] + done.stderr[-3000:]
    info = JobSubmissionClient(cluster.dashboard_url).get_job_info(found.group())
    done.status, done.ray_job_id, done.ended = str(info.status.value), info.job_id, (info.end_time or 0) / 1000
    return done


@pytest.mark.timeout(240)
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_embed_from_zero_workers_grows_its_gpu_pool_and_leaves_no_node(start_cluster, tiny_clip, tmp_path, version):
    table = photo_table(tmp_path / "table", 24, 30)  # 24 units of 30 rows: work for both encoders
    out = str(tmp_path / "out")
    cluster = start_cluster(cpu_nodes=2, gpu_nodes=2, v2=version == "v2")
    assert cluster.worker_nodes() == []  # from zero worker nodes
    t0 = time.time()
    job = submit(cluster, "embed", "--input", table, "--out", out, "--model", tiny_clip, "--batch-size", "8",
                 "--rows-per-shard", "30", "--decode", "cpu")
    took = time.time() - t0
    assert job.returncode == 0 and job.status == "SUCCEEDED", job.stdout[-3000:] + job.stderr[-3000:] + cluster.log()

    # every input row embedded exactly once: the output's keys against the input's, read apart from the job
    keys, _ = embeddings.read_all(out)
    expected = pq.read_table(table, columns=["key"]).column("key").to_pylist()
    assert len(keys) == len(set(keys)) == 720 and sorted(keys) == sorted(expected)

    # the pool is sized from the autoscaler's config (Ray 2.60's autoscalers report none to the GCS), and grew onto
    # both GPU nodes the autoscaler added for it
    assert ("[embed] encoders: 2 actors x 1 GPU + 1 CPU (0 GPUs up now, up to 2 as its autoscaler adds nodes (its "
            "autoscaler's config)") in job.stdout
    nodes = cluster.worker_nodes()
    gpu_nodes = {n.node_id for n in nodes if n.kind == autoscaling.GPU_TYPE}
    assert len(gpu_nodes) == 2 and all(n.started > t0 for n in nodes), nodes
    encoders = cluster.actors("EncodeStage", job.ray_job_id)
    assert len(encoders) == 2 and {a["node_id"] for a in encoders} == gpu_nodes, encoders

    # and every node goes away once idle: the last within the idle timeout and the autoscaler's rounds of the job's end
    cluster.wait_until_no_workers(timeout=IDLE_TIMEOUT + 45)
    nodes = cluster.worker_nodes()
    last = max(n.ended for n in nodes) - job.ended
    assert last < IDLE_TIMEOUT + 20, nodes
    print(f"[{version}] job {took:.1f}s, nodes (type, up, down; s after submit) "
          f"{sorted((n.kind, round(n.started - t0, 1), round(n.ended - t0, 1)) for n in nodes)}, the last removed "
          f"{last:.1f}s after the job ended")


@pytest.mark.timeout(120)
def test_a_gpu_type_capped_at_zero_is_one_line_at_once(start_cluster, tiny_clip, tmp_path):
    """No GPU node can ever come: the embed job fails in one line within 60 s of its submission, naming the cause,
    rather than wait for a GPU; and starts no node."""
    table = photo_table(tmp_path / "table", 2, 10)
    cluster = start_cluster(cpu_nodes=1, gpu_nodes=0)
    args = ["embed", "--input", table, "--model", tiny_clip, "--decode", "cpu"]
    t0 = time.time()
    job = submit(cluster, *args, "--out", str(tmp_path / "a"))
    assert job.returncode != 0 and job.status == "FAILED" and time.time() - t0 < 60
    # once in the tailed log, once in the status message
    lines = sorted({line for line in (job.stdout + job.stderr).splitlines() if line.startswith("mieb-ray: error:")})
    assert lines == ["mieb-ray: error: the Ray cluster has no GPU (1 nodes) and its autoscaler can add none (its "
                     "autoscaler's config); pass --gpus-per-worker 0 to encode on CPUs, or give the cluster a GPU "
                     "node type"], job.stdout[-3000:]
    # asked for GPUs in so many words: the same, at once
    t0 = time.time()
    job = submit(cluster, *args, "--out", str(tmp_path / "b"), "--gpus-per-worker", "1")
    assert job.status == "FAILED" and time.time() - t0 < 60
    assert ("mieb-ray: error: --gpus-per-worker 1 asks for GPUs, but the Ray cluster has none and its autoscaler can "
            "add none (its autoscaler's config); pass --gpus-per-worker 0 to encode on CPUs") in job.stdout
    assert cluster.worker_nodes() == []
