"""MIEB(Multilingual) (which holds MIEB(eng)), all 130 tasks, per mteb task type: `mieb-ray eval`'s whole call against
`mteb.evaluate`'s on the same embeddings; and the encodes per unique item of one `eval --model` of the benchmark.

Data: the 23 sources' mirror (mieb_ray/demo_data/mirror.py, --rows train and --eval-rows eval rows each; SciMMIR's
eval split at most 5 rows: its fixture's rows 5 and 6 have no caption on purpose, which the SciMMIR retrieval suite
refuses) and a mirror of each of the other 85 tasks in its hub repo's layout (tests/support/hub_tasks/), one root;
a tiny CLIP (make_tiny_clip). Not timed:
  warm   `mieb-ray eval --tasks "MIEB(Multilingual)" --sources MIRROR --model MODEL --out WARM`: embeds every input
         the benchmark needs, once; its outputs are the embeddings both contenders score from. Then the same with
         --overwrite, which must encode nothing. The rows its cache encoded over the benchmark's distinct items
         (by content) give "encodes per unique item".
  check  each contender once per type; every TaskResult of one compared with the other's (every metric of every
         split and subset, within 1e-6) before anything is timed. This also warms the `datasets` cache.
Contenders, per task type (mteb's `metadata.type`), interleaved, --repeat rounds, each a fresh process timed from
spawn to exit:
  1. mteb 2.26.24  bench/contenders/mteb_types_call.py: import mteb, read the type's vectors (one table keyed by
                   content: an image by the sha256 of its stored bytes, a text by itself; made untimed from the warm
                   run's outputs), one `mteb.evaluate` of the type's tasks with an encoder answering from the table,
                   mteb loading each task's data itself (warm `datasets` cache), TaskResults written
  2. mieb-ray      `mieb-ray eval --tasks <the type's tasks> --sources MIRROR --image-embeddings ... --text-embeddings
                   ... --out OUT` on the warm run's outputs (each suite's own: the hand-built suites' keyed by row,
                   the mteb suite's content-keyed cache). Where a type spans a hand-built suite with L2-normalised
                   embeddings and the mteb suite (zero-shot, Any2Any retrieval), one call cannot take both suites'
                   embeddings (the mteb suite refuses normalised vectors beside its raw ones): one call per suite,
                   their seconds summed.

Run from the repository root:
    .venv/bin/python bench/eval_types.py [--rows 40] [--eval-rows 20] [--repeat 3]
    .venv/bin/python bench/eval_types.py --rows 20 --eval-rows 5 --repeat 1 --records /tmp/records   # a smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported

# a fresh `datasets` cache, set before `datasets` is imported (it reads the place once): a cache shared with earlier
# runs can serve an old mirror's rows for a new one at a path of the same name
HF_HOME = tempfile.mkdtemp(prefix="bench-hf-")
os.environ.update(HF_HOME=HF_HOME, HF_HUB_OFFLINE="1")
h.use_test_fixtures()
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from support.hub_tasks import compositionality, retrieval, sts, tasks_misc  # noqa: E402
from support.mteb_tasks import assert_same_scores  # noqa: E402

from mieb_ray.demo_data.mirror import make_mirror  # noqa: E402
from mieb_ray.demo_data.models import make_tiny_clip  # noqa: E402
from mieb_ray.evals import benchmarks, registry  # noqa: E402
from mieb_ray.io import embeddings  # noqa: E402
from mieb_ray.sources import select as catalog  # noqa: E402

WRITERS = {**tasks_misc.TASKS, **sts.TASKS, **compositionality.TASKS, **retrieval.TASKS}
BENCHMARK = "MIEB(Multilingual)"
MTEB = "mteb 2.26.24"
FLOOR = "floor: `python -c 'import mteb'`"
CALL = h.CONTENDERS / "mteb_types_call.py"
SCIMMIR_EVAL_ROWS = 5  # the fixture's SciMMIR rows 5 (null) and 6 (blank) have no caption
ENCODE = re.compile(r"\[embed\] .*?([\d,]+) rows to encode")


def task_types() -> dict[str, list[str]]:
    """mteb's task type -> the benchmark's tasks of that type, in the benchmark's order."""
    import mteb

    types: dict[str, list[str]] = {}
    for name in benchmarks.BENCHMARKS[BENCHMARK]:
        types.setdefault(mteb.get_task(name).metadata.type, []).append(name)
    return types


