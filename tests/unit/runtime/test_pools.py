"""Pool sizes and the GPU decision, from what a Ray cluster has now and can grow to; and what Ray reports."""

from __future__ import annotations

import pytest

from mieb_ray.errors import UserError
from mieb_ray.runtime.cluster import read_cluster
from mieb_ray.runtime.pools import Cluster, cpu_pool, encoder_pool

LAPTOP = Cluster(cpus=8, gpus=0, max_cpus=8, max_gpus=0, nodes=1, autoscaler=None)
GPU_BOX = Cluster(cpus=16, gpus=2, max_cpus=16, max_gpus=2, nodes=1, autoscaler=None)
# an autoscaling cluster right after `ray up`: the head alone, which takes no work
FRESH = Cluster(cpus=0, gpus=0, max_cpus=544, max_gpus=8, nodes=1, autoscaler="Ray's cluster config")
CPU_CLUSTER = Cluster(cpus=12, gpus=0, max_cpus=12, max_gpus=0, nodes=3, autoscaler=None)
CPU_AUTOSCALER = Cluster(cpus=0, gpus=0, max_cpus=512, max_gpus=0, nodes=1, autoscaler="Ray's cluster config")


def test_gpus_that_are_not_up_yet_still_make_a_gpu_pool():
    pool = encoder_pool(FRESH, None, 1.0)
    # all at once: Ray Data would grow the pool only within the GPUs up (ray-project/ray#59144)
    assert (pool.min_size, pool.max_size, pool.num_gpus) == (8, 8, 1.0)
    assert "0 GPUs up now, up to 8 as its autoscaler adds nodes (Ray's cluster config)" in pool.why
    assert pool.why.endswith(": all started at once, each waiting for the GPU node its autoscaler adds")
    some_up = Cluster(cpus=8, gpus=2, max_cpus=544, max_gpus=8, nodes=3, autoscaler="Ray's cluster config")
    assert (encoder_pool(some_up, None, 1.0).min_size, encoder_pool(some_up, None, 1.0, workers=3).min_size) == (8, 3)
    fixed = encoder_pool(GPU_BOX, None, 1.0)  # no autoscaler: what is up
    assert (fixed.min_size, fixed.max_size) == (2, 2) and "all started at once" not in fixed.why
    assert encoder_pool(GPU_BOX, None, 2.0).why == ("encoders: 2 actors x 1 GPU + 2 CPU (2 GPUs up now; 2 CPU: "
                                                     "--cpus-per-worker)")
    half = encoder_pool(GPU_BOX, 0.5, 1.0)
    assert (half.min_size, half.max_size) == (4, 4)
    assert encoder_pool(FRESH, None, 1.0, cap=3).max_size == 3  # no more actors than units


def test_a_gpu_encoder_gets_the_cpus_its_work_needs_and_says_why():
    decoding = encoder_pool(GPU_BOX, None, None, device_decode=True)
    assert decoding.num_cpus == 2.0 and decoding.why == (
        "encoders: 2 actors x 1 GPU + 2 CPU (2 GPUs up now; 2 CPU: one drives the GPU (JPEG headers, copies, kernel "
        "launches), one decodes what its device refuses)")
    fed = encoder_pool(GPU_BOX, None, None)
    assert fed.num_cpus == 1.0 and fed.why.endswith("1 CPU: it only drives the GPU: CPU tasks decode its images)")
    assert encoder_pool(GPU_BOX, None, 3.0, device_decode=True).num_cpus == 3.0  # --cpus-per-worker wins
    assert encoder_pool(LAPTOP, None, None, device_decode=True).num_cpus == 1.0  # no GPU: a CPU encoder


def test_a_gpu_encoder_has_the_next_unit_fetched_while_it_encodes():
    """Ray Data's actor strategy for GPU encoders: 2 calls in flight (the next block fetched and batched while the
    UDF, still one call at a time, encodes); a CPU encoder, busy computing, keeps Ray's default."""
    assert encoder_pool(GPU_BOX, None, None).strategy().max_concurrent_calls_per_actor == 2
    assert not encoder_pool(GPU_BOX, None, None).strategy().enable_true_multi_threading
    assert encoder_pool(LAPTOP, None, None).strategy().max_concurrent_calls_per_actor is None


