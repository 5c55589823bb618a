"""A real multi-node Ray cluster on one machine: `ray start --head` plus worker nodes joined with
`ray start --address`, each with its own CPUs, custom resource, object store, process tree and Hugging Face caches,
so that a test can kill a whole node (its raylet, object store and workers, with SIGKILL) and start it again.

The head advertises no CPU, as on an autoscaling cluster: drivers run there, work runs on the workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from mieb_ray.runtime.cluster import worker_soft_limit
from support.s3server import free_port

BIN = Path(sys.executable).parent
OBJECT_STORE = 150 << 20  # small, so that spilling and transfers between nodes happen in tests too


class NodeDidNotStart(RuntimeError):
    pass


@dataclass
class Node:
    name: str
    process: subprocess.Popen
    args: list[str]

    def kill(self) -> list[int]:
        """SIGKILL the node's whole process tree (raylet, object store, workers, agents): a machine lost."""
        try:
            tree = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        pids = [p.pid for p in tree] + [self.process.pid]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=30)
        return pids


@dataclass
class RayCluster:
    tmp: str
    env: dict
    port: int
    dashboard: int
    nodes: dict[str, Node] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard}"

    def _start(self, name: str, args: list[str], retries: int = 2) -> None:
        """Start the node and wait until it has joined."""
        log = open(os.path.join(self.tmp, f"{name}.log"), "ab")
        # ports of its own: the test session's local Ray, and the other nodes of this machine, hold others
        first = 20_000 + 1000 * (list(self.nodes).index(name) if name in self.nodes else len(self.nodes))
        ports = [f"--{p}={free_port()}" for p in ("node-manager-port", "object-manager-port", "metrics-export-port",
                                                  "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                  "runtime-env-agent-port")]
        ports += [f"--min-worker-port={first}", f"--max-worker-port={first + 999}"]
        # as cluster.yaml starts its nodes: room for the idle workers a node's pool and tasks take turns with
        cpus = int(next(a.split("=")[1] for a in args if a.startswith("--num-cpus=")))
        env = {**self.env, "RAY_num_workers_soft_limit": str(worker_soft_limit(cpus))}
        # Hugging Face caches and mieb-ray's of its own, as on its own machine: what one node downloaded, another
        # has not
        hf = os.path.join(self.tmp, f"hf-{name}")
        env.update(HF_HOME=hf, HF_DATASETS_CACHE=os.path.join(hf, "datasets"), XDG_CACHE_HOME=os.path.join(hf, "xdg"))
        seen = log.tell()
        process = subprocess.Popen([str(BIN / "ray"), "start", "--block", "--disable-usage-stats", *args, *ports],
                                   env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.nodes[name] = Node(name, process, args)
        try:
            # its own word first: a node killed moments ago still counts as alive until the head's health check
            # says otherwise, so the count alone could pass before this one joined, or miss that it failed
            self._registered(name, seen)
            self.wait_for(len(self.nodes), name)
        except NodeDidNotStart:  # a port drawn for it was taken meanwhile: once more, with new ports
            if retries == 0:
                raise
            self._sweep(next(a.split("=", 1)[1] for a in args if a.startswith("--temp-dir=")))
            self._start(name, args, retries - 1)

    def add_worker(self, name: str, cpus: int) -> None:
        # a temp dir of its own, as on its own machine: nodes that shared one would unpack the same job
        # packages into the same folder at the same time (short: Ray's socket paths have a length limit)
        temp = os.path.join(self.tmp, f"w{len(self.nodes)}")
        self._start(name, [f"--address={self.address}", f"--num-cpus={cpus}", f"--resources={{\"{name}\": 1}}",
                           f"--object-store-memory={OBJECT_STORE}", f"--temp-dir={temp}"])

    def _registered(self, name: str, seen: int, timeout: float = 180) -> None:
        """Until `ray start` of `name` says its runtime started; NodeDidNotStart if it exits first."""
        path, deadline = os.path.join(self.tmp, f"{name}.log"), time.time() + timeout
        while time.time() < deadline:
            with open(path, errors="replace") as f:
                f.seek(seen)
                if "Ray runtime started" in f.read():
                    return
            if self.nodes[name].process.poll() is not None:
                log = open(path, errors="replace").read()
                raise NodeDidNotStart(f"the Ray node {name} did not start:\n{log[-3000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"the Ray node {name} did not start in {timeout:.0f}s")

    def restart(self, name: str) -> None:
        self._start(name, self.nodes[name].args)

    def alive(self) -> int:
        """The nodes the head counts as alive, from its state API (milliseconds, where a driver that connects to
        ask takes a second or more); 0 while the head does not answer yet."""
        try:
            with urllib.request.urlopen(f"{self.dashboard_url}/api/v0/nodes?limit=1000", timeout=10) as answer:
                nodes = json.load(answer)["data"]["result"]["result"]
        except (OSError, ValueError, KeyError, TypeError):
            return 0
        return sum(n["state"] == "ALIVE" for n in nodes)

    def wait_for(self, nodes: int, starting: str, timeout: float = 180) -> None:
        """Until `nodes` nodes are alive; fails at once, with the node's log, if `starting`'s `ray start` exits."""
        deadline = time.time() + timeout
        while self.alive() != nodes:
            if self.nodes[starting].process.poll() is not None:
                log = open(os.path.join(self.tmp, f"{starting}.log"), errors="replace").read()
                raise NodeDidNotStart(f"the Ray node {starting} did not start:\n{log[-3000:]}")
            if time.time() > deadline:
                raise TimeoutError(f"the Ray cluster did not reach {nodes} live nodes")
            time.sleep(0.2)

    def wait_for_jobs(self, timeout: float = 180) -> None:
        """Until the head takes a job: its dashboard answers before its job agent does."""
        from ray.job_submission import JobSubmissionClient

        deadline = time.time() + timeout
        while True:
            try:
                client = JobSubmissionClient(self.dashboard_url)
                probe = client.submit_job(entrypoint="python -c pass")
                while client.get_job_status(probe).value not in ("SUCCEEDED", "FAILED", "STOPPED"):
                    time.sleep(0.5)
                return
            except Exception:
                if self.nodes["head"].process.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the Ray head does not take jobs: " +
                                       open(os.path.join(self.tmp, "head.log"), errors="replace").read()[-2000:])
                time.sleep(1)

    def node_id(self, name: str) -> str:
        """The Ray node id of the live node started as `name`."""
        out = subprocess.run([str(BIN / "ray"), "list", "nodes", "--address", self.dashboard_url, "--detail",
                              "--format", "json", "--limit", "1000"], env=self.env, capture_output=True, text=True,
                             timeout=120, check=True)
        (node,) = [n["node_id"] for n in json.loads(out.stdout)
                   if n["state"] == "ALIVE" and name in (n.get("resources_total") or {})]
        return node

    def actor_nodes(self, class_part: str, *jobs) -> set[str]:
        """The nodes (ids) where the jobs' actors whose class name contains `class_part` ran, per Ray's state API
        (`jobs`: what tests/system/test_e2e.py's `submit` returned; a session's other tests ran actors too)."""
        out = subprocess.run([str(BIN / "ray"), "list", "actors", "--address", self.dashboard_url, "--detail",
                              "--format", "json", "--limit", "10000"], env=self.env, capture_output=True, text=True,
                             timeout=120, check=True)
        ids = {j.ray_job_id for j in jobs}
        return {a["node_id"] for a in json.loads(out.stdout)
                if class_part in (a.get("class_name") or "") and a.get("job_id") in ids}

    def processes(self, name: str) -> list[str]:
        """The command lines of a node's processes (its raylet's workers among them)."""
        try:
            tree = psutil.Process(self.nodes[name].process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        lines = []
        for proc in tree:
            try:
                lines.append(" ".join(proc.cmdline()))
            except psutil.Error:
                pass
        return lines

    def stop(self) -> None:
        for node in reversed(list(self.nodes.values())):
            node.kill()
        self._sweep(self.tmp)

    @staticmethod
    def _sweep(temp_dir: str) -> None:
        """Kill what outlived its node: any process whose command line names the node's (or cluster's) temp dir."""
        for proc in psutil.process_iter(["cmdline"]):
            if temp_dir in " ".join(proc.info["cmdline"] or []):
                try:
                    proc.kill()
                except psutil.Error:
                    pass


def start(tmp: str, extra_env: dict, workers: dict[str, int]) -> RayCluster:
    """A head (no CPU) and one worker node per `workers` entry (name -> CPUs)."""
    env = {**os.environ, **extra_env, "RAY_AUTH_MODE": "disabled", "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    cluster = RayCluster(tmp, env, free_port(), free_port())
    try:
        cluster._start("head", ["--head", f"--port={cluster.port}", "--num-cpus=0", f"--temp-dir={tmp}/r",
                                "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                                f"--dashboard-port={cluster.dashboard}", f"--ray-client-server-port={free_port()}",
                                f"--object-store-memory={OBJECT_STORE}"])
        for name, cpus in workers.items():
            cluster.add_worker(name, cpus)
    except BaseException:
        cluster.stop()
        raise
    return cluster
