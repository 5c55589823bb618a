"""Chaos on a real three-node Ray cluster (issue 29): build and embed while worker nodes are SIGKILLed again and
again, and while the driver is killed and resubmitted with --resume; then every key is checked.

The cluster is the tests' (tests/support/raycluster.py): a head that takes no work and two worker nodes of 2 CPUs. For
each job (build as Parquet, build as WebDataset, embed of the Parquet build with a tiny CLIP):

    reference  an uninterrupted run: the content every other run must end with, and the time overheads' base
    nodes      a killer thread SIGKILLs a worker node holding some of the job's workers (its raylet, object
               store and every worker at once) at --kills random points of the job (shards committed), and
               starts it again after a pause; the other node may go down while the first is still down
    driver     the driver (`python -m mieb_ray ... --address`, the process `ray job submit` runs) is killed at
               a random point, SIGKILL (a lost driver) then SIGTERM (`ray job stop`), each time resubmitted
               with --resume; the last submission finishes

After each chaos run (verify_build, verify_embed, also used by tests/system/test_chaos.py): every key present and none
twice, counted in the shard files on disk; the content equal to the reference's (the sha256 of every file for
build, every vector within 1e-6 for embed); the same files as the reference (no staging `.*.tmp`, no
`_progress/`, no stray shard); each shard's sha256 as the manifest records it; the manifest's shards and counts
equal. Prints a table and a Markdown block, kept as bench/records/chaos.json by the harness (wrapped; --records DIR
puts it elsewhere). A few minutes on 2 cores; never in CI.

    .venv/bin/python bench/chaos.py [--rows 12] [--kills 5] [--seed 0] [--formats parquet,webdataset]
                                    [--jobs build,embed] [--health-check PERIOD_MS,FAILURES] [--work DIR]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' support: raycluster, s3server

from mieb_ray import storage  # noqa: E402
from mieb_ray.io import embeddings  # noqa: E402

# the processes of a node that are not the job's: its agents, and workers no job holds
NOT_WORK = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
ATOL = 1e-6


# ---- verification, shared with tests/system/test_chaos.py ----

def listing(out: str) -> dict[str, str]:
    """{relative path: sha256} of every file under `out`."""
    found = {}
    for folder, _, files in os.walk(out):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, out)] = hashlib.file_digest(f, "sha256").hexdigest()
    return found


def tar_keys(path: str) -> list[str]:
    """The sample keys of a WebDataset tar, each once per sample: a member name is `<key>.<ext>` (a key has no
    dot after its last `/`); a member written twice counts its key twice."""
    with tarfile.open(path) as tar:
        names = [m.name for m in tar.getmembers()]
    members: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name in names:
        cut = name.index(".", name.rfind("/") + 1)
        members[name[:cut]][name[cut:]] += 1
    return [key for key, exts in members.items() for _ in range(max(exts.values()))]


def shard_keys(out: str, rel: str) -> list[str]:
    path = os.path.join(out, rel)
    if rel.endswith(".parquet"):
        return pq.read_table(path, columns=["key"])["key"].to_pylist()
    if rel.endswith(".tar"):
        return tar_keys(path)
    return embeddings.open_shard(path)["key"].to_pylist()


def _shards(files: dict[str, str], suffix: str) -> list[str]:
    """The shard files of a listing (not the error tables)."""
    return sorted(p for p in files if p.endswith(suffix) and not p.startswith(("_errors/", storage.PROGRESS + "/")))


def _common(out: str, ref: str, suffix: str) -> tuple[list[str], dict, dict, dict[str, list[str]]]:
    """The checks both jobs share: problems, the two listings, and each shard's keys ({path: keys})."""
    got, want = listing(out), listing(ref)
    problems = []
    temp = [p for p in got if (os.path.basename(p).startswith(".") and p.endswith(".tmp"))
            or p.startswith(storage.PROGRESS + "/")]
    if temp:
        problems.append(f"{len(temp)} temporary files left (e.g. {temp[0]})")
    if stray := sorted(set(got) - set(want) - set(temp)):
        problems.append(f"{len(stray)} files the reference lacks (e.g. {stray[0]})")
    if lost := sorted(set(want) - set(got)):
        problems.append(f"{len(lost)} files missing (e.g. {lost[0]})")
    manifest, reference = storage.read_manifest(out), storage.read_manifest(ref)
    if manifest is None:
        return [*problems, "no manifest"], got, want, {}
    if manifest["counts"] != reference["counts"]:
        problems.append(f"manifest counts {manifest['counts']} != reference {reference['counts']}")
    if [(s["path"], s["rows"]) for s in manifest["shards"]] != [(s["path"], s["rows"]) for s in reference["shards"]]:
        problems.append("the manifest's shards (path, rows) differ from the reference's")
    if bad := [s["path"] for s in manifest["shards"] if got.get(s["path"]) != s["sha256"]]:
        problems.append(f"{len(bad)} shards differ from the sha256 their manifest records (e.g. {bad[0]})")
    keys = {p: shard_keys(out, p) for p in _shards(got, suffix)}
    ref_keys = collections.Counter(k for p in _shards(want, suffix) for k in shard_keys(ref, p))
    counted = collections.Counter(k for ks in keys.values() for k in ks)
    if missing := sorted(set(ref_keys) - set(counted)):
        problems.append(f"{len(missing)} keys missing (e.g. {missing[0]})")
    if doubled := sorted(k for k, n in counted.items() if n > 1):
        problems.append(f"{len(doubled)} keys doubled (e.g. {doubled[0]}: {counted[doubled[0]]} times)")
    if extra := sorted(set(counted) - set(ref_keys)):
        problems.append(f"{len(extra)} keys the reference lacks (e.g. {extra[0]})")
    if max(ref_keys.values(), default=1) > 1 or not ref_keys:
        problems.append("the reference itself has no keys or doubled keys")
    return problems, got, want, keys


