"""Tasks (mieb_ray/runtime/tasks.py): declared once, run inline as Ray runs them; a task's torch threads set on Ray
only; the one retry policy (a TransientStorageError runs again, on Ray and inline); a worker's UserError as the job's
one line."""

from __future__ import annotations

import sys

import pytest
import ray.cloudpickle

from mieb_ray.errors import TransientStorageError, UserError
from mieb_ray.runtime import cluster, tasks
from mieb_ray.runtime.cluster import RunContext

pytestmark = pytest.mark.timeout(300)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers cannot import a test module


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


@tasks.remote(num_cpus=0.5)
def _after(seconds: float, value):
    import time

    time.sleep(seconds)
    return value


@pytest.mark.parametrize("where", ["ray", "local"])
def test_each_gives_every_task_s_value_with_its_place_as_it_ends(ray_local, where):
    """On Ray in the order the tasks end (a slow first one last), in this process in order; a UserError itself."""
    with tasks.using(where):
        got = list(tasks.each([_after.remote(3, "slow"), _after.remote(0, "quick"), _after.remote(0.5, "next")]))
        assert sorted(got) == [(0, "slow"), (1, "quick"), (2, "next")]
        assert got[-1 if where == "ray" else 0] == (0, "slow")
        with pytest.raises(UserError, match="^bad input$"):
            list(tasks.each([_after.remote(0, 1), _fails.remote("bad input")]))


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


def test_ray_comes_up_as_the_command_said(monkeypatch):
    """The lazy ray_up of remote/put joins the cluster of the command's RunContext (using(mode, ctx)); an inner
    using(mode) keeps it."""
    seen = []

    def ray_up(ctx=None):
        seen.append(ctx)
        raise RuntimeError("no Ray here")

    monkeypatch.setattr(cluster, "ray_up", ray_up)
    ctx = RunContext(address="10.0.0.1:6379")
    with tasks.using("ray", ctx), tasks.using("ray"), pytest.raises(RuntimeError, match="no Ray here"):
        tasks.put(1)
    with tasks.using("ray"), pytest.raises(RuntimeError, match="no Ray here"):
        _two.remote(1, 2)  # no context given: ray_up's default, RunContext()
    assert seen == [ctx, None]
