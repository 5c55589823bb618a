"""The job's one bound on hub requests (mieb_ray/hubgate.py): requests through the hub's filesystem are bounded and a
429's wait is honoured; a slot whose process died comes back after its lease."""

from __future__ import annotations

import threading
import time

import pytest
from support import fakehub

from mieb_ray import hubfs, hubgate
from mieb_ray.io import reader
from mieb_ray.sources import by_slug

pytestmark = pytest.mark.timeout(300)


def test_requests_are_bounded_and_rate_limits_honoured(mirror, monkeypatch):
    root, _ = mirror
    monkeypatch.setenv(hubfs.ENV_CONCURRENCY, "3")
    hubgate.reset(hubfs.bound())
    try:
        fake = fakehub.FakeHub(root, delay=0.05)
        fs = hubfs.HubFileSystem(fake)
        path = reader.repo_root(by_slug("cifar10"), "hf")[len("hf://"):] + "/README.md"
        threads = [threading.Thread(target=fs.info, args=(path,)) for _ in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert fake.max_inflight == 3 and fake.requests == 24

        fake = fakehub.FakeHub(root, every=2, faults=["429"], retry_after=1)  # the 2nd request: wait 1 s
        fs = hubfs.HubFileSystem(fake)
        fs.info(path)
        t0 = time.monotonic()
        fs.info(path)
        assert 1.0 <= time.monotonic() - t0 < 5 and fake.injected == ["429"]
    finally:
        hubgate.reset(hubfs.bound())


def test_the_gate_takes_back_a_slot_its_process_never_returned(monkeypatch):
    """A shard builder killed mid-request never leaves the gate: its slot comes back after the lease, not never."""
    import asyncio

    monkeypatch.setattr(hubgate, "LEASE", 0.3)

    async def scenario() -> tuple[float, float, dict]:
        gate = hubgate.GateActor(1)
        await gate.enter()  # its process dies holding it
        t0 = time.monotonic()
        second = await gate.enter()
        waited = time.monotonic() - t0
        await gate.leave(second)
        gate.pause(0.2)
        t0 = time.monotonic()
        await gate.enter()
        return waited, time.monotonic() - t0, gate.stats()

    waited, paused, stats = asyncio.run(scenario())
    assert 0.25 <= waited < 2 and 0.15 <= paused < 2
    assert stats == {"requests": 3, "throttled": 1, "peak": 1, "slots": 1}


def test_driver_threads_that_need_the_gate_at_once_start_one_that_stays_up(ray_local, monkeypatch):
    """A driver's threads that first need the gate together (the pre-flight's readers, with Ray up already) start one
    gate, and it stays up. A non-detached actor ends with its creator's handle, and a handle found by name does not
    keep it. Seen in the suite: the thread that found the gate by name stored its handle last, the creator's was
    dropped, the gate ended at once, and every process fell back to its own bound. That order is forced here: the
    creator waits 1 s for the gate to start, the finder 2 s before it stores its handle."""
    ray = ray_local
    job = hubgate._job(ray.get_runtime_context())
    hubgate._shared.pop(job, None)
    hubgate._made.pop(job, None)  # an earlier test's gate ends with its creator's handle: a fresh driver's state
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get_actor(hubgate.GATE)
        except ValueError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the earlier gate did not end")

    creating, real_get, real_local = threading.Event(), ray.get, hubgate.local

    def get(refs, *args, **kwargs):
        if threading.current_thread().name == "creator":
            creating.set()
            time.sleep(1)
        return real_get(refs, *args, **kwargs)

    def local(slots):
        if threading.current_thread().name == "finder":
            time.sleep(2)
        return real_local(slots)

    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(hubgate, "local", local)
    got = {}  # what each thread's gate is: a handle kept here would keep the gate up
    threads = [threading.Thread(target=lambda name=name: got.__setitem__(name, type(hubgate.gate(2)).__name__),
                                name=name) for name in ("creator", "finder")]
    threads[0].start()
    assert creating.wait(30)
    threads[1].start()
    for thread in threads:
        thread.join(60)
    time.sleep(2)  # a gate whose creator's handle was dropped ends within this
    assert got == {"creator": "SharedGate", "finder": "SharedGate"}
    assert real_get(ray.get_actor(hubgate.GATE).stats.remote())["slots"] == 2  # ValueError: no gate of that name
