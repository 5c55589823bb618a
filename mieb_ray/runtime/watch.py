"""What the cluster did while a job's units ran on Ray: worker nodes added and removed (an autoscaler's, a spot
reclaim, a lost machine), and how many actors each pool started against its maximum, as the job's own log lines.

A thread polls the alive nodes (ray.nodes(), from the GCS) while Job.run runs (`watching`); at the end the job's
actors are read once from Ray's state API, which keeps ended ones (an actor restarted on another node keeps its
id), so a pool whose actors lived a second between two polls is still counted. Where the state API is unavailable
(a local Ray without its dashboard) the pools go unreported rather than the job failing. What changed and the lines
are pure functions of what was read.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

POLL_SECONDS = 2.0

Nodes = dict[str, dict[str, float]]  # alive node id -> its CPU and GPU


def alive_nodes(reported: list[dict]) -> Nodes:
    """{node id: {"CPU", "GPU"}} of the alive nodes in `ray.nodes()`'s records."""
    return {n["NodeID"]: {r: float((n.get("Resources") or {}).get(r, 0)) for r in ("CPU", "GPU")}
            for n in reported if n.get("Alive")}


def describe(resources: dict[str, float]) -> str:
    """"2 CPU, 1 GPU"; "no CPU" for a node that declares neither."""
    parts = [f"{resources[r]:g} {r}" for r in ("CPU", "GPU") if resources.get(r)]
    return ", ".join(parts) or "no CPU"


def change_lines(name: str, before: Nodes, after: Nodes) -> list[str]:
    """A line per node added or removed between two polls, with what is up after it."""
    cpus, gpus = (sum(n[r] for n in after.values()) for r in ("CPU", "GPU"))
    up = f"now {len(after)} node{'s' if len(after) != 1 else ''}, {cpus:g} CPU, {gpus:g} GPU"
    return ([f"[{name}] node added ({describe(after[i])}): {up}" for i in sorted(set(after) - set(before))] +
            [f"[{name}] node removed ({describe(before[i])}): {up}" for i in sorted(set(before) - set(after))])


@dataclass
class Seen:
    """What the watch saw over the job: node ids added and removed, the actors each pool started."""

    added: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    started: dict[str, int] = field(default_factory=dict)  # pool -> actors

    def summary(self, name: str, pools: dict[str, int]) -> str:
        """The job's closing line on its cluster; `pools`: {pool's name: its maximum}."""
        nodes = f"{len(self.added)} node{'s' if len(self.added) != 1 else ''} added, {len(self.removed)} removed" \
            if self.added or self.removed else "no node added or removed"
        reached = [f"{what}: {self.started[what]} of {most} actor{'s' if most != 1 else ''} started"
                   for what, most in pools.items() if self.started.get(what)]
        return f"[{name}] cluster during the job: {'; '.join([nodes, *reached])}"


def pool_counts(actors: list[dict], pools: dict[str, str]) -> dict[str, int]:
    """{pool: actors started} from the state API's actor records of one job; `pools`: {pool's name: its actor
    class}. Ray Data names a pool's actors after the class it runs (`MapWorker(MapBatches(EncodeStage))`); an actor
    that started has a process (pid), alive or ended since, or has been restarted (its node lost: while it waits
    for another its pid is 0); one still waiting for its first node has neither."""
    return {what: len({a["actor_id"] for a in actors if (a.get("pid") or a.get("num_restarts"))
                       and f"({cls})" in (a.get("class_name") or "")})
            for what, cls in pools.items()}


def _actors(ray) -> list[dict]:
    """This job's actors on this cluster, per Ray's state API (ended ones included)."""
    from ray.util.state import list_actors

    context = ray.get_runtime_context()
    actors = list_actors(address=context.gcs_address, filters=[("job_id", "=", context.get_job_id())],
                         limit=10_000, raise_on_missing_output=False)
    # with no dashboard of its own, Ray's state API asks the default port's: another cluster's, whose job ids
    # repeat ours; its actors ran on nodes that are not this cluster's
    ours = {n["NodeID"] for n in ray.nodes()}
    return [{"actor_id": a.actor_id, "pid": a.pid, "num_restarts": a.num_restarts, "class_name": a.class_name}
            for a in actors if a.node_id in ours or not a.pid]


@contextmanager
def watching(name: str, log, pools: dict[str, tuple[str, int]]):
    """While the block runs: a line per worker node added or removed; after it, the summary line.
    `pools`: {pool's name: (its actor class, its maximum)}."""
    import ray

    seen, stop = Seen(), threading.Event()
    state = {"nodes": alive_nodes(ray.nodes()), "earlier": None}
    if pools:
        try:  # the actors of this driver's earlier runs (eval runs several jobs) are not this run's
            state["earlier"] = {a["actor_id"] for a in _actors(ray)}
        except Exception:  # no dashboard to ask (a local Ray without it): pools unreported, the job unharmed
            pass

    def poll():
        nodes = alive_nodes(ray.nodes())
        for line in change_lines(name, state["nodes"], nodes):
            log(line)
        seen.added |= set(nodes) - set(state["nodes"])
        seen.removed |= set(state["nodes"]) - set(nodes)
        state["nodes"] = nodes

    def loop():
        while not stop.wait(POLL_SECONDS):
            try:
                poll()
            except Exception:  # a watch never fails the job it watches
                pass

    thread = threading.Thread(target=loop, name="mieb-watch", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()
    try:
        poll()
        if state["earlier"] is not None:
            seen.started = pool_counts([a for a in _actors(ray) if a["actor_id"] not in state["earlier"]],
                                       {what: cls for what, (cls, _) in pools.items()})
    except Exception:
        pass
    log(seen.summary(name, {what: most for what, (_, most) in pools.items()}))
