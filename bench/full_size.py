"""The full-size rehearsal (issue 29): every job at its real row counts, on this machine, one command; never in CI.

Tiny payloads, real shapes: what is measured is the jobs' per-row work and memory, not the pictures' bytes.
Stages (each count times --scale; 1.0 = real size):
  build     `build` of all 23 sources (4,434,196 rows out) from bench/build_rows.py's synthetic hub-layout mirror
            (ensure_mirror: hub_rows(), 4 parquet files a source, tars of 10,000 rows, one 80-byte payload per
            image: the build copies image bytes, it never decodes them). Its output is kept: embed's input.
  embed     `embed --modality text` of the build's output, every row's caption, with the instant encoder of
            bench/embed_driver.py (bench/instant/sitecustomize.py: Encoder.encode_texts returns a fixed unit
            vector) and a tiny CLIP with 512-d embeddings (loaded, never run), float32 shards written. Texts, not
            images: the image path would decode and resize 4.4M images (its cost is bench/preprocess.py's, and
            the model's is the GPU's), which no stand-in makes instant without faking what is measured.
  zeroshot, probe, biovita   the eval stages of bench/full_size_evals.py (its docstring), loaded if present.
  audit     `audit --against mieb`: the build's output at --audit-scale (default 0.05, when below --scale) with
            every image replaced by a distinct 16x16 RGB noise PNG (~850 bytes, PDQ quality 100), against the
            23 MIEB eval splits at the catalog's sizes times the same scale (a mirror in the hub's layout, eval
            images distinct noise PNGs; one eval image in 1,000 is a byte copy of a train image: the pairs to
            find) and the BioVITA-shaped corpus (~3,000 photos, always real size, as bench/eval_biovita.py).
            The hash stage really hashes (sha256, pixels, four PDQ hashes a picture), then the join and the pdq
            pair search. Its full size would take a day here (hash ~6 ms a picture a core, pdq ~2.6e13
            comparisons): its phases are timed apart and projected, the pair search as the square of the scale.
Each stage's `prepare` (inputs, cached in --work, not timed) and `run` (the timed job) run in a fresh child process
(`full_size.py --child STAGE`); the jobs run on a local Ray that the child starts (`--executor ray`), except the
eval stages, which run as `mieb-ray` runs them. Measured per stage:
  wall      seconds from the child's spawn to its exit (Python and Ray start-up included);
  CPU       user + system seconds of the child and every descendant (Ray's GCS, raylet, workers), summed over
            processes from samples every 0.25 s (the last value seen per process: a process's last < 0.25 s,
            and any process that lived < 0.25 s, are missed); the machine's load average beside it;
  RSS       the driver's peak (the child's ru_maxrss) and the largest peak of any one Ray worker (`ray::` in its
            command line; sampled; object-store pages it maps counted);
  read      the sum over processes of /proc/<pid>/io rchar (every read(): files from the page cache or disk,
            Python's imports, sockets and pipes, so Ray's RPC too), over the stage's input bytes;
  spilled   Ray's object spilling counters (memory_summary(stats_only=True)), read before Ray shuts down.
Then the phases of each run (Ray start-up, the job's steps), projected to full size (CPU and wall here scale as
scale^p: 0 for start-up, 1 for per-row work, 2 for the audit's pair search), and a cost model: the time on a
256-core, 16-GPU cluster from the per-core rates, its assumptions printed with it. A Markdown block for
bench/RESULTS.md closes the output; each stage's figures also go to WORK/results-SCALE.json as they come.

Projections from small scales overstate: a step's own start-up (actors, tasks) is projected with its per-row work;
at 0.05 and above it is small. Run from the repository root (--scale 0.1: about 20 minutes on an idle machine, most
of it the audit at 0.05; --scale 1.0: an hour or more):
    .venv/bin/python bench/full_size.py --scale 0.01                      # a quick check
    .venv/bin/python bench/full_size.py --scale 0.1 --stages build,embed,audit
    .venv/bin/python bench/full_size.py                                    # full size; the audit at 0.05
Run through the harness (wrapped): what it prints becomes bench/records/full_size.json (--records DIR elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
FULL_ROWS = 4_434_196  # mieb-train's rows
CLUSTER_CORES, CLUSTER_GPUS = 256, 16
DIM = 512  # embedding size (ViT-B/32's; the eval stages' too)
MIRROR_FILES = 4  # parquet train files per source, as bench/build_rows.py
AUDIT_SCALE = 0.05
PLANT_EVERY = 1_000  # one eval image in this many copies a train image
BIOVITA = dict(species_queries=288, genus_queries=289, single_genera=258)  # bench/eval_biovita.py's ~3,000 photos
SAMPLE_S = 0.25


@dataclass
class Stage:
    prepare: Callable[[Path, float], dict]  # (work dir, scale) -> {"input_bytes": int, ...}; untimed, cached in work
    run: Callable[[Path, float], dict]  # (work dir, scale) -> {"rows": int, "note": str, ...}; the timed job
    # run may also return "scale" (the scale it ran at, if not the one given), "full_rows" (its rows at full
    # size, if not rows / scale) and "phases": {name: [t0, t1, p] or [t0, t1, p, tasks]} (time.time() bounds of
    # a step whose cost grows as scale^p, and the most tasks it splits into at full size, if that limits the
    # cores it can use); the rest of the run is taken to grow as scale, on any number of cores


# ---------------------------------------------------------------------------------------------- in the child


class Phases:
    """The timed steps of a run: `with phases("name", p): ...`; phases.bounds is what run() returns."""

    def __init__(self):
        self.bounds: dict[str, list[float]] = {}

    @contextmanager
    def __call__(self, name: str, exponent: int = 1):
        t0 = time.time()
        try:
            yield
        finally:
            self.bounds[name] = [t0, time.time(), exponent]

    def wrap(self, module, function: str, name: str, exponent: int = 1) -> None:
        """Time every call of module.function as phase `name` (the job calls it by its module-level name)."""
        original = getattr(module, function)

        def timed(*args, **kwargs):
            with self(name, exponent):
                return original(*args, **kwargs)
        setattr(module, function, timed)


def start_ray(work: Path) -> None:
    """A new local Ray (never another's cluster), set up as the jobs' own (cluster.ray_up), files in work/ray."""
    import ray

    from mieb_ray.hubfs import worker_runtime_env
    from mieb_ray.runtime.cluster import worker_soft_limit

    ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             _temp_dir=str(work / "ray"), runtime_env=worker_runtime_env(),
             _system_config={"num_workers_soft_limit": worker_soft_limit(os.cpu_count() or 1)})
    ray.data.DataContext.get_current().enable_progress_bars = False


def spill_stats() -> dict:
    """Ray's spilling counters, from its memory summary ("Spilled N MiB, M objects"; absent: none spilled)."""
    import ray
    from ray._private.internal_api import memory_summary

    text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    found = re.search(r"Spilled (\d+) MiB, (\d+) objects", text)
    return {"spilled_mib": int(found[1]) if found else 0, "spilled_objects": int(found[2]) if found else 0}


def watch_ray_shutdown(record: dict) -> None:
    """Once Ray is imported, wrap ray.shutdown so that the spill counters are read just before Ray goes, whoever
    shuts it down (the job's command does: cluster.own_ray), added up over the Rays of the run. Polls sys.modules:
    nothing imports Ray for it."""
    def patch():
        while not hasattr(sys.modules.get("ray"), "shutdown"):
            time.sleep(0.05)
        ray = sys.modules["ray"]
        original = ray.shutdown

        def shutdown(*args, **kwargs):
            if ray.is_initialized():
                try:
                    for key, n in spill_stats().items():
                        record[key] = record.get(key, 0) + n
                except Exception as exc:  # noqa: BLE001  a measurement, never the job's failure
                    record["spill_error"] = f"{type(exc).__name__}: {exc}"
            return original(*args, **kwargs)
        ray.shutdown = shutdown
    threading.Thread(target=patch, daemon=True).start()


def child(args) -> None:
    """One stage's prepare or run in this process; a JSON record (result or error, times, driver RSS) to --result."""
    import resource

    record = {"t_start": time.time()}
    watch_ray_shutdown(record)
    try:
        stage = stage_named(args.child, args.audit_scale)
        record["result"] = (stage.prepare if args.phase == "prepare" else stage.run)(args.work.resolve(), args.scale)
    except BaseException:  # noqa: BLE001  reported as the stage's failure, then the next stage
        record["error"] = traceback.format_exc()
    record["t_end"] = time.time()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()  # wrapped: the spill counters first
    record["driver_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    Path(args.result).write_text(json.dumps(record))


def log(line: str) -> None:
    print(f"    {line}", flush=True)


# ---------------------------------------------------------------------------------------------- build, embed


def mirror_dir(work: Path, scale: float) -> Path:
    return work / "build" / f"mirror-{scale:g}"


def train_dir(work: Path, scale: float) -> Path:
    return work / "build" / f"train-{scale:g}"


def expected_train_rows(scale: float) -> int:
    import harness as h

    h.use_test_fixtures()
    from support.mirror import hub_rows, kept_rows

    return sum(kept_rows({s: max(1, int(n * scale)) for s, n in hub_rows().items()}).values())


def build_prepare(work: Path, scale: float) -> dict:
    import _baselines as b
    from build_rows import ensure_mirror

    rows = ensure_mirror(mirror_dir(work, scale), scale, MIRROR_FILES)
    files = b.train_files(mirror_dir(work, scale), list(rows))  # what the build reads
    return {"input_bytes": sum(os.path.getsize(f) for f in files), "rows_in": sum(rows.values()),
            "expected_rows": expected_train_rows(scale)}


def build_run(work: Path, scale: float) -> dict:
    from mieb_ray.pipelines.build import BuildConfig, build

    phases = Phases()
    with phases("ray start", 0):
        start_ray(work)
    with phases("build"):
        manifest = build(BuildConfig(str(mirror_dir(work, scale)), str(train_dir(work, scale)), overwrite=True,
                                     executor="ray"), log=log)
    return {"rows": manifest["counts"]["total"], "full_rows": FULL_ROWS, "phases": phases.bounds,
            "note": f"{len(manifest['shards'])} Parquet shards"}


def ensure_train(work: Path, scale: float) -> Path:
    """The build's output at this scale: the one a build stage left, else built now (a prepare: not timed)."""
    out = train_dir(work, scale)
    manifest = out / "_manifest.json"
    if not (manifest.exists() and json.loads(manifest.read_text())["counts"]["total"] == expected_train_rows(scale)):
        import ray

        build_prepare(work, scale)
        build_run(work, scale)
        ray.shutdown()
    return out


def table_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.parquet"))


def model_dir(work: Path) -> Path:
    return work / "embed" / f"clip-{DIM}"


def make_model(work: Path) -> None:
    """A tiny CLIP with DIM-d embeddings, made once (the instant encoder never runs it)."""
    from mieb_ray.demo_data.models import save_clip

    if not (model_dir(work) / "config.json").exists():
        tower = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
        save_clip(str(model_dir(work)), tower, dict(tower, image_size=64, patch_size=16), DIM, seed=0)


def embed_prepare(work: Path, scale: float) -> dict:
    import shutil

    table = ensure_train(work, scale)
    make_model(work)
    shutil.rmtree(work / "embed" / "out", ignore_errors=True)  # the last run's embeddings (9 GB at full size)
    return {"input_bytes": table_bytes(table), "expected_rows": expected_train_rows(scale)}


def embed_run(work: Path, scale: float) -> dict:
    from mieb_ray.encode import model as encoder
    from mieb_ray.pipelines.embed import EmbedConfig, embed

    if encoder.Encoder.encode_texts.__module__ != "sitecustomize":
        raise RuntimeError("the instant encoder is not loaded: bench/instant must be on PYTHONPATH")
    phases = Phases()
    with phases("ray start", 0):
        start_ray(work)
    out = work / "embed" / "out"
    with phases("embed"):
        manifest = embed(EmbedConfig(str(train_dir(work, scale)), str(out), str(model_dir(work)), modality="text",
                                     executor="ray", overwrite=True), log=log)
    written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"rows": manifest["counts"]["total"], "full_rows": FULL_ROWS, "phases": phases.bounds,
            "note": f"texts (captions) of the build's output, instant encoder, {DIM}-d float32: "
                    f"{len(manifest['shards'])} shards, {written / 2**30:.2f} GiB written"}


# ---------------------------------------------------------------------------------------------- audit


# 8 x 8 noise made PDQ hashes whose 16-bit chunks crowd (17x the pdq search's candidates of uniform hashes: it searched
# them by brute force); 16 x 16 makes 1.4x, as pictures do (1.5x: bench/audit_pdq_search.py --distributions)
NOISE_SIDE = 16


def noise_png(seed: str) -> bytes:
    """A NOISE_SIDE x NOISE_SIDE RGB PNG of sha256 noise: distinct per seed, decodable, PDQ quality 100."""
    import hashlib
    import io

    from PIL import Image

    size = NOISE_SIDE * NOISE_SIDE * 3
    raw = b"".join(hashlib.sha256(f"{seed}#{i}".encode()).digest() for i in range(-(-size // 32)))[:size]
    buf = io.BytesIO()
    Image.frombytes("RGB", (NOISE_SIDE, NOISE_SIDE), raw).save(buf, "PNG")
    return buf.getvalue()


def eval_image(source, index: int) -> bytes:
    """An eval image: a byte copy of train row <slug>/<index> for one index in PLANT_EVERY, else its own noise."""
    return noise_png(f"train/{source.slug}/{index}" if index % PLANT_EVERY == 7 else f"eval/{source.slug}/{index}")


def with_noise_images(src: Path, dst: Path) -> int:
    """The built table with each row's image replaced by noise_png("train/<key>"), same files, row groups and
    manifest (shard checksums stale: the reader trusts a mieb-train manifest). Returns rows."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.rmtree(dst, ignore_errors=True)
    rows = 0
    for path in sorted(p for p in src.rglob("*.parquet") if not any(s.startswith((".", "_")) for s in
                                                                    p.relative_to(src).parts)):
        meta = pq.ParquetFile(path).metadata
        table = pq.read_table(path)
        image = table["image"].combine_chunks()
        images = [noise_png(f"train/{k}") for k in table["key"].to_pylist()]
        column = pa.StructArray.from_arrays([pa.array(images, image.type.field("bytes").type), image.field("path")],
                                            fields=list(image.type))
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.set_column(table.schema.get_field_index("image"), "image", column), target,
                       row_group_size=(meta.row_group(0).num_rows if meta.num_row_groups else 0) or None)
        rows += table.num_rows
    shutil.copy(src / "_manifest.json", dst / "_manifest.json")
    return rows


def eval_rows(scale: float) -> dict[str, int]:
    from mieb_ray.sources import select

    return {s.slug: max(1, int(s.eval_rows * scale)) for s in select(None)}


def planted(train: Path, scale: float) -> int:
    """How many eval images are byte copies of a row of the train table (the exact pairs the audit must find)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    keys = pa.array([f"{slug}/{i}" for slug, n in eval_rows(scale).items() for i in range(7, n, PLANT_EVERY)])
    return sum(pc.sum(pc.is_in(keys, value_set=pq.read_table(p, columns=["key"])["key"])).as_py() or 0
               for p in train.rglob("*.parquet"))


def audit_inputs(work: Path, scale: float) -> dict:
    """The train table and the eval mirror at this scale, made once (a marker file holds what they hold)."""
    import harness as h
    from build_rows import TAR_ROWS

    from mieb_ray.demo_data.biovita import make_biovita_mirror
    from mieb_ray.demo_data.mirror import make_mirror

    h.use_test_fixtures()
    from support.biovita import describe

    from mieb_ray.sources import select

    folder = work / "audit"
    marker = folder / f"prepared-{scale:g}-{NOISE_SIDE}px.json"
    if marker.exists():
        return json.loads(marker.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    train = folder / f"train-{scale:g}"
    print(f"[audit] train table at scale {scale:g}: the build's output, images replaced by noise PNGs ...", flush=True)
    train_rows = with_noise_images(ensure_train(work, scale), train)
    mirror = folder / f"eval-mirror-{scale:g}"
    print(f"[audit] eval mirror: {sum(eval_rows(scale).values()):,} rows of the 23 eval splits + BioVITA ...",
          flush=True)
    make_mirror(mirror, rows={s.slug: 1 for s in select(None)}, files=1, image_bytes=eval_image, tar_rows=TAR_ROWS,
                eval_rows=eval_rows(scale))
    corpus = describe(make_biovita_mirror(mirror, **BIOVITA))["corpus"]
    done = {"input_bytes": table_bytes(train) + sum(p.stat().st_size for p in mirror.rglob("*")
                                                    if p.is_file() and ".cache" not in p.parts),
            "train_rows": train_rows, "eval_rows": sum(eval_rows(scale).values()) + corpus,
            "planted": planted(train, scale), "prepare_seconds": round(time.perf_counter() - t0, 1)}
    marker.write_text(json.dumps(done))
    return done


def audit_prepare_at(work: Path, scale: float) -> dict:
    import shutil

    shutil.rmtree(work / "audit" / "out", ignore_errors=True)  # the eval splits it built: each run builds them
    return audit_inputs(work, scale)


def audit_run_at(work: Path, scale: float) -> dict:
    from mieb_ray.audit import hashes, join, pdq, plan
    from mieb_ray.audit.job import AuditConfig, audit

    prepared = audit_inputs(work, scale)
    phases = Phases()
    with phases("ray start", 0):
        start_ray(work)
    for module, function, name, exponent in ((plan, "against_side", "eval splits", 1), (hashes, "hash_all", "hash", 1),
                                             (join, "pairs", "join", 1), (pdq, "pairs", "pdq search", 2)):
        phases.wrap(module, function, name, exponent)  # the job calls each phase through its module
    manifest = audit(AuditConfig(str(work / "audit" / f"train-{scale:g}"), ("mieb",), str(work / "audit" / "out"),
                                 sources=str(work / "audit" / f"eval-mirror-{scale:g}"), overwrite=True,
                                 executor="ray"), log=log)  # its planning and writing: the rest of the run
    counts = manifest["counts"]
    exact = json.loads((work / "audit" / "out" / "summary.json").read_text())["totals"]["pairs"].get("exact", 0)
    corpus = prepared["eval_rows"] - sum(eval_rows(scale).values())  # BioVITA's photos: real size at any scale
    full_rows = FULL_ROWS + sum(eval_rows(1.0).values()) + corpus
    phases.bounds["join"].append(-(-full_rows // plan.PARTITION_ROWS))  # one task per join partition
    # one task per batch of train rows: at most PDQ_BATCH_ROWS, at least two a CPU of the cluster (pdq.batches; the
    # other way as many again, of eval rows)
    phases.bounds["pdq search"].append(max(-(-FULL_ROWS // pdq.PDQ_BATCH_ROWS), 2 * CLUSTER_CORES))
    return {"rows": counts["train_rows"] + counts["eval_rows"], "scale": scale, "phases": phases.bounds,
            "full_rows": full_rows,
            "train_rows": counts["train_rows"], "eval_rows": counts["eval_rows"],
            "note": f"{counts['train_rows']:,} train x {counts['eval_rows']:,} eval rows hashed, at scale {scale:g}; "
                    f"exact pairs {exact:,} of {prepared['planted']:,} planted; pairs {counts['pairs']}; "
                    f"undecodable {counts['errors']:,}"}


def audit_stage(audit_scale: float) -> Stage:
    """The audit at min(scale, audit_scale)."""
    return Stage(prepare=lambda work, scale: audit_prepare_at(work, min(scale, audit_scale)),
                 run=lambda work, scale: audit_run_at(work, min(scale, audit_scale)))


def own_stages(audit_scale: float) -> dict[str, Stage]:
    return {"build": Stage(build_prepare, build_run), "embed": Stage(embed_prepare, embed_run),
            "audit": audit_stage(audit_scale)}


def stage_named(name: str, audit_scale: float) -> Stage:
    """One of ours, else one of bench/full_size_evals.py's (imported only then)."""
    if name in (own := own_stages(audit_scale)):
        return own[name]
    import full_size_evals

    return full_size_evals.STAGES[name]


def all_stages(audit_scale: float) -> tuple[dict[str, Stage], str | None]:
    """build, embed, the eval stages of bench/full_size_evals.py (if it loads: else why not), audit."""
    own, evals, problem = own_stages(audit_scale), {}, None
    try:
        import full_size_evals

        evals = full_size_evals.STAGES
    except Exception as exc:  # noqa: BLE001  the evals are optional: reported, the rest goes on
        problem = f"bench/full_size_evals.py not loaded: {type(exc).__name__}: {exc}"
    return {"build": own["build"], "embed": own["embed"], **evals, "audit": own["audit"]}, problem


# ---------------------------------------------------------------------------------------------- the parent


class TreeSampler:
    """Every SAMPLE_S s in a thread: the child and its descendants' CPU times and rchar (last seen per process),
    the largest RSS of a Ray worker, and the running CPU total (for the phases)."""

    def __init__(self, pid: int):
        import psutil

        self.psutil, self.root = psutil, psutil.Process(pid)
        self.cpu, self.rchar, self.task_rss, self.series, self.load = {}, {}, 0, [(time.time(), 0.0)], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except self.psutil.Error:
            return
        for p in procs:
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    times = p.cpu_times()
                    self.cpu[key] = times.user + times.system
                    self.rchar[key] = p.io_counters().read_chars
                    if (p.cmdline() or [""])[0].startswith("ray::"):
                        self.task_rss = max(self.task_rss, p.memory_info().rss)
            except self.psutil.Error:  # gone, or not ours to read
                pass
        self.series.append((time.time(), sum(self.cpu.values())))
        self.load.append(os.getloadavg()[0])  # the whole machine's: other work slows the wall time

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(SAMPLE_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_at(self, t: float) -> float:
        """The CPU total of the last sample at or before t."""
        import bisect

        return self.series[max(0, bisect.bisect_right([s[0] for s in self.series], t) - 1)][1]


def spawn(args, name: str, phase: str) -> tuple[dict, TreeSampler | None, float, float]:
    """Run `--child name --phase phase`; (its record, the sampler (runs only), spawn and exit times)."""
    work = args.work.resolve()
    result = work / f"{name}-{phase}.json"
    result.unlink(missing_ok=True)
    paths = [str(BENCH / "instant")] if name == "embed" else []  # the instant encoder: embed's only
    paths += [str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    env.pop("RAY_ADDRESS", None)
    argv = [sys.executable, __file__, "--child", name, "--phase", phase, "--work", str(work), "--scale",
            str(args.scale), "--audit-scale", str(args.audit_scale), "--result", str(result)]
    t0 = time.time()
    proc = subprocess.Popen(argv, env=env, cwd=REPO)
    sampler = TreeSampler(proc.pid) if phase == "run" else None
    proc.wait()
    t1 = time.time()
    if sampler:
        sampler.stop()
    record = json.loads(result.read_text()) if result.exists() else {"error": f"exited {proc.returncode}, no record"}
    return record, sampler, t0, t1


def measure(args, name: str) -> dict:
    """prepare (untimed), then the measured run, of one stage: its row of the report."""
    print(f"\n[{name}] prepare (not timed) ...", flush=True)
    prepared, *_ = spawn(args, name, "prepare")
    if "error" in prepared:
        return {"stage": name, "error": "prepare: " + prepared["error"].strip().splitlines()[-1],
                "trace": prepared["error"]}
    print(f"[{name}] run ...", flush=True)
    record, sampler, t0, t1 = spawn(args, name, "run")
    if "error" in record:
        return {"stage": name, "error": "run: " + record["error"].strip().splitlines()[-1], "trace": record["error"]}
    result = record["result"]
    scale = result.get("scale", args.scale)
    rows, expected = result.get("rows", 0), prepared["result"].get("expected_rows")
    check = "" if expected is None else "rows as expected; " if rows == expected else f"EXPECTED {expected:,} ROWS; "
    return {"stage": name, "rows": rows, "note": check + result.get("note", ""), "scale": scale,
            "full_rows": result.get("full_rows", rows / scale),
            "wall": t1 - t0, "cpu": sampler.series[-1][1], "load": sum(sampler.load) / max(len(sampler.load), 1),
            "driver_rss": record["driver_rss"], "task_rss": sampler.task_rss,
            "read": sum(sampler.rchar.values()), "input_bytes": prepared["result"].get("input_bytes", 0),
            "spilled": (f"{record['spilled_mib']:,} MiB, {record['spilled_objects']:,} objects"
                        if "spilled_mib" in record else record.get("spill_error", "no Ray")),
            "phases": phase_table(record, sampler, t0, t1, scale), "extra": result}


def phase_table(record: dict, sampler: TreeSampler, t0: float, t1: float, scale: float) -> list[dict]:
    """Wall and CPU of each phase (start-up, the run's own phases, the rest of the run, shutdown), each also
    projected to full size as its cost x scale^-p."""
    def cpu(a: float, b: float) -> float:
        return max(0.0, sampler.cpu_at(b) - sampler.cpu_at(a))

    start, end = record["t_start"], record["t_end"]
    inner = [(name, *bounds[:3], (bounds[3:] or [None])[0])
             for name, bounds in record["result"].get("phases", {}).items()]
    phases = [("start-up (process, imports)", t0, start, 0, None), *inner,
              ("shutdown (Ray, exit)", end, t1 + 1, 0, None)]
    table = [{"phase": n, "wall": min(b, t1) - a, "cpu": cpu(a, b), "p": p, "tasks": k} for n, a, b, p, k in phases]
    table.insert(len(inner) + 1, {"phase": "rest of the run", "p": 1, "tasks": None,
                                  "wall": max(0.0, end - start - sum(b - a for _, a, b, _, _ in inner)),
                                  "cpu": max(0.0, cpu(start, end) - sum(cpu(a, b) for _, a, b, _, _ in inner))})
    for row in table:
        row["full_cpu"], row["full_wall"] = row["cpu"] / scale ** row["p"], row["wall"] / scale ** row["p"]
    return table


# ---------------------------------------------------------------------------------------------- report


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def cost_line(r: dict) -> list:
    """The cluster projection of one stage: full-size CPU seconds, per-core rate, time on CLUSTER_CORES cores."""
    fixed = sum(p["full_wall"] for p in r["phases"] if p["p"] == 0)
    work = sum(p["full_cpu"] for p in r["phases"] if p["p"] != 0)
    spread = sum(p["full_cpu"] / min(CLUSTER_CORES, p["tasks"] or CLUSTER_CORES) for p in r["phases"] if p["p"] != 0)
    full_rows = r["full_rows"]
    cluster = fixed + spread
    here = sum(p["full_wall"] for p in r["phases"])
    gpu = ("+ the GPU encode: unknown (no GPU figure in bench/RESULTS.md; bench/gpu_encode.py has not run on a GPU); "
           f"on {CLUSTER_GPUS} GPUs, {full_rows:,.0f} / ({CLUSTER_GPUS} x images/s per GPU)"
           if r["stage"] == "embed" else "CPU only")
    return [r["stage"], f"{full_rows:,.0f}", f"{here / 60:,.1f} min", f"{work:,.0f}",
            f"{full_rows / max(work, 1e-9):,.0f}", f"{fixed:.0f} s + {spread:,.0f} s = {cluster / 60:,.1f} min",
            gpu]


def main_row(r: dict, scale: float) -> list:
    """stage, rows, wall s, CPU s, rows / CPU-s, driver peak RSS, largest task RSS, read ÷ input, spilled."""
    read = f"{r['read'] / max(r['input_bytes'], 1):.2f} ({r['read'] / 2**30:.2f} / {r['input_bytes'] / 2**30:.2f} GiB)"
    return [r["stage"], f"{r['rows']:,}" + (f" (scale {r['scale']:g})" if r["scale"] != scale else ""),
            f"{r['wall']:.1f}", f"{r['cpu']:.1f}", f"{r['rows'] / max(r['cpu'], 1e-9):,.0f}", gib(r["driver_rss"]),
            gib(r["task_rss"]) if r["task_rss"] else "no Ray task", read, r["spilled"]]


def report(args, results: list[dict], problem: str | None) -> None:
    import harness as h

    ok = [r for r in results if "error" not in r]
    main = [main_row(r, args.scale) for r in ok]
    main += [[r["stage"], "FAILED", "", "", "", "", "", "", r["error"][:200]] for r in results if "error" in r]
    phases = [[r["stage"], p["phase"], f"{p['wall']:.1f}", f"{p['cpu']:.1f}", f"{p['p']}", f"{p['full_cpu']:,.0f}",
               f"{p['full_wall']:,.0f}", f"{p['tasks']:,}" if p["tasks"] else ""] for r in ok for p in r["phases"]]
    print("\n" + "=" * 100)
    print(f"### Full-size rehearsal (issue 29): scale {args.scale:g} of the real rows, tiny payloads\n")
    print(h.markdown_table(["stage", "rows", "wall s", "CPU s", "rows / CPU-s", "driver peak RSS",
                            "largest task RSS", "read ÷ input", "spilled"], main))
    print()
    for r in ok:
        print(f"- **{r['stage']}**: {r['note']}; machine load during the run (1-minute load average, mean) "
              f"{r['load']:.1f} on {os.cpu_count()} CPUs")
    if problem:
        print(f"- {problem}")
    print("\n#### Phases, and each projected to full size on this machine (its cost x scale^-p)\n")
    print(h.markdown_table(["stage", "phase", "wall s", "CPU s", "p", "full size: CPU s", "full size: wall s here",
                            "tasks at full size (if few)"], phases))
    print(f"\n#### Cost model: full size on a {CLUSTER_CORES}-core, {CLUSTER_GPUS}-GPU cluster\n")
    print(h.markdown_table(["stage", "rows at full size", "full size here (projected wall)",
                            "full size: CPU s of per-row work", "rows / CPU-s of per-row work",
                            f"on {CLUSTER_CORES} cores: start-up + CPU / min({CLUSTER_CORES}, tasks)", "GPU"],
                           [cost_line(r) for r in ok]))
    audit = next((r for r in ok if r["stage"] == "audit"), None)
    if audit:
        x = audit["extra"]
        pdq = next(p for p in audit["phases"] if p["phase"] == "pdq search")
        comparisons = x["train_rows"] * x["eval_rows"] * 6
        print(f"\n- audit measured at scale {audit['scale']:g} ({x['train_rows']:,} train x {x['eval_rows']:,} eval "
              f"rows): pdq search {comparisons / max(pdq['cpu'], 1e-9) / 1e9:.3f} G comparisons per CPU-second "
              "(counted as train x eval x 6 hash pairs; the search skips repeated and flat eval pictures, so its "
              "true rate is at most this), projected as scale^2; at full size it splits into "
              f"{pdq['tasks'] or '?'} tasks (a batch of train rows each, against every eval hash), so no more than "
              f"{pdq['tasks'] or '?'} cores work on it. Every other step is projected as scale (BioVITA's ~3,000 "
              "photos, fixed in size, with them: a slight overestimate).")
    print(f"""
Assumptions of the cost model: {CLUSTER_CORES} cores of this VM's speed, the per-row work spread evenly over them
with no loss (linear scaling), the build, the audit and the evals CPU-bound; the fixed start-up (Python, imports,
Ray) as measured here, once; inputs read from S3 as fast as from this local disk (not measured); embed's CPU side
is its text pipeline around an instant encoder (reading, moving rows, writing shards): the real image path adds
JPEG decode and resize on CPU (bench/RESULTS.md, "Embed: preprocessing") and the model on the GPUs. CPU seconds are
sampled every {SAMPLE_S} s per process (a process's last {SAMPLE_S} s is missed); read ÷ input counts every read()
(page cache, Python's imports, Ray's sockets and pipes) over the bytes of the stage's input files; the largest
task RSS is the peak of any one `ray::` process, the object-store pages it maps included.
""")
    h.footer(f"Each stage: `prepare` (inputs, cached in {args.work}, not timed) then `run` in a fresh process "
             "(build, embed and audit start their own local Ray; the eval stages run as `mieb-ray` does); wall time "
             "from spawn to exit.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=BENCH / "_work" / "full_size",
                    help="inputs, outputs and Ray's session files (default bench/_work/full_size, git-ignored)")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the real rows (default 1.0; 0.01 a quick "
                                                             "check)")
    ap.add_argument("--audit-scale", type=float, default=AUDIT_SCALE,
                    help=f"the audit runs at min(--scale, this) and is projected (default {AUDIT_SCALE})")
    ap.add_argument("--stages", help="comma-separated, in order (default: all: build, embed, the eval stages, audit)")
    for hidden in ("--child", "--phase", "--result"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    args.work.resolve().mkdir(parents=True, exist_ok=True)
    stages, problem = all_stages(args.audit_scale)
    names = args.stages.split(",") if args.stages else list(stages)
    results = []
    for name in names:
        if name not in stages:
            results.append({"stage": name, "error": f"no such stage (have: {', '.join(stages)})"
                                                    + (f"; {problem}" if problem else "")})
            continue
        results.append(r := measure(args, name))
        if "error" in r:
            print(f"[{name}] FAILED: {r['trace']}", flush=True)
        else:
            print(f"[{name}] {r['rows']:,} rows, {r['wall']:.1f}s, CPU {r['cpu']:.1f}s, driver {gib(r['driver_rss'])}, "
                  f"largest task {gib(r['task_rss'])}, spilled {r['spilled']}", flush=True)
        (args.work / f"results-{args.scale:g}.json").write_text(json.dumps(results, indent=1))  # so far
    report(args, results, problem)


if __name__ == "__main__":
    if "--child" in sys.argv:  # a stage's process, not the benchmark
        main()
    else:
        import harness

        harness.wrap(main, "full_size", "Full-size rehearsal: every job at its real row counts", group="Full size")
