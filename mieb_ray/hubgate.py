"""One bound on the hub's requests for the whole job: how many at once, and the pause after a 429.

Every request hubfs makes enters the gate first and leaves it after. The gate is the job's when the job has Ray: a
named actor (`GATE`) that the driver starts once Ray is up (`share()`) and every process of the job (the driver,
each shard builder on any node) finds by name. Without it (no Ray yet, a process of no job, the actor lost) a
process uses its own gate with the same rules, so a request is never refused for want of a gate.

- At most `slots` requests hold a slot at once, whichever process makes them.
- A 429 pauses the gate for the wait the hub asked (or the backoff): every process waits it out together,
  instead of each finding the limit on its own.
- A slot held past `LEASE` seconds is taken back: its process died mid-request (a node lost).
- `stats()` counts requests, the most held at once and the 429s, for the job's closing line.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
import time
from contextlib import suppress

GATE = "mieb-ray-hub-gate"
LEASE = 120.0  # longer than any one range request takes: a slot held past it is presumed lost with its process
_COUNTS = ("requests", "throttled")


class LocalGate:
    """A gate for this process's threads."""

    def __init__(self, slots: int):
        self.slots = slots
        self._free = threading.BoundedSemaphore(slots)
        self._lock = threading.Lock()
        self._until = 0.0
        self.requests = self.throttled = self.held = self.peak = 0

    def enter(self):
        while (wait := self._until - time.monotonic()) > 0:
            time.sleep(wait)
        self._free.acquire()
        with self._lock:
            self.requests, self.held = self.requests + 1, self.held + 1
            self.peak = max(self.peak, self.held)

    def leave(self, lease=None) -> None:
        with self._lock:
            self.held -= 1
        self._free.release()

    def pause(self, seconds: float) -> None:
        with self._lock:
            self._until = max(self._until, time.monotonic() + seconds)
            self.throttled += 1

    def stats(self) -> dict:
        return {"requests": self.requests, "throttled": self.throttled, "peak": self.peak}


class GateActor:
    """The job's gate, as a Ray actor (async: a waiting request holds no thread of it)."""

    def __init__(self, slots: int):
        self.slots = slots
        self.leases: dict[int, float] = {}  # lease -> when it is taken back
        self.last = 0
        self.until = 0.0
        self.changed = asyncio.Condition()
        self.requests = self.throttled = self.peak = 0

    async def enter(self) -> int:
        async with self.changed:
            while True:
                now = time.monotonic()
                for lease in [k for k, end in self.leases.items() if end < now]:
                    del self.leases[lease]
                if now >= self.until and len(self.leases) < self.slots:
                    break
                wake = self.until if now < self.until else min(self.leases.values())
                with suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), max(0.001, wake - now))
            self.last += 1
            self.leases[self.last] = now + LEASE
            self.requests += 1
            self.peak = max(self.peak, len(self.leases))
            return self.last

    async def leave(self, lease: int) -> None:
        async with self.changed:
            self.leases.pop(lease, None)
            self.changed.notify()

    def pause(self, seconds: float) -> None:
        self.until = max(self.until, time.monotonic() + seconds)
        self.throttled += 1

    def stats(self) -> dict:
        return {"requests": self.requests, "throttled": self.throttled, "peak": self.peak, "slots": self.slots}

    def setup(self, slots: int, clear: bool = False) -> None:
        """The bound of the driver that shares the gate; `clear`: counts, slots held and pause start over."""
        self.slots = slots
        if clear:
            self.leases.clear()
            self.until, self.requests, self.throttled, self.peak = 0.0, 0, 0, 0


