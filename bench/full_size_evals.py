"""The eval stages of the full-size rehearsal (issue 29): mieb-ray's evals at the real row counts of their tasks,
as bench/full_size.py runs them (STAGES: `prepare` writes the inputs, not timed; `run` is the timed job).

Stages (every count times `scale`, at least one row per class; 1.0 = real size):
  zeroshot  `mieb-ray eval-zeroshot` on every task of its suite, at the real eval sizes of the catalog
            (sources/catalog.py, from mteb's descriptive stats): the 22 classification datasets' 970,944 images
            (UCF101 alone 697,222) and SciMMIR's 16,263, which the suite scores too: 987,207 in all. Data: the
            fixture mirror in the hub's layout (make_mirror: eval splits of 1x1 PNGs, as bench/eval_probe.py
            writes them, WebDataset eval splits in tars of 10,000 rows as on the hub; the eval never decodes an
            image); 512-d float32 image embeddings keyed `<slug>/<split>/<index>`, streamed in the embed job's
            layout (one output, one shard per 10,000 rows of a split: ~2 GB at real size, never all in memory);
            the text embeddings of mteb's and the fixed prompts (one shard). Each class has a random centre; a
            prompt lies near it, an image around it (TEXT_NOISE, IMAGE_NOISE), so accuracy is far from chance.
            bench/eval_zeroshot.py's make_zeroshot_embeddings is not used: it keeps every vector in memory and puts
            each on an exact lattice (about 10 ms a vector: hours at this size).
  probe     `mieb-ray eval` on the 19 linear-probe tasks: bench/eval_probe.py's data at `--scale` (real train and
            eval splits in the mirror, the drawn train rows and every eval row embedded; make_embeddings holds
            them all in memory: 6.4 GB peak at real size); mieb-ray's side only.
            Its 100 fits (16 drawn rows a class, five or ten times) cost the same at any scale: most of its run at
            small scales, so its run does not grow in proportion to the scale.
  biovita   `mieb-ray eval-biovita` on bench/eval_biovita.py's shape: 288 species + 289 genus queries, 3,004
            photos, 512-d. Always the real shape, whatever `scale` (it is small, and the fixture's special cases
            need most of its taxa); its run says so (scale 1.0).

Each stage keeps its inputs in WORK/<stage>/ (data/, embeddings, prepared.json: the scale they were made for and
their bytes; a prepare with the same scale reuses them) and its run's output in WORK/<stage>/out/ (replaced by
each run). `run` calls `mieb_ray.cli.main`, as `mieb-ray ...` would, with the default `--executor auto`, and
reads the executor the job took from its manifest.

Run from the repository root (prepare then run, each timed, one stage or all; --step prepare|run for one alone):
    .venv/bin/python bench/full_size_evals.py [--stage zeroshot|probe|biovita|all] [--scale 0.01] [--step both]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' support (embedding_fixtures)
from full_size import Stage  # noqa: E402

DIM = 512
SHARD_ROWS = 10_000  # rows per image-embedding shard: the embed job's default --rows-per-shard
TEXT_NOISE = 0.5  # how far a prompt lies from its class centre (centres and noise of norm ~1)
IMAGE_NOISE = 1.5  # how far an image lies from its class centre
MARKER = "prepared.json"


# ---------------------------------------------------------------------------------------------- shared


def _cached(work: Path, stage: str, scale: float, make: Callable[[Path], dict]) -> dict:
    """make(folder) into WORK/<stage>/ unless its marker says it was made for this scale; the marker last."""
    folder = work / stage
    marker = folder / MARKER
    if marker.exists() and (done := json.loads(marker.read_text()))["scale"] == scale:
        return done
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    info = make(folder)
    inputs = [folder / "data", *(folder / name for name in info.pop("embeddings"))]
    done = {"scale": scale, "input_bytes": sum(_bytes(p) for p in inputs), **info,
            "prepare_seconds": round(time.perf_counter() - t0, 1)}
    marker.write_text(json.dumps(done, indent=1) + "\n")
    return done


def _bytes(root: Path) -> int:
    """Bytes of the files under root, less the hub's download bookkeeping (.cache/), which no job reads."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts)


def _eval(work: Path, stage: str, argv: list[str]) -> dict:
    """`mieb-ray <argv> --out WORK/<stage>/out` in this process; from its manifest the executor it took and its
    seconds, and the phases for full_size.py: the job's own Ray start-up (its first cluster.ray_up call, a fixed
    cost), when it took Ray."""
    from mieb_ray import cli
    from mieb_ray.runtime import cluster

    out, phases, ray_up = work / stage / "out", {}, cluster.ray_up
    shutil.rmtree(out, ignore_errors=True)

    def timed_ray_up(ctx=None) -> None:
        t0 = time.time()
        ray_up(ctx)
        phases.setdefault("ray start", [t0, time.time(), 0])
    cluster.ray_up = timed_ray_up
    try:
        rc = cli.main([*argv, "--out", str(out)])
    finally:
        cluster.ray_up = ray_up
    if rc:
        raise RuntimeError(f"mieb-ray {' '.join(argv)} exited with {rc}")
    manifest = json.loads((out / "_manifest.json").read_text())
    return {"executor": manifest.get("executor"), "job_seconds": manifest.get("seconds"), "phases": phases}