def test_a_laptop_encodes_on_cpus_and_says_so():
    pool = encoder_pool(LAPTOP, None, 1.0)
    assert (pool.min_size, pool.max_size, pool.num_gpus, pool.num_cpus) == (2, 2, 0.0, 1.0)
    assert pool.why.endswith("no GPU on this machine and no autoscaler to add one")
    assert encoder_pool(Cluster(2, 0, 2, 0, 1, None), None, 1.0).max_size == 1  # at least one


def test_a_cluster_encodes_on_cpus_only_when_asked():
    for cluster in (CPU_CLUSTER, CPU_AUTOSCALER):
        with pytest.raises(UserError, match=r"^the Ray cluster has no GPU .*pass --gpus-per-worker 0"):
            encoder_pool(cluster, None, 1.0)
    pool = encoder_pool(CPU_CLUSTER, 0, 1.0)
    assert (pool.num_gpus, pool.max_size) == (0.0, 3) and pool.why.endswith("--gpus-per-worker 0")
    with pytest.raises(UserError, match="asks for GPUs, but the Ray cluster has none and its autoscaler can add none"):
        encoder_pool(CPU_AUTOSCALER, 1, 1.0)
    assert encoder_pool(CPU_CLUSTER, 0, 1.0, workers=5).why.startswith("encoders on CPUs: 5 actors")


def test_encoders_that_would_hold_every_cpu_the_cluster_has_fail_in_one_line():
    """A read task per unit feeds the encoders, a CPU each: encoders holding every CPU would wait forever (seen:
    --workers 2 on a 2-CPU Ray, both encoders loaded, no unit ever read)."""
    two = Cluster(cpus=2, gpus=0, max_cpus=2, max_gpus=0, nodes=1, autoscaler=None)
    with pytest.raises(UserError) as caught:
        encoder_pool(two, None, None, workers=2)
    assert str(caught.value) == ("2 encoders x 1 CPU would hold all 2 CPUs the Ray cluster has, leaving none for the "
                                 "tasks that read their input (the job would wait forever); pass --workers 1 or fewer")
    assert encoder_pool(two, None, None, workers=1).max_size == 1  # one CPU left to read
    with pytest.raises(UserError, match=r"^12 encoders x 1 CPU would hold all 12 CPUs .*; pass --workers 11 or fewer$"):
        encoder_pool(CPU_CLUSTER, 0, None, workers=12)
    with pytest.raises(UserError, match=r"^1 encoder x 1 CPU would hold all 1 CPU the Ray cluster has.*"
                                        r"encode in this process \(--executor local\)$"):
        encoder_pool(Cluster(1, 0, 1, 0, 1, None), None, None)  # the default pool too
    one_gpu = Cluster(cpus=4, gpus=1, max_cpus=4, max_gpus=1, nodes=1, autoscaler=None)
    with pytest.raises(UserError, match=r"^1 encoder x 4 CPU would hold all 4 CPUs .*; pass --cpus-per-worker 3$"):
        encoder_pool(one_gpu, None, 4.0)
    # what the autoscaler can add counts; GPU nodes Ray does not know of yet bring CPUs of their own
    with pytest.raises(UserError, match=r"^512 encoders x 1 CPU would hold all 512 CPUs the Ray cluster can grow to"):
        encoder_pool(CPU_AUTOSCALER, 0, None, workers=512)
    assert encoder_pool(CPU_AUTOSCALER, 0, None, workers=511).max_size == 511
    assert encoder_pool(Cluster(1, 0, 1, 0, 1, None), 1, None).max_size == 1