class SharedGate:
    """A process's handle on the job's gate. A call that cannot reach the actor looks it up again once (the
    driver may have started a new one); failing that, the request passes through this process's own gate."""

    def __init__(self, actor, fallback: LocalGate):
        self.actor, self.fallback = actor, fallback

    def _call(self, method: str, *args, wait: bool = True):
        import ray

        for attempt in (1, 2):
            try:
                ref = getattr(self.actor, method).remote(*args)
                return ray.get(ref) if wait else None
            except Exception:
                if attempt == 2:
                    raise
                self.actor = ray.get_actor(GATE)  # ValueError if there is none: raised, the caller falls back

    def enter(self):
        try:
            return self._call("enter")
        except Exception:
            self.fallback.enter()
            return None

    def leave(self, lease) -> None:
        if lease is None:
            self.fallback.leave()
            return
        with suppress(Exception):
            self._call("leave", lease, wait=False)  # not waited for: the request is done

    def pause(self, seconds: float) -> None:
        try:
            self._call("pause", seconds, wait=False)
        except Exception:  # at least this process's other requests wait
            self.fallback.pause(seconds)

    def stats(self) -> dict:
        return self._call("stats")


@functools.lru_cache(maxsize=None)
def local(slots: int) -> LocalGate:
    return LocalGate(slots)


_shared: dict[str, SharedGate] = {}  # the job (_job) -> its gate
# A non-detached actor ends when its creator's handle goes; a handle found by name does not keep it: the driver keeps
# the handle it made for the life of the process (the job's), and one of its threads at a time starts or finds the
# gate (threads that raced each kept the other's handle, and the creator's was dropped)
_made: dict[str, object] = {}
_starting = threading.Lock()


def _ray():
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def _job(here) -> str:
    # a driver's namespace is its own (anonymous: a fresh one per connection), its workers share it
    return f"{here.namespace}/{here.get_job_id()}"


def gate(slots: int) -> LocalGate | SharedGate:
    """The gate of the job this process works for: the one its driver shared (a driver shares it now if it has
    not), else this process's own."""
    ray = _ray()
    if ray is None:
        return local(slots)
    here = ray.get_runtime_context()
    job = _job(here)
    if job not in _shared:
        if here.worker.mode == ray.SCRIPT_MODE:
            try:
                share(slots)
            except Exception:  # no gate can be started (a cluster at its limit): this process's own bound
                return local(slots)
        else:  # a worker of the job
            try:
                _shared[job] = SharedGate(ray.get_actor(GATE), local(slots))
            except ValueError:  # no such actor (yet): this request is bounded here
                return local(slots)
    return _shared[job]


def share(slots: int, clear: bool = False) -> None:
    """In a job's driver, with Ray up: start the job's gate, or find the one this driver started before."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context()
    job = _job(here)
    if here.worker.mode != ray.SCRIPT_MODE:
        return  # a worker finds the gate, it does not start one
    with _starting:
        if isinstance(_shared.get(job), SharedGate):
            return  # a driver starts it once
        actor = ray.remote(GateActor).options(
            name=GATE, get_if_exists=True, num_cpus=0, max_restarts=-1, max_concurrency=10_000,
            # beside the driver: a worker node lost takes no gate with it
            scheduling_strategy=NodeAffinitySchedulingStrategy(here.get_node_id(), soft=True)).remote(slots)
        ray.get(actor.setup.remote(slots, clear))  # up before the job's work starts; this driver's bound
        _made.setdefault(job, actor)
        _shared[job] = SharedGate(actor, local(slots))


def stats(slots: int) -> dict:
    """Requests, 429s and the most at once so far: the job's gate's (if Ray is up), plus this process's own (the
    driver's requests before Ray was up)."""
    own = {**local(slots).stats(), "slots": slots, "scope": "process"}
    shared = gate(slots) if _ray() else None
    if not isinstance(shared, SharedGate):
        return own
    try:
        job = shared.stats()
    except Exception:
        return own
    return {**{k: own[k] + job[k] for k in _COUNTS}, "peak": max(own["peak"], job["peak"]), "slots": job["slots"],
            "scope": "job"}


def reset(slots: int) -> None:
    """Start over (tests: a new bound, counts from zero): this process's own gate, and the job's if Ray is up."""
    _shared.clear()
    local.cache_clear()
    if _ray() is not None:
        share(slots, clear=True)
