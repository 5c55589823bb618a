"""The one placement rule (mieb_ray/runtime/placement.py): where a job runs, and why, under --executor auto, ray
and local."""

from __future__ import annotations

import pytest

from mieb_ray.errors import UserError
from mieb_ray.runtime import cluster, placement
from mieb_ray.runtime.cluster import RunContext

pytestmark = pytest.mark.timeout(300)


def test_one_placement_rule(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(placement, "ray_running", lambda: False)
    assert placement.choose("auto", None, "1 MiB").describe() == "in this process (no cluster, 1 MiB: Ray not started)"
    assert placement.choose("auto", "2 GiB, more than 256 MiB").mode == "ray"  # the job's own reason
    assert placement.choose("ray", None).describe() == "on Ray (--executor ray)"
    assert placement.choose("local", "2 GiB").mode == "local"  # asked for: whatever the size
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # a `ray job submit` job stays on its cluster
    assert placement.choose("auto", None).describe() == "on Ray (a cluster was asked for (RAY_ADDRESS))"
    monkeypatch.delenv("RAY_ADDRESS")
    asked = RunContext(address="10.0.0.1:6379")  # --address
    assert placement.choose("auto", None, ctx=asked).why == "a cluster was asked for (--address)"
    assert placement.choose("auto", None, ctx=asked).ctx is asked  # carried on to where Ray comes up
    monkeypatch.setattr(placement, "ray_running", lambda: True)  # a caller's ray.init keeps its Ray
    assert placement.choose("auto", None).why == "Ray already running in this process"
    ours = RunContext(started_here=True)  # not a caller's Ray: the one-node Ray this job brought up
    monkeypatch.setattr(cluster, "started_here", lambda ctx: ctx.started_here)  # no Ray here to count nodes of
    assert placement.choose("auto", None, ctx=ours).describe() == "in this process (no cluster: beside the " \
                                                                  "one-node Ray this job started)"
    assert placement.choose("auto", None).why == "Ray already running in this process"  # another job's context
    with pytest.raises(UserError, match="--executor must be one of auto, ray, local, not 'gpu'"):
        placement.choose("gpu", None)
