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
