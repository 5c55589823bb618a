"""The job runtime: tasks inline as Ray runs them, the one placement rule, the one retry policy, a unit's stages
on Ray Data and inline with the same results, a worker's UserError as the job's one line, Ray Data's settings
restored after a job, and a job's output rules (complete, unfinished, error rate)."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
import ray.cloudpickle

from mieb_ray import storage
from mieb_ray.errors import TransientStorageError, UserError
from mieb_ray.runtime import cluster, placement, tasks, units
from mieb_ray.runtime.job import Job
from mieb_ray.runtime.pools import Pool

pytestmark = pytest.mark.timeout(300)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers cannot import a test module


# ---------------------------------------------------------------------------------------------- tasks


@tasks.remote(num_cpus=1, num_returns=2)
def _two(a, b):
    return a + b, a * b


@tasks.remote(num_cpus=1)
def _fails(what):
    raise UserError(what)


def test_local_tasks_run_inline_as_ray_would():
    """Refs as arguments are resolved (top level), num_returns splits the one list, a task runs once and only
    when fetched, its error surfaces at get (as Ray's), and Ray is never touched."""
    calls = []

    @tasks.remote(num_cpus=1)
    def counted(x):
        calls.append(x)
        return x

    with tasks.using("local"):
        s, p = _two.remote(tasks.put(3), 4)
        total = _two.options(num_returns=2).remote(s, p)[0]
        ref = counted.remote(total)
        failing = _fails.remote("bad input")  # not fetched: not run
        assert tasks.is_ref(ref) and not calls
        assert tasks.get([ref, s]) == [19, 7] and tasks.get(ref) == 19 and calls == [19]
        for _ in range(2):  # fetched again, it raises again
            with pytest.raises(UserError, match="bad input"):
                tasks.get(failing)
        assert tasks.mode() == "local"
    assert tasks.mode() == "ray"


@tasks.remote(num_cpus=1, torch_threads=2)
def _torch_threads():
    import torch

    return torch.get_num_threads()


def test_a_task_s_torch_threads_are_set_on_ray_only(ray_local):
    """torch_threads: a Ray task runs torch on that many threads (Ray itself would give a 1-CPU task one); inline,
    the driver's own threads stay."""
    import torch

    with tasks.using("ray"):
        assert tasks.get(_torch_threads.remote()) == 2
        assert tasks.get(_torch_threads.options(num_cpus=0.5).remote()) == 2  # an options() copy keeps it
    with tasks.using("local"):
        assert tasks.get(_torch_threads.remote()) == torch.get_num_threads()


@pytest.mark.parametrize("where", ["ray", "local"])
def test_a_task_s_user_error_is_itself_and_a_transient_one_is_retried(ray_local, tmp_path, where):
    counter = tmp_path / "calls"

    @tasks.remote(num_cpus=0.5)
    def flaky(path: str, fail: int):  # fails `fail` times (counted in a file: Ray retries in new processes)
        with open(path, "a") as f:
            f.write(".")
        if len(open(path).read()) <= fail:
            raise TransientStorageError("the hub kept failing on hf://x: 503")
        return "done"

    with tasks.using(where):
        with pytest.raises(UserError, match="^bad input$"):  # the UserError itself, not Ray's wrapper
            tasks.get(_fails.remote("bad input"))
        assert tasks.get(flaky.remote(str(counter), tasks.UNIT_RETRIES)) == "done"
        assert len(counter.read_text()) == tasks.UNIT_RETRIES + 1
        counter.write_text("")
        with pytest.raises(TransientStorageError):
            tasks.get(flaky.remote(str(counter), tasks.UNIT_RETRIES + 1))
        assert len(counter.read_text()) == tasks.UNIT_RETRIES + 1


def test_retrying_runs_again_only_on_a_transient_error():
    calls = []

    def stage(fail):
        calls.append(1)
        if len(calls) <= fail:
            raise TransientStorageError("503")
        return "ok"

    assert tasks.retrying(stage, tasks.UNIT_RETRIES) == "ok" and len(calls) == tasks.UNIT_RETRIES + 1
    calls.clear()
    with pytest.raises(TransientStorageError):
        tasks.retrying(stage, tasks.UNIT_RETRIES + 1)
    calls.clear()

    def broken():
        calls.append(1)
        raise UserError("no such file: hf://x")

    with pytest.raises(UserError, match="no such file"):  # any other error is not retried
        tasks.retrying(broken)
    assert len(calls) == 1


# ---------------------------------------------------------------------------------------------- placement


def test_one_placement_rule(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(placement, "ray_running", lambda: False)
    monkeypatch.setattr(cluster, "address", lambda: None)
    assert placement.choose("auto", None, "1 MiB").describe() == "in this process (no cluster, 1 MiB: Ray not started)"
    assert placement.choose("auto", "2 GiB, more than 256 MiB").mode == "ray"  # the job's own reason
    assert placement.choose("ray", None).describe() == "on Ray (--executor ray)"
    assert placement.choose("local", "2 GiB").mode == "local"  # asked for: whatever the size
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # a `ray job submit` job stays on its cluster
    assert placement.choose("auto", None).describe() == "on Ray (a cluster was asked for (RAY_ADDRESS))"
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(cluster, "address", lambda: "10.0.0.1:6379")
    assert placement.choose("auto", None).why == "a cluster was asked for (--address)"
    monkeypatch.setattr(cluster, "address", lambda: None)
    monkeypatch.setattr(placement, "ray_running", lambda: True)  # a caller's ray.init keeps its Ray
    assert placement.choose("auto", None).why == "Ray already running in this process"
    monkeypatch.setattr(cluster, "started_here", lambda: True)  # not the one-node Ray this job brought up
    assert placement.choose("auto", None).describe() == "in this process (no cluster: beside the one-node Ray this " \
                                                        "job started)"
    with pytest.raises(UserError, match="--executor must be one of auto, ray, local, not 'gpu'"):
        placement.choose("gpu", None)


# ---------------------------------------------------------------------------------------------- units


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
def test_a_stage_s_user_error_is_the_job_s_one_line(ray_local, tmp_path, where):
    with pytest.raises(UserError, match="^bad is not a table$"):
        list(units.run([0, 1], _stages(["good", "bad"], str(tmp_path)), where))


# ---------------------------------------------------------------------------------------------- job


def test_a_job_refuses_to_replace_work_by_mistake(tmp_path):
    out = tmp_path / "out"
    ours = re.compile(r"^\d+\.txt$")
    job = Job("test", str(out), "a complete test", ours)
    job.start()
    job.earlier({}, {"v": 1})
    job.progress.record("u0", {"lo": 0}, {"rows": 1})
    (out / "0.txt").write_text("x")
    plain = Job("test", str(out), "a complete test", ours)
    plain.start()
    with pytest.raises(UserError, match=r"out holds an unfinished run of test \(2 files\); pass --resume to "
                                        r"continue it or --overwrite to start again$"):
        plain.earlier({"u0": {"lo": 0}}, {"v": 1})
    with pytest.raises(UserError, match=r"out holds an unfinished run of test \(2 files\), started with other "
                                        r"settings \(v 1 -> 2\); pass --resume"):
        plain.earlier({"u0": {"lo": 0}}, {"v": 2})
    resumed = Job("test", str(out), "a complete test", ours, resume=True)
    resumed.start()
    assert resumed.earlier({"u0": {"lo": 0}, "u1": {"lo": 1}}, {"v": 1}) == {"u0": {"rows": 1}}
    assert resumed.earlier({"u0": {"lo": 5}}, {"v": 1}) == {}  # its input changed: made again
    with pytest.raises(UserError, match=r"started with other settings: v 1 -> 2; pass --resume with its settings"):
        resumed.earlier({"u0": {"lo": 0}}, {"v": 2})
    with pytest.raises(UserError, match=r"started with other settings: 1 of its units are not in this run's plan "
                                        r"\(e\.g\. u0\); pass"):  # other --datasets: its work is never orphaned
        resumed.earlier({"u9": {"lo": 0}}, {"v": 1})
    assert (out / "0.txt").exists() and (out / storage.PROGRESS / "u0.json").exists()  # refusals change nothing
    again = Job("test", str(out), "a complete test", ours, overwrite=True)
    again.start()  # the unfinished run's files are gone
    assert not (out / "0.txt").exists() and not (out / storage.PROGRESS).exists()
    again.earlier({}, {"v": 1})
    (out / "1.txt").write_text("x")
    (out / "7.txt").write_text("stale")
    with pytest.raises(UserError, match=r"^3 of 10 rows could not be made \(x: 3\), more than --max-error-rate 0.1; "
                                        r"see .*out/_errors$"):
        again.check_errors(3, 7, 0.1, "made", "x: 3")
    again.check_errors(1, 9, 0.1, "made")
    assert again.finish({"format": "test"}, {"1.txt"}) == {"format": "test"}
    assert sorted(p.name for p in out.iterdir()) == ["1.txt", storage.MANIFEST]  # the stale file removed
    with pytest.raises(UserError, match="already holds a complete test"):
        Job("test", str(out), "a complete test", ours).start()


def lossy(batch: dict) -> dict:
    """A last stage that loses unit 1 and hands unit 2 back twice."""
    units_out = [u for u in batch["unit"] if u != 1] + [u for u in batch["unit"] if u == 2]
    return {"unit": np.array(units_out, dtype=np.int64),
            "result": np.array([json.dumps({"rows": 1}) for _ in units_out], dtype=object)}


def test_a_unit_that_never_comes_back_is_an_error_and_one_that_comes_twice_counts_once(tmp_path):
    job = Job("test", str(tmp_path / "out"), "a complete test", re.compile("^$"), log=lambda _: None)
    assert job.run([0, 2], [units.Stage(lossy)], "local") == [{"rows": 1}, {"rows": 1}]
    with pytest.raises(RuntimeError, match=r"^1 of 3 units did not come back \(e\.g\. unit 1\)"):
        job.run([0, 1, 2], [units.Stage(lossy)], "local")
