"""The one rule for where a job's work runs: on Ray, or in this process with Ray never started.

`--executor ray|local` decides when given. Under `auto` (the default) work runs on Ray when a cluster was
asked for (--address, RAY_ADDRESS: a `ray job submit` job stays on its cluster), when this process already runs
a caller's Ray, or when the job itself needs Ray's parallelism (more work than one process does well, a pool of
encoders or a GPU asked for, a GPU on this machine); otherwise in this process, and Ray's start-up (seconds) is
skipped. The one-node Ray an earlier stage of the same command brought up (cluster.started_here) does not hold
the later stages on Ray. What the command said (--address) and what it started come in its RunContext; a
Placement carries it on to where Ray comes up (cpus, and the job's units and tasks).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from mieb_ray import flags
from mieb_ray.errors import UserError
from mieb_ray.runtime import cluster
from mieb_ray.runtime.cluster import RunContext

EXECUTORS = flags.EXECUTORS


@dataclass(frozen=True)
class Placement:
    mode: str  # "ray" or "local" (runtime.tasks.using)
    why: str  # one line for the log
    ctx: RunContext = field(default_factory=RunContext, compare=False)  # the command's Ray, for where it comes up

    def describe(self) -> str:
        return f"{'on Ray' if self.mode == 'ray' else 'in this process'} ({self.why})"

    def cpus(self) -> float:
        """The CPUs its work can spread over: the cluster's at its largest on Ray, this machine's inline."""
        if self.mode == "ray":
            from mieb_ray.runtime.cluster import read_cluster

            return read_cluster(self.ctx).max_cpus
        return float(os.cpu_count() or 1)


def ray_running() -> bool:
    """This process is connected to Ray (without importing Ray to find out)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def keep_ray(ctx: RunContext | None = None) -> str | None:
    """Why work runs on Ray whatever its size (None: nothing holds it there)."""
    ctx = ctx or RunContext()
    if address := ctx.address or os.environ.get("RAY_ADDRESS"):
        return f"a cluster was asked for ({'--address' if address == ctx.address else 'RAY_ADDRESS'})"
    if ray_running() and not cluster.started_here(ctx):
        return "Ray already running in this process"
    return None


def choose(requested: str, needs_ray: str | None, size: str = "", ctx: RunContext | None = None) -> Placement:
    """Where to run, for a job asked to run on `requested` (auto, ray, local) whose own reason to use Ray is
    `needs_ray` (None: the work fits this process). `size`: what the work is, for the log line. ctx: the
    command's (None: RunContext()), carried by the Placement."""
    ctx = ctx or RunContext()
    if requested not in EXECUTORS:
        raise UserError(f"--executor must be one of {', '.join(EXECUTORS)}, not {requested!r}")
    more = f", {size}" if size else ""
    if requested != "auto":
        return Placement(requested, f"--executor {requested}{more}", ctx)
    if why := keep_ray(ctx) or needs_ray:
        return Placement("ray", f"{why}{more}", ctx)
    alone = "beside the one-node Ray this job started" if ray_running() else "Ray not started"
    return Placement("local", f"no cluster{more}: {alone}", ctx)
