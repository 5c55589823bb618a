"""The Ray cluster: joined (or a local Ray started) when a job's Ray work begins, not before, so that a check
that needs no Ray (a wrong path, a complete output, an unknown name) fails in a second rather than after Ray's
start-up; and what it has now and can grow to.

The command line makes one RunContext per command (--address, --verbose) and hands it to the job, which passes
it down to where Ray work begins: `ray_up(ctx)` (runtime/units.py, runtime/tasks.py, read_cluster). A caller
that started Ray itself keeps its Ray. Work placed in this process (runtime/placement.py) never calls it.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import yaml

from mieb_ray.errors import UserError
from mieb_ray.hubfs import share_gate, worker_runtime_env
from mieb_ray.runtime.pools import Cluster, launcher_capacity

BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"  # where `ray up` leaves the launcher config on the head


@dataclass
class RunContext:
    """What one command says about its Ray, handed to its job explicitly rather than kept in module globals: two
    jobs in one process (a test, a notebook, demo's stages) each see their own, and a library caller that passes
    none gets a default RunContext(): RAY_ADDRESS, else a new local Ray, quiet."""

    address: str | None = None  # --address; None: RAY_ADDRESS, else a new local Ray
    verbose: bool = False  # Ray's own log lines (INFO and WARNING) shown: --verbose
    started_here: bool = False  # set by ray_up: it brought up a local Ray with no cluster named, for this job

    def ray_log_level(self) -> int:
        """The level of Ray's Python loggers (ray, ray.data) while a job runs."""
        return logging.INFO if self.verbose else logging.ERROR


# With Ray's default limit on a node's worker processes (num_workers_soft_limit -1), a job whose stages are an
# actor pool beside short read and commit tasks saw the worker a task had just freed killed after 1 s idle, and
# the next unit waited for a fresh process to import torch and pyarrow again (3-5 s on 2 cores). 68 small units
# on one 2-CPU node: 20 worker processes started, 13 ended idle, 72.7 s; with this limit 8, none, 45.3 s
# (bench/ray_workers.py).
# Nodes started by `ray start` take the same limit from their environment (cluster.yaml, tests/support/raycluster.py).
def worker_soft_limit(cpus: int) -> int:
    """How many worker processes a node of `cpus` CPUs keeps, idle ones included: Ray's num_workers_soft_limit."""
    return 2 * cpus + 4


def started_here(ctx: RunContext) -> bool:
    """Ray runs in this process because ray_up brought it up with no cluster named (--address, RAY_ADDRESS), on
    one node: a laptop job's own Ray, not a cluster and not a caller's ray.init."""
    ray = sys.modules.get("ray")
    return ctx.started_here and ray is not None and ray.is_initialized() and \
        sum(1 for n in ray.nodes() if n.get("Alive")) == 1


def ray_up(ctx: RunContext | None = None) -> None:
    """Join ctx's cluster, or start a local Ray, unless Ray is up already (ctx None: RunContext())."""
    import ray

    ctx = ctx or RunContext()
    if not ray.is_initialized():
        address = ctx.address or os.environ.get("RAY_ADDRESS")
        _reachable(address)
        handler = signal.getsignal(signal.SIGTERM)
        own = {}  # a new local Ray: room for idle workers, unless the user set Ray's own variable for it
        if address is None and "RAY_num_workers_soft_limit" not in os.environ:
            own = {"_system_config": {"num_workers_soft_limit": worker_soft_limit(os.cpu_count() or 1)}}
        # HF_TOKEN and the hub settings reach every worker through its environment, never a log
        # the workers' own output (a model's progress bars, Ray's retry notes) only with --verbose: their errors
        # reach the job as exceptions
        try:
            ray.init(address=address, log_to_driver=ctx.verbose, logging_level=ctx.ray_log_level(),
                     runtime_env=worker_runtime_env(), **own)
        except SystemExit as exc:  # a SIGTERM met the handler ray.init installs, sys.exit(15): the caller's decides
            if exc.code == signal.SIGTERM and callable(handler):
                handler(signal.SIGTERM, None)  # the CLI's raises KeyboardInterrupt: the command's interrupt
            raise
        finally:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, handler)  # ray.init installed its own, which exits on the spot
        ctx.started_here = address is None
    logging.getLogger("ray").setLevel(ctx.ray_log_level())
    share_gate()  # a job that read the hub before Ray was up: one bound for all its processes


