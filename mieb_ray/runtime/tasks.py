"""Tasks that run on Ray or inline in this process, with the one retry policy of the package.

A task is declared once, `@tasks.remote(num_cpus=1)` (or `num_returns=N`), and called as a Ray remote
function: `task.remote(*args)`, `task.options(num_returns=N).remote(...)`, with `put` and `get` for `ray.put` and
`ray.get`; `task.options(node=tasks.node())` (a node an earlier task ran on) runs it there while that node is
alive and can ever run it (a soft node affinity: what the earlier task left on that node's disk is found again).
Under `using("ray")` (the default) these are Ray's own: the Ray remote function is made from the plain
function on first use. Under `using("local")` a call returns a LocalRef at once and the function runs inline
when a result is first fetched (as Ray's, its errors surface at `get`), its ref arguments resolved as Ray
resolves top-level ones; with num_returns=N the call gives N refs to the items of the one list it returns.
Nothing here imports Ray unless Ray is the executor.

Retries: a task or a unit that raised TransientStorageError (the hub or S3 failing for longer than the store's
own retries) runs again, UNIT_RETRIES times at most, the same on Ray (`retry_exceptions`, Ray Data's
`retried_map_errors`: runtime/units.py) and inline (`retrying`). Its outputs are written under deterministic names,
so a rerun rewrites the same files. `get` raises a worker's UserError as itself (errors.surfaced).
"""

from __future__ import annotations

import functools
import sys
from contextlib import contextmanager

from mieb_ray.errors import TransientStorageError, surfaced
from mieb_ray.runtime import cluster
from mieb_ray.runtime.cluster import RunContext

MODES = ("ray", "local")
UNIT_RETRIES = 3  # runs of a task or unit after the first when it raised TransientStorageError

_mode = "ray"  # what remote/put/get do now
_ctx: RunContext | None = None  # the job's Ray, brought up lazily by remote/put under using(mode, ctx)


def retrying(fn, *args, **kwargs):
    """fn(*args, **kwargs), run again on TransientStorageError as Ray runs a task again (UNIT_RETRIES)."""
    for retries_left in range(UNIT_RETRIES, -1, -1):
        try:
            return fn(*args, **kwargs)
        except TransientStorageError:
            if not retries_left:
                raise


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
            cluster.ray_up(_ctx)  # the job's Ray, not the default one a bare .remote() would start
            return self._ray_function().remote(*args, **kwargs)
        call = LocalRef(lambda: retrying(_run_inline, self.fn, args, kwargs))
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

            threads = base._options.get(TORCH_THREADS)
            fn = _with_torch_threads(base.fn, threads) if threads else base.fn
            base._remote = ray.remote(retry_exceptions=[TransientStorageError], max_retries=UNIT_RETRIES,
                                      **_ray_options(base._options))(fn)
        return base._remote if base is self else base._remote.options(**_ray_options(self._options))


def _ray_options(options: dict) -> dict:
    """Ray's options for ours: torch_threads is ours alone, node a soft node affinity (None: anywhere)."""
    options = {k: v for k, v in options.items() if k != TORCH_THREADS}
    if "node" in options:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = options.pop("node")
        if node is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
    return options


TORCH_THREADS = "torch_threads"


def remote(**options):
    """@tasks.remote(num_cpus=..., num_returns=...): as @ray.remote, for either executor. torch_threads=N: as a Ray
    task, torch runs on N threads (one task a CPU: Ray, not torch, spreads the work); inline, the driver keeps its
    threads, as the only worker."""
    return lambda fn: Task(fn, options)


def _with_torch_threads(fn, threads: int):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        import torch

        torch.set_num_threads(threads)
        return fn(*args, **kwargs)

    return run


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

        cluster.ray_up(_ctx)
        return ray.put(value)
    return LocalRef(value=value, done=True)


def get(refs):
    """ray.get of a ref or a list of refs; a UserError raised in a task is raised as itself."""
    with surfaced():
        if _mode == "ray":
            import ray

            return ray.get(refs)
        if isinstance(refs, list):
            return [r.value() for r in refs]
        return refs.value()


def each(refs: list):
    """(i, the value of refs[i]) for every ref, as each is ready: on Ray in the order they finish, in this process
    in order (each runs when fetched). A worker's UserError is raised as itself, as by `get`."""
    with surfaced():
        if _mode != "ray":
            for i, ref in enumerate(refs):
                yield i, ref.value()
            return
        import ray

        place, pending = {ref: i for i, ref in enumerate(refs)}, list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            yield place[ready[0]], ray.get(ready[0])


def node() -> str | None:
    """The Ray node this process runs on (None where this process has no Ray): where its local disk is."""
    ray = sys.modules.get("ray")
    return ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else None


def is_ref(x) -> bool:
    if isinstance(x, LocalRef):
        return True
    ray = sys.modules.get("ray")
    return ray is not None and isinstance(x, ray.ObjectRef)


def mode() -> str:
    return _mode


@contextmanager
def using(which: str, ctx: RunContext | None = None):
    """remote/put/get go to `which` ("ray" or "local") inside the block; on Ray, the first of them brings up
    `ctx`'s Ray (None: the enclosing block's, else RunContext()): a job's tasks join the cluster its command
    named without every call site passing it."""
    global _mode, _ctx
    if which not in MODES:
        raise ValueError(f"executor must be ray or local, not {which!r}")
    before, _mode = (_mode, _ctx), which
    _ctx = ctx or _ctx
    try:
        yield
    finally:
        _mode, _ctx = before
