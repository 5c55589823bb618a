"""Every eval task by its mteb name, and the suite that scores it (evals/protocol.py's EvalSuite). A new task
type is a suite module and an entry in SUITES, and more places besides (docs/architecture.md lists them).

`evaluate_tasks` is `mieb-ray eval`: the chosen tasks grouped by suite, each suite embedded first when a model
is given (complete embeddings of the same identity are reused: runtime/identity.py) and scored. The outputs of
one suite go to OUT; of several, each to OUT/<suite>/ (a Suite's name), with OUT/_manifest.json listing them last.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from mieb_ray import __version__, formats, storage
from mieb_ray.errors import UserError
from mieb_ray.evals import biovita_data, clustering, probe_tasks, protocol, results_repo, retrieval, run_report
from mieb_ray.evals.biovita import BioVITASuite
from mieb_ray.evals.linear_probe import LinearProbeSuite
from mieb_ray.evals.zeroshot import ZeroShotSuite
from mieb_ray.evals.zeroshot_tasks import TASKS, select_tasks
from mieb_ray.io import embeddings

ALL = "all"


@dataclass(frozen=True)
class Options:
    """Settings of the suites that use them: BioVITA's query blocks and corpus partitions."""

    sources: str  # "hf" or a mirror root
    query_block: int = 256
    partitions: int | None = None
    exclude: str | None = None  # an audit output: each task also scored without what it flagged (mieb_ray.clean)


@dataclass(frozen=True)
class Suite:
    name: str  # its folder when several suites run
    tasks: tuple[str, ...]  # the mteb task names it scores
    make: Callable[[list[str], Options], protocol.EvalSuite]
    sources: tuple[str | None, ...] = ()  # per task: the catalog source whose eval split it scores, if any


def _suite(name: str, tasks, make) -> Suite:
    """A suite of SourceTasks (evals/source_task.py): each task scores its catalog source's eval split."""
    return Suite(name, tuple(t.name for t in tasks), make, tuple(t.slug for t in tasks))


SUITES = (
    Suite("biovita", (biovita_data.TASK,),
          lambda names, o: BioVITASuite(o.sources, query_block=o.query_block, partitions=o.partitions)),
    _suite("zeroshot", TASKS, lambda names, o: ZeroShotSuite(select_tasks(names), o.sources, exclude=o.exclude)),
    _suite("linear_probe", probe_tasks.TASKS,
           lambda names, o: LinearProbeSuite(probe_tasks.select_tasks(names), o.sources, exclude=o.exclude)),
    _suite("clustering", clustering.TASKS,
           lambda names, o: clustering.ClusteringSuite(clustering.select_tasks(names), o.sources, exclude=o.exclude)),
    _suite("retrieval", retrieval.TASKS,
           lambda names, o: retrieval.RetrievalSuite(retrieval.select_tasks(names), o.sources, exclude=o.exclude)),
)


def tasks_by_source() -> dict[str, list[str]]:
    """Catalog source slug -> every registered task that scores its eval split, in registry order (what an
    audit against MIEB names as the tasks an eval image belongs to)."""
    found: dict[str, list[str]] = {}
    for suite in SUITES:
        for task, slug in zip(suite.tasks, suite.sources):
            if slug:
                found.setdefault(slug, []).append(task)
    return found

# Other names of mteb tasks, accepted so that a name copied from a dataset's card works: BioVITA's card says
# mteb.get_task("BioVITAT2IRetrieval"), a name mteb 2.26.24 refuses (its task is BioVITAT2IReranking).
ALIASES = {"BioVITAT2IRetrieval": biovita_data.TASK}


def select(tasks: str | None, within: tuple[Suite, ...] = SUITES, log=print) -> list[tuple[Suite, list[str]]]:
    """(suite, its chosen task names) for `tasks`: comma-separated mteb names (or an ALIASES name, logged as
    the task it is), or "all" / None for every task of the suites `within`; an unknown name is one line listing
    the valid ones."""
    valid = [name for suite in within for name in suite.tasks]
    given = valid if tasks in (None, ALL) else [t.strip() for t in tasks.split(",") if t.strip()]
    # an alias of a task outside `within` (eval-zeroshot) stays unknown, under the name the user gave
    wanted = [ALIASES[t] if ALIASES.get(t) in valid else t for t in given]
    for name, task in zip(given, wanted):
        if name != task:
            log(f"[eval] {name} is mteb's {task} (the name on its dataset card)")
    unknown = [t for t in wanted if t not in valid]
    if unknown or not wanted:
        raise UserError(f"unknown eval task {unknown[0]!r}; valid: {ALL}, {', '.join(valid)}" if unknown
                        else f"no eval task given; valid: {ALL}, {', '.join(valid)}")
    return [(suite, [t for t in suite.tasks if t in wanted]) for suite in within if set(suite.tasks) & set(wanted)]


def evaluate_tasks(selected: list[tuple[Suite, list[str]]], options: Options, out: str, model: str | None = None,
                   revision: str | None = None, images: str | None = None, texts: str | None = None,
                   allow_mixed_models: bool = False, executor: str = "auto", results_dir: str | None = None,
                   trained_on_mieb_train: bool = False, log=print, **pools) -> dict[str, dict]:
    """Score the chosen tasks from `images` and `texts` (embed outputs; texts only where a task needs them), or
    embed what they need with `model` first; {task name: its TaskResult}. pools: the embed job's workers,
    gpus_per_worker, cpus_per_worker. results_dir: also every TaskResult in the layout of mteb's results
    repository (evals/results_repo.py)."""
    scorers = [(suite, names, suite.make(names, options)) for suite, names in selected]
    if bool(model) == bool(images or texts):
        raise UserError("give either --model, or --image-embeddings (and --text-embeddings where a task needs them)")
    needing = [n for _, names, scorer in scorers if scorer.needs_texts for n in names]
    if not model and not images:
        raise UserError("--image-embeddings is needed" + (f" (and --text-embeddings: {needing[0]} needs both)"
                                                          if needing else ""))
    if not model and needing and not texts:
        raise UserError(f"{needing[0]} needs --text-embeddings too")
    storage.check_output(out)
    t0, results, folders, scored_from = time.time(), {}, {}, None
    for suite, names, scorer in scorers:
        where = storage.join(out, suite.name) if len(selected) > 1 else out
        inputs = (protocol.embed(scorer, where, model, revision, log, executor=executor, **pools) if model
                  else (images, texts if scorer.needs_texts else None))
        results |= protocol.run(scorer, where, *inputs, log=log, allow_mixed_models=allow_mixed_models,
                                executor_name=executor)
        scored_from = scored_from or inputs[0]
        folders[suite.name] = suite.name
    if len(selected) > 1:  # the run's page, then its manifest, last
        model = embeddings.model_of(scored_from)
        sections = [(suite.name, f"{suite.name}/report.html", {n: results[n] for n in names})
                    for suite, names in selected]
        storage.write_bytes(storage.join(out, "report.html"), run_report.render(sections, model).encode())
        storage.write_manifest(out, {**formats.EVAL.stamp(), "version": __version__,
                                     "tasks": list(results), "suites": folders, "files": ["report.html"],
                                     "seconds": round(time.time() - t0, 3)})
    if results_dir:
        results_repo.write(results_dir, scored_from, results, trained_on_mieb_train, log)
    log(f"[eval] {len(results)} tasks in {time.time() - t0:.1f}s -> {storage.display(out)}")
    return results
