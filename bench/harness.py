"""The harness every script in bench/ runs through: contenders side by side, one table, one JSON record.

A benchmark declares its contenders: a name, what its timing includes, and either a callable run in this process
or a command run in a fresh process for each run (as the scripts that time whole calls always did). run() times
them --repeat rounds, interleaved (a busy moment of the machine hurts every contender alike), all in this process
tree; Record.finish() prints one table and writes bench/records/<benchmark>.json:

  {benchmark, title, kind ("speed" or "calibration"), group, script, command, commit, dirty, date,
   machine {cpu, cores, memory_gib, platform, python, packages}, unit, repeat, load [before, after],
   contenders [{name, includes, baseline, seconds [every run], runs, median, fastest, cells, extras [per run]}],
   ratio {contender, baseline, value = median / median, of}, columns, figures {free-form}, notes [...]}

bench/results.py renders bench/RESULTS.md from the records. A record replaces the benchmark's last one, whose
rendering moves into bench/legacy/<benchmark>.md (its history). Scripts not ported yet run through wrap(): the
harness calls their main, times it and keeps the Markdown they print as the record's figures.

Also the helpers the scripts share: fresh-process runs, memory and CPU sampling of Ray's workers, start_ray,
the machine's facts, Markdown tables. Importing this module imports neither Ray nor torch.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # before any `import ray`: no token auth, no ~/.ray/auth_token

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
TESTS = ROOT / "tests"
CONTENDERS = BENCH / "contenders"  # the scripts some benchmarks time as a fresh process (mteb's calls, a loop)
RECORDS = BENCH / "records"
RULE = "=" * 100
KINDS = ("speed", "calibration")
CORES = os.cpu_count() or 1  # the build's pool gets one actor per real core
PACKAGES = ("mieb-ray", "ray", "pyarrow", "numpy", "torch", "transformers", "mteb", "pillow", "simplejpeg",
            "faiss-cpu")


def use_test_fixtures() -> None:
    """Put tests/ on this process's path: the tests' support package (tests/support/: embedding_fixtures,
    mteb_reference, planted, raycluster, the mirror's row counts, the models of other sizes and families) that some
    benchmarks share. Called where they are imported, so the dependency stays visible."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))


def legacy_dir(records: Path) -> Path:
    """Where the history of the records in `records` goes: bench/legacy/ beside bench/records/."""
    return Path(records).parent / "legacy"


# ---------------------------------------------------------------------------------------------- contenders


@dataclass
class Contender:
    """One side of a benchmark. Exactly one of `call` (run here; gets the run's index) and `argv` (a command, or a
    function of the run's index giving one, run in a fresh process timed from spawn to exit), or neither, when
    another contender's call reports this one's seconds (its `also`, below).

    A call's return value: None (its wall time counts), a number (its own measure of seconds, e.g. CPU time), or
    a dict: "seconds" (as a number), "also" ({other contender: seconds} measured in the same run) and anything
    else, kept as the run's extras."""

    name: str
    includes: str  # what the timing includes, in words
    call: Callable[[int], Any] | None = None
    argv: Sequence[str] | Callable[[int], Sequence[str]] | None = None
    baseline: str | None = None  # the contender this one's "x baseline" is taken against
    env: dict | None = None  # for argv: the environment (default fresh_process_env())
    cwd: str | None = None


@dataclass
class Benchmark:
    name: str  # the record's file name: bench/records/<name>.json
    title: str  # the shape measured, one line
    contenders: list[Contender]
    kind: str = "speed"  # or "calibration"
    group: str = ""  # Build, Embed, Eval, Audit, Full size, ...
    ratio: tuple[str, str] | None = None  # (contender, baseline): the headline, median / median
    repeat: int = 1
    unit: str = "s"
    # extra columns of the table: (header, function of a Result -> cell text)
    columns: list[tuple[str, Callable[[Result], str]]] = field(default_factory=list)

    def __post_init__(self):
        assert self.kind in KINDS, self.kind
        names = [c.name for c in self.contenders]
        assert len(set(names)) == len(names), f"contender names repeat: {names}"
        for c in self.contenders:
            assert c.call is None or c.argv is None, c.name
            assert c.baseline is None or c.baseline in names, (c.name, c.baseline)
        assert self.ratio is None or set(self.ratio) <= set(names), self.ratio


@dataclass
class Result:
    contender: Contender
    seconds: list[float] = field(default_factory=list)
    extras: list[dict] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    @property
    def fastest(self) -> float | None:
        return min(self.seconds) if self.seconds else None

    def extra(self, key: str) -> list:
        """One extra of every run that reported it."""
        return [e[key] for e in self.extras if key in e]


def run(bench: Benchmark, log: Callable[[str], None] = print) -> Record:
    """Every contender `bench.repeat` times, interleaved; the Record to finish()."""
    results = {c.name: Result(c) for c in bench.contenders}
    load = os.getloadavg()[0]
    for i in range(bench.repeat):
        done = []
        for c in bench.contenders:
            if c.call is None and c.argv is None:
                continue  # reported by another contender's call
            if c.argv is not None:
                argv = c.argv(i) if callable(c.argv) else c.argv
                out = wall = run_process(list(argv), c.env if c.env is not None else fresh_process_env(), cwd=c.cwd)
            else:
                t0 = time.perf_counter()
                out = c.call(i)
                wall = time.perf_counter() - t0
                out = wall if out is None else out
            if isinstance(out, dict):
                out = dict(out)
                seconds = float(out.pop("seconds", wall))
                for name, s in out.pop("also", {}).items():
                    results[name].seconds.append(float(s))
                    done.append(f"{name} {s:.4g}")
                results[c.name].extras.append(out)
            else:
                seconds = float(out)
            results[c.name].seconds.append(seconds)
            done.append(f"{c.name} {seconds:.4g}")
        log(f"[{bench.name} {i + 1}/{bench.repeat}] " + ", ".join(done))
    return Record(bench, results, (load, os.getloadavg()[0]))


def measured(bench: Benchmark, seconds: dict[str, list[float]], extras: dict[str, list[dict]] | None = None,
             load: tuple[float, float] | None = None) -> Record:
    """A Record of runs timed elsewhere (a child process that reports its own seconds, a loop of the script's)."""
    results = {c.name: Result(c, list(seconds.get(c.name, [])), list((extras or {}).get(c.name, [])))
               for c in bench.contenders}
    return Record(bench, results, load or (os.getloadavg()[0],) * 2)


def combine(name: str, title: str, records: Sequence[Record], ratio: tuple[str, str] | None = None,
            group: str = "", kind: str = "speed") -> Record:
    """One Record of the runs of several benchmarks run one after the other (e.g. whole calls in fresh processes,
    then contenders in this process once it has started Ray): one table, one record."""
    columns = {}
    for r in records:
        columns.update(dict(r.bench.columns))
    bench = Benchmark(name, title, [c for r in records for c in r.bench.contenders], kind=kind, group=group,
                      ratio=ratio, repeat=max(r.bench.repeat for r in records), unit=records[0].bench.unit,
                      columns=list(columns.items()))
    out = Record(bench, {k: v for r in records for k, v in r.results.items()}, (records[0].load[0],
                                                                                 records[-1].load[1]))
    for r in records:
        out.figures.update(r.figures)
        out.notes.extend(r.notes)
    return out


def _cell(fn, result: Result) -> str:
    try:
        return fn(result)
    except (KeyError, IndexError, ValueError, TypeError, ZeroDivisionError):  # an extra this contender lacks
        return ""


class Record:
    """The runs of a benchmark, before and after finish(): figures and notes are the script's to add."""

    def __init__(self, bench: Benchmark, results: dict[str, Result], load: tuple[float, float]):
        self.bench, self.results, self.load = bench, results, load
        self.figures: dict[str, Any] = {}
        self.notes: list[str] = []

    def __getitem__(self, name: str) -> Result:
        return self.results[name]

    def ratio(self, contender: str, baseline: str) -> float | None:
        a, b = self.results[contender].median, self.results[baseline].median
        return a / b if a is not None and b else None

    def to_json(self) -> dict:
        b = self.bench
        contenders = []
        for c in b.contenders:
            r = self.results[c.name]
            contenders.append({"name": c.name, "includes": c.includes, "baseline": c.baseline,
                               "seconds": r.seconds, "runs": len(r.seconds), "median": r.median,
                               "fastest": r.fastest,
                               "cells": {h: _cell(fn, r) for h, fn in b.columns} if r.seconds else {},
                               "extras": r.extras})
        ratio = None
        if b.ratio:
            ratio = {"contender": b.ratio[0], "baseline": b.ratio[1], "value": self.ratio(*b.ratio),
                     "of": f"median {b.unit}, contender / baseline"}
        return {"benchmark": b.name, "title": b.title, "kind": b.kind, "group": b.group,
                "script": script_path(), "command": command_line(), **git_state(),
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
                "unit": b.unit, "repeat": b.repeat, "load": [round(x, 2) for x in self.load],
                "contenders": contenders, "ratio": ratio, "columns": [h for h, _ in b.columns],
                "figures": self.figures, "notes": self.notes}

    def finish(self, figures: dict | None = None, notes: Sequence[str] = (), records: Path | None = None) -> dict:
        """Print the table, write the record (None: the default folder, or --records); the record."""
        self.figures.update(figures or {})
        self.notes.extend(notes)
        record = self.to_json()
        print("\n" + RULE)
        print(render(record))
        path = write_record(record, records if records is not None else records_option())
        print(f"\nrecord: {_shown(path)}")
        return record


# ---------------------------------------------------------------------------------------------- records


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def write_record(record: dict, records: Path) -> Path:
    """records/<benchmark>.json; the benchmark's previous record, rendered, is appended to its history."""
    records = Path(records)
    records.mkdir(parents=True, exist_ok=True)
    path = records / f"{record['benchmark']}.json"
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = None
        if old is not None:
            archive(old, legacy_dir(records))
    path.write_text(json.dumps(record, indent=1, default=_jsonable) + "\n")
    return path


def archive(old: dict, legacy: Path) -> Path:
    """Append a superseded record's rendering to legacy/<benchmark>.md, oldest first."""
    legacy.mkdir(parents=True, exist_ok=True)
    path = legacy / f"{old['benchmark']}.md"
    head = "" if path.exists() else (f"# {old.get('title', old['benchmark'])}: earlier runs\n\n"
                                     f"Superseded runs of `{old['benchmark']}`, oldest first; the current one is in "
                                     "bench/RESULTS.md.\n")
    when = "before the harness (bench/RESULTS.md until issue 36)" if old.get("legacy_markdown") else \
        f"{old.get('date', '?')}, commit {str(old.get('commit'))[:10]}"
    with path.open("a") as f:
        f.write(f"{head}\n## Run of {when}\n\n{render(old, level=3).strip()}\n")
    return path


def _jsonable(x):
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (set, tuple)):
        return list(x)
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON: {type(x).__name__}")