def write_stream(out: Path, shards: Iterator[tuple[list[str], np.ndarray]], modality: str, config: dict) -> int:
    """Embedding shards as the embed job lays them out (part-NNNNN.arrow, manifest last), one (keys, vectors) at
    a time; returns the rows written."""
    from support.embedding_fixtures import MODEL

    from mieb_ray import __version__, formats, storage
    from mieb_ray.io import embeddings

    entries, schema = [], None
    for k, (keys, matrix) in enumerate(shards):
        schema = schema or formats.embedding_schema(DIM, "float32", None, {
            "model": MODEL | {"dim": DIM}, "modality": modality, "dtype": "float32", "normalized": True,
            "preprocessing": None, "package": f"mieb-ray {__version__}"})
        table = embeddings.shard_table(schema, keys, matrix, {})
        name = f"part-{k:05d}.arrow"
        stats = storage.commit_file(str(out / name), lambda local: embeddings.write_ipc(local, table))
        entries.append({"path": name, "rows": len(keys), **stats})
    total = sum(e["rows"] for e in entries)
    storage.write_manifest(str(out), {
        **formats.EMBEDDINGS.stamp(), "package": "mieb-ray", "version": __version__,
        "config": {"input": "fixture", "modality": modality, "dtype": "float32", **config},
        "model": MODEL | {"dim": DIM}, "dim": DIM, "preprocessing": None,
        "counts": {"total": total, "errors": 0}, "shards": entries, "error_files": []})
    return total


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


# ---------------------------------------------------------------------------------------------- zero-shot


def zeroshot_rows(scale: float) -> dict[str, int]:
    """Eval rows per task slug: the real count times scale, at least one per class."""
    from mieb_ray.demo_data.mirror import label_order
    from mieb_ray.evals.zeroshot_tasks import TASKS

    return {t.slug: min(t.source.eval_rows, max(round(t.source.eval_rows * scale), len(label_order(t.slug))))
            for t in TASKS}


def _zeroshot_make(folder: Path, scale: float) -> dict:
    import eval_probe

    from mieb_ray.demo_data.mirror import hub_names, make_mirror
    from mieb_ray.evals.zeroshot_tasks import TASKS

    rows = zeroshot_rows(scale)
    make_mirror(folder / "data", rows=1, datasets=list(rows), files=1, tar_rows=eval_probe.TAR_ROWS, eval_rows=rows,
                image_bytes=eval_probe.index_png)
    rng, texts, centres = np.random.default_rng(0), {}, {}
    for task in TASKS:  # a prompt's vector is its text's: shared texts (ImageNet's two "missile") are one vector
        names = hub_names(task.slug)
        centres[task.slug] = _unit(rng.standard_normal((len(task.mteb_prompts(names)), DIM)))
        for prompts in (task.mteb_prompts(names), task.fixed_prompts(names)):
            for label, text in enumerate(prompts):
                noise = rng.standard_normal(DIM) / np.sqrt(DIM)
                texts.setdefault(text, _unit(centres[task.slug][label] + TEXT_NOISE * noise))

    def images() -> Iterator[tuple[list[str], np.ndarray]]:
        for task in TASKS:  # keyed by position in the split as read (tars in name order), labelled as written
            n, prefix = rows[task.slug], task.key_prefix()
            labels = eval_probe.labels_of(task.slug, eval_probe.read_order(
                str(folder / "data"), task.slug, task.source.repo, task.source.eval_split, n))
            for lo in range(0, n, SHARD_ROWS):
                index = np.arange(lo, min(lo + SHARD_ROWS, n))
                noise = rng.standard_normal((len(index), DIM), dtype=np.float32) / np.float32(np.sqrt(DIM))
                yield ([f"{prefix}{i}" for i in index.tolist()],
                       _unit(centres[task.slug][labels[index]] + np.float32(IMAGE_NOISE) * noise))

    config = {"fixture": "bench/full_size_evals.py", "text_noise": TEXT_NOISE, "image_noise": IMAGE_NOISE}
    n = write_stream(folder / "img", images(), "image", config)
    write_stream(folder / "txt", iter([(list(texts), np.stack(list(texts.values())))]), "text", config)
    return {"rows": n, "prompts": len(texts), "tasks": len(TASKS), "embeddings": ["img", "txt"]}


def zeroshot_prepare(work: Path, scale: float) -> dict:
    return _cached(work, "zeroshot", scale, lambda folder: _zeroshot_make(folder, scale))


def zeroshot_run(work: Path, scale: float) -> dict:
    folder = work / "zeroshot"
    ran = _eval(work, "zeroshot", ["eval-zeroshot", "--data", str(folder / "data"), "--image-embeddings",
                                   str(folder / "img"), "--text-embeddings", str(folder / "txt")])
    rows = zeroshot_rows(scale)
    n, ucf = sum(rows.values()), rows["ucf101"]
    return {"rows": n, **ran,
            "note": f"eval-zeroshot, {len(rows)} tasks (the 22 classification tasks + SciMMIR), {n:,} eval images "
                    f"(UCF101 {ucf:,}), 512-d float32, both prompt sets; executor {ran['executor']}"}