def outputs(warm: Path, suite: str) -> tuple[list[Path], list[Path]]:
    """The complete embedding outputs (image, text) the warm run made for a suite."""
    if suite == "mteb":  # the run's content-keyed cache: OUT/embeddings/cache/<model>/{images,texts}-<digest>/
        base = next(p for p in (warm / "embeddings/cache").iterdir() if not p.name.startswith("_"))
        images, texts = base.glob("images-*"), base.glob("texts-*")
    else:
        images, texts = (warm / suite / "embeddings").glob("images*"), (warm / suite / "embeddings").glob("texts*")
    complete = lambda found: sorted(p for p in found if (p / "_manifest.json").exists())  # noqa: E731
    return complete(images), complete(texts)


def normalised(root: Path) -> bool:
    return not json.loads((root / "_manifest.json").read_text())["config"].get("raw")


def row_images(warm: Path, suite: str):
    """(key, image bytes) of every row a hand-built suite embedded: its eval splits and the probe's train draw."""
    for folder in ("eval-data", "probe-train"):
        for path in sorted((warm / suite / folder).glob("**/*.parquet")):
            table = pq.read_table(path, columns=["key", "image"])
            for key, image in zip(table["key"].to_pylist(), table["image"].to_pylist()):
                yield key, image["bytes"] if isinstance(image, dict) else image


def content_keyed(warm: Path, suite: str) -> dict[str, np.ndarray]:
    """A suite's vectors keyed as mteb's inputs are keyed (mieb_ray.evals.mteb_suite.inputs): the mteb suite's cache
    as it is; a hand-built suite's image vectors by the sha256 of their row's stored bytes (the build keeps a
    source's bytes as stored: the check fails on any input left without a vector), its texts by themselves."""
    images, texts = outputs(warm, suite)
    by_key = {k: v for root in images for k, v in zip(*embeddings.read_all(str(root)))}
    vectors = by_key if suite == "mteb" else {"sha256:" + hashlib.sha256(data).hexdigest(): by_key[key]
                                              for key, data in row_images(warm, suite) if key in by_key}
    for root in texts:
        vectors.update(zip(*embeddings.read_all(str(root))))
    return vectors


def write_vectors(path: Path, vectors: dict[str, np.ndarray]) -> None:
    matrix = np.stack(list(vectors.values())).astype(np.float32)
    pq.write_table(pa.table({"key": list(vectors), "vector": pa.FixedSizeListArray.from_arrays(
        pa.array(matrix.ravel()), matrix.shape[1])}), path)


def eval_calls(names: list[str], mirror: str, warm: Path) -> list[tuple[list[str], list[Path], list[Path]]]:
    """(tasks, image outputs, text outputs) of each `mieb-ray eval` call a type takes: one, unless its suites'
    embeddings cannot go to one call (normalised ones beside the mteb suite's)."""
    by_suite = [(suite.name, picked) for suite, picked in registry.select(",".join(names), log=lambda *a: None)]
    calls = []
    for suite, picked in by_suite:
        images, texts = outputs(warm, suite)
        needs_texts = registry.BY_NAME[suite].make(picked, registry.Options(mirror)).needs_texts
        calls.append((picked, images, texts if needs_texts else []))
    texts = [t for _, _, ts in calls for t in ts]
    mixed = any(s == "mteb" for s, _ in by_suite) and any(normalised(r) for _, images, ts in calls for r in images + ts)
    if len(calls) > 1 and not mixed:
        calls = [([n for c in calls for n in c[0]], [i for c in calls for i in c[1]], texts)]
    return calls


