"""Does `eval` on a GPU give mteb's scores, and how far from them is `eval --fast`? Embeddings made on the GPU
machine, scored here against mteb's own run (the GPU machine has neither mteb nor datasets).

  prepare DIR         here, on the CPU: a fixture mirror of a task of every type the eval has (the hand-built
                      suites' and mteb's: TASKS), a tiny CLIP, and the eval of all of them twice with --model: as it
                      is (exact) into DIR/exact, with --fast into DIR/fast; DIR/index.json lists every embed output
                      (folder, input table, key, modality, raw, mode), all relative to DIR (it travels)
  device DIR OUT      on the GPU machine (imports mieb_ray's embed job, numpy, pyarrow, torch; no mteb, no
                      datasets): every output of the index embedded again with its mode's settings (exact: what eval
                      does; fast: what eval --fast does, on Ray as eval would: nvJPEG where --decode auto picks it);
                      per output the rows, max |diff| and min cosine against the CPU's exact vectors, the seconds;
                      OUT/gpu_eval.tar.gz holds the vectors (npz) and a summary
  score DIR TARBALL   here: per mode, DIR's eval output copied, the device's vectors swapped into its embedding
                      shards (keys, manifests and identities kept), the eval run again on it (its embeddings reused:
                      no embed may run), every task compared with mteb.evaluate of mteb's CLIP wrapper on the CPU;
                      a bench record (bench/records/gpu_eval.json) when the vectors came from a GPU
  --cpu-smoke         the three steps here, the CPU as the device (no record): exact must equal mteb everywhere

The fast swap is a measurement device: the CPU's --fast run made the outputs (their manifests say fast, bf16 where a
GPU is, decode auto), and the GPU's fast vectors replace its vectors, so the eval scores what eval --fast on the GPU
would have embedded.

    .venv/bin/python bench/gpu_eval.py prepare .gpu_eval               # then carried to the device as .gpu_eval/
    python3 bench/gpu_eval.py device .gpu_eval "$out"                   # on the device (bench/gpu_check.sh)
    .venv/bin/python bench/gpu_eval.py score .gpu_eval OUT/gpu_eval.tar.gz
    .venv/bin/python bench/gpu_eval.py --cpu-smoke
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # mieb_ray from this checkout, as `python3 bench/x.py`
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
MODES = ("exact", "fast")
# task type -> a task of it: the hand-built suites', then mteb's own code's
TASKS = {"zero-shot": "CIFAR10ZeroShot", "linear probe": "CIFAR10", "clustering": "CIFAR10Clustering",
         "retrieval (SciMMIR)": "SciMMIRI2TRetrieval", "VisualSTS": "STS12VisualSTS",
         "Compositionality": "AROCocoOrder", "multilabel": "VOC2007", "VisionCentricQA": "CVBenchCount",
         "Any2Any retrieval": "Flickr30kT2IRetrieval", "Any2Any fused (it2i)": "CIRRIT2IRetrieval",
         "DocumentUnderstanding": "VidoreArxivQARetrieval", "ImageClustering": "ImageNet10Clustering"}


def _quiet(*_):
    pass


def _redone(line: str) -> None:
    if "redoing" in line:  # why an output is not reused (then no_embed stops the score)
        print(line)


def _mteb_env() -> None:
    """A fresh `datasets` cache, offline, and tests/ on the path: before datasets or mteb are imported."""
    os.environ.update(HF_HOME=tempfile.mkdtemp(prefix="gpu-eval-hf-"), HF_HUB_OFFLINE="1",
                      HF_DATASETS_DISABLE_PROGRESS_BARS="1", PYTHONWARNINGS="ignore")
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


# ---------------------------------------------------------------------------------------------- prepare (CPU)


def prepare(root: Path) -> None:
    _mteb_env()
    from support.hub_tasks import compositionality, retrieval, sts, tasks_misc

    from mieb_ray.demo_data import mirror as fixture_mirror
    from mieb_ray.demo_data.models import make_tiny_clip
    from mieb_ray.evals import job, registry

    root = root.resolve()  # the model's path names it (a local model's name): score must find it where it was
    if root.exists():
        shutil.rmtree(root)
    mirror = root / "mirror"
    # SciMMIR's rows 0-4: before the fixture's null and blank captions (rows 5, 6), which the eval refuses by design
    fixture_mirror.make_mirror(mirror, rows={"cifar10": 60, "scimmir": 2}, datasets=["cifar10", "scimmir"],
                               eval_rows={"cifar10": 40, "scimmir": 5}, files=1)
    writers = {**tasks_misc.TASKS, **sts.TASKS, **compositionality.TASKS, **retrieval.TASKS}
    for write in dict.fromkeys(writers[t] for t in TASKS.values() if t in writers):
        write(str(mirror))
    model = make_tiny_clip(str(root / "model"))
    for mode in MODES:
        t0 = time.time()
        job.evaluate(registry.select(",".join(TASKS.values())), registry.Options(str(mirror)), str(root / mode),
                     log=_quiet, model=model, executor="local", fast=mode == "fast")
        print(f"[gpu_eval] eval ({mode}) on the CPU: {time.time() - t0:.1f}s")
    # the run's cache: every vector the suites read comes from it (their embed outputs are views of it, made anew)
    outputs = [_entry(root, m, Path(m).parent.relative_to(root))
               for m in sorted(root.glob("*/embeddings/cache/*/*/_manifest.json"))]
    (root / "index.json").write_text(json.dumps({"model": "model", "mirror": "mirror", "tasks": TASKS,
                                                 "outputs": outputs}, indent=1) + "\n")
    for items in root.glob("*/**/embeddings/mteb/_items"):  # what mteb's loaders gave: in DIR/inputs/ now, and
        shutil.rmtree(items)  # each eval collects it again
    print(f"[gpu_eval] {len(outputs)} embed outputs in {root}/index.json")


def _entry(root: Path, manifest: Path, folder: Path) -> dict:
    """A cache output's index entry; its input (deleted once embedded) written again, relative to DIR."""
    m = json.loads(manifest.read_text())
    config = m["config"]
    source = _cache_input(root, folder, config["modality"])
    return {"output": str(folder), "input": str(source.resolve().relative_to(root.resolve())),
            "key": config["key_column"], "modality": config["modality"], "image_column": config["image_column"],
            "text_column": config["text_column"], "raw": config["raw"], "mode": "exact" if config["exact"] else "fast",
            "rows": m["counts"]["total"]}


