"""An eval run's TaskResults summarised as mteb summarises a benchmark for its leaderboard (summary.json, the run
page's numbers): per task its main score, per task type the mean, per MIEB benchmark the run covers its
`Benchmark.get_score` (Mean(TaskType), each type's mean, MIEB(Multilingual)'s task-mean groups, and Mean(Task)).

Every number is mteb's own computation on mteb's TaskResult objects: a task's score is `TaskResult.get_score()`
after `validate_and_filter_scores` against the task (the mean over its eval splits and subsets, None where one
is missing, as the leaderboard leaves it blank); a mean is None where any of its tasks has none. mteb scores a
model only on a whole benchmark, so a benchmark the run covers in part is scored as mteb's `get_score` scores the
same benchmark restricted to the tasks run, which is what its leaderboard's summary table shows of these results
alone (beside other models' full results it leaves them blank); `missing` names the rest.

A clean score (`--exclude`: result["mieb_ray"]["clean"]) is a task's score without the images the audit flagged,
from its clean scores per split and subset where the suite keeps them (the mteb suite), else its one clean score;
a task too small to score clean has an `error` instead. The clean means count a task without a clean score at its
main score, so clean - mteb is the audit's effect on the mean.
mteb is imported inside the functions: the CLI does not import it at start-up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import random
import warnings
from unittest import mock

import numpy as np

from mieb_ray.evals import benchmarks

MEAN_TASK = "Mean(Task)"  # mteb's get_score keys
MEAN_TYPE = "Mean(TaskType)"


def clean_of(result: dict) -> dict | None:
    """A TaskResult's clean scores (with --exclude), or None."""
    return result.get("mieb_ray", {}).get("clean")


def summarize(results: dict[str, dict]) -> dict:
    """{tasks: {task: type, main_score, clean_score, left_out, clean_error}, types: {type: tasks, main_score,
    clean_score}, benchmarks: {name: tasks, run, missing, scores, clean_scores}} of the run's TaskResults ({task:
    its JSON})."""
    theirs = {name: mteb_task(name) for name in results}
    main = {name: _task_result(result) for name, result in results.items()}
    clean = {name: _clean_result(main[name], clean_of(r)) for name, r in results.items()
             if "main_score" in (clean_of(r) or {})}
    tasks = {name: {"type": theirs[name].metadata.type,
                    "main_score": _task_score(main[name], theirs[name]),
                    "clean_score": _task_score(clean[name], theirs[name]) if name in clean else None,
                    "left_out": (clean_of(results[name]) or {}).get("left_out", {}).get("eval", {}).get("any"),
                    "clean_error": (clean_of(results[name]) or {}).get("error")}
             for name in results}
    types = {}
    for name, task in tasks.items():
        types.setdefault(task["type"], []).append(name)
    return {"tasks": tasks,
            "types": {kind: {"tasks": names, "main_score": _mean([main[n] for n in names], theirs),
                             "clean_score": _mean([clean.get(n, main[n]) for n in names], theirs)
                             if clean.keys() & set(names) else None}
                      for kind, names in types.items()},
            "benchmarks": {name: _benchmark(name, main, clean) for name, members in benchmarks.BENCHMARKS.items()
                           if set(members) & set(results)}}


def mteb_task(name: str):
    """mteb's task object, made as `_mteb_objects` makes them."""
    import mteb

    with _mteb_objects():
        return mteb.get_task(name)


@contextlib.contextmanager
def _mteb_objects():
    """mteb's task and benchmark objects made quietly and cheaply, for their metadata and scoring rules alone.
    Quietly: a beta task (BioVITA) warns on every instance, in a log line and a warning, which belong to whoever runs
    it, not to a summary of its scores or a check of a run's inputs. Cheaply: every task mteb makes seeds random,
    numpy and, once torch is imported, torch's CUDA generators, each of which records its caller's stack
    (torch.cuda._lazy_call); mteb's benchmark registry makes about 2,200 tasks, so with torch imported the first
    get_benchmark took 2 to 3 s more here (0.4 s without). The tasks get the generators mteb's `_set_seed` returns,
    without its global seeding, which mteb's evaluators do again when they are made."""
    from mteb.abstasks import abstask

    log = logging.getLogger("mteb")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), mock.patch.object(abstask, "_set_seed", _generators):
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def _generators(seed: int) -> tuple[random.Random, np.random.Generator]:
    """What mteb 2.26.24's `_set_seed` returns, without its seeding of the global generators."""
    return random.Random(seed), np.random.default_rng(seed)


def _task_result(result: dict):
    """mteb's TaskResult of our JSON (mteb ignores the `mieb_ray` key)."""
    from mteb.results import TaskResult

    return TaskResult.from_dict(result)


def _clean_result(result, clean: dict):
    """The task's clean TaskResult: its clean scores per split and subset, or its one clean score in the place of
    every (split, subset) main score."""
    if "scores" in clean:
        return result.model_copy(update={"scores": clean["scores"]})
    return result.model_copy(update={"scores": {split: [{**entry, "main_score": clean["main_score"]}
                                                        for entry in entries]
                                                for split, entries in result.scores.items()}})


def _number(value) -> float | None:
    """A score as JSON has it: a float, or None for mteb's None or NaN."""
    return None if value is None or math.isnan(value) else float(value)


def _task_score(result, task) -> float | None:
    return _number(result.validate_and_filter_scores(task).get_score())


def _mean(results: list, theirs: dict) -> float | None:
    """mteb's Mean(Task) of some TaskResults, each validated against its task."""
    from mteb.benchmarks.benchmark import BenchmarkAggregation

    valid = [r.validate_and_filter_scores(theirs[r.task_name]) for r in results]
    return _number(BenchmarkAggregation.MEAN_TASK.aggregate(valid)[MEAN_TASK])


def _benchmark(name: str, main: dict, clean: dict) -> dict:
    """One MIEB benchmark: its size, the tasks the run has and lacks, and mteb's get_score of the run's results
    (and of its clean results, where the run has any)."""
    import mteb

    with _mteb_objects():
        bench = mteb.get_benchmark(name)
    members = [t.metadata.name for t in bench.tasks]
    run = [n for n in members if n in main]
    return {"tasks": len(members), "run": run, "missing": [n for n in members if n not in main],
            "scores": _scores(bench, [main[n] for n in run]),
            "clean_scores": _scores(bench, [clean.get(n, main[n]) for n in run]) if clean.keys() & set(run) else None}


def _scores(bench, results: list) -> dict[str, float | None]:
    """`Benchmark.get_score` of one model's results on the benchmark restricted to their tasks, with Mean(Task)
    beside MIEB's own aggregations (mteb's ranks, meaningless for one model, left out)."""
    from mteb.benchmarks.benchmark import BenchmarkAggregation
    from mteb.results import BenchmarkResults, ModelResult

    names = {r.task_name for r in results}
    run = dataclasses.replace(bench, tasks=[t for t in bench.tasks if t.metadata.name in names],
                              aggregations=(BenchmarkAggregation.MEAN_TASK, *bench.aggregations))
    model = ModelResult(model_name="run", model_revision="run", task_results=results)  # mteb drops a null revision
    [scores] = run.get_score(BenchmarkResults(model_results=[model]), raise_error=True).values()
    return {key: _number(value) for key, value in scores.items() if key != "Rank"}
