"""Actor pool sizes from what Ray reports: the resources up now, and what the cluster's autoscaler can add.

An autoscaling cluster starts with its head alone, so sizing from what is up would give one actor and, for
the encoders, CPUs (NeMo Curator's bug: GPU requests computed on a CPU-only head). What the cluster can grow
to comes from Ray itself: the cluster config its autoscaler reports to the GCS (none does in Ray 2.60), or, on
the head, the launcher's config of `ray up` or the config the autoscaler's monitor runs with
(runtime/cluster.read_cluster). Without any there is no autoscaler we know of, and the maximum is what is up now.

Pools then autoscale between a minimum (what fits now, at least one) and that maximum; but on an autoscaling
cluster a pool's actors all start at once, each waiting for its node (_at_once: ray-project/ray#59144), and CPU
pools size to the node types without GPUs, so that a build brings up no GPU node. The rules
are pure functions of a `Cluster` (runtime/cluster.py reads one from Ray), tested without Ray; a pool carries one line
that says what it uses and why.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mieb_ray import flags
from mieb_ray.errors import UserError

CPUS_PER_CPU_ENCODER = 4  # on CPUs, one encoder per 4 CPUs: the rest decode images for it
GPU_ENCODER_CPUS = 2.0  # a GPU encoder that decodes JPEGs on its device (--decode gpu): see encoder_pool


def workers_option(prefix: str = ""):
    return flags.option(None, flag="--workers", check=flags.count,
                        help=f"{prefix}encoder actors, a fixed number (default: a pool from one per GPU up now to one "
                             "per GPU the cluster can grow to; on CPUs, one per 4 CPUs)")


def gpus_option(prefix: str = ""):
    return flags.option(None, flag="--gpus-per-worker", check=flags.gpus,
                        help=f"{prefix}GPUs per encoder actor; 0 encodes on CPUs (default: 1 when the cluster has or "
                             "can add GPUs; CPUs only on a single machine without GPU and autoscaler, else an error)")


def cpus_option(prefix: str = ""):
    return flags.option(None, flag="--cpus-per-worker", check=flags.cpus,
                        help=f"{prefix}CPUs (and torch threads) per encoder actor (default: 2 for a GPU encoder that "
                             "decodes JPEGs on its device, else 1)")


@dataclass(frozen=True)
class PoolRequest:
    """What a command asks of an encoder pool; None: the pool decides from the cluster (encoder_pool)."""

    workers: int | None = workers_option()
    gpus_per_worker: float | None = gpus_option()
    cpus_per_worker: float | None = cpus_option()


@dataclass(frozen=True)
class Cluster:
    cpus: float  # up now
    gpus: float
    max_cpus: float  # what the cluster can grow to (= up now without an autoscaler)
    max_gpus: float
    nodes: int
    autoscaler: str | None  # where the maximum came from; None: no autoscaler we know of
    # CPUs the cluster can grow to on node types without GPUs, where a config tells them apart (None: unknown):
    # CPU pools size to these, so that a build never brings up GPU nodes for their CPUs
    max_cpus_without_gpus: float | None = None

    def cpu_pool_cpus(self) -> float:
        """The most CPUs a CPU pool may use: those up, or more on the nodes without GPUs the autoscaler can add
        (every CPU where no node type lacks a GPU)."""
        if not self.max_cpus_without_gpus:
            return self.max_cpus
        return max(self.cpus, self.max_cpus_without_gpus)

    def describe(self, resource: str) -> str:
        now, most = (self.gpus, self.max_gpus) if resource == "GPU" else (self.cpus, self.cpu_pool_cpus())
        text = f"{_n(now)} {resource}s up now"
        if self.autoscaler:
            where = " on nodes without GPUs" if resource == "CPU" and self.max_cpus_without_gpus \
                and self.max_cpus_without_gpus >= self.cpus else ""
            text += f", up to {_n(most)}{where} as its autoscaler adds nodes ({self.autoscaler})"
        return text


def _n(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Pool:
    min_size: int
    max_size: int
    num_cpus: float
    num_gpus: float
    why: str  # one line: what the pool uses and why
    what: str = "actors"  # its actors, for the job's log ("encoders", "shard builders")
    # calls in flight in an actor: at 2 Ray Data fetches and batches a block while the actor's own work (one call
    # at a time, as by default) runs on the last, so a GPU need not wait for the host between units
    calls: int = 1

    def strategy(self):
        import ray

        return ray.data.ActorPoolStrategy(min_size=self.min_size, max_size=self.max_size,
                                          max_concurrent_calls_per_actor=self.calls if self.calls > 1 else None)


def launcher_capacity(config: dict) -> dict[str, float]:
    """CPUs and GPUs of every node type at its max_workers (the head once), per a cluster launcher config; and
    "CPU without GPU": the CPUs of the types that declare no GPU."""
    total = {"CPU": 0.0, "GPU": 0.0, "CPU without GPU": 0.0}
    for name, node_type in config.get("available_node_types", {}).items():
        count = node_type.get("max_workers", 0) if name != config.get("head_node_type") else 1
        resources = node_type.get("resources", {})
        for resource in ("CPU", "GPU"):
            total[resource] += float(resources.get(resource, 0)) * count
        if not resources.get("GPU"):
            total["CPU without GPU"] += float(resources.get("CPU", 0)) * count
    return total


def _sized(now: int, most: int, workers: int | None, cap: int | None) -> tuple[int, int]:
    if workers is not None:
        now = most = workers
    most = max(1, most if cap is None else min(most, cap))
    return max(1, min(now, most)), most


def _at_once(cluster: Cluster, workers: int | None, lo: int, hi: int, kind: str = "") -> tuple[int, str]:
    """The pool's minimum on an autoscaling cluster: its maximum. Ray Data grows a pool only within the resources it
    sees up, so the autoscaler would add the node the first actor waits for and no more (ray-project/ray#59144; a
    CPU pool the same: a build from zero nodes stayed at 1 of 8 shard builders): every actor is asked for at once,
    each waiting for its node, which is what the autoscaler adds nodes for (and no request outlives the job)."""
    if cluster.autoscaler is not None and workers is None and hi > lo:
        return hi, f": all started at once, each waiting for the {kind}node its autoscaler adds"
    return lo, ""


def cpu_pool(cluster: Cluster, cpus_per_worker: float, workers: int | None = None, cap: int | None = None,
             what: str = "actors") -> Pool:
    """A pool of CPU actors: as many as fit now, growing to what the cluster can add (`cap`: no more than
    there is work for)."""
    lo, hi = _sized(int(cluster.cpus // cpus_per_worker), int(cluster.cpu_pool_cpus() // cpus_per_worker), workers,
                    cap)
    lo, waiting = _at_once(cluster, workers, lo, hi)
    why = "--workers" if workers is not None else cluster.describe("CPU")
    return Pool(lo, hi, cpus_per_worker, 0.0,
                f"{what}: {_sizes(lo, hi)} x {_n(cpus_per_worker)} CPU ({why}){waiting}", what)


def encoder_pool(cluster: Cluster, gpus_per_worker: float | None, cpus_per_worker: float | None,
                 workers: int | None = None, cap: int | None = None, device_decode: bool = False) -> Pool:
    """The encoders: on GPUs when the cluster has or can add them; on CPUs when asked (--gpus-per-worker 0),
    or on a single machine with no GPU and no autoscaler (a laptop). Anything else fails now, in one line,
    rather than encode silently on CPUs or wait for GPUs that cannot come, or for a CPU (_leaves_a_cpu).
    cpus_per_worker None: 1, or GPU_ENCODER_CPUS for a GPU encoder that decodes JPEGs on its device
    (`device_decode`)."""
    return _leaves_a_cpu(cluster, _encoders(cluster, gpus_per_worker, cpus_per_worker, workers, cap, device_decode))


def _leaves_a_cpu(cluster: Cluster, pool: Pool) -> Pool:
    """The tasks that read the encoders' input take a CPU each, and Ray Data stops no actor for them: a pool that
    holds every CPU the cluster has, or can grow to, waits forever for its first unit. Not where GPU encoders
    wait for nodes Ray does not know of: those bring CPUs of their own."""
    if pool.num_gpus and pool.max_size * pool.num_gpus > cluster.max_gpus:
        return pool
    if pool.max_size * pool.num_cpus <= cluster.max_cpus - 1:
        return pool
    fits = int((cluster.max_cpus - 1) // pool.num_cpus)
    fix = (f"pass --workers {fits} or fewer" if fits >= 1 else
           f"pass --cpus-per-worker {_n(cluster.max_cpus - 1)}" if cluster.max_cpus >= 2 else
           "give the cluster a second CPU, or encode in this process (--executor local)")
    encoders = f"{pool.max_size} encoder{'s' if pool.max_size > 1 else ''} x {_n(pool.num_cpus)} CPU"
    cpus = f"{_n(cluster.max_cpus)} CPU{'s' if cluster.max_cpus != 1 else ''} the Ray cluster " + \
        ("can grow to" if cluster.autoscaler else "has")
    raise UserError(f"{encoders} would hold all {cpus}, leaving none for the tasks that read their input (the job "
                    f"would wait forever); {fix}")


def _encoders(cluster: Cluster, gpus_per_worker: float | None, cpus_per_worker: float | None,
              workers: int | None, cap: int | None, device_decode: bool) -> Pool:
    if gpus_per_worker is None:
        if cluster.max_gpus > 0:
            gpus_per_worker = 1.0
        elif cluster.nodes <= 1 and cluster.autoscaler is None:
            pool = _cpu_encoders(cluster, cpus_per_worker or 1.0, workers, cap)
            return dataclasses.replace(pool, why=pool.why + ": no GPU on this machine and no autoscaler to add one")
        elif cluster.autoscaler:  # a GPU node type capped at 0, or none: waiting would never end
            raise UserError(f"the Ray cluster has no GPU ({cluster.nodes} nodes) and its autoscaler can add none "
                            f"({cluster.autoscaler}); pass --gpus-per-worker 0 to encode on CPUs, or give the "
                            "cluster a GPU node type")
        else:
            raise UserError(f"the Ray cluster has no GPU ({cluster.nodes} nodes) and Ray reports no autoscaler that "
                            "could add one; pass --gpus-per-worker 0 to encode on CPUs, or --gpus-per-worker 1 to "
                            "wait for GPU nodes")
    if gpus_per_worker == 0:
        pool = _cpu_encoders(cluster, cpus_per_worker or 1.0, workers, cap)
        return dataclasses.replace(pool, why=pool.why + ": --gpus-per-worker 0")
    if cluster.max_gpus == 0 and workers is None and cluster.autoscaler is not None:
        raise UserError(f"--gpus-per-worker {_n(gpus_per_worker)} asks for GPUs, but the Ray cluster has none and "
                        f"its autoscaler can add none ({cluster.autoscaler}); pass --gpus-per-worker 0 to encode "
                        "on CPUs")
    # without a known autoscaler, a GPU the user asked for may come from a node not started yet: wait for one
    lo, hi = _sized(int(cluster.gpus // gpus_per_worker), int(cluster.max_gpus // gpus_per_worker), workers, cap)
    why = "--workers" if workers is not None else cluster.describe("GPU")
    lo, waiting = _at_once(cluster, workers, lo, hi, "GPU ")
    if cpus_per_worker is not None:
        cpus, because = cpus_per_worker, "--cpus-per-worker"
    elif device_decode:
        cpus, because = GPU_ENCODER_CPUS, ("one drives the GPU (JPEG headers, copies, kernel launches), one decodes "
                                           "what its device refuses")
    else:
        cpus, because = 1.0, "it only drives the GPU: CPU tasks decode its images"
    return Pool(lo, hi, cpus, gpus_per_worker,
                f"encoders: {_sizes(lo, hi)} x {_n(gpus_per_worker)} GPU + {_n(cpus)} CPU ({why}; {_n(cpus)} CPU: "
                f"{because}){waiting}", "encoders", calls=2)


def _cpu_encoders(cluster: Cluster, cpus_per_worker: float, workers: int | None, cap: int | None) -> Pool:
    lo, hi = _sized(int(cluster.cpus // CPUS_PER_CPU_ENCODER),
                    int(cluster.cpu_pool_cpus() // CPUS_PER_CPU_ENCODER), workers, cap)
    lo, waiting = _at_once(cluster, workers, lo, hi)
    why = ("--workers" if workers is not None
           else f"one per {CPUS_PER_CPU_ENCODER} CPUs, at least one; {cluster.describe('CPU')}")
    return Pool(lo, hi, cpus_per_worker, 0.0,
                f"encoders on CPUs: {_sizes(lo, hi)} x {_n(cpus_per_worker)} CPU ({why}){waiting}", "encoders")


def _sizes(lo: int, hi: int) -> str:
    return f"{lo} actor{'s' if hi > 1 else ''}" if lo == hi else f"{lo}-{hi} actors"