def _cache_input(root: Path, folder: Path, modality: str) -> Path:
    """DIR/inputs/<kind>-<digest of its keys>.parquet: a cache output's items (key, image or text) taken again from
    what the eval's suites read (mteb's item tables; the hand-built suites' tables keyed by content)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mieb_ray.evals.mteb_keys import image_key
    from mieb_ray.io import embeddings, parquet

    keys, _ = embeddings.read_all(str(root / folder))
    kind = "images" if modality == "image" else "texts"
    run = root / folder.parts[0]
    items = {}
    for table in sorted(run.glob(f"**/embeddings/mteb/_items/*/{kind}.parquet")):
        for k, v in zip(*pq.read_table(table).columns):
            items.setdefault(k.as_py(), v.as_py())
    if kind == "images":  # the eval splits and the probe's drawn rows
        for table in sorted(p for p in run.glob("**/*.parquet") if {"eval-data", "probe-train"} & set(p.parts)):
            for value in parquet.image_bytes(pq.read_table(table, columns=["image"])["image"]).to_pylist():
                items.setdefault(image_key(value), value)
    else:  # prompts and captions: tables keyed by the text
        for table in sorted(run.glob("**/embeddings/_*/*.parquet")):
            items.update((t, t) for t in pq.read_table(table, columns=["key"])["key"].to_pylist())
    target = root / "inputs" / f"{kind}-{hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:12]}.parquet"
    if not target.exists():  # named by its keys: the exact and fast caches hold the same items, written once
        target.parent.mkdir(parents=True, exist_ok=True)
        column = pa.array([items[k] for k in keys], pa.binary() if kind == "images" else pa.string())
        pq.write_table(pa.table({"key": keys, kind[:-1]: column}), target)
    return target


# ---------------------------------------------------------------------------------------------- device (GPU)


def device(root: Path, out: Path, fast_executor: str = "auto") -> None:
    """Every output of the index embedded again here: vectors, diffs against the CPU's exact ones, seconds."""
    import torch

    from mieb_ray.io import embeddings
    from mieb_ray.pipelines.embed import EmbedConfig, embed

    root, index = root.resolve(), json.loads((root / "index.json").read_text())
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    reference = {_role(e): e for e in index["outputs"] if e["mode"] == "exact"}
    work, out = Path(tempfile.mkdtemp(prefix="gpu-eval-")), out.resolve()
    import transformers

    from mieb_ray.encode.pixels import alpha_onto_white

    # the machine's transformers decides how a transparent image becomes RGB (preprocess._to_rgb): score() runs
    # mteb's reference under the same rule
    summary = {"device": name, "torch": torch.__version__, "transformers": transformers.__version__,
               "alpha_onto_white": alpha_onto_white(), "outputs": []}
    t_all = time.time()
    try:
        for e in index["outputs"]:
            target = work / e["mode"] / e["output"].replace("/", "__")
            config = EmbedConfig(str(root / e["input"]), str(target), str(root / index["model"]),
                                 modality=e["modality"], key_column=e["key"], image_column=e["image_column"],
                                 text_column=e["text_column"], raw=e["raw"], exact=e["mode"] == "exact",
                                 executor="local" if e["mode"] == "exact" or e["modality"] == "text"
                                 else fast_executor)
            t0 = time.time()
            manifest = embed(config, log=_quiet)
            seconds = time.time() - t0
            keys, vectors = embeddings.read_all(str(target))
            cpu = reference[_role(e)]
            stats = _compare(keys, vectors, *embeddings.read_all(str(root / cpu["output"])))
            np.savez(work / f"{e['mode']}__{e['output'].replace('/', '__')}.npz", keys=np.array(keys), vectors=vectors)
            summary["outputs"].append({**e, **stats, "seconds": round(seconds, 3), "counts": manifest["counts"],
                                       "executor": manifest["executor"]})
            print(f"[gpu_eval] {e['mode']:5s} {e['output']:60s} {stats['rows']:5d} rows  max|diff| "
                  f"{stats['max_abs_diff']:.3g}  min cos {stats['min_cosine']:.6f}  {seconds:.2f}s", flush=True)
        summary["seconds"] = round(time.time() - t_all, 3)
        (work / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out / "gpu_eval.tar.gz", "w:gz") as tar:
            for f in sorted(work.glob("*.npz")) + [work / "summary.json"]:
                tar.add(f, arcname=f.name)
        print(f"[gpu_eval] {name}: {len(summary['outputs'])} outputs in {summary['seconds']:.1f}s -> "
              f"{out / 'gpu_eval.tar.gz'} ({(out / 'gpu_eval.tar.gz').stat().st_size / 2**20:.2f} MiB)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _role(entry: dict) -> str:
    """What a cache output is within its mode's eval, the same for its exact and fast twins (whose folders are
    named by digests that differ): its modality and input, named by the keys it holds."""
    return f"{entry['modality']}: {Path(entry['input']).name}"


def _compare(keys, vectors, ref_keys, ref) -> dict:
    at = {k: i for i, k in enumerate(ref_keys)}
    assert set(keys) == set(at), "the device's keys are not the CPU's"
    theirs = ref[[at[k] for k in keys]].astype(np.float64)
    ours = vectors.astype(np.float64)
    cos = (ours * theirs).sum(1) / np.maximum(np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1), 1e-30)
    return {"rows": len(keys), "max_abs_diff": float(np.abs(ours - theirs).max()) if len(keys) else 0.0,
            "min_cosine": float(cos.min()) if len(keys) else 1.0}