def records_option(strip: bool = False) -> Path:
    """--records DIR from the command line: the folder records are written to, bench/records by default (a smoke
    run points it elsewhere). strip: also take it out of sys.argv, for a wrapped script whose parser lacks it."""
    args, found = sys.argv, None
    for k, a in enumerate(args):
        if a == "--records" and k + 1 < len(args):
            found, cut = args[k + 1], slice(k, k + 2)
            break
        if a.startswith("--records="):
            found, cut = a.split("=", 1)[1], slice(k, k + 1)
            break
    if found is not None and strip:
        del args[cut]
    return Path(found).resolve() if found is not None else RECORDS


def add_records_option(parser) -> None:
    """Document --records in a script's --help (records_option() reads it)."""
    parser.add_argument("--records", type=Path, default=None, metavar="DIR",
                        help="where the JSON record goes (default bench/records; a smoke run: a temporary folder)")


# ---------------------------------------------------------------------------------------------- wrap


def wrap(main: Callable[[], Any], name: str, title: str, kind: str = "speed", group: str = "",
         includes: str = "the whole script: set-up, every contender, the checks") -> Any:
    """Run a script's main() through the harness without porting it: its stdout is shown as it comes and kept;
    the record has one contender (the whole run) and, as its figures, the Markdown the script printed (from its
    first rule of '=' or its first heading on)."""
    command = command_line()
    records = records_option(strip=True)
    bench = Benchmark(name, title, [Contender("the script", includes, call=lambda i: None)], kind=kind, group=group)
    buffer = io.StringIO()
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    with contextlib.redirect_stdout(_Tee(sys.stdout, buffer)):
        out = main()
    rec = measured(bench, {"the script": [time.perf_counter() - t0]}, load=(load, os.getloadavg()[0]))
    rec.figures["markdown"] = printed_markdown(buffer.getvalue())
    record = rec.to_json()
    record["wrapped"], record["command"] = True, command
    path = write_record(record, records)
    print(f"\nrecord: {_shown(path)} (the script's own output, wrapped)")
    return out


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for stream in self.streams:
            stream.write(s)
        return len(s)

    def flush(self):
        for stream in self.streams:
            stream.flush()