# ---------------------------------------------------------------------------------------------- linear probe


def _probe_make(folder: Path, scale: float) -> dict:
    import eval_probe
    from eval_probe import TASKS, index_png, make_embeddings, sizes

    from mieb_ray.demo_data.mirror import make_mirror

    rows = {t.slug: sizes(t, scale) for t in TASKS}
    make_mirror(folder / "data", rows={s: r[0] for s, r in rows.items()}, datasets=list(rows), files=1,
                tar_rows=eval_probe.TAR_ROWS, eval_rows={s: r[1] for s, r in rows.items()}, image_bytes=index_png)
    drawn, evaluated = make_embeddings(TASKS, rows, str(folder / "data"), str(folder / "img-train"),
                                       str(folder / "img-eval"))
    return {"train_rows": sum(r[0] for r in rows.values()), "eval_rows": sum(r[1] for r in rows.values()),
            "drawn_rows": drawn, "embedded_eval_rows": evaluated, "shard_rows": eval_probe.SHARD_ROWS,
            "embeddings": ["img-train", "img-eval"]}


def probe_prepare(work: Path, scale: float) -> dict:
    return _cached(work, "probe", scale, lambda folder: _probe_make(folder, scale))


def probe_run(work: Path, scale: float) -> dict:
    from mieb_ray.evals.probe_tasks import TASKS

    folder = work / "probe"
    info = json.loads((folder / MARKER).read_text())
    ran = _eval(work, "probe", ["eval", "--tasks", ",".join(t.name for t in TASKS), "--sources", str(folder / "data"),
                                "--image-embeddings", f"{folder / 'img-train'},{folder / 'img-eval'}"])
    return {"rows": info["eval_rows"], **ran,
            "note": f"eval, {len(TASKS)} linear-probe tasks, {info['train_rows']:,} train rows (labels read; "
                    f"{info['drawn_rows']:,} drawn and embedded) + {info['eval_rows']:,} eval rows, 512-d float32; "
                    f"executor {ran['executor']}"}


# ---------------------------------------------------------------------------------------------- BioVITA


def _biovita_make(folder: Path) -> dict:
    from support.embedding_fixtures import make_biovita_embeddings

    from mieb_ray.demo_data.biovita import make_biovita_mirror

    mirror = make_biovita_mirror(folder / "data", species_queries=288, genus_queries=289, single_genera=258)
    make_biovita_embeddings(mirror, str(folder / "img"), str(folder / "txt"), dim=DIM, grid=None, spread=12.0)
    images = json.loads((folder / "img" / "_manifest.json").read_text())["counts"]["total"]
    return {"queries": 288 + 289, "images": images, "embeddings": ["img", "txt"]}


def biovita_prepare(work: Path, scale: float) -> dict:
    return _cached(work, "biovita", 1.0, _biovita_make)  # the real shape at any scale


def biovita_run(work: Path, scale: float) -> dict:
    folder = work / "biovita"
    info = json.loads((folder / MARKER).read_text())
    ran = _eval(work, "biovita", ["eval-biovita", "--data", str(folder / "data"), "--image-embeddings",
                                  str(folder / "img"), "--text-embeddings", str(folder / "txt")])
    return {"rows": info["queries"], "scale": 1.0, **ran,
            "note": f"eval-biovita, {info['queries']} queries (288 species + 289 genus) against {info['images']:,} "
                    f"photos, 512-d float32 (real shape at any scale); executor {ran['executor']}"}


STAGES = {"zeroshot": Stage(zeroshot_prepare, zeroshot_run), "probe": Stage(probe_prepare, probe_run),
          "biovita": Stage(biovita_prepare, biovita_run)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", default="all", choices=[*STAGES, "all"])
    ap.add_argument("--scale", type=float, default=0.01, help="fraction of the real row counts (default 0.01)")
    ap.add_argument("--work", type=Path, default=Path("bench/_work/full_size_evals"))
    ap.add_argument("--step", default="both", choices=["prepare", "run", "both"],
                    help="prepare, run (inputs prepared before) or both (default); one step a process measures it "
                         "alone, e.g. under /usr/bin/time -v")
    args = ap.parse_args()
    work = args.work.resolve()
    for name in STAGES if args.stage == "all" else [args.stage]:
        t0 = time.perf_counter()
        prepared = STAGES[name].prepare(work, args.scale) if args.step != "run" else {}
        t1 = time.perf_counter()
        ran = STAGES[name].run(work, args.scale) if args.step != "prepare" else {}
        t2 = time.perf_counter()
        print(json.dumps({"stage": name, "scale": args.scale, "prepare_s": round(t1 - t0, 1),
                          "run_s": round(t2 - t1, 1), **prepared, **ran,
                          "process_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10}), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # as the other benchmarks: a local Ray without token auth
    main()
