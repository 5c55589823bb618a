"""cluster.yaml passes Ray's own cluster-config validation (what `ray up` checks), and offers the resources
the jobs ask for."""

import subprocess

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config
from support.paths import ROOT

from mieb_ray.pipelines.embed import DECODE_MEMORY
from mieb_ray.runtime.cluster import worker_soft_limit
from mieb_ray.runtime.pools import launcher_capacity

CONFIG = ROOT / "cluster.yaml"


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def test_ray_up_would_accept_it(config):
    validate_config(prepare_config(config))  # the schema and checks of `ray up`, defaults filled in as it does


def test_node_types_offer_what_the_jobs_ask_for(config):
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"] == {"CPU": 0, "GPU": 0}  # the drivers run there; no task or actor does

    def fits(request: dict) -> list[str]:
        return [name for name, t in types.items()
                if all(t.get("resources", {}).get(r, 0) >= n for r, n in request.items())]

    # build: ShardBuilder actors (1 CPU); embed: read/decode tasks (1 CPU) and encoder actors (1 GPU, 1 CPU)
    assert fits({"CPU": 1}) == ["cpu_worker", "gpu_worker"]
    assert fits({"CPU": 1, "GPU": 1}) == ["gpu_worker"]
    assert all(types[n]["max_workers"] > 0 for n in ("cpu_worker", "gpu_worker"))
    assert DECODE_MEMORY < 8 << 30  # a decode task's memory hint fits any worker
    assert sum(t.get("min_workers", 0) for t in types.values()) <= config["max_workers"]


def test_default_pools_see_what_the_autoscaler_can_add(config):
    # on a cluster that starts with its head alone, the embed job still sizes its GPU pool to the GPUs
    # the autoscaler can bring up, instead of running on CPUs; the build's CPU pools size to the CPU nodes alone
    assert launcher_capacity(config) == {"CPU": 16 * 32 + 8 * 4, "GPU": 8, "CPU without GPU": 16 * 32}


def test_the_nodes_install_this_checkout(config):
    assert config["file_mounts"] == {"~/mieb-ray": "."}
    assert any("-e ~/mieb-ray" in c and "torch==2.13.0" in c for c in config["setup_commands"])


def test_every_node_keeps_idle_workers_for_the_pools(config):
    # `ray start` on each node sets Ray's idle-worker limit as a laptop's own Ray gets it (runtime/cluster.py's
    # ray_up): with Ray's default, the workers that read and commit tasks take turns with were killed between units
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        [start] = [c for c in config[key] if " ray start " in f" {c} "]
        env = start.split("ray start")[0]
        shell = f"nproc() {{ echo 8; }}; {env} bash -c 'echo $RAY_num_workers_soft_limit'"  # a node of 8 CPUs
        out = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == str(worker_soft_limit(8)) == "20"