def printed_markdown(text: str) -> str:
    lines = text.splitlines()
    start = next((k + 1 for k, line in enumerate(lines) if line.strip() == RULE), None)
    if start is None:
        start = next((k for k, line in enumerate(lines) if line.startswith("#")), 0)
    kept = [line for line in lines[start:] if line.strip() != RULE]
    return "\n".join(kept).strip() + "\n"


# ---------------------------------------------------------------------------------------------- rendering


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:,.0f}"


def demote(markdown: str, top: int) -> str:
    """Shift the headings of a Markdown block so that its shallowest becomes level `top`."""
    lines = markdown.splitlines()
    levels = [len(line) - len(line.lstrip("#")) for line in lines if line.startswith("#") and " " in line]
    if not levels:
        return markdown
    shift = top - min(levels)
    out = []
    for line in lines:
        if line.startswith("#") and " " in line:
            level, rest = len(line) - len(line.lstrip("#")), line.lstrip("#")
            line = "#" * max(1, min(6, level + shift)) + rest
        out.append(line)
    return "\n".join(out)


def table(record: dict) -> str:
    """The contenders' table of a record."""
    unit = record.get("unit", "s")
    names = {c["name"] for c in record["contenders"]}
    header = ["contender", "what the timing includes", f"runs ({unit})", f"median ({unit})", "fastest",
              "x baseline (median)", *record.get("columns", [])]
    median = {c["name"]: c["median"] for c in record["contenders"]}
    rows = []
    for c in record["contenders"]:
        base = c.get("baseline")
        vs = "-"
        if base in names and c["median"] is not None and median.get(base):
            vs = f"{c['median'] / median[base]:.3g}x {base}"
        elif base is None and any(o.get("baseline") == c["name"] for o in record["contenders"]):
            vs = "1.00 (baseline)"
        rows.append([c["name"], c["includes"], ", ".join(fmt(s) for s in c["seconds"]) or "not run",
                     fmt(c["median"]), fmt(c["fastest"]), vs,
                     *[c.get("cells", {}).get(h, "") for h in record.get("columns", [])]])
    return markdown_table(header, rows)


