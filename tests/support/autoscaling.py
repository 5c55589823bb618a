"""A Ray cluster on this machine that autoscales: Ray's own autoscaler (v1 or v2) with its fake multi-node provider,
as `ray.cluster_utils.AutoscalingCluster` sets it up for Ray's autoscaler tests. The head takes no work (no CPU, no
GPU); a CPU worker type and a GPU worker type start from zero nodes, and the autoscaler adds real raylets of the
declared resources (GPUs included: an encoder given one runs on the CPU, support.fake_cuda.gpus_on_cpu) when work
waits for them, and removes them after the idle timeout.

Two parts of AutoscalingCluster are replaced, not used:
- its base config: `_generate_config` reads `ray/autoscaler/_private/fake_multi_node/example.yaml` from Ray's package,
  a path with no parameter, and Ray's wheel does not ship that file; ours is autoscaling.yaml beside this module,
  the same fields (nothing is written into the installed Ray);
- its `start` and `shutdown`: they run `ray stop --force`, which kills every Ray process of this user on the
  machine (the test session's local Ray, another checkout's tests), and put the head on port 6379 and Ray's default
  temp dir. Here the head is `ray start --head --block` on free ports and a temp dir of its own, the fake provider is
  told its GCS address, and stopping kills this cluster's processes alone (support/raycluster.py's way: the head's
  process tree, then whatever names the temp dir: the worker nodes the autoscaler started share the head's).

The head's environment reaches the autoscaler (the monitor process) and through it every node it starts: the venv's
bin first on PATH, the tests' PYTHONPATH, and each node's room for idle workers (cluster.worker_soft_limit).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml
from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID
from ray.cluster_utils import AutoscalingCluster

from mieb_ray.runtime.cluster import worker_soft_limit
from support.paths import TESTS
from support.raycluster import BIN, OBJECT_STORE, Node, RayCluster
from support.s3server import free_port

BASE_CONFIG = Path(__file__).with_name("autoscaling.yaml")
CPU_TYPE, GPU_TYPE = "cpu_worker", "gpu_worker"
NODE_CPUS = 2  # logical CPUs a worker node declares (this machine has 2 cores: nodes oversubscribe them)


class _Config(AutoscalingCluster):
    """AutoscalingCluster's config, from our base config rather than the example.yaml Ray's wheel lacks."""

    def _generate_config(self, head_resources, worker_node_types, autoscaler_v2=False, **config_kwargs):
        config = copy.deepcopy(yaml.safe_load(BASE_CONFIG.read_text()))
        config["available_node_types"] = copy.deepcopy(worker_node_types)
        config["available_node_types"]["ray.head.default"] = {"resources": dict(head_resources), "node_config": {},
                                                              "max_workers": 0}
        if autoscaler_v2:  # as AutoscalingCluster: v2 launches several nodes at once and knows the head's id
            config["provider"]["launch_multiple"] = True
            config["provider"]["head_node_id"] = FAKE_HEAD_NODE_ID
        config.update(config_kwargs)
        return config

    def start(self, *args, **kwargs):  # `ray stop --force`: every Ray of this user on the machine
        raise NotImplementedError("AutoscalingRay.start() starts this cluster")

    shutdown = start


@dataclass
class WorkerNode:
    node_id: str
    kind: str  # CPU_TYPE or GPU_TYPE
    alive: bool
    started: float  # seconds since the epoch
    ended: float | None


class AutoscalingRay(RayCluster):
    """The cluster: RayCluster's address, state queries, job probe and stop, with the head alone started by hand."""

    config: dict
    v2: bool

    def start_head(self, config_path: str, v2: bool) -> None:
        log = open(os.path.join(self.tmp, "head.log"), "ab")
        env = {**self.env, "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_FAKE_CLUSTER": "1",
               "RAY_num_workers_soft_limit": str(worker_soft_limit(NODE_CPUS))}
        if v2:  # as AutoscalingCluster.start
            env.update(RAY_enable_autoscaler_v2="1", RAY_CLOUD_INSTANCE_ID=FAKE_HEAD_NODE_ID,
                       RAY_OVERRIDE_NODE_ID_FOR_TESTING=FAKE_HEAD_NODE_ID)
        args = ["--head", f"--port={self.port}", "--num-cpus=0", "--num-gpus=0", f"--temp-dir={self.tmp}/r",
                f"--autoscaling-config={config_path}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard}", f"--ray-client-server-port={free_port()}",
                f"--object-store-memory={OBJECT_STORE}"]
        args += [f"--{p}={free_port()}" for p in ("node-manager-port", "object-manager-port", "metrics-export-port",
                                                 "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                 "runtime-env-agent-port")]
        process = subprocess.Popen([str(BIN / "ray"), "start", "--block", "--disable-usage-stats", *args], env=env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.nodes["head"] = Node("head", process, args)
        self._registered("head", 0)
        self.wait_for(1, "head")

    def restart(self, name: str) -> None:
        raise NotImplementedError("the autoscaler starts and stops this cluster's worker nodes")

    def worker_nodes(self) -> list[WorkerNode]:
        """Every worker node the autoscaler started, alive or gone, per the head's state API."""
        with urllib.request.urlopen(f"{self.dashboard_url}/api/v0/nodes?limit=1000&detail=true", timeout=10) as a:
            nodes = json.load(a)["data"]["result"]["result"]
        found = []
        for n in nodes:
            if n.get("is_head_node"):
                continue
            kind = GPU_TYPE if (n.get("resources_total") or {}).get("GPU") else CPU_TYPE
            end = n.get("end_time_ms")
            found.append(WorkerNode(n["node_id"], kind, n["state"] == "ALIVE", n["start_time_ms"] / 1000,
                                    end / 1000 if end else None))
        return found

    def started_actor_nodes(self, class_part: str) -> list[str]:
        """The nodes (ids) of the ALIVE actors (their constructors done) whose class name contains `class_part`, per
        the head's state API."""
        with urllib.request.urlopen(f"{self.dashboard_url}/api/v0/actors?limit=1000&detail=true", timeout=10) as a:
            actors = json.load(a)["data"]["result"]["result"]
        return [a["node_id"] for a in actors if class_part in (a.get("class_name") or "") and a["state"] == "ALIVE"]

    def wait_until_no_workers(self, timeout: float) -> float:
        """Until the autoscaler has removed every worker node; the seconds that took. TimeoutError after
        `timeout`."""
        t0 = time.time()
        while any(n.alive for n in self.worker_nodes()):
            if time.time() - t0 > timeout:
                raise TimeoutError(f"worker nodes still up {timeout:.0f} s after the job: {self.worker_nodes()}")
            time.sleep(0.5)
        return time.time() - t0

    def submit(self, *args: str, hook: str = "support.fake_cuda.gpus_on_cpu") -> subprocess.Popen:
        """`ray job submit -- mieb-ray ARGS`, running: it follows the job's log (stdout, stderr merged) until the job
        ends. Encoders given a declared GPU run on the CPU (`hook`: support.fake_cuda's). No --working-dir: the fake
        provider starts every node with the head's temp dir, so a working dir would be unpacked by several nodes into
        one folder at once (a worker then imports a half-written package); the nodes run this checkout's venv."""
        runtime_env = json.dumps({"worker_process_setup_hook": hook})
        return subprocess.Popen([str(BIN / "ray"), "job", "submit", "--address", self.dashboard_url,
                                 "--runtime-env-json", runtime_env, "--", "mieb-ray", *args], env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def wait_for_workers(self, count: int, timeout: float = 120) -> float:
        """Until `count` worker nodes are alive; the seconds that took. TimeoutError after `timeout`."""
        t0 = time.time()
        while sum(n.alive for n in self.worker_nodes()) < count:
            if time.time() - t0 > timeout:
                raise TimeoutError(f"{count} worker nodes not up after {timeout:.0f} s: {self.worker_nodes()}")
            time.sleep(0.5)
        return time.time() - t0

    def kill_node(self, node_id: str) -> int:
        """SIGKILL a worker node the autoscaler started, as a reclaimed spot machine goes: its raylet (the object store
        within it), its agents and every worker under it, at once. The autoscaler is not told. The processes killed."""
        mine = [p for p in psutil.process_iter(["cmdline"])
                if any(a in (f"--node_id={node_id}", f"--node-id={node_id}") for a in p.info["cmdline"] or [])]
        tree = {p.pid: p for p in mine}
        for p in mine:
            try:
                tree.update((c.pid, c) for c in p.children(recursive=True))
            except psutil.Error:
                pass
        for p in tree.values():
            try:
                p.kill()
            except psutil.Error:
                pass
        return len(tree)

    def log(self) -> str:
        """The autoscaler's own log (the monitor's), for a failing test's message."""
        path = os.path.join(self.tmp, "r", "session_latest", "logs", "monitor.log")
        try:
            return open(path, errors="replace").read()[-4000:]
        except OSError:
            return ""


def start(tmp: str, extra_env: dict, *, cpu_nodes: int = 2, gpu_nodes: int = 2, gpus_per_node: int = 1,
          idle_timeout_s: float = 6.0, v2: bool = False, all_up: bool = False) -> AutoscalingRay:
    """A head (no CPU, no GPU) and no worker node; the autoscaler adds up to `cpu_nodes` nodes of NODE_CPUS CPUs and
    `gpu_nodes` of NODE_CPUS CPUs and `gpus_per_node` GPUs (a type capped at 0 nodes when 0), and removes a node
    idle for `idle_timeout_s`. all_up: every node type's min_workers its max_workers, so the autoscaler brings every
    node up at once and keeps it (wait_for_workers waits for them): the same cluster, never scaled."""
    node = {"node_config": {}}
    store = {"object_store_memory": OBJECT_STORE}
    types = {CPU_TYPE: {**node, "resources": {"CPU": NODE_CPUS, **store}, "max_workers": cpu_nodes,
                        "min_workers": cpu_nodes if all_up else 0},
             GPU_TYPE: {**node, "resources": {"CPU": NODE_CPUS, "GPU": gpus_per_node, **store},
                        "max_workers": gpu_nodes, "min_workers": gpu_nodes if all_up else 0}}
    env = {**os.environ, **extra_env, "RAY_AUTH_MODE": "disabled", "PATH": f"{BIN}:{os.environ['PATH']}"}
    # every node's workers import support/ (fake_cuda's setup hook), started from the tests or from bench/
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    env.pop("RAY_ADDRESS", None)
    cluster = AutoscalingRay(tmp, env, free_port(), free_port())
    cluster.v2 = v2
    cluster.config = _Config({"CPU": 0, "GPU": 0}, types, autoscaler_v2=v2,
                             max_workers=cpu_nodes + gpu_nodes, idle_timeout_minutes=idle_timeout_s / 60)._config
    # the fake provider starts its nodes against the GCS at this address (its default: this machine's port 6379)
    cluster.config["provider"]["gcs_address"] = f"127.0.0.1:{cluster.port}"
    path = os.path.join(tmp, "autoscaling.json")
    with open(path, "w") as f:
        json.dump(cluster.config, f)
    try:
        cluster.start_head(path, v2)
    except BaseException:
        cluster.stop()
        raise
    return cluster