def verify_build(out: str, ref: str) -> list[str]:
    """What is wrong with the build at `out` against the uninterrupted build at `ref` (empty: nothing)."""
    suffix = ".tar" if storage.read_manifest(ref)["config"]["format"] == "webdataset" else ".parquet"
    problems, got, want, _ = _common(out, ref, suffix)
    if differ := sorted(p for p in set(got) & set(want) if got[p] != want[p] and p != storage.MANIFEST):
        problems.append(f"{len(differ)} files differ from the reference's bytes (e.g. {differ[0]})")
    return problems


def vectors(out: str, files: list[str]) -> dict[str, np.ndarray]:
    """{key: float32 vector} of embedding shards."""
    found = {}
    for rel in files:
        table = embeddings.open_shard(os.path.join(out, rel))
        found.update(zip(table["key"].to_pylist(), embeddings.matrix(table).astype(np.float32)))
    return found


def verify_embed(out: str, ref: str) -> list[str]:
    """What is wrong with the embeddings at `out` against the uninterrupted run at `ref`: vectors equal to float32
    rounding (another batching may change the last bit of a matrix product)."""
    problems, got, want, keys = _common(out, ref, ".arrow")
    ours, theirs = vectors(out, list(keys)), vectors(ref, _shards(want, ".arrow"))
    common = sorted(set(ours) & set(theirs))
    worst = max((float(np.abs(ours[k] - theirs[k]).max()) for k in common), default=0.0)
    if worst > ATOL:
        problems.append(f"vectors differ from the reference's by up to {worst:.2e} (> {ATOL})")
    return problems


# ---- the chaos ----

def committed(out: str, suffix: str) -> int:
    """Shard files committed under `out` (staging files start with a dot)."""
    return sum(f.endswith(suffix) and not f.startswith(".") for _, _, fs in os.walk(out) for f in fs)


def job_workers(cluster, node: str) -> int:
    """The Ray workers a job holds on `node` (its actors, its tasks)."""
    return sum(p.startswith("ray::") and not p.startswith(NOT_WORK) for p in cluster.processes(node))