def headline(record: dict) -> str:
    r = record.get("ratio")
    if not r or r.get("value") is None:
        return ""
    return f"{r['contender']} / {r['baseline']} = {r['value']:.3g} (medians, {record.get('unit', 's')})"


def render(record: dict, level: int = 4) -> str:
    """A record as Markdown: its table, figures and notes, the command, machine and commit (headings inside it
    from `level` on). A record from before the harness renders its text as it was."""
    if record.get("legacy_markdown"):
        return demote(record["legacy_markdown"].strip(), level) + "\n"
    figures = dict(record.get("figures") or {})
    markdown = figures.pop("markdown", None)
    if record.get("wrapped") and markdown:  # the script's own Markdown, its headings from `level` on
        out = [demote(markdown.strip(), level), "",
               f"Whole run of the script: {fmt(record['contenders'][0]['seconds'][0])} s."]
    else:
        out = [f"{'#' * level} {record['title']}", "", table(record)]
        if headline(record):
            out += ["", f"**{headline(record)}**"]
    for t in figures.pop("tables", []):
        out += ["", f"{t['title']}:" if t.get("title") else "", "", markdown_table(t["header"], t["rows"])]
    if figures:
        out.append("")
        out += [f"- {k}: {_figure(v)}" for k, v in figures.items()]
    if markdown and not record.get("wrapped"):
        out += ["", demote(markdown.strip(), level + 1)]
    if record.get("notes"):
        out.append("")
        out += [f"- {n}" for n in record["notes"]]
    m = record.get("machine") or {}
    packages = ", ".join(f"{k} {v}" for k, v in (m.get("packages") or {}).items())
    out += ["", f"Command: `{record.get('command')}`  ",
            f"Run {record.get('date')} at commit {str(record.get('commit'))[:10]}"
            + (" (with uncommitted changes)" if record.get("dirty") else "")
            + f"; load average (1 min) before / after: {' / '.join(map(str, record.get('load', [])))}  ",
            f"Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB; {m.get('platform')}; "
            f"Python {m.get('python')}" + (f"; {packages}" if packages else "")]
    return "\n".join(line for line in out if line is not None) + "\n"