def encodes(warm: Path, log: str) -> dict:
    """Rows the warm run's embed jobs encoded (its log; the cache's manifests must say the same) and the distinct
    items of the benchmark by content: the mteb suite's item tables' keys, the sha256 of the stored bytes of every
    row a hand-built suite read (a source's eval row is one item however many suites score it, and so is a picture
    in several rows), texts by themselves."""
    counted = sum(int(n.replace(",", "")) for n in ENCODE.findall(log))
    per_output = {}
    for manifest in sorted(warm.glob("embeddings/cache/*/*/_manifest.json")):
        kind = re.sub(r"-[0-9a-f]{16}$", "", manifest.parent.name)
        per_output[kind] = per_output.get(kind, 0) + json.loads(manifest.read_text())["counts"]["total"]
    assert counted == sum(per_output.values()), (counted, per_output)
    images, texts = set(), set()
    for kind, found in (("images", images), ("texts", texts)):
        for table in (warm / "mteb/embeddings/mteb/_items").glob(f"*/{kind}.parquet"):
            found.update(pq.read_table(table, columns=["key"])["key"].to_pylist())
    for suite in ("zeroshot", "linear_probe", "clustering", "retrieval"):
        images.update("sha256:" + hashlib.sha256(data).hexdigest() for _, data in row_images(warm, suite))
        for root in outputs(warm, suite)[1]:
            texts.update(embeddings.read_all(str(root))[0])
    return {"encoded": counted, "per_output": per_output, "images": len(images), "texts": len(texts)}


