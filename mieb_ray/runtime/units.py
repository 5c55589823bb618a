"""A job's units through its stages: on Ray Data, or inline in this process, the same stage code either way.

A unit is what one worker reads and commits whole (rows [lo, hi) of a file, of a source split): the job plans
a list of them, and each goes through the job's stages as one block, from its number in (`{"unit": [i]}`) to
its number and committed result out (`{"unit": [i], "result": [json]}`, what the unit's progress record
holds). A stage is a function `fn(batch, **kwargs) -> batch` (a Ray task per unit) or a class built once with
`kwargs` and called per batch (a Ray Data actor pool: a model, the build's class tables).

On Ray, the stages are one Ray Data pipeline, with this job's DataContext settings applied and restored after
it: blocks never sliced (a unit reaches its last stage whole), a worker's exception raised as itself, our own
progress lines instead of Ray Data's bars, and a unit that raised TransientStorageError run again (UNIT_RETRIES,
runtime/tasks.py). Inline, one unit at a time, with the same retries; with several stages a thread runs the
first stage (the read) of the next unit while the others run this one, and class stages are built after the
first read is under way (a model loads while the first unit decodes).
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from mieb_ray.errors import UserError, surfaced
from mieb_ray.runtime import cluster
from mieb_ray.runtime.cluster import RunContext
from mieb_ray.runtime.pools import Pool
from mieb_ray.runtime.tasks import UNIT_RETRIES, retrying


@dataclass(frozen=True)
class Stage:
    fn: object  # a function (batch, **kwargs) -> batch, or a class built with **kwargs whose instances take a batch
    kwargs: dict = field(default_factory=dict)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: int | None = None  # bytes: Ray's scheduling hint (and it keeps the stage from being fused)
    pool: Pool | None = None  # a class stage on Ray: its actor pool
    # rows per call on Ray after the first stage. None: one block, i.e. one unit. Ray Data wants a number for a GPU
    # stage: give the job's largest unit. Ray Data then hands a task whole blocks (units) until it has that many
    # rows, the calls may cross units, and the task's output is still one block of whole units.
    batch_rows: int | None = None
    concurrency: int | None = None  # a function stage on Ray: at most this many tasks at once (None: Ray Data's)

    @classmethod
    def commit(cls, fn, kwargs: dict, pool: Pool, units: int) -> Stage:
        """A job's last stage after its actor pool (its output written, its progress recorded): on Ray it takes no
        CPU and at most 2 tasks per actor at once (no more than the job's `units`: Ray Data warns of a cap above
        them). Ray Data gives a stage whose tasks take CPUs and have no cap every CPU its budget leaves over, so the
        commit tasks held CPUs the reads needed: on 3 CPUs (an encoder's and 2) the embed job ran 1 read task at a
        time (tests/unit/runtime/test_units.py; bench/embed_feed.py)."""
        return cls(fn, kwargs, num_cpus=0, concurrency=max(1, min(2 * pool.max_size, units)))

    def build(self):
        """Inline: the callable that takes a batch."""
        return self.fn(**self.kwargs) if isinstance(self.fn, type) else functools.partial(self.fn, **self.kwargs)


@contextmanager
def data_context(ctx: RunContext | None = None):
    """Ray Data settings for this job (ctx: its --verbose), restored after it."""
    import ray

    ctx = ctx or RunContext()
    data = ray.data.DataContext.get_current()
    # Ray Data's logger is set up when ray.data is first imported, at INFO: our own progress lines instead
    logger = logging.getLogger("ray.data")
    level = logger.level
    logger.setLevel(ctx.ray_log_level())
    quiet = [] if ctx.verbose else list(logger.handlers)
    for handler in quiet:
        handler.addFilter(_not_a_user_error)
    ours = {"target_max_block_size": None,  # never sliced: a unit reaches its last stage whole
            "raise_original_map_exception": True,  # a worker's UserError reaches the driver as itself
            "enable_progress_bars": False,  # our own progress lines
            # Ray Data matches "Class: message" of the stage's exception
            "retried_map_errors": ["TransientStorageError"], "max_map_retries": UNIT_RETRIES}
    saved = {k: getattr(data, k) for k in ours}
    for k, v in ours.items():
        setattr(data, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(data, k, v)
        logger.setLevel(level)
        for handler in quiet:
            handler.removeFilter(_not_a_user_error)


def _not_a_user_error(record: logging.LogRecord) -> bool:
    """Ray Data's records of a stage's UserError (an operator's exception, then, as the job has the original raised,
    a trace "in Ray Data or Ray Core internal code" asking for a bug report) are dropped: the job says it in one
    line. Its own errors pass."""
    exc = record.exc_info[1] if record.exc_info else sys.exc_info()[1]  # logged inside its except block
    return not isinstance(exc, UserError)  # a worker's: RayTaskError(UserError), an instance of both


def run(todo: list[int], stages: list[Stage], mode: str, on_rows=None,
        ctx: RunContext | None = None) -> Iterator[tuple[int, dict]]:
    """(unit number, result) of units `todo` (numbers the stages look up), as they come, on Ray or inline.
    on_rows: inline, given to each class stage that has an `on_rows` attribute (rows done within a unit).
    ctx: the command's Ray (None: RunContext())."""
    if not todo:
        return iter(())
    return _on_ray(todo, stages, ctx) if mode == "ray" else _inline(todo, stages, on_rows)


def _on_ray(todo: list[int], stages: list[Stage], ctx: RunContext | None = None) -> Iterator[dict]:
    import ray
    from ray.data.block import BlockAccessor

    cluster.ray_up(ctx)
    with data_context(ctx), surfaced():
        ds = ray.data.from_items([{"unit": i} for i in todo], override_num_blocks=len(todo))
        for n, stage in enumerate(stages):
            options = dict(num_cpus=stage.num_cpus, batch_format="numpy", batch_size=1 if n == 0 else stage.batch_rows)
            if stage.num_gpus:
                options["num_gpus"] = stage.num_gpus
            if stage.memory:
                options["memory"] = stage.memory
            if stage.concurrency:
                options["concurrency"] = stage.concurrency
            if isinstance(stage.fn, type):
                ds = ds.map_batches(_raising_at_first_call(stage.fn), fn_constructor_kwargs=stage.kwargs,
                                    compute=stage.pool.strategy(), **options)
            else:
                ds = ds.map_batches(stage.fn, fn_kwargs=stage.kwargs, **options)
        # the results read here, block by block: iter_rows' prefetching threads would outlive an interrupted job
        # and touch Ray after the command shut it down, which ends the process (exit 1, its message unsaid)
        bundles = ds.iter_internal_ref_bundles()
        try:
            for bundle in bundles:
                for ref in bundle.block_refs:
                    table = BlockAccessor.for_block(ray.get(ref)).to_arrow()
                    for unit, result in zip(table["unit"].to_pylist(), table["result"].to_pylist()):
                        yield int(unit), json.loads(result)
        finally:  # the job ends (done, an error, an interrupt): Ray Data's executor stops now, while Ray is up
            del bundles


def _raising_at_first_call(cls: type) -> type:
    """`cls` for a Ray Data actor pool, with a UserError of its constructor (a model that cannot load, a GPU torch
    cannot see) raised at its first call instead: an actor's constructor error reaches the driver only as text in
    ActorDiedError (and Ray Data starts the actor again), a call's as the exception itself (errors.surfaced)."""

    class Built(cls):
        def __init__(self, **kwargs):
            try:
                super().__init__(**kwargs)
                self.__failed = None
            except UserError as exc:
                self.__failed = exc

        def __call__(self, batch):
            if self.__failed is not None:
                raise self.__failed
            return super().__call__(batch)

    Built.__name__ = Built.__qualname__ = cls.__name__  # Ray names the pool's actors after it
    return Built


def _inline(todo: list[int], stages: list[Stage], on_rows) -> Iterator[dict]:
    def build(stage: Stage):
        made = stage.build()
        if on_rows is not None and hasattr(made, "on_rows"):
            made.on_rows = on_rows
        return made

    if len(stages) == 1:  # nothing to overlap
        one = build(stages[0])
        for i in todo:
            yield from _results(retrying(one, _batch(i)))
        return
    read = build(stages[0])
    with ThreadPoolExecutor(1, thread_name_prefix="mieb-read") as reader:
        ahead = reader.submit(retrying, read, _batch(todo[0]))
        rest = [build(stage) for stage in stages[1:]]  # a model loads while the first unit is read
        for i in todo[1:] + [None]:
            batch = ahead.result()
            if i is not None:
                ahead = reader.submit(retrying, read, _batch(i))
            for stage in rest:
                batch = retrying(stage, batch)
            yield from _results(batch)


def _batch(i: int) -> dict:
    return {"unit": np.array([i])}


def _results(batch: dict) -> Iterator[tuple[int, dict]]:
    return ((int(u), json.loads(r)) for u, r in zip(batch["unit"], batch["result"]))