def _figure(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict):
        return "; ".join(f"{k} {_figure(x)}" for k, x in v.items())
    if isinstance(v, list):
        return json.dumps(v, default=_jsonable)
    return str(v)


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- facts


def machine() -> dict:
    """The CPU model (/proc/cpuinfo), cores, memory, platform, Python and the versions of the packages that matter
    (from their metadata: nothing imported)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    memory = None
    try:
        with open("/proc/meminfo") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
        memory = round(kb / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return {"cpu": model or "unknown", "cores": os.cpu_count(), "memory_gib": memory, "platform": platform.platform(),
            "python": platform.python_version(), "packages": packages}


def git_state() -> dict:
    """{commit: `git rev-parse HEAD`, dirty: tracked files changed} of this checkout (None where git is absent)."""
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, check=True).stdout
        return {"commit": commit, "dirty": bool(status.strip())}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def script_path() -> str:
    return os.path.relpath(os.path.abspath(sys.argv[0]), ROOT) if sys.argv and sys.argv[0] else ""


def command_line() -> str:
    return " ".join([".venv/bin/python", script_path(), *sys.argv[1:]])


def portable_argv() -> None:
    """This process's arguments as its record will show them, without this machine's layout: a path outside the
    repo (a lent device's files, fetched here) as OUTSIDE/<its folder>/<its name>. For the scripts that record what
    another machine ran."""
    sys.argv[1:] = [arg if not Path(arg).is_absolute() or Path(arg).resolve().is_relative_to(ROOT)
                    else "/".join(["OUTSIDE", *Path(arg).parts[-2:]]) for arg in sys.argv[1:]]


def machine_facts() -> list[str]:
    """The machine in two lines, for scripts that print their own footer."""
    m = machine()
    return [f"CPUs: {m['cores']} ({m['cpu']}); RAM: {m['memory_gib']} GiB; {m['platform']}",
            f"Python {m['python']}, " + ", ".join(f"{k} {v}" for k, v in m["packages"].items())]


def footer(*notes: str) -> None:
    """The end of a result block of a script not ported yet: the command, the notes, the machine, a rule."""
    for line in [f"Command: `{command_line()}`", *notes, *machine_facts()]:
        print(line + "  ")
    print(RULE)


# ---------------------------------------------------------------------------------------------- processes


def fresh_process_env() -> dict:
    """The environment of a timed CLI process: this checkout importable, no RAY_ADDRESS (it starts its own Ray)."""
    paths = [str(ROOT), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    env.pop("RAY_ADDRESS", None)
    return env


def worktree(work: Path, rev: str) -> Path:
    """A git worktree of this repository at `rev` in `work` (made once, reused): the code of an old-vs-new
    comparison, which a child process imports with the tree first on its PYTHONPATH and its cwd outside this
    checkout (whose mieb_ray/ would come first)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"], check=True,
                         capture_output=True, text=True).stdout.strip()
    tree = Path(work) / f"baseline-{sha[:12]}"
    if not (tree / "mieb_ray" / "__init__.py").exists():
        shutil.rmtree(tree, ignore_errors=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha], check=True,
                       capture_output=True)
    return tree


def run_process(argv: list[str], env: dict | None = None, cwd: str | None = None) -> float:
    """Seconds from spawn to exit of one process; its stderr tail and an exit if it fails."""
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env if env is not None else fresh_process_env(), capture_output=True, text=True,
                          cwd=cwd)
    seconds = time.perf_counter() - t0
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stderr[-3000:]}")
    return seconds


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - t0, result


def start_ray(work: Path, num_cpus: int = 4) -> None:
    """Start local Ray once, before anything is timed (num_cpus logical CPUs; see below for the default)."""
    import ray

    from mieb_ray.runtime.cluster import worker_soft_limit

    # 4 logical CPUs on this 2-core machine: an actor pool whose actors reserve every CPU leaves none for the
    # read tasks feeding it and Ray Data deadlocks (platform notes, section 2). 4 logical CPUs let the
    # baseline's CORES actors run beside its read and write tasks; the build is given workers=CORES explicitly.
    pythonpath = os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING",
             _temp_dir=str((work / "ray").resolve()),  # session files inside the work folder, not /tmp/ray
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},  # workers can import bench/'s modules
             _system_config={"num_workers_soft_limit": worker_soft_limit(num_cpus)})  # as the jobs' own Ray
    ray.data.DataContext.get_current().enable_progress_bars = False
    # untimed warm-up, part of start-up: the first Ray Data job starts worker processes and imports Ray Data
    # in them, which would otherwise be charged to whichever contender happens to run first
    ray.data.range(100).map_batches(lambda batch: batch).count()