def test_cpu_pools_grow_from_what_is_up_to_what_can_be_added():
    # on an autoscaling cluster, all at once (a pool from 1 stayed at 1 of 8 on Ray's autoscaler: ray#59144)
    pool = cpu_pool(FRESH, 1.0, what="shard builders")
    assert (pool.min_size, pool.max_size) == (544, 544)
    assert pool.why == ("shard builders: 544 actors x 1 CPU (0 CPUs up now, up to 544 as its autoscaler adds nodes "
                        "(Ray's cluster config)): all started at once, each waiting for the node its autoscaler adds")
    assert (cpu_pool(FRESH, 1.0, cap=5).min_size, cpu_pool(FRESH, 1.0, workers=3).min_size) == (5, 3)
    # where the config tells node types apart, only the CPUs of those without GPUs: a build brings up no GPU node
    typed = Cluster(cpus=2, gpus=0, max_cpus=544, max_gpus=8, nodes=2, autoscaler="its autoscaler's config",
                    max_cpus_without_gpus=512)
    assert cpu_pool(typed, 2.0).max_size == 256
    assert "(2 CPUs up now, up to 512 on nodes without GPUs as its autoscaler adds nodes" in cpu_pool(typed, 2.0).why
    assert encoder_pool(typed, 0, 1.0).max_size == 512 // 4  # CPU encoders too
    # CPUs up on GPU nodes (an embed job just brought them up) are CPUs to use
    up = Cluster(cpus=600, gpus=8, max_cpus=600, max_gpus=8, nodes=30, autoscaler="x", max_cpus_without_gpus=512)
    assert cpu_pool(up, 1.0).max_size == 600
    assert "(600 CPUs up now, up to 600 as its autoscaler adds nodes (x))" in cpu_pool(up, 1.0).why
    # a cluster whose every node type has GPUs: their CPUs, or a build would stay at one builder
    gpus_only = Cluster(cpus=0, gpus=0, max_cpus=32, max_gpus=8, nodes=1, autoscaler="x", max_cpus_without_gpus=0)
    assert cpu_pool(gpus_only, 1.0).max_size == 32
    # no autoscaler: from what fits now to what is up
    assert (cpu_pool(LAPTOP, 0.5, cap=5).min_size, cpu_pool(LAPTOP, 0.5, cap=5).max_size) == (5, 5)
    assert cpu_pool(LAPTOP, 1.0, workers=3).why == "actors: 3 actors x 1 CPU (--workers)"


def test_read_cluster_reports_the_local_ray(ray_local):
    cluster = read_cluster()
    assert (cluster.cpus, cluster.gpus, cluster.nodes, cluster.autoscaler) == (4, 0, 1, None)
    assert encoder_pool(cluster, None, 1.0).num_gpus == 0  # the test session's Ray is a laptop


def test_the_autoscaler_config_is_what_this_clusters_monitor_runs_with(tmp_path):
    """Ray 2.60's autoscalers report no config to the GCS: a `ray start --autoscaling-config` cluster's maximum comes
    from its monitor's command line, on the head (a fake /proc here: this cluster's monitor, another cluster's, a
    monitor with no config, other processes)."""
    from mieb_ray.runtime.cluster import autoscaler_config

    def process(pid: str, *args: str) -> None:
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")

    python, v1, v2 = "/venv/bin/python", "/ray/autoscaler/_private/monitor.py", "/ray/autoscaler/v2/monitor.py"
    process("10", python, v1, "--gcs-address=10.0.0.1:6379", "--autoscaling-config=/tmp/other.yaml")
    process("11", python, v2, "--logs-dir=/tmp/l", "--gcs-address=10.0.0.1:7000", "--autoscaling-config=/tmp/ours.json")
    process("12", python, "-m", "mieb_ray", "--gcs-address=10.0.0.1:7000", "--autoscaling-config=/tmp/not-a-monitor")
    process("13", python, v1, "--gcs-address=10.0.0.1:7001")  # a local Ray's monitor: no autoscaler
    (tmp_path / "self").mkdir()
    assert autoscaler_config("10.0.0.1:7000", str(tmp_path)) == "/tmp/ours.json"
    assert autoscaler_config("10.0.0.1:6379", str(tmp_path)) == "/tmp/other.yaml"
    assert autoscaler_config("10.0.0.1:7001", str(tmp_path)) is None
    assert autoscaler_config("10.0.0.1:7000", str(tmp_path / "absent")) is None