# ---------------------------------------------------------------------------------------------- score (CPU)


def score(root: Path, tarball: Path, record: bool = True, alpha_onto_white: bool | None = None) -> dict:
    """Per mode, the eval rerun on the device's vectors and compared with mteb's own run: per task type, exact
    equal or its first difference, fast the largest |difference| of the main score and of any metric. mteb runs
    under the device's rule for transparent images (its transformers': the summary says, or `alpha_onto_white`
    for a tarball from before it did), as mteb on that machine would."""
    _mteb_env()
    from _pytest.monkeypatch import MonkeyPatch
    from support import rgb_rules
    from support.mteb_tasks import assert_same_scores, mteb_result

    from mieb_ray.evals import job, registry
    from mieb_ray.pipelines import embed as embed_job

    root, index = root.resolve(), json.loads((root / "index.json").read_text())
    work = Path(tempfile.mkdtemp(prefix="gpu-eval-score-"))
    try:
        with tarfile.open(tarball) as tar:
            tar.extractall(work / "device", filter="data")
        summary = json.loads((work / "device" / "summary.json").read_text())
        mirror, model = str(root / index["mirror"]), str(root / index["model"])  # the model where prepare saved it:
        onto_white = summary.get("alpha_onto_white", alpha_onto_white)
        if onto_white is None:
            raise SystemExit("the tarball does not say how its machine's transformers makes transparent images RGB: "
                             "pass --alpha-onto-white yes (5.21 on) or no (before)")
        with rgb_rules.rule(onto_white, MonkeyPatch()):  # a local model's name is its path
            theirs = {t: mteb_result(t, mirror, model) for t in TASKS.values()}
        found = {}

        def no_embed(*a, **k):  # every embedding must be reused: the swapped vectors are what is scored
            raise AssertionError("the eval embedded again instead of reusing the swapped embeddings")

        real_plan, embed_job._plan = embed_job._plan, no_embed
        try:
            for mode in MODES:
                shutil.copytree(root / mode, work / mode)  # copy2: the inputs' times, part of their identity, kept
                for e in index["outputs"]:
                    if e["mode"] == mode:
                        _swap(work / e["output"], work / "device" / f"{mode}__{e['output'].replace('/', '__')}.npz")
                ours = job.evaluate(registry.select(",".join(TASKS.values())), registry.Options(mirror),
                                    str(work / mode), log=_redone, model=model, executor="local",
                                    fast=mode == "fast", overwrite=True)
                for kind, task in TASKS.items():
                    assert ours[task]["mieb_ray"]["embeddings"]["mode"] == mode
                    found.setdefault(kind, {})[mode] = _differences(ours[task], theirs[task], assert_same_scores)
        finally:
            embed_job._plan = real_plan
        for kind, d in found.items():
            print(f"[gpu_eval] {kind:24s} {TASKS[kind]:24s} exact: {d['exact']['equal'] or d['exact']['first']}"
                  f" | fast: main {d['fast']['main']:.2e}, any metric {d['fast']['any']:.2e}"
                  f" ({d['fast']['metric']})")
        if record and summary["device"] != "cpu":
            _record({**summary, "alpha_onto_white": onto_white}, found)
        return found
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _swap(output: Path, npz: Path) -> None:
    """The device's vectors in place of an output's, row by row by key; keys, schema, manifest kept."""
    import pyarrow as pa

    from mieb_ray.io import embeddings

    data = np.load(npz)
    at = {k: i for i, k in enumerate(data["keys"].tolist())}
    for uri in embeddings.shard_uris(str(output)):
        table = embeddings.open_shard(uri)
        rows = data["vectors"][[at[k] for k in table["key"].to_pylist()]]
        column = table.schema.field("embedding")
        values = pa.array(rows.reshape(-1).astype(column.type.value_type.to_pandas_dtype()))
        table = table.set_column(table.schema.get_field_index("embedding"), column,
                                 pa.FixedSizeListArray.from_arrays(values, rows.shape[1]))
        with pa.OSFile(uri + ".tmp", "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
            writer.write_table(table)
        os.replace(uri + ".tmp", uri)


def _differences(ours: dict, theirs: dict, assert_same) -> dict:
    try:
        assert_same(ours, theirs)
        equal, first = True, None
    except AssertionError as exc:
        equal, first = False, str(exc)[:200]
    diffs = {}

    def walk(a, b, where):
        if isinstance(b, dict):
            for k in b:
                if k in a:
                    walk(a[k], b[k], f"{where}/{k}")
        elif isinstance(b, list):
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{where}[{i}]")
        elif isinstance(b, float | int) and not isinstance(b, bool) and isinstance(a, float | int) and a == a \
                and b == b:
            diffs[where] = abs(a - b)

    for split, entries in theirs["scores"].items():
        for mine, ref in zip(ours["scores"][split], entries):
            walk({k: v for k, v in mine.items() if k != "evaluation_time"},
                 {k: v for k, v in ref.items() if k != "evaluation_time"}, f"{split}/{ref['hf_subset']}")
    main = max((v for k, v in diffs.items() if k.endswith("/main_score")), default=0.0)
    metric = max(diffs, key=diffs.get) if diffs else "-"
    return {"equal": equal, "first": first, "main": main, "any": diffs.get(metric, 0.0), "metric": metric}


def _record(summary: dict, found: dict) -> None:
    import harness as h

    h.portable_argv()  # the device's tarball lies in a folder of this machine's own
    seconds = {m: [sum(o["seconds"] for o in summary["outputs"] if o["mode"] == m)] for m in MODES}
    bench = h.Benchmark("gpu_eval", f"eval's embeddings made on {summary['device']}, exact and --fast, scored "
                        "against mteb's own run on the CPU (a task of every type, a tiny CLIP)", [
        h.Contender("exact", "embed every output as eval does (CPU decode, float32), seconds on the device"),
        h.Contender("fast", "embed every output as eval --fast does (bf16, --decode auto)", baseline="exact")],
        kind="calibration", group="Eval")
    h.measured(bench, seconds).finish(figures={
        "by task type": {k: {"task": TASKS[k], "exact equals mteb": d["exact"]["equal"],
                             "exact first difference": d["exact"]["first"], "fast max |main score diff|":
                             round(d["fast"]["main"], 6), "fast max |metric diff|": round(d["fast"]["any"], 6),
                             "fast metric": d["fast"]["metric"]} for k, d in found.items()},
        "vectors": {f"{o['mode']} {o['output']}": {"rows": o["rows"], "max_abs_diff": o["max_abs_diff"],
                                                    "min_cosine": o["min_cosine"]} for o in summary["outputs"]},
        "device": summary["device"], "torch": summary["torch"], "transformers": summary.get("transformers"),
        "transparency onto white (the device's transformers' rule; mteb's reference ran under it)":
            summary["alpha_onto_white"]}, notes=[
        "Vectors made on the device, scored here: per mode DIR's eval output with the device's vectors swapped in, "
        "the eval rerun on them (no embedding redone), every task compared with mteb.evaluate of mteb's CLIP "
        "wrapper on this CPU. The fast swap is a measurement device: the outputs' manifests are the CPU --fast run's.",
        "max |diff| and min cosine: each output's vectors against the CPU's exact ones (eval's reference)."])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="prepare, device (this CPU) and score, no record")
    sub = parser.add_subparsers(dest="step")
    sub.add_parser("prepare").add_argument("dir", type=Path)
    dev = sub.add_parser("device")
    dev.add_argument("dir", type=Path)
    dev.add_argument("out", type=Path)
    dev.add_argument("--fast-executor", default="auto", choices=("auto", "ray", "local"),
                     help="where fast image outputs embed (auto: as eval --fast does; Ray on a GPU machine)")
    sc = sub.add_parser("score")
    sc.add_argument("dir", type=Path)
    sc.add_argument("tarball", type=Path)
    sc.add_argument("--alpha-onto-white", choices=("yes", "no"),
                    help="the device's transformers' rule for transparent images (yes: 5.21 on), where the tarball "
                         "does not say")
    args = parser.parse_args()
    if args.cpu_smoke:
        work = Path(tempfile.mkdtemp(prefix="gpu-eval-smoke-"))
        try:
            prepare(work / "dir")
            device(work / "dir", work / "out", "local")
            score(work / "dir", work / "out" / "gpu_eval.tar.gz", record=False)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    elif args.step == "prepare":
        prepare(args.dir)
    elif args.step == "device":
        device(args.dir, args.out, args.fast_executor)
    elif args.step == "score":
        score(args.dir, args.tarball, alpha_onto_white=None if args.alpha_onto_white is None
              else args.alpha_onto_white == "yes")
    else:
        parser.error("a step: prepare, device or score (or --cpu-smoke)")


if __name__ == "__main__":
    main()
