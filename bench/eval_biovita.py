"""Eval on the BioVITA shape against mteb's own `mteb.evaluate`, same embeddings, same scores: the whole call
(process start to results JSON) and the scoring alone.

Data: the BioVITA-shaped fixture (mieb_ray/fixtures/biovita.py) at the real query counts, 288 species and
289 genus queries, with 512-d embeddings in our shard format. Not timed.

  A. Whole call, each a fresh process timed from spawn to exit (Python imports included):
     1. mteb 2.26.24   bench/mteb_biovita_call.py: import mteb, load data and embeddings (as
                       tests/mteb_reference.py does), `mteb.evaluate`, write the TaskResult JSON.
     2. mieb-ray       `python -m mieb_ray eval-biovita --data ... --image-embeddings ... --text-embeddings ...
                       --out ...`: a corpus this small is scored in-process (--executor auto), Ray never
                       started; writes results JSON, ranks, report.html and the manifest.
     3. mieb-ray, Ray  the same with `--executor ray`: starts a local Ray (--no-ray-row leaves it out).
  B. In one process (no Ray), each of the three phases timed apart:
     1. mteb 2.26.24   `mteb.evaluate` with an encoder that returns the precomputed embeddings.
     2. mieb-ray       scoring alone, inputs in memory as mteb's are: the top-k engine in-process (lay out the
                       image embeddings by taxon, score every query block, merge) and the ranks, from the
                       key lookup, pools, candidates and query vectors read before timing.
     3. mieb-ray       the eval's scoring phase (`evaluation_time`: reading the task's data and the embeddings,
                       then scoring) and its whole call, `evaluate(EvalConfig(...))` (also writing every output).

Prints both blocks with ratios, and checks that every per-subset score and the task score are identical.

Run from the repository root:
    .venv/bin/python bench/eval_biovita.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import _baselines as b  # first: sets RAY_AUTH_MODE before Ray is imported
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from embedding_fixtures import make_biovita_embeddings  # noqa: E402
from mteb_reference import mteb_scores  # noqa: E402

from mieb_ray.evals import biovita_data as biovita  # noqa: E402
from mieb_ray.evals import protocol  # noqa: E402
from mieb_ray.evals.biovita import RESULTS_FILE, EvalConfig, evaluate, scored_queries, subset_scores  # noqa: E402
from mieb_ray.fixtures.biovita import make_biovita_mirror  # noqa: E402
from mieb_ray.io import embeddings  # noqa: E402
from mieb_ray.runtime import tasks  # noqa: E402
from mieb_ray.topk import engine  # noqa: E402
from mieb_ray.topk.kernels import CandidateMax, Candidates  # noqa: E402

KEYS = [f"taxon_top_{k}_accuracy" for k in (1, 5, 10)]


def lookup(uri: str) -> dict[str, np.ndarray]:
    return dict(zip(*embeddings.read_all(uri)))


def entries(result: dict) -> dict:
    return {e["hf_subset"]: e for e in result["scores"]["test"]}


def same_scores(ours: dict, theirs: dict) -> bool:
    a, b_ = entries(ours), entries(theirs)
    return all(a[s][k] == b_[s][k] for s in biovita.SUBSETS for k in KEYS + ["main_score"])


def whole_calls(root: str, images: str, texts: str, work: Path, repeat: int, ray_row: bool) -> dict:
    """Fresh processes, one after the other."""
    env = b.fresh_process_env()
    flags = ["--data", root, "--image-embeddings", images, "--text-embeddings", texts]
    times = {"mteb": [], "ours": [], "ours_ray": []}
    load = os.getloadavg()[0]
    for i in range(repeat):
        mteb_out = work / f"mteb_call{i}.json"
        times["mteb"].append(b.run_process([sys.executable, str(b.BENCH / "mteb_biovita_call.py"), *flags,
                                            "--out", str(mteb_out)], env))
        times["ours"].append(b.run_process([sys.executable, "-m", "mieb_ray", "eval-biovita", *flags,
                                            "--out", str(work / f"cli_out{i}")], env))
        if ray_row:
            times["ours_ray"].append(b.run_process([sys.executable, "-m", "mieb_ray", "eval-biovita", *flags,
                                                    "--executor", "ray", "--out", str(work / f"cli_ray{i}")], env))
        print(f"[whole call {i + 1}] " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items() if v), flush=True)
    last = repeat - 1
    mteb = json.loads((work / f"mteb_call{last}.json").read_text())
    outs = [work / f"cli_out{last}"] + ([work / f"cli_ray{last}"] if ray_row else [])
    same = all(same_scores(json.loads((o / RESULTS_FILE).read_text()), mteb) for o in outs)
    executors = [json.loads((o / "_manifest.json").read_text()).get("executor") for o in outs]
    return {**times, "same": same, "executors": executors, "load": (load, os.getloadavg()[0])}


def engine_inputs(root: str, images: str, texts: str) -> dict:
    """Per subset, what the eval's tasks read before the engine scores (not timed): the key lookup, the pools
    and candidates (one query block), the query vectors, the correct positions."""
    out = {}
    for name in biovita.SUBSETS:
        q = scored_queries(biovita.load_queries(root, name))
        ids, taxa = biovita.read_corpus(root, name)
        vocabulary, groups = biovita.taxon_ids(taxa)
        keys = pa.array(ids, pa.string())
        lookup = engine.KeyLookup(keys, np.arange(len(ids), dtype=np.int64), groups)
        indptr, positions = biovita.pool_positions(root, name, q.query_ids, keys)
        indptr, docs = biovita.pool_csr(indptr, positions, len(ids))
        candidates = Candidates(biovita.candidate_groups(q.candidate_taxa, vocabulary), indptr, docs,
                                best_docs=EvalConfig.gallery)  # the best photos the report shows, as the eval
        _, vectors = protocol.text_vectors(texts, q.query_texts, "query texts")
        correct = np.array([c.index(t) for c, t in zip(q.candidate_taxa, q.correct_taxa)])
        out[name] = (lookup, candidates, vectors, correct)
    return {"subsets": out, "shards": embeddings.shard_uris(images)}


def engine_scoring(inputs: dict) -> dict[str, dict]:
    """The top-k engine in this process on in-memory inputs, as the eval runs it: lay out, score, merge, rank."""
    scores = {}
    with tasks.using("local"):
        for name, (lookup, candidates, vectors, correct) in inputs["subsets"].items():
            lay = engine.layout(inputs["shards"], lookup=lookup)
            best, _ = tasks.get(engine.search(lay, [vectors], CandidateMax(), [candidates]))[0]
            scores[name] = subset_scores(best, correct)[0]
    return scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("bench/_work/eval_biovita"))
    ap.add_argument("--no-ray-row", dest="ray_row", action="store_false",
                    help="leave out the whole call with --executor ray (a local Ray started and stopped)")
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    print("[setup] BioVITA-shaped mirror (288 + 289 queries) and 512-d embeddings ...", flush=True)
    root = str(work / "data")
    make_biovita_mirror(root, species_queries=288, genus_queries=289, single_genera=258)  # ~3,000 photos
    images, texts = str(work / "img"), str(work / "txt")
    make_biovita_embeddings(root, images, texts, dim=512, grid=None, spread=12.0)  # top-1 well below 1
    subsets = {name: biovita.load_subset(root, name) for name in biovita.SUBSETS}
    n_images = len(subsets["unseen_species"].corpus_ids)
    n_queries = sum(len(s.query_ids) for s in subsets.values())
    shape = f"{n_queries} queries (288 species + 289 genus), {n_images:,} images, 512-d"

    calls = whole_calls(root, images, texts, work, args.repeat, args.ray_row)

    text_emb, image_emb = lookup(texts), lookup(images)
    inputs = engine_inputs(root, images, texts)
    load = os.getloadavg()[0]
    mteb_times, engine_times, ours_scoring, ours_total = [], [], [], []
    for i in range(args.repeat):
        t0 = time.perf_counter()
        want = mteb_scores(subsets, text_emb, image_emb)
        mteb_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        alone = engine_scoring(inputs)
        engine_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = evaluate(EvalConfig(root, images, texts, str(work / f"out{i}"), executor="local"), log=lambda _: None)
        ours_total.append(time.perf_counter() - t0)
        ours_scoring.append(got["evaluation_time"])
        print(f"[in-process {i + 1}] mteb {mteb_times[-1]:.3f}s, mieb-ray scoring alone {engine_times[-1]:.3f}s, "
              f"scoring phase {ours_scoring[-1]:.3f}s, whole call {ours_total[-1]:.3f}s", flush=True)
    same = same_scores(got, want["task_result"]) and abs(got["mieb_ray"]["task_score"] - want["task_score"]) < 1e-12
    same = same and all(round(alone[s][k], 6) == entries(got)[s][k] for s in biovita.SUBSETS for k in KEYS)
    scores = ", ".join(f"{s}: " + "/".join(f"{entries(got)[s][k]:.4f}" for k in KEYS) for s in biovita.SUBSETS)

    t_mteb, t_ours = min(calls["mteb"]), min(calls["ours"])
    rows = [["mteb 2.26.24: `python bench/mteb_biovita_call.py` (import mteb, load, `mteb.evaluate`, write JSON)",
             f"{t_mteb:.2f}", "1.00", "1.0"],
            ["mieb-ray: `python -m mieb_ray eval-biovita` (in-process: imports, read, score, write JSON, ranks, "
             "report)", f"{t_ours:.2f}", f"{t_ours / t_mteb:.2f}", f"{t_mteb / t_ours:.1f}"]]
    if args.ray_row:
        t_ray = min(calls["ours_ray"])
        rows.append(["mieb-ray: `python -m mieb_ray eval-biovita --executor ray` (the same on a local Ray it "
                     "starts and stops)", f"{t_ray:.2f}", f"{t_ray / t_mteb:.2f}", f"{t_mteb / t_ray:.1f}"])
    print("\n" + "=" * 100)
    print(f"### BioVITA shape, whole call (process start to results JSON): {shape}\n")
    print(b.markdown_table(["contender", f"seconds (fastest of {args.repeat})", "x mteb's time",
                            "x faster than mteb"], rows))
    print(f"\n**whole call: mieb-ray {t_ours:.2f}s vs mteb {t_mteb:.2f}s = {t_ours / t_mteb:.2f}x mteb's time "
          f"({t_mteb / t_ours:.1f}x faster)**; executor taken (manifest): {', '.join(map(str, calls['executors']))}; "
          f"scores identical to mteb's: {'yes' if calls['same'] else 'NO'}\n")
    b.footer("All runs: " + "; ".join(f"{k} {', '.join(f'{t:.2f}' for t in v)} s" for k, v in calls.items()
                                      if k in ("mteb", "ours", "ours_ray") and v),
             "Each a fresh process timed from spawn to exit, one after the other.",
             f"Load average (1 min) before / after: {calls['load'][0]:.2f} / {calls['load'][1]:.2f}.")

    t_mteb, t_alone, t_score, t_total = min(mteb_times), min(engine_times), min(ours_scoring), min(ours_total)
    print(f"\n### BioVITA shape, in one process (no Ray): {shape}\n")
    print(b.markdown_table(["contender", f"seconds (fastest of {args.repeat})", "x faster than mteb"], [
        ["mteb 2.26.24 `mteb.evaluate` (precomputed embeddings)", f"{t_mteb:.3f}", "1.0"],
        ["mieb-ray scoring alone (inputs in memory, as mteb's: top-k engine in-process, ranks)", f"{t_alone:.3f}",
         f"{t_mteb / t_alone:.1f}"],
        ["mieb-ray eval: scoring phase (reads the task data and embeddings, then scores)", f"{t_score:.3f}",
         f"{t_mteb / t_score:.1f}"],
        ["mieb-ray eval: whole call (read data, score, write JSON, ranks, report)", f"{t_total:.3f}",
         f"{t_mteb / t_total:.1f}"]]))
    print(f"\n**scoring alone {t_mteb / t_alone:.1f}x faster than mteb, scoring phase {t_mteb / t_score:.1f}x, whole "
          f"call {t_mteb / t_total:.1f}x**; scores identical to mteb's: {'yes' if same else 'NO'} (top-1/5/10 "
          f"{scores}; task score {got['mieb_ray']['task_score']:.6f})\n")
    b.footer(f"All runs: mteb {', '.join(f'{t:.3f}' for t in mteb_times)} s; scoring alone "
             f"{', '.join(f'{t:.3f}' for t in engine_times)} s; scoring phase "
             f"{', '.join(f'{t:.3f}' for t in ours_scoring)} s; "
             f"whole call {', '.join(f'{t:.3f}' for t in ours_total)} s",
             "The first run of each includes first imports (torch).",
             f"Load average (1 min) before / after: {load:.2f} / {os.getloadavg()[0]:.2f}.")


if __name__ == "__main__":
    main()