# ---------------------------------------------------------------------------------------------- memory, CPU


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _raylet():
    import psutil

    return next((p for p in psutil.Process().children(recursive=True) if p.name() == "raylet"), None)


def _used() -> int:
    import psutil

    vm = psutil.virtual_memory()
    return vm.total - vm.available


class MemorySampler:
    """Every `interval` s in a thread: system-wide used memory (total - available) and the RSS of the raylet's
    child processes (Ray's workers and actors). `with MemorySampler() as m: ...` then m.used_delta (peak used
    minus used just before the block), m.ray_rss (peak RSS sum), m.task_rss (peak RSS of any one worker: a
    task's memory) and, with uss=True, m.task_uss (the same for private memory, USS). RSS counts pages shared
    between workers (the /dev/shm object store, libraries) once per process, so the sum overstates; a worker's
    RSS keeps the object store pages it has touched in earlier tasks, its USS leaves out pages read zero-copy."""

    METHOD = ("memory: system used = psutil total - available, sampled every 0.25 s, peak minus the value "
              "just before the run (includes anything else running on the machine); Ray workers = peak over "
              "samples of the summed RSS of the raylet's child processes (shared pages counted per process); "
              "per task = peak over samples of the largest single worker's RSS (object-store pages it maps "
              "included) and of its USS (private pages only)")

    def __init__(self, interval: float = 0.25, uss: bool = False):
        self.interval, self.uss, self._stop = interval, uss, threading.Event()
        self.raylet = _raylet()

    def _workers_rss(self) -> tuple[int, int, int]:
        """(sum, max) of the workers' RSS, and the max of their USS (0 unless asked: reading it costs more)."""
        import psutil

        if self.raylet is None:
            return 0, 0, 0
        rss, uss = [], []
        for p in self.raylet.children(recursive=True):
            try:
                info = p.memory_full_info() if self.uss else p.memory_info()
                rss.append(info.rss)
                uss.append(info.uss if self.uss else 0)
            except psutil.Error:  # a worker that just exited
                pass
        return sum(rss), max(rss, default=0), max(uss, default=0)

    def _run(self):
        while not self._stop.is_set():
            self.peak_used = max(self.peak_used, _used())
            total, largest, private = self._workers_rss()
            self.ray_rss, self.task_rss = max(self.ray_rss, total), max(self.task_rss, largest)
            self.task_uss = max(self.task_uss, private)
            self._stop.wait(self.interval)

    def __enter__(self):
        self.before = _used()
        self.peak_used, self.ray_rss, self.task_rss, self.task_uss = self.before, 0, 0, 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.used_delta = self.peak_used - self.before


class CpuClock:
    """CPU seconds (user + system) spent by this process and Ray's workers (the raylet's children) inside
    `with CpuClock() as c: ...` -> c.seconds. Unlike wall time, it hardly moves when other work shares the
    machine. A worker that exits inside the block (an actor pool's actors when its dataset is done) is counted
    too: once the raylet has reaped it, its time is in the raylet's children times."""

    def __init__(self):
        self.raylet = _raylet()

    def _times(self) -> tuple[dict[int, float], float]:
        import psutil

        procs = [psutil.Process()] + (self.raylet.children(recursive=True) if self.raylet else [])
        out = {}
        for p in procs:
            try:
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        reaped = 0.0
        if self.raylet is not None:
            try:
                t = self.raylet.cpu_times()
                reaped = t.children_user + t.children_system
            except psutil.Error:
                pass
        return out, reaped

    def __enter__(self):
        self._start = self._times()
        return self

    def __exit__(self, *exc):
        time.sleep(0.5)  # the raylet reaps the workers that exited at the end of the block
        (start, start_reaped), (end, end_reaped) = self._start, self._times()
        # a worker alive at both ends: end - start; one that exited: its whole time is in the reaped delta, less
        # what it had spent before the block (its start value, subtracted here)
        self.seconds = sum(end.values()) - sum(start.values()) + (end_reaped - start_reaped)
