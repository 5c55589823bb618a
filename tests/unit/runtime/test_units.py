"""A job's units through its stages (mieb_ray/runtime/units.py): on Ray Data and inline with the same results, a
class stage's rows reported as it goes, a stage's UserError as the job's one line, Ray Data's settings restored
after a job, nothing of a run left working after an interrupt, the read tasks on every CPU an actor pool leaves."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import ray.cloudpickle

from mieb_ray import storage
from mieb_ray.errors import UserError
from mieb_ray.runtime import units
from mieb_ray.runtime.pools import Pool

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[3]
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers cannot import a test module


def read(batch: dict, names: list[str], out: str) -> dict:
    (i,) = batch["unit"]
    if names[i] == "bad":
        raise UserError(f"{names[i]} is not a table")
    return {"unit": batch["unit"], "name": np.array([names[i]], dtype=object)}


class Upper:
    """A class stage (an actor pool on Ray): built once, called per unit."""

    def __init__(self, suffix: str):
        self.suffix, self.on_rows = suffix, None

    def __call__(self, batch: dict) -> dict:
        if self.on_rows is not None:
            self.on_rows(1)
        return {**batch, "name": np.array([n.upper() + self.suffix for n in batch["name"]], dtype=object)}


def commit(batch: dict, out: str) -> dict:
    results = [{"unit": int(u), "path": f"{n}.txt", "rows": 1} for u, n in zip(batch["unit"], batch["name"])]
    for r in results:
        storage.write_bytes(storage.join(out, r["path"]), b"x")
    return {"unit": batch["unit"], "result": np.array([json.dumps(r) for r in results], dtype=object)}


def _stages(names, out):
    pool = Pool(1, 1, 0.5, 0.0, "test")
    return [units.Stage(read, dict(names=names, out=out), num_cpus=0.5),
            units.Stage(Upper, dict(suffix="!"), num_cpus=0.5, pool=pool),
            units.Stage(commit, dict(out=out), num_cpus=0.5)]


def test_units_run_the_same_on_ray_data_and_inline(ray_local, tmp_path):
    import ray

    names = ["a", "b", "c", "d"]
    ctx = ray.data.DataContext.get_current()
    before = (ctx.target_max_block_size, ctx.raise_original_map_exception, ctx.retried_map_errors)
    got, ticks = {}, []
    for where in ("ray", "local"):
        out = str(tmp_path / where)
        got[where] = [r for _, r in sorted(units.run([0, 2, 3], _stages(names, out), where, on_rows=ticks.append),
                                           key=lambda pair: pair[0])]
        assert sorted(p.name for p in (tmp_path / where).iterdir()) == ["A!.txt", "C!.txt", "D!.txt"]
    assert got["ray"] == got["local"] == [{"unit": u, "path": f"{n}!.txt", "rows": 1}
                                          for u, n in ((0, "A"), (2, "C"), (3, "D"))]
    assert ticks == [1, 1, 1]  # inline, a class stage reports its rows as it goes
    assert (ctx.target_max_block_size, ctx.raise_original_map_exception, ctx.retried_map_errors) == before
    assert list(units.run([], _stages(names, str(tmp_path)), "ray")) == []


@pytest.mark.parametrize("where", ["ray", "local"])
def test_a_stage_s_user_error_is_the_job_s_one_line(ray_local, tmp_path, where, capfd):
    """Raised as itself, and nothing else says it: not Ray Data's error log (an operator's exception, then a trace
    "in Ray Data or Ray Core internal code" asking for a bug report)."""
    with pytest.raises(UserError, match="^bad is not a table$"):
        list(units.run([0, 1], _stages(["good", "bad"], str(tmp_path)), where))
    assert "bad is not a table" not in capfd.readouterr().err


class Built:
    """A job's stage: 0.1 s a unit."""

    def __call__(self, batch: dict) -> dict:
        time.sleep(0.1 * len(batch["unit"]))
        return {"unit": batch["unit"], "result": np.array(['{"rows": 1}'] * len(batch["unit"]), dtype=object)}


def test_a_job_left_by_an_interrupt_leaves_no_thread_of_its_run_behind(ray_local, tmp_path):
    """Ctrl-C (or `ray job stop`) while the driver handles a result: when Job.run has raised, nothing of the run
    still works. Ray Data's prefetching thread, left blocked, touched Ray after the command had shut it down, and
    Ray ended the process: exit 1, the interrupt's line unsaid (1 run in 7 of an interrupted build)."""
    import threading

    from mieb_ray.runtime.job import Job

    def log(line: str) -> None:
        if "units," in line:  # the first progress line, in the driver's loop
            raise KeyboardInterrupt

    before = set(threading.enumerate())
    stage = units.Stage(Built, num_cpus=1, pool=Pool(2, 2, 1.0, 0.0, "test"))
    with pytest.raises(KeyboardInterrupt):
        Job("test", str(tmp_path), "a test", re.compile("x"), log=log).run(list(range(200)), [stage], "ray")
    left = [t for t in threading.enumerate() if t not in before]
    for thread in left:
        thread.join(timeout=5)
    assert not [t.name for t in left if t.is_alive()]


READS_AT_ONCE = """
import json, time
import numpy as np, ray
from mieb_ray.runtime import units
from mieb_ray.runtime.pools import Pool

def read(batch):
    t0 = time.time()
    time.sleep(3)
    return {"unit": batch["unit"], "span": np.array([[t0, time.time()]])}

class Passing:
    def __call__(self, batch):
        return batch

def spans(batch):
    return {"unit": batch["unit"], "result": np.array([json.dumps(list(s)) for s in batch["span"]], dtype=object)}

ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
pool = Pool(1, 1, 1.0, 0.0, "test")
stages = [units.Stage(read, num_cpus=1, memory=1 << 20),  # a memory hint: not fused into the pool, as the job's
          units.Stage(Passing, num_cpus=1, pool=pool), units.Stage.commit(spans, {}, pool, 6)]
print(json.dumps([span for _, span in units.run(list(range(6)), stages, "ray")]))
"""


def test_the_reads_run_on_every_cpu_the_actor_pool_leaves(tmp_path):
    """On a Ray of 4 CPUs, one actor of 1 CPU leaves 3 to the read tasks, all used at once. With the commit stage as
    it was (0.25 CPU a task, no cap), Ray Data kept CPUs back for it and ran 1 read at a time. A Ray of its own: Ray
    Data shares a Ray's CPUs among the datasets that ran last (another test's, for minutes)."""
    got = subprocess.run([sys.executable, "-c", READS_AT_ONCE], capture_output=True, text=True, timeout=240,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"})
    assert got.returncode == 0, got.stderr[-3000:]
    spans = json.loads(got.stdout.strip().splitlines()[-1])
    at_once = max(sum(1 for t0, t1 in spans if t0 <= t < t1) for t, _ in spans)  # reads running as each starts
    assert len(spans) == 6 and at_once == 3, sorted(spans)
