"""Where the engine's and the evals' tasks run: as Ray tasks, or inline in the driver, Ray never started.

A task is declared once, `@executor.remote(num_cpus=1)` (or `num_returns=N`), and called as a Ray remote
function: `task.remote(*args)`, `task.options(num_returns=N).remote(...)`, with `put` and `get` for
`ray.put` and `ray.get`. Under `using("ray")` (the default) these are Ray's own: the Ray remote function is
made from the plain function on first use. Under `using("local")` a call returns a LocalRef at once and the
function runs inline in this process when a result is first fetched (as Ray's, its errors surface at `get`),
its ref arguments resolved as Ray resolves top-level ones; with num_returns=N the call gives N refs to the
items of the one list it returns. Nothing here imports Ray unless Ray is the executor.

`choose()` picks the executor for an eval: Ray when asked for, when a cluster was asked for (--address,
RAY_ADDRESS: a `ray job submit` job stays on its cluster), when this process already runs Ray (a caller that
started Ray keeps its Ray; not the one-node Ray the same job brought up for an earlier stage), or when the
embeddings are bigger than one partition of the engine; otherwise local, and Ray's start-up (seconds) is skipped
for a corpus scored in well under a second.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

EXECUTORS = ("auto", "ray", "local")

_mode = "ray"  # what remote/put/get do now


class LocalRef:
    """A task's result in this process: computed on first get, then kept."""

    __slots__ = ("_thunk", "_value", "_done")

    def __init__(self, thunk=None, value=None, done: bool = False):
        self._thunk, self._value, self._done = thunk, value, done

    def value(self):
        if not self._done:  # a task that raised keeps its thunk: fetched again, it raises again (as Ray's)
            self._value, self._done, self._thunk = self._thunk(), True, None
        return self._value


class Task:
    """A function that runs as a Ray task or inline; `fn` is the plain function."""

    def __init__(self, fn, options: dict):
        self.fn, self._options, self._remote = fn, options, None
        self.__name__, self.__doc__, self.__module__ = fn.__name__, fn.__doc__, fn.__module__

    def options(self, **options) -> Task:
        task = Task(self.fn, {**self._options, **options})
        task._base = self
        return task

    def remote(self, *args, **kwargs):
        if _mode == "ray":
            return self._ray_function().remote(*args, **kwargs)
        call = LocalRef(lambda: _run_inline(self.fn, args, kwargs))
        n = self._options.get("num_returns", 1)
        if n == 1:
            return call
        return [LocalRef(lambda i=i: _item(call.value(), i, n)) for i in range(n)]

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def _ray_function(self):
        base = getattr(self, "_base", self)
        if base._remote is None:
            import ray

            base._remote = ray.remote(**base._options)(base.fn)
        return base._remote if base is self else base._remote.options(**self._options)


def remote(**options):
    """@executor.remote(num_cpus=..., num_returns=...): as @ray.remote, for either executor."""
    return lambda fn: Task(fn, options)


def _run_inline(fn, args, kwargs):
    args = [a.value() if isinstance(a, LocalRef) else a for a in args]
    kwargs = {k: v.value() if isinstance(v, LocalRef) else v for k, v in kwargs.items()}
    return fn(*args, **kwargs)


def _item(values, i: int, n: int):
    if len(values) != n:  # as Ray: a task declared with num_returns=n returns n values
        raise ValueError(f"task returned {len(values)} values, expected {n}")
    return values[i]


def put(value):
    if _mode == "ray":
        import ray

        return ray.put(value)
    return LocalRef(value=value, done=True)


def get(refs):
    """ray.get of a ref or a list of refs."""
    if _mode == "ray":
        import ray

        return ray.get(refs)
    if isinstance(refs, list):
        return [r.value() for r in refs]
    return refs.value()


def is_ref(x) -> bool:
    if isinstance(x, LocalRef):
        return True
    ray = sys.modules.get("ray")
    return ray is not None and isinstance(x, ray.ObjectRef)


def is_task_error(exc: BaseException) -> bool:
    """A task's exception as Ray re-raises it in the driver (its `cause` the task's own); inline, a task's
    exception is raised as itself."""
    ray = sys.modules.get("ray")
    return ray is not None and isinstance(exc, ray.exceptions.RayTaskError)


def mode() -> str:
    return _mode


@contextmanager
def using(which: str):
    """remote/put/get go to `which` ("ray" or "local") inside the block."""
    global _mode
    if which not in ("ray", "local"):
        raise ValueError(f"executor must be ray or local, not {which!r}")
    before, _mode = _mode, which
    try:
        yield
    finally:
        _mode = before


def ray_running() -> bool:
    """This process is connected to Ray (without importing Ray to find out)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def keep_ray(address: str | None) -> str | None:
    """Why a job runs on Ray whatever its size (None: nothing holds it there): a cluster was asked for
    (`address`, RAY_ADDRESS: a `ray job submit` job stays on its cluster), or this process runs a caller's Ray
    or a cluster's. The one-node Ray the same job brought up for an earlier stage (connect.started_here) does
    not hold it."""
    if address or os.environ.get("RAY_ADDRESS"):
        return f"a cluster was asked for ({'--address' if address else 'RAY_ADDRESS'})"
    from mieb_ray import connect

    if ray_running() and not connect.started_here():
        return "Ray already running in this process"
    return None


def choose(requested: str, corpus_bytes: int, limit: int, address: str | None) -> tuple[str, str]:
    """("ray" | "local", why) for an eval asked to run on `requested` ("auto", "ray", "local") over embeddings
    of corpus_bytes, `limit` the most bytes scored in-process and `address` the cluster asked for."""
    if requested not in EXECUTORS:
        from mieb_ray.errors import UserError

        raise UserError(f"--executor must be one of {', '.join(EXECUTORS)}, not {requested!r}")
    size, most = f"{corpus_bytes / 2 ** 20:.1f} MiB of embeddings", f"{limit / 2 ** 20:.0f} MiB"
    if requested != "auto":
        return requested, f"--executor {requested}, {size}"
    if why := keep_ray(address):
        return "ray", f"{why}, {size}"
    if corpus_bytes > limit:
        return "ray", f"{size}, more than {most}"
    return "local", f"{size}, at most {most}: scored in this process" + ("" if ray_running() else ", Ray not started")
