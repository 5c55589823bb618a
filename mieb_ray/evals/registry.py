"""Every eval task by its mteb name, and the suite that scores it (evals/protocol.py's EvalSuite): the hand-built
suites' tasks, and every other MIEB task through mteb's own code (the `mteb` suite, last). A MIEB task mteb defines
needs nothing here; a hand-built path is a suite module and an entry in SUITES (docs/architecture.md: which path).

`select` turns `--tasks` (task names, MIEB's benchmark names) into the chosen tasks grouped by suite, which the eval
job (evals/job.py) scores; the outputs of one suite go to OUT, of several each to OUT/<suite>/ (a Suite's name).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field

from mieb_ray.errors import UserError
from mieb_ray.evals import benchmarks, biovita_data, clustering, probe_tasks, protocol, retrieval
from mieb_ray.evals.biovita import BioVITASuite
from mieb_ray.evals.linear_probe import LinearProbeSuite
from mieb_ray.evals.mteb_suite import MtebSuite
from mieb_ray.evals.zeroshot import ZeroShotSuite
from mieb_ray.evals.zeroshot_tasks import TASKS, select_tasks

ALL = "all"


@dataclass(frozen=True)
class Setting:
    """A setting of a suite's own that the command line takes: its flag, the flags.py check of its value (by
    name), its default and help. The CLI adds it to a command whose suites have it."""

    flag: str
    check: str
    default: object
    help: str

    @property
    def name(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Options:
    """What every suite is made with: where the data is, an audit to score clean against, and the suites' own
    settings by name (Setting.name; a setting not given takes its default)."""

    sources: str  # "hf" or a mirror root
    exclude: str | None = None  # an audit output: each task also scored without what it flagged (mieb_ray.clean)
    settings: dict = field(default_factory=dict)

    def get(self, setting: Setting):
        return self.settings.get(setting.name, setting.default)


@dataclass(frozen=True)
class Suite:
    name: str  # its folder when several suites run
    tasks: tuple[str, ...]  # the mteb task names it scores
    make: Callable[[list[str], Options], protocol.EvalSuite]
    sources: tuple[str | None, ...] = ()  # per task: the catalog source whose eval split it scores, if any
    settings: tuple[Setting, ...] = ()  # its own command-line settings


def _suite(name: str, tasks, make) -> Suite:
    """A suite of SourceTasks (evals/source_task.py): each task scores its catalog source's eval split."""
    return Suite(name, tuple(t.name for t in tasks), make, tuple(t.slug for t in tasks))


QUERY_BLOCK = Setting("--query-block", "count", 256, "BioVITA queries per scoring task (default: 256)")
PARTITIONS = Setting("--partitions", "count", None, "BioVITA's taxon-aligned corpus partitions, each scored by its "
                                                    "own tasks (default: one per 256 MB of image embeddings)")

SUITES = (
    Suite("biovita", (biovita_data.TASK,),
          lambda names, o: BioVITASuite(o.sources, query_block=o.get(QUERY_BLOCK), partitions=o.get(PARTITIONS),
                                        exclude=o.exclude),
          settings=(QUERY_BLOCK, PARTITIONS)),
    _suite("zeroshot", TASKS,
           lambda names, o: ZeroShotSuite(select_tasks(names), o.sources, exclude=o.exclude)),
    _suite("linear_probe", probe_tasks.TASKS,
           lambda names, o: LinearProbeSuite(probe_tasks.select_tasks(names), o.sources, exclude=o.exclude)),
    _suite("clustering", clustering.TASKS,
           lambda names, o: clustering.ClusteringSuite(clustering.select_tasks(names), o.sources, exclude=o.exclude)),
    _suite("retrieval", retrieval.TASKS,
           lambda names, o: retrieval.RetrievalSuite(retrieval.select_tasks(names), o.sources, exclude=o.exclude)),
)
# the rest of MIEB: scored by mteb's own loaders and evaluators (evals/mteb_suite.py)
_HAND_BUILT = {task for suite in SUITES for task in suite.tasks}
SUITES += (Suite("mteb", tuple(t for t in benchmarks.TASKS if t not in _HAND_BUILT),
                 lambda names, o: MtebSuite(names, o.sources, exclude=o.exclude)),)
BY_NAME = {suite.name: suite for suite in SUITES}


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
    """(suite, its chosen task names) for `tasks`: comma-separated mteb task or benchmark names (or an ALIASES name,
    logged as the task it is), or "all" / None for every task of the suites `within`; an unknown name is one line
    with the closest valid name, if one is close, and all of them."""
    valid = [name for suite in within for name in suite.tasks]
    # "MIEB(lite)": its tasks; a benchmark only where every task of it is here (eval-zeroshot takes none)
    benches = {b: names for b, names in benchmarks.BENCHMARKS.items() if set(names) <= set(valid)}
    given = valid if tasks in (None, ALL) else [t.strip() for t in tasks.split(",") if t.strip()]
    given = list(dict.fromkeys(n for t in given for n in benches.get(t, (t,))))
    # an alias of a task outside `within` (eval-zeroshot) stays unknown, under the name the user gave
    wanted = [ALIASES[t] if ALIASES.get(t) in valid else t for t in given]
    for name, task in zip(given, wanted):
        if name != task:
            log(f"[eval] {name} is mteb's {task} (the name on its dataset card)")
    unknown = [t for t in wanted if t not in valid]
    if unknown or not wanted:
        names = [ALL, *benches, *valid]
        raise UserError(f"unknown eval task {unknown[0]!r}{_did_you_mean(unknown[0], names)}; valid: "
                        f"{', '.join(names)}" if unknown else f"no eval task given; valid: {', '.join(names)}")
    return [(suite, [t for t in suite.tasks if t in wanted]) for suite in within if set(suite.tasks) & set(wanted)]


def _did_you_mean(name: str, names: list[str]) -> str:
    """The valid name closest to a misspelt one, case aside ("mieb(Lite)", "CIFAR10Zeroshot"), if one is close."""
    lowered = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), lowered, n=1, cutoff=0.8)
    return f" (did you mean {lowered[close[0]]}?)" if close else ""