def driver(cluster, args: list[str]) -> subprocess.Popen:
    """`mieb-ray ARGS` against the cluster, as `ray job submit` runs it on the head."""
    return subprocess.Popen([sys.executable, "-m", "mieb_ray", "--address", cluster.address, *args], env=cluster.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen, timeout: float) -> str:
    """The driver's output once it exits; an error with its output if it fails."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise RuntimeError(f"the driver hung for {timeout:.0f} s: {process.args}\n{output[-3000:]}") from None
    if process.returncode != 0:
        raise RuntimeError(f"the driver failed ({process.returncode}): {process.args}\n{output[-3000:]}")
    return output


@dataclass
class Kill:
    at: float  # seconds since the run started
    target: str  # the node, or the driver's signal
    committed: int  # shard files committed by then
    workers: int  # the job's workers on the node when it was killed (the driver: 1)
    mid_job: bool  # the job was still running

    @property
    def landed(self) -> bool:
        """While the job ran, on a node that held some of its work."""
        return self.mid_job and self.workers > 0


def kill_points(rng: random.Random, shards: int, kills: int, within: float = 0.85) -> list[int]:
    """Random moments of a job that commits `shards` shard files, as the number committed by then: `kills` distinct
    counts from 1 to `within` of them, so that every kill lands while work is in flight, whatever the machine's
    speed."""
    return sorted(rng.sample(range(1, max(kills + 1, int(within * shards))), kills))


@dataclass
class NodeChaos:
    """In a thread: at each of `points` (shard files committed), SIGKILL a worker node that is up and holds some of
    the job's workers (random), and start it again in the background after `pause` seconds (random). The other
    node may be killed while the first is still down. `running()` says whether the job still runs; the kills stop
    when it ends, and join() returns once every node is up again."""
    cluster: object
    running: object
    out: str
    suffix: str
    rng: random.Random
    points: list[int]
    pause: tuple[float, float] = (0.5, 3.0)
    log: object = print
    done: list[Kill] = field(default_factory=list)

    def start(self) -> NodeChaos:
        self.t0, self.down, self.errors, self.restarts = time.time(), set(), [], []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def join(self) -> list[Kill]:
        self.thread.join()
        for thread in self.restarts:
            thread.join()
        if self.errors:
            raise self.errors[0]
        return self.done

    def _run(self) -> None:
        try:
            for point in self.points:
                while self.running() and committed(self.out, self.suffix) < point:
                    time.sleep(0.02)
                busy = {}
                while self.running() and not busy:
                    busy = {n: w for n in sorted(set(self.cluster.nodes) - {"head"} - self.down)
                            if (w := job_workers(self.cluster, n))}
                    time.sleep(0 if busy else 0.05)
                if not busy:
                    return
                victim = self.rng.choice(sorted(busy))
                shards = committed(self.out, self.suffix)
                self.down.add(victim)
                self.cluster.nodes[victim].kill()
                kill = Kill(round(time.time() - self.t0, 2), victim, shards, busy[victim], self.running())
                self.done.append(kill)
                self.log(f"  kill {len(self.done)}: {victim} at {kill.at:.2f} s ({kill.workers} job workers, "
                         f"{shards} shards committed{'' if kill.mid_job else ', AFTER the job ended'})")
                pause = self.rng.uniform(*self.pause)  # drawn here: one thread draws from the seeded generator
                self.restarts.append(threading.Thread(target=self._restart, args=(victim, pause), daemon=True))
                self.restarts[-1].start()
        except BaseException as exc:  # noqa: BLE001  raised again in join()
            self.errors.append(exc)

    def _restart(self, node: str, pause: float) -> None:
        try:
            time.sleep(pause)
            self.cluster.restart(node)  # raycluster waits for its `ray start` to say it registered
            self.down.discard(node)
            self.log(f"  {node} back at {time.time() - self.t0:.2f} s")
        except BaseException as exc:  # noqa: BLE001  raised again in join()
            self.errors.append(exc)


def node_chaos(cluster, args: list[str], out: str, suffix: str, rng: random.Random, points: list[int],
               pause: tuple[float, float] = (0.5, 3.0), timeout: float = 900, log=print) -> tuple[float, list[Kill]]:
    """Run the job while NodeChaos kills its nodes at `points`: (wall seconds, the kills)."""
    t0 = time.time()
    process = driver(cluster, args)
    chaos = NodeChaos(cluster, lambda: process.poll() is None, out, suffix, rng, points, pause, log).start()
    try:
        finish(process, timeout)
    finally:
        if process.poll() is None:
            process.kill()
        wall = time.time() - t0
        done = chaos.join()  # every node up again
    return wall, done


def driver_chaos(cluster, args: list[str], out: str, suffix: str, shards: int, rng: random.Random,
                 signals=(signal.SIGKILL, signal.SIGTERM), timeout: float = 900, log=print) -> tuple[float, list[Kill]]:
    """Submit the job, kill its driver with each of `signals` in turn once a random number of further shards (of
    the `shards` it makes) are committed, resubmitting with --resume each time; the last submission finishes.
    (wall seconds from the first submission to the last one's exit, the kills)."""
    t0, kills = time.time(), []
    for sig in signals:
        process = driver(cluster, args + (["--resume"] if kills else []))
        before = committed(out, suffix)
        target = before + rng.randint(1, max(1, (shards - before) // 3))
        deadline = time.time() + timeout
        while committed(out, suffix) < target and process.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        now = committed(out, suffix)
        if process.poll() is None:
            process.send_signal(sig)
        output, _ = process.communicate(timeout=120)
        if process.returncode == 0:  # it finished first: this kill missed, and there is nothing to resume
            kills.append(Kill(round(time.time() - t0, 2), sig.name, now, 1, False))
            log(f"  the driver finished before its {sig.name}")
            return time.time() - t0, kills
        expected = 130 if sig == signal.SIGTERM else -sig
        if process.returncode != expected:
            raise RuntimeError(f"the driver ended with {process.returncode} on {sig.name}, not {expected}:\n"
                               f"{output[-3000:]}")
        kills.append(Kill(round(time.time() - t0, 2), sig.name, now, 1, True))
        log(f"  {sig.name} the driver at {kills[-1].at:.2f} s ({now} of {shards} shards committed), "
            "resubmitted with --resume")
    finish(driver(cluster, args + ["--resume"]), timeout)
    return time.time() - t0, kills


# ---- the benchmark ----

def timed(cluster, args: list[str], timeout: float = 900) -> float:
    t0 = time.time()
    finish(driver(cluster, args), timeout)
    return time.time() - t0


def outcome(problems: list[str], kills: list[Kill], wanted: int) -> tuple[str, str]:
    """(the kills column: how many landed mid-job on work, the verdict)."""
    landed = sum(k.landed for k in kills)
    column = str(landed) if landed == len(kills) else f"{landed} of {len(kills)} mid-job"
    if problems:
        return column, "FAIL: " + "; ".join(problems)
    return column, "PASS" if landed >= wanted else f"PASS, but only {landed} of {wanted} kills landed mid-job"


def run_job(cluster, name: str, suffix: str, verify, args, base: str, rng: random.Random, a) -> list[tuple]:
    """The reference, node-chaos and driver-chaos runs of one job: table rows (scenario, kills, wall, ratio,
    verdict). A run that fails or hangs is a FAIL row, and the next job still runs."""
    ref = os.path.join(base, "reference")
    print(f"{name}: reference run", flush=True)
    wall = timed(cluster, args(ref))
    shards = committed(ref, suffix)
    rows = [(name, "reference", "0", wall, 1.0, "PASS" if storage.read_manifest(ref) else "FAIL: no manifest")]
    print(f"  {wall:.1f} s, {shards} shards", flush=True)
    for scenario, wanted in (("nodes", a.kills), ("driver", 2)):
        print(f"{name}: {'worker nodes killed' if scenario == 'nodes' else 'driver killed and resubmitted'}",
              flush=True)
        out = os.path.join(base, scenario)
        t0 = time.time()
        try:
            if scenario == "nodes":
                seconds, kills = node_chaos(cluster, args(out), out, suffix, rng, kill_points(rng, shards, a.kills),
                                            tuple(a.pause))
            else:
                seconds, kills = driver_chaos(cluster, args(out), out, suffix, shards, rng)
            column, verdict = outcome(verify(out, ref), kills, wanted)
        except RuntimeError as exc:  # the driver failed or hung
            seconds, column, verdict = time.time() - t0, "?", "FAIL: " + str(exc).splitlines()[0]
            print(str(exc)[-3000:], flush=True)
        print(f"  {seconds:.1f} s: {verdict}", flush=True)
        rows.append((name, scenario, column, seconds, seconds / wall, verdict))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=12, help="train rows per source in the fixture mirror (default 12)")
    p.add_argument("--rows-per-shard", type=int, default=1, help="build shard size (default 1: many small units)")
    p.add_argument("--embed-rows-per-shard", type=int, default=1, help="embed shard size (default 1)")
    p.add_argument("--kills", type=int, default=5, help="node kills per job (default 5)")
    p.add_argument("--pause", type=float, nargs=2, default=(0.5, 3.0),
                   help="seconds a killed node stays down, uniform (default 0.5 3)")
    p.add_argument("--health-check", default=None, metavar="PERIOD_MS,FAILURES",
                   help="how soon Ray's head declares a silent node dead (default: Ray's, 3000,5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--formats", default="parquet,webdataset", help="build formats (default parquet,webdataset)")
    p.add_argument("--jobs", default="build,embed", help="build, embed or both (default); embed reads the first "
                   "format's reference build")
    p.add_argument("--work", default=None, help="work folder, kept (default: a new one in /tmp, removed)")
    a = p.parse_args()
    if a.work and os.path.exists(a.work):
        p.error(f"--work {a.work} exists: give a new folder")
    os.environ.pop("RAY_ADDRESS", None)
    from support import raycluster

    from mieb_ray.demo_data.mirror import make_mirror
    from mieb_ray.demo_data.models import make_tiny_clip

    work = a.work or tempfile.mkdtemp(prefix="mieb-chaos-", dir="/tmp")  # short: Ray's socket paths
    os.makedirs(work, exist_ok=True)
    rng, rows, started = random.Random(a.seed), [], time.time()
    try:
        mirror, clip = os.path.join(work, "mirror"), os.path.join(work, "clip")
        written = make_mirror(mirror, rows=a.rows)
        make_tiny_clip(clip)
        print(f"mirror: {sum(written.values())} rows in {len(written)} sources; starting the cluster", flush=True)
        os.makedirs(os.path.join(work, "ray"))
        env = {"HF_HOME": os.path.join(work, "hf"), "HF_HUB_OFFLINE": "1"}  # nothing outside the work folder
        if a.health_check:
            period, failures = a.health_check.split(",")
            env.update(RAY_health_check_period_ms=period, RAY_health_check_failure_threshold=failures)
        cluster = raycluster.start(os.path.join(work, "ray"), env, {"node_a": 2, "node_b": 2})
        try:
            formats = a.formats.split(",")
            jobs = []
            if "build" in a.jobs:
                jobs += [(f"build ({fmt})", ".tar" if fmt == "webdataset" else ".parquet", verify_build,
                          lambda out, fmt=fmt: ["build", "--sources", mirror, "--out", out, "--format", fmt,
                                                "--rows-per-shard", str(a.rows_per_shard), "--cpus-per-worker", "0.5"])
                         for fmt in formats]
            if "embed" in a.jobs:
                table = os.path.join(work, f"build ({formats[0]})", "reference")  # made by the first build job
                jobs.append(("embed", ".arrow", verify_embed,
                             lambda out: ["embed", "--input", table, "--out", out, "--model", clip, "--batch-size", "4",
                                          "--rows-per-shard", str(a.embed_rows_per_shard), "--gpus-per-worker", "0",
                                          "--workers", "2", "--cpus-per-worker", "0.5"]))
            for name, suffix, verify, args in jobs:
                if name == "embed" and not os.path.exists(table):  # --jobs embed: its input made first
                    timed(cluster, ["build", "--sources", mirror, "--out", table, "--format", formats[0],
                                    "--rows-per-shard", str(a.rows_per_shard)])
                rows += run_job(cluster, name, suffix, verify, args, os.path.join(work, name), rng, a)
        finally:
            cluster.stop()
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    report(rows, a, time.time() - started)


def report(rows: list[tuple], a, seconds: float) -> None:
    import ray

    lines = ["| job | scenario | kills | wall s | x reference | verdict |", "|---|---|---|---|---|---|"]
    lines += [f"| {job} | {scenario} | {kills} | {wall:.1f} | {ratio:.2f} | {verdict} |"
              for job, scenario, kills, wall, ratio, verdict in rows]
    detection = a.health_check or "Ray's default, 3000,5"
    print("\n" + "\n".join(lines))
    print("\n--- for bench/RESULTS.md ---\n\n## Chaos: worker nodes and drivers killed again and again (issue 29)\n")
    print("\n".join(lines))
    print("  \n".join([  # Markdown line breaks
        f"\nCommand: `.venv/bin/python bench/chaos.py {' '.join(sys.argv[1:])}` (seed {a.seed}; {seconds:.0f} s)",
        f"Fixture mirror of {a.rows} train rows per source; build --rows-per-shard {a.rows_per_shard}; embed of the "
        f"Parquet build with a tiny CLIP, --rows-per-shard {a.embed_rows_per_shard}. A head (no CPU) and two worker "
        f"nodes of 2 CPUs on one machine (tests/support/raycluster.py); node health check (period ms, failures) "
        f"{detection}.",
        f"nodes: at {a.kills} random points of the job (shards committed), a worker node holding some of its workers "
        f"SIGKILLed (raylet, object store, workers at once), started again after {a.pause[0]:g}-{a.pause[1]:g} s; "
        "driver: the driver SIGKILLed, then SIGTERMed, at random points, each time resubmitted with --resume. kills: "
        "those that landed while the job ran, on a node holding its work. Wall: first driver start to last exit.",
        "Verdict: every key once (counted in the shard files), the sha256 of every file (build) or every vector "
        "within 1e-6 (embed) as the reference's, the same files as the reference (no staging or progress file left), "
        "each shard's sha256 as its manifest records, manifest shards and counts equal.",
        f"CPUs: {os.cpu_count()}; Python {platform.python_version()}, Ray {ray.__version__}"]))


if __name__ == "__main__":
    import harness  # here, not above: tests/system/test_chaos.py imports this module as bench.chaos

    harness.wrap(main, "chaos", "Build and embed on three Ray nodes under node and driver kills", group="Chaos")
