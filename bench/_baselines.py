"""Helpers shared by bench/build_bytes.py and bench/build_rows.py (not a benchmark itself).

The two baselines the build is compared with:
  copy_floor(files, out)        one process, no Ray: pq.read_table + pq.write_table of each file, unchanged;
  minimal_pipeline(files, out)  ray.data.read_parquet -> map_batches(CaptionTake, CORES actors, pyarrow) ->
                                write_parquet: as many actors as the build's pool gets.
and start_ray(), MemorySampler, train_files(), parquet_rows(), machine_facts(), footer(), markdown_table().

Ray's workers import CaptionTake by its module name, `_baselines`: start_ray() puts bench/ on their PYTHONPATH.
Importing it also puts tests/ on this process's path, for the fixtures the benchmarks share with the tests.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # before `import ray`: no token auth, no ~/.ray/auth_token
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' fixtures (embeddings, planted)

import psutil  # noqa: E402  Ray's vendored copy (ray/thirdparty_files), on sys.path once ray is imported
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray

from mieb_ray.runtime.cluster import worker_soft_limit  # noqa: E402

BENCH = Path(__file__).resolve().parent

# the label column of each parquet source (scimmir's `class` holds strings: its class codes)
LABEL_COLUMNS = ("label", "fine_label", "common", "class")


# ---------------------------------------------------------------------------------------------- Ray


CORES = os.cpu_count() or 1  # the build's pool gets one actor per real core, not per logical CPU below


def start_ray(work: Path, num_cpus: int = 4) -> None:
    """Start local Ray once, before anything is timed (num_cpus logical CPUs; see below for the default)."""
    # 4 logical CPUs on this 2-core machine: an actor pool whose actors reserve every CPU leaves none for the
    # read tasks feeding it and Ray Data deadlocks (platform notes, section 2). 4 logical CPUs let the
    # baseline's CORES actors run beside its read and write tasks; the build is given workers=CORES explicitly.
    pythonpath = os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING",
             _temp_dir=str((work / "ray").resolve()),  # session files inside the work folder, not /tmp/ray
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},  # workers can import `_baselines`
             _system_config={"num_workers_soft_limit": worker_soft_limit(num_cpus)})  # as the jobs' own Ray
    ray.data.DataContext.get_current().enable_progress_bars = False
    # untimed warm-up, part of start-up: the first Ray Data job starts worker processes and imports Ray Data
    # in them, which would otherwise be charged to whichever contender happens to run first
    ray.data.range(100).map_batches(lambda batch: batch).count()


# ---------------------------------------------------------------------------------------------- baselines


def copy_floor(files: list[str], out: Path) -> int:
    """The floor: read each parquet file whole and write it back unchanged, one process. Returns rows."""
    out.mkdir(parents=True, exist_ok=True)
    rows = 0
    for k, path in enumerate(files):
        table = pq.read_table(path)
        pq.write_table(table, out / f"{k:05d}.parquet")  # same schema (metadata too), default settings
        rows += table.num_rows
    return rows


class CaptionTake:
    """The minimal pipeline's transform: caption = take(a small class-name array, label)."""

    def __init__(self):
        self.names = pa.array([f"a photo of class {i}." for i in range(1000)])  # birdsnap has 500 classes

    def __call__(self, batch: pa.Table) -> pa.Table:
        label = batch[next(c for c in LABEL_COLUMNS if c in batch.column_names)]
        if not pa.types.is_integer(label.type):  # scimmir: class code strings -> their index
            label = pc.index_in(label, value_set=pc.unique(label))
        return batch.append_column("caption", pc.take(self.names, label))


def minimal_pipeline(files: list[str], out: Path) -> int:
    """read_parquet -> pyarrow take in CORES actors, the build's pool size -> write_parquet. Returns rows written."""
    ds = ray.data.read_parquet(files)
    ds = ds.map_batches(CaptionTake, compute=ray.data.ActorPoolStrategy(size=CORES), batch_format="pyarrow")
    ds.write_parquet(str(out))
    return parquet_rows(out)


# ---------------------------------------------------------------------------------------------- files


def train_files(mirror: Path, slugs: list[str]) -> list[str]:
    """The train split files of the sources, as the build itself finds them."""
    from mieb_ray.io import reader
    from mieb_ray.sources import by_slug

    return [f for slug in slugs for f in reader.train_files(by_slug(slug), str(mirror))]


def parquet_rows(folder: Path) -> int:
    """Rows in the parquet files under folder, from their footers (cheap); the build's _errors/ not counted."""
    return sum(pq.read_metadata(p).num_rows for p in Path(folder).rglob("*.parquet")
               if not p.name.startswith(".") and "_errors" not in p.relative_to(folder).parts)


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - t0, result


# ---------------------------------------------------------------------------------------------- memory


def _used() -> int:
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
        me = psutil.Process()
        self.raylet = next((p for p in me.children(recursive=True) if p.name() == "raylet"), None)

    def _workers_rss(self) -> tuple[int, int, int]:
        """(sum, max) of the workers' RSS, and the max of their USS (0 unless asked: reading it costs more)."""
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
        me = psutil.Process()
        self.raylet = next((p for p in me.children(recursive=True) if p.name() == "raylet"), None)

    def _times(self) -> tuple[dict[int, float], float]:
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


# ---------------------------------------------------------------------------------------------- report


def fresh_process_env() -> dict:
    """The environment of a timed CLI process: this checkout importable, no RAY_ADDRESS (it starts its own Ray)."""
    paths = [str(BENCH.parent), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    env.pop("RAY_ADDRESS", None)
    return env


def run_process(argv: list[str], env: dict) -> float:
    """Seconds from spawn to exit of one process; its stderr tail and an exit if it fails."""
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stderr[-3000:]}")
    return seconds


def machine_facts() -> list[str]:
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    import mieb_ray

    ram = psutil.virtual_memory().total / 2**30
    return [f"CPUs: {os.cpu_count()} ({model or 'unknown model'}); RAM: {ram:.1f} GiB; {platform.platform()}",
            f"Python {platform.python_version()}, Ray {ray.__version__}, pyarrow {pa.__version__}, "
            f"mieb-ray {mieb_ray.__version__}" + (f"; Ray started with num_cpus={int(ray.cluster_resources()['CPU'])}"
                                                  if ray.is_initialized() else "; no Ray in this process")]


def command_line() -> str:
    return " ".join([".venv/bin/python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])


def footer(*notes: str) -> None:
    """The end of a result block: the command, the notes, the machine (markdown line breaks), a rule."""
    for line in [f"Command: `{command_line()}`", *notes, *machine_facts()]:
        print(line + "  ")
    print("=" * 100)


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
