"""The embed job's CPU feed on Ray against the CPU decode ceiling, on photos of mixed sizes (issue 40: on an H200 the
ViT-B/32 job ran at 68% of the ceiling with the GPU 17% busy, so the CPUs' feed bounded it).

  decode ceiling       bench/gpu_encode.decode_rate: `load_image` one photo at a time in --cpus processes, the same
                       photos: the bound bench/gpu_embed.py names
  read tasks           the embed job's read stage (encode/stages.read_stage) as the job runs it on Ray: a Ray Data
                       task per unit (1 CPU each; the job's units: pipelines/embed.unit_rows) on a Ray of --cpus
                       CPUs, reading its rows from Parquet, decoding and resizing them into the unit's block; this
                       process takes each block from the object store and drops it (what the CPUs alone can feed)
  embed job            `embed()` of this checkout on Ray, its encoder instant (bench/instant: a fixed vector per
                       image, no normalising; the model loaded, never run), on a Ray of --cpus + 1 CPUs: its encoder
                       actor's own and --cpus for the rest, as a GPU node's encoder holds one of its CPUs
  embed job, REF       with --baseline REF: the same on a git worktree of REF (its Ray workers checked to import it)

Each run is a fresh process with its own Ray; its rate counts the rows that arrive after its first wave of units
(one per read CPU, started together), over the time since (Ray's start, the model's load, the workers' imports and
the first wave left out): blocks as the driver takes them, or the job's committed units as their progress records
appear. Per image inside the read tasks: wall, user and system CPU milliseconds (getrusage around read_stage).
--rows photos of 160 to 800 px a side, --distinct of them different, in Parquet files of 2,000 rows
(bench/gpu_embed.write_photos, as the device run's).

Run from the repository root (a quiet machine):
    .venv/bin/python bench/embed_feed.py --baseline HEAD~1
    .venv/bin/python bench/embed_feed.py --rows 4000 --repeat 1 --records /tmp/records   # a smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported

INSTANT = h.BENCH / "instant"  # the instant encoder's sitecustomize
CLIP_B32 = {"crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_normalize": True,
            "do_rescale": True, "do_resize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3, "rescale_factor": 0.00392156862745098,
            "size": {"shortest_edge": 224}}  # openai/clip-vit-base-patch32's preprocessor_config.json


def child(repo: str, photos: str, cpus: int) -> None:
    """One run of the read tasks on a Ray of its own; prints its figures as JSON."""
    sys.path.insert(0, repo)
    import numpy as np
    import ray

    import mieb_ray
    from mieb_ray.encode.preprocess import ImageSpec
    from mieb_ray.encode.stages import read_stage
    from mieb_ray.io import reader
    from mieb_ray.pipelines.embed import EmbedConfig, table_units, unit_rows

    spec = ImageSpec.from_processor_config(CLIP_B32).to_dict()
    _, files = reader.input_files(photos)
    shard_rows = next(f.default for f in dataclasses.fields(EmbedConfig) if f.name == "rows_per_shard")
    units = table_units(files, unit_rows(shard_rows, spec))  # the job's units at its defaults
    columns = reader.TableColumns("key", "image", ())

    def timed_read(batch, **kw):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = read_stage(batch, **kw)
        r1, n = resource.getrusage(resource.RUSAGE_SELF), len(out["key"])
        out["__ms"] = np.tile([(time.perf_counter() - t0) * 1e3 / n, (r1.ru_utime - r0.ru_utime) * 1e3 / n,
                               (r1.ru_stime - r0.ru_stime) * 1e3 / n], (n, 1))
        out["__code"] = np.full(n, os.path.dirname(mieb_ray.__file__))
        return out

    ray.init(num_cpus=cpus, include_dashboard=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": repo}})
    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.from_items([{"unit": i} for i in range(len(units))], override_num_blocks=len(units))
    ds = ds.map_batches(timed_read, batch_size=1, num_cpus=1,
                        fn_kwargs=dict(units=units, columns=columns, modality="image", spec=spec))
    arrived, per_image, code = [], [], set()  # (time, rows) of each block as it comes
    for block in ds.iter_batches(batch_size=None, batch_format="numpy"):
        arrived.append((time.perf_counter(), len(block["key"])))
        per_image.append(block["__ms"][0])
        code.add(str(block["__code"][0]))
    assert code == {os.path.join(repo, "mieb_ray")}, f"the read tasks ran {code}, not {repo}'s code"
    if len(arrived) <= cpus:
        sys.exit(f"{len(arrived)} units on {cpus} CPUs: too few for a rate after the first wave (more --rows)")
    # from the end of the first wave (one unit per CPU, started together) to the last unit: the rows since
    (start, _), (end, _) = arrived[cpus - 1], arrived[-1]
    wall, user, system = np.mean(per_image[cpus:], axis=0)
    print(json.dumps({"rows_s": sum(n for _, n in arrived[cpus:]) / (end - start), "rows": sum(n for _, n in arrived),
                      "task_ms": [wall, user, system]}))


def job_child(repo: str, photos: str, cpus: int, model: str, out: str) -> None:
    """One run of the embed job (its encoder instant: INSTANT on PYTHONPATH) on a Ray of its own; prints its
    figures as JSON."""
    import glob
    import threading

    import ray

    import mieb_ray
    from mieb_ray.pipelines.embed import EmbedConfig, embed

    ray.init(num_cpus=cpus + 1, include_dashboard=False, logging_level="ERROR")  # + the encoder actor's CPU
    ray.data.DataContext.get_current().enable_progress_bars = False
    where = ray.get(ray.remote(lambda: os.path.dirname(__import__("mieb_ray").__file__)).remote())
    assert where == os.path.dirname(mieb_ray.__file__) == os.path.join(repo, "mieb_ray"), (where, repo)
    committed, seen, done = [], set(), threading.Event()  # (time, rows) of each unit as its record appears

    def watch():
        while not done.is_set():
            for path in glob.glob(os.path.join(out, "_progress", "*.json")):
                if path not in seen:
                    try:
                        with open(path) as f:
                            rows = json.load(f)["result"]["rows"]
                    except (OSError, ValueError):
                        continue  # being written: next round
                    seen.add(path)
                    committed.append((time.perf_counter(), rows))
            time.sleep(0.05)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        manifest = embed(EmbedConfig(photos, out, model, executor="ray", overwrite=True), log=lambda _: None)
    finally:
        done.set()
        watcher.join()
    assert manifest["counts"]["total"] == sum(n for _, n in committed), "a unit's record was missed"
    if len(committed) <= cpus:
        sys.exit(f"{len(committed)} units on {cpus} CPUs: too few for a rate after the first wave (more --rows)")
    committed.sort()
    (start, _), (end, _) = committed[cpus - 1], committed[-1]
    print(json.dumps({"rows_s": sum(n for _, n in committed[cpus:]) / (end - start),
                      "rows": manifest["counts"]["total"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--distinct", type=int, default=4096)
    ap.add_argument("--cpus", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", help="a git commit whose embed job runs beside this checkout's")
    ap.add_argument("--work", type=Path, default=Path(__file__).parent / "_work" / "embed_feed")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--job-child", nargs=5, help=argparse.SUPPRESS)
    h.add_records_option(ap)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], int(args.child[2]))
    if args.job_child:
        repo, photos, cpus, model, out = args.job_child
        return job_child(repo, photos, int(cpus), model, out)

    sys.path[:0] = [str(h.ROOT), str(h.ROOT / "tests")]  # the tests' support: a ViT-B/32-sized CLIP
    from support.models import make_clip_b32

    from bench.gpu_embed import write_photos
    from bench.gpu_encode import decode_rate
    from mieb_ray.encode.preprocess import ImageSpec

    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    photos = write_photos(str(work / "photos"), args.rows, args.distinct)
    model = make_clip_b32(str(work / "model"))  # its preprocessing is CLIP_B32's
    spec = ImageSpec.from_processor_config(CLIP_B32)
    jobs = {"embed job": str(h.ROOT)}
    if args.baseline:
        tree = work / "baseline"
        subprocess.run(["git", "-C", str(h.ROOT), "worktree", "add", "--detach", "-f", str(tree), args.baseline],
                       check=True, capture_output=True)
        jobs[f"embed job, {args.baseline}"] = str(tree)

    def fresh(argv: list[str], repo: str, env: dict) -> dict:
        got = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, cwd=repo, env=env)
        if got.returncode:
            sys.exit(f"{argv[0]} on {repo} failed:\n{got.stderr[-3000:]}")
        out = json.loads(got.stdout.strip().splitlines()[-1])
        return {"seconds": 10_000 / out["rows_s"], **out}

    def reads(i):
        return fresh(["--child", str(h.ROOT), str(work / "photos"), str(args.cpus)], str(h.ROOT), h.fresh_process_env())

    def job(repo: str):
        env = {**h.fresh_process_env(), "PYTHONPATH": os.pathsep.join([str(INSTANT), repo])}
        return lambda i: fresh(["--job-child", repo, str(work / "photos"), str(args.cpus), model, str(work / "out")],
                               repo, env)

    contenders = [h.Contender("decode ceiling", f"load_image one photo at a time in {args.cpus} processes",
                              call=lambda i: 10_000 / decode_rate(photos[:256], spec, args.cpus, 5)),
                  h.Contender("read tasks", f"read_stage as Ray Data tasks of the job's units on {args.cpus} CPUs, "
                                            "blocks dropped", call=reads, baseline="decode ceiling")]
    contenders += [h.Contender(name, f"embed() of {'this checkout' if repo == str(h.ROOT) else args.baseline} on "
                                     f"Ray, instant encoder, {args.cpus} CPUs + the encoder's, committed units",
                               call=job(repo), baseline="decode ceiling") for name, repo in jobs.items()]
    try:
        record = h.run(h.Benchmark(
            "embed_feed", f"The embed job's CPU feed on Ray against the CPU decode ceiling: {args.rows:,} photos of "
            f"160-800 px ({args.distinct:,} distinct), ViT-B/32's 224 px, {args.cpus} CPUs", contenders, group="Embed",
            ratio=("embed job", f"embed job, {args.baseline}" if args.baseline else "decode ceiling"),
            repeat=args.repeat, unit="s per 10,000 images",
            columns=[("images/s (median)", lambda r: f"{10_000 / r.median:,.0f}"),
                     ("in a read task, ms per image: wall / user / system", lambda r: " / ".join(
                         f"{v:.2f}" for v in (sum(x[k] for x in r.extra("task_ms")) / len(r.extra("task_ms"))
                                              for k in range(3))) if r.extra("task_ms") else "")]))
        record.finish(notes=[
            "Rates count the rows after each run's first wave of units (one per read CPU), over the time since "
            "(Ray's start, the model's load, the workers' imports and the first wave left out); every run a fresh "
            "process with its own Ray.",
            "Everything shares the machine's cores with this process and Ray's own: the read tasks with the process "
            "that takes their blocks, the job's with its driver, its encoder actor and its commit tasks.",
            "The job's read tasks run as many at once as Ray Data's budget gives them: up to 0531777 its commit "
            "stage (0.25 CPU a task, no cap) held the CPUs the budget left over, and the job ran 1 read task at a time "
            "of the 2 its CPUs allow (tests/unit/runtime/test_units.py)."])
    finally:
        if args.baseline:
            subprocess.run(["git", "-C", str(h.ROOT), "worktree", "remove", "--force", str(work / "baseline")],
                           capture_output=True)

if __name__ == "__main__":
    main()
