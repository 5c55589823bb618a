"""What an audit reads and how it is cut, on the driver from metadata: the two sides (Side; train: one table;
against: the tables given, or the MIEB eval splits, built into OUT/eval-data by the build job and reused, with the
BioVITA corpus) and the eval task of each table or row; the hash stage's work items (HashUnit: rows of one file)
and the join partitions (Plan).
"""

from __future__ import annotations

from dataclasses import dataclass

from mieb_ray import __version__, formats, storage
from mieb_ray.audit import matches
from mieb_ray.audit.config import MIEB, AuditConfig
from mieb_ray.errors import UserError
from mieb_ray.evals import biovita_data as biovita
from mieb_ray.evals import mteb_suite, registry
from mieb_ray.io import reader
from mieb_ray.pipelines.build import build_eval_splits
from mieb_ray.pipelines.embed import table_units
from mieb_ray.runtime import placement
from mieb_ray.runtime.cluster import RunContext

BY_SLUG = "<by slug>"  # an against table whose rows' eval task follows from their key's slug (mieb)
BY_ROW = "<by row>"  # an against table whose rows say their eval tasks (its eval_task column: mieb's mteb tasks)
UNIT_ROWS = 10_000  # rows one hash task reads
PARTITION_ROWS = 2_000_000  # hash rows one join task holds (about 100 bytes each)


def eval_tasks() -> dict[str, str]:
    """Source slug -> the MIEB tasks its eval split serves, joined with "/": every registered task that scores that
    split (evals/registry.py), e.g. cifar10 -> CIFAR10ZeroShot/CIFAR10/CIFAR10Clustering."""
    return {slug: "/".join(names) for slug, names in registry.tasks_by_source().items()}


@dataclass(frozen=True)
class Side:
    """The tables of one side: train (one table) or against (eval_task per table, or per key for mieb)."""

    name: str
    uris: tuple[str, ...]
    tasks: tuple[str | None, ...]  # per table: its eval task, BY_SLUG or BY_ROW (mieb), or None (train)
    keys: tuple[str, ...] = ()  # per table: its key column (default "key")

    def columns(self, table: int) -> reader.TableColumns:
        return reader.TableColumns(self.keys[table] if self.keys else "key", "image",
                                   ("eval_task",) if self.tasks[table] == BY_ROW else ())

    def units(self) -> list[HashUnit]:
        """The units of every table, in order: a unit's number is its position in its side."""
        found: list[HashUnit] = []
        for n, uri in enumerate(self.uris):
            fmt, files = reader.input_files(uri)
            reader.check_columns(fmt, files[0], self.columns(n).read_as("image"))
            planned = table_units(files, UNIT_ROWS)
            if not sum(u.hi - u.lo for u in planned):
                raise UserError(f"{storage.display(uri)} holds no rows: nothing to audit "
                                f"{'in' if self.name == 'train' else 'against'}")
            found += [HashUnit(self, n, u, len(found) + i) for i, u in enumerate(planned)]
        return found

    def size(self) -> int:
        """Bytes of its tables' input files."""
        return sum(sum(storage.file_sizes([f.uri for f in reader.input_files(uri)[1]], "input file"))
                   for uri in self.uris)


@dataclass(frozen=True)
class HashUnit:
    """One unit of the hash stage: rows of one table of a side, hashed into one file."""

    side: Side
    table: int  # its table's number in the side
    unit: reader.Unit
    number: int  # its position in the side (the hash rows' `unit`)

    @property
    def name(self) -> str:
        """Its hash file's name (and progress record's) under the hash folder."""
        return f"{self.side.name}/{self.table}/{self.unit.name.removesuffix('.arrow')}"

    @property
    def rows(self) -> int:
        return self.unit.hi - self.unit.lo

    @property
    def columns(self) -> reader.TableColumns:
        return self.side.columns(self.table)

    @property
    def task(self) -> str | None:
        """Its table's eval task: of every row, BY_SLUG (the task its key's slug serves), BY_ROW (the tasks its row
        names), or None (train)."""
        return self.side.tasks[self.table]


@dataclass(frozen=True)
class Plan:
    """Both sides, their units and the join partitions: what the phases after the plan read."""

    train: Side
    against: Side
    units: tuple[HashUnit, ...]  # the train side's, then the against side's
    partitions: int  # of the hash rows, for the join

    def of(self, side: str) -> list[HashUnit]:
        """One side's units, by number."""
        return [u for u in self.units if u.side.name == side]

    @property
    def rows(self) -> int:
        return sum(u.rows for u in self.units)

    def settings(self) -> dict:
        """What a resumed run must share with the one whose hash files it reuses."""
        return {"version": __version__, "hashes": matches.HASH_VERSION, "partitions": self.partitions,
                "unit_rows": UNIT_ROWS, "train": storage.display(self.train.uris[0]),
                "against": [storage.display(u) for u in self.against.uris]}


def cut(train: Side, against: Side) -> Plan:
    """The units of both sides, and as many join partitions as keep each under PARTITION_ROWS hash rows."""
    units = (*train.units(), *against.units())
    return Plan(train, against, units, max(1, -(-sum(u.rows for u in units) // PARTITION_ROWS)))


def train_side(config: AuditConfig) -> Side:
    return Side("train", (config.train,), (None,))


def against_side(config: AuditConfig, log, ctx: RunContext | None = None) -> Side:
    """No tables for --against self; the tables given, each table's eval task the last component of its path; or
    every MIEB eval image: the eval splits of the train table's sources, the BioVITA corpus and the images of the
    tasks mteb scores (evals/mteb_suite.py: read by mteb's loaders, each image once, its tasks beside it)."""
    if config.alone:
        return Side("against", (), ())
    if config.against != (MIEB,):
        return Side("against", config.against, tuple(u.rstrip("/").rsplit("/", 1)[-1] for u in config.against))
    train = storage.read_manifest(config.train) or {}  # a mieb-train output: the eval splits of its sources
    settings = train.get("config") if isinstance(train.get("config"), dict) else {}  # another tool's: all of them
    slugs = settings.get("datasets") if formats.MIEB_TRAIN.holds(train) else None
    uris, task_of, keys = [build_eval_splits(config.sources, config.out, log, slugs, ctx)], [BY_SLUG], ["key"]
    try:  # and the BioVITA corpus, keyed by photo id
        uris.append(biovita.corpus_files(config.sources, biovita.SUBSETS[0])[0].rsplit("/", 1)[0])
        task_of.append(biovita.TASK)
        keys.append("id")
    except UserError as exc:
        log(f"[audit] warning: no BioVITA corpus to audit against ({exc})")
    names = list(registry.BY_NAME["mteb"].tasks)
    lacking = mteb_suite.missing_data(names, config.sources)
    if lacking:
        log(f"[audit] warning: {len(lacking)} of the {len(names)} MIEB tasks mteb scores are not audited against: "
            f"{storage.display(config.sources)} holds no data of {', '.join(list(lacking)[:3])}"
            + (f" and {len(lacking) - 3} more" if len(lacking) > 3 else ""))
    found = [n for n in names if n not in lacking]
    table = mteb_suite.eval_images(found, config.sources, storage.join(config.out, "eval-data", "mteb"), log,
                                   placement.choose(config.executor, None, ctx=ctx)) if found else None
    if table:
        uris.append(table)
        task_of.append(BY_ROW)
        keys.append("key")
    return Side("against", tuple(uris), tuple(task_of), tuple(keys))