def exact(n: int, d: int) -> str:
    f = Fraction(n, d)
    return f"{n:,} / {d:,} = {float(f):.6f}" + (f" (= {f.numerator:,}/{f.denominator:,})" if f.denominator != d else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40, help="train rows of each of the 23 sources")
    parser.add_argument("--eval-rows", type=int, default=20, help="eval rows of each of the 23 sources")
    parser.add_argument("--repeat", type=int, default=3)
    h.add_records_option(parser)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="eval-types-"))
    env = h.fresh_process_env()  # HF_HOME: this process's
    try:
        mirror, warm, runs = str(work / "mirror"), work / "warm", work / "runs"
        t0 = time.time()
        eval_rows = {s.slug: args.eval_rows for s in catalog(None)}
        eval_rows["scimmir"] = min(args.eval_rows, SCIMMIR_EVAL_ROWS)
        make_mirror(mirror, rows=args.rows, eval_rows=eval_rows)
        for write in dict.fromkeys(WRITERS.values()):
            write(mirror)
        model = make_tiny_clip(str(work / "model"))
        print(f"[eval_types] mirrors and model written in {time.time() - t0:.1f}s", flush=True)

        # the embeddings, once; then again with --overwrite, which must encode nothing
        warm_argv = [sys.executable, "-m", "mieb_ray", "eval", "--tasks", BENCHMARK, "--sources", mirror,
                     "--model", model, "--out", str(warm)]
        logs, made = [], []
        for argv in (warm_argv, [*warm_argv, "--overwrite"]):
            t0 = time.perf_counter()
            done = subprocess.run(argv, env=env, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"failed: {' '.join(argv)}\n{done.stderr[-3000:]}")
            logs.append((time.perf_counter() - t0, done.stdout + done.stderr))
            made.append({**{p: p.read_text() for p in warm.glob("embeddings/cache/**/_manifest.json")},  # the cache
                         **{p: json.loads(p.read_text())["shards"]  # the suites' views of it: their shards' sha256
                            for p in warm.glob("*/embeddings/**/_manifest.json")}})
        count = encodes(warm, logs[0][1])
        again = sum(int(n.replace(",", "")) for n in ENCODE.findall(logs[1][1]))
        assert made[0] == made[1], "the second run changed the cache or the vectors the suites read"
        distinct = count["images"] + count["texts"]
        print(f"[eval_types] warm run {logs[0][0]:.0f}s: {count['encoded']:,} rows encoded, {distinct:,} distinct "
              f"items; again with --overwrite {logs[1][0]:.0f}s: {again} rows encoded", flush=True)

        # the contenders of each type, on the warm run's outputs
        types = task_types()
        vectors = {s: content_keyed(warm, s) for s in ("zeroshot", "linear_probe", "clustering", "retrieval", "mteb")}
        suite_of = {t: s.name for s in registry.SUITES for t in s.tasks}
        tables, calls = {}, {}
        for k, (kind, names) in enumerate(types.items()):
            merged = {}  # the hand-built suites' first, the mteb suite's last: a text in both gets its raw vector
            for suite in sorted({suite_of[n] for n in names}, key=lambda s: s == "mteb"):
                merged.update(vectors[suite])
            tables[kind] = work / f"vectors-{k}.parquet"
            write_vectors(tables[kind], merged)
            calls[kind] = eval_calls(names, mirror, warm)

        def theirs(kind: str, out: Path) -> list[str]:
            return [sys.executable, str(CALL), "--tasks", ",".join(types[kind]), "--sources", mirror,
                    "--vectors", str(tables[kind]), "--out", str(out)]

        def ours(kind: str, out: Path) -> list[list[str]]:
            return [[sys.executable, "-m", "mieb_ray", "eval", "--tasks", ",".join(names), "--sources", mirror,
                     "--image-embeddings", ",".join(map(str, images)),
                     *(["--text-embeddings", ",".join(map(str, texts))] if texts else []), "--out", str(out / str(j))]
                    for j, (names, images, texts) in enumerate(calls[kind])]

        differ = {}
        for kind, names in types.items():  # the check: the same scores, or nothing is worth timing
            a, b = work / "check" / f"{len(differ)}-mteb", work / "check" / f"{len(differ)}-ours"
            h.run_process(theirs(kind, a), env)
            for argv in ours(kind, b):
                h.run_process(argv, env)
            found = {}
            for name in names:
                try:
                    assert_same_scores(json.loads(next(b.rglob(f"{name}.json")).read_text()),
                                       json.loads((a / f"{name}.json").read_text()))
                except AssertionError as exc:  # the first metric that differs, and by how much
                    found[name] = str(exc)
            differ[kind] = found
            print(f"[eval_types] {kind}: {len(names) - len(found)} of {len(names)} tasks equal mteb's, every metric"
                  + (f"; differing: {found}" if found else ""), flush=True)

        def timed(kind: str, side: str):
            def call(i: int) -> dict:
                out = runs / f"{side}-{list(types).index(kind)}-{i}"
                argvs = [theirs(kind, out)] if side == "mteb" else ours(kind, out)
                seconds = sum(h.run_process(argv, env) for argv in argvs)
                shutil.rmtree(out, ignore_errors=True)
                return {"seconds": seconds, "tasks": len(types[kind]), "processes": len(argvs),
                        "load": os.getloadavg()[0]}
            return call

        contenders = [h.Contender(FLOOR, "a fresh process that imports mteb and exits: a fixed cost of every call on "
                                  "either side", argv=[sys.executable, "-c", "import mteb"])]
        for kind in types:
            contenders += [h.Contender(f"{kind}: {MTEB}", "mteb.evaluate of the type's tasks from the vectors, a fresh "
                                       "process", call=timed(kind, "mteb")),
                           h.Contender(f"{kind}: mieb-ray", "mieb-ray eval of the type's tasks from the embed outputs, "
                                       "fresh process(es)", call=timed(kind, "ours"), baseline=f"{kind}: {MTEB}")]
        bench = h.Benchmark("eval_types", "per type", contenders, repeat=args.repeat, columns=[
            ("tasks", lambda r: str(r.extras[0]["tasks"])), ("processes", lambda r: str(r.extras[0]["processes"]))])
        per_type = h.run(bench)
        rounds = range(args.repeat)
        total = {side: [sum(per_type[f"{k}: {side}"].seconds[i] for k in types) for i in rounds]
                 for side in (MTEB, "mieb-ray")}
        n_tasks = sum(len(v) for v in types.values())
        totals = h.measured(h.Benchmark("eval_types", "all", [
            h.Contender(f"all {n_tasks} tasks: {MTEB}", "the sum of the types' mteb calls"),
            h.Contender(f"all {n_tasks} tasks: mieb-ray", "the sum of the types' mieb-ray calls",
                        baseline=f"all {n_tasks} tasks: {MTEB}")]),
            {f"all {n_tasks} tasks: {side}": s for side, s in total.items()}, load=per_type.load)
        record = h.combine("eval_types", f"{BENCHMARK}, {n_tasks} tasks by mteb task type: the whole call of "
                           "`mieb-ray eval` vs `mteb.evaluate` on the same embeddings, fixture mirrors, a tiny CLIP",
                           [per_type, totals], ratio=(f"all {n_tasks} tasks: mieb-ray", f"all {n_tasks} tasks: {MTEB}"),
                           group="Eval")
        header = ["type", "tasks (by suite)", f"{MTEB}, median (s)", "mieb-ray, median (s)", "mieb-ray / mteb",
                  "fastest: mteb / mieb-ray (s)", "mieb-ray / mteb, fastest", "scores equal", "mieb-ray processes"]
        everything = f"all {n_tasks} tasks"
        groups = {**types, everything: [n for names in types.values() for n in names]}
        differ[everything] = {n: d for found in differ.values() for n, d in found.items()}
        calls[everything] = [c for kind in types for c in calls[kind]]
        rows = []
        for kind, names in groups.items():
            m, o = (record[f"{kind}: {side}"] for side in (MTEB, "mieb-ray"))
            suites = {}
            for n in names:
                suites[suite_of[n]] = suites.get(suite_of[n], 0) + 1
            rows.append([kind, f"{len(names)} ({', '.join(f'{s} {c}' for s, c in suites.items())})",
                         f"{m.median:.2f}", f"{o.median:.2f}", f"{o.median / m.median:.2f}x",
                         f"{m.fastest:.2f} / {o.fastest:.2f}", f"{o.fastest / m.fastest:.2f}x",
                         f"no ({len(differ[kind])})" if differ[kind] else "yes", len(calls[kind])])
        print("\n" + h.markdown_table(header, rows), flush=True)
        loads = [[r.extras[i]["load"] for r in per_type.results.values() if len(r.extras) > i] for i in rounds]
        record.finish(records=args.records, figures={
            "tables": [{"title": "Per task type", "header": header, "rows": rows}],
            "encodes per unique item": exact(count["encoded"], distinct),
            "rows encoded, per kind of the run's cache outputs": count["per_output"],
            "distinct items (images by the sha256 of their bytes; the mirror reuses 32 pictures per source "
            "cyclically)": {"images": count["images"], "texts": count["texts"]},
            "rows encoded by the second --model run (--overwrite; its embedding outputs unchanged)": again,
            "warm --model run (s)": round(logs[0][0], 1), "second --model run, --overwrite (s)": round(logs[1][0], 1),
            "tasks differing from mteb": differ[everything] or "none",
            "load average (1 min) after each timed call, min - max per round": "; ".join(
                f"round {i + 1}: {min(x):.2f} - {max(x):.2f}" for i, x in enumerate(loads)),
            "rows": args.rows, "eval_rows": args.eval_rows}, notes=[
            "Each contender is a fresh process per type, timed from spawn to exit, on the embeddings of one warm "
            "`eval --model` run; every TaskResult of both sides was compared (every metric, within 1e-6) before "
            "timing.",
            "At fixture scale fixed costs dominate: each process starts Python and imports mteb (and torch, "
            "datasets, sklearn through it) before any task; the data are a few rows a task. mieb-ray's placement "
            "keeps every call of this size in its own process (Ray not started), so no Ray start is in these "
            "numbers, and its tasks are scored one after another there, as mteb's are. Besides mteb's own work "
            "a mieb-ray call writes the run's report.html and summary.json (mteb's get_benchmark and get_score of "
            "each MIEB benchmark its tasks belong to) and its job's files. ImageClassification's time is mostly the "
            "linear probe's logistic regressions (100 fits on either side).",
            "This machine has 2 cores: parallel scoring of tasks would have at most 2 CPUs. Other engineers use the "
            "same 2 cores at the same time: the load average before, after and between the calls is recorded, "
            "and it moves single runs by seconds.",
            "Zero-shot and Any2Any retrieval take two mieb-ray processes, one per suite: one `eval` call cannot be "
            "given both suites' precomputed embeddings (the mteb suite refuses the hand-built suites' "
            "L2-normalised vectors given beside its own raw ones).",
            "Encodes per unique item: rows the warm run's embed jobs encoded (its log; the run's cache's manifests "
            "agree) over the benchmark's distinct items by content: the mteb suite's item keys (an image by the "
            "sha256 of its stored bytes, a text by itself), the sha256 of the bytes of every row a hand-built suite "
            "read (a source's eval row that the zero-shot, probe and clustering suites score is one item) and their "
            "texts. Every suite's embeddings come from the run's one content-keyed cache "
            "(mieb_ray/evals/embed_cache.py). SciMMIR's eval split has at most 5 rows: its "
            "fixture's rows 5 and 6 have no caption on purpose, which the SciMMIR retrieval suite refuses."])
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(HF_HOME, ignore_errors=True)


if __name__ == "__main__":
    main()