@contextmanager
def own_ray():
    """A Ray that a job's command brought up (joined or started) is let go when the command ends, here and not at the
    interpreter's exit: Ray's threads print its last notices while the command's output is still filtered. A caller
    that had Ray up already (a test, a notebook) keeps it."""
    ray = sys.modules.get("ray")
    before = ray is not None and ray.is_initialized()
    try:
        yield
    finally:
        ray = sys.modules.get("ray")
        if not before and ray is not None and ray.is_initialized():
            ray.shutdown()


def _reachable(address: str | None, timeout: float = 5.0) -> None:
    """A HOST:PORT that takes no connection is one line now; ray.init would retry it for minutes."""
    found = re.fullmatch(r"(?:[a-z]+://)?\[?([^\]/]+?)\]?:(\d+)/?", address or "")
    if not found:  # "auto", "local" or none: Ray finds (or starts) the cluster itself
        return
    try:
        socket.create_connection((found.group(1), int(found.group(2))), timeout=timeout).close()
    except OSError as exc:
        raise UserError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from None


def autoscaler_config(gcs_address: str, proc: str = "/proc") -> str | None:
    """The config file this cluster's autoscaler runs with, when its monitor process runs on this machine: the
    `--autoscaling-config` of `ray start --head` (`ray up` passes ~/ray_bootstrap_config.yaml), which the monitor
    (autoscaler v1 or v2) is started with, beside the address of its cluster's GCS. A `ray job submit` driver runs on
    the head, where the monitor does. Ray 2.60's autoscalers do not report their config to the GCS, so there is no
    other way to know what a `ray start --autoscaling-config` cluster can grow to. None elsewhere (another machine,
    no /proc)."""
    try:
        pids = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                args = [a.decode(errors="replace") for a in f.read().split(b"\0")]
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if f"--gcs-address={gcs_address}" not in args or not any(a.endswith("monitor.py") for a in args):
            continue
        for arg in args:
            if arg.startswith("--autoscaling-config="):
                return os.path.expanduser(arg.split("=", 1)[1])
    return None


def read_cluster(ctx: RunContext | None = None) -> Cluster:
    """What the Ray cluster has now and can grow to (joining ctx's, or starting a local Ray, on first use)."""
    import ray

    ray_up(ctx)

    now = ray.cluster_resources()
    cpus, gpus = float(now.get("CPU", 0)), float(now.get("GPU", 0))
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    grown, source = None, None
    try:
        reported = ray._private.state.state.get_max_resources_from_cluster_config()
    except Exception:  # a private API: its absence must not stop a job
        reported = None
    if reported:
        grown, source = {"CPU": float(reported.get("CPU", 0)), "GPU": float(reported.get("GPU", 0))}, \
            "Ray's cluster config"
    elif os.path.exists(path := os.path.expanduser(BOOTSTRAP_CONFIG)):
        with open(path) as f:
            grown, source = launcher_capacity(yaml.safe_load(f) or {}), "the cluster launcher's config"
    elif path := autoscaler_config(ray.get_runtime_context().gcs_address):
        try:
            with open(path) as f:
                grown, source = launcher_capacity(yaml.safe_load(f) or {}), "its autoscaler's config"
        except (OSError, yaml.YAMLError):  # gone or unreadable: as if there were none
            pass
    if grown is None:
        return Cluster(cpus, gpus, cpus, gpus, nodes, None)
    return Cluster(cpus, gpus, max(cpus, grown["CPU"]), max(gpus, grown["GPU"]), nodes, source,
                   grown.get("CPU without GPU"))
