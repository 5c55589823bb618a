"""Eval on the BioVITA shape against mteb's own `mteb.evaluate`, same embeddings, same scores: the whole call
(process start to results JSON) and the scoring alone.

Data: the BioVITA-shaped fixture (mieb_ray/fixtures/biovita.py) at the real query counts, 288 species and
289 genus queries, with 512-d embeddings in our shard format. Not timed.

  A. Whole call, each a fresh process timed from spawn to exit (Python imports, and for us Ray start-up):
     1. mteb 2.26.24   bench/mteb_biovita_call.py: import mteb, load data and embeddings (as
                       tests/mteb_reference.py does), `mteb.evaluate`, write the TaskResult JSON.
     2. mieb-ray       `python -m mieb_ray eval-biovita --data ... --image-embeddings ... --text-embeddings ...
                       --out ...`: starts a local Ray, writes results JSON, ranks, report.html and the manifest.
  B. In one process, Ray already started:
     1. mteb 2.26.24   `mteb.evaluate` with an encoder that returns the precomputed embeddings (dataset objects
                       built before timing).
     2. mieb-ray       `evaluate(EvalConfig(...))`: its scoring phase (the top-k engine: layout, score, merge)
                       and the whole call (reading data, scoring, writing every output).

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from mteb_reference import mteb_scores  # noqa: E402

from mieb_ray.fixtures.biovita import make_biovita_embeddings, make_biovita_mirror  # noqa: E402
from mieb_ray.io import embeddings  # noqa: E402
from mieb_ray.evals.biovita import RESULTS_FILE, EvalConfig, evaluate  # noqa: E402
from mieb_ray.retrieval import biovita  # noqa: E402

KEYS = [f"taxon_top_{k}_accuracy" for k in (1, 5, 10)]


def lookup(uri: str) -> dict[str, np.ndarray]:
    return dict(zip(*embeddings.read_all(uri)))


def entries(result: dict) -> dict:
    return {e["hf_subset"]: e for e in result["scores"]["test"]}


def same_scores(ours: dict, theirs: dict) -> bool:
    a, b_ = entries(ours), entries(theirs)
    return all(a[s][k] == b_[s][k] for s in biovita.SUBSETS for k in KEYS + ["main_score"])


def whole_calls(root: str, images: str, texts: str, work: Path, repeat: int) -> dict:
    """Fresh processes, one after the other, before this process starts Ray (so the CLI starts its own)."""
    env = b.fresh_process_env()
    mteb_t, ours_t, load = [], [], os.getloadavg()[0]
    for i in range(repeat):
        mteb_out, ours_out = work / f"mteb_call{i}.json", work / f"cli_out{i}"
        mteb_t.append(b.run_process([sys.executable, str(b.BENCH / "mteb_biovita_call.py"), "--data", root,
                                   "--image-embeddings", images, "--text-embeddings", texts,
                                   "--out", str(mteb_out)], env))
        ours_t.append(b.run_process([sys.executable, "-m", "mieb_ray", "eval-biovita", "--data", root,
                                   "--image-embeddings", images, "--text-embeddings", texts,
                                   "--out", str(ours_out)], env))
        print(f"[whole call {i + 1}] mteb {mteb_t[-1]:.2f}s, mieb-ray CLI {ours_t[-1]:.2f}s", flush=True)
    same = same_scores(json.loads((ours_out / RESULTS_FILE).read_text()), json.loads(mteb_out.read_text()))
    return {"mteb": mteb_t, "ours": ours_t, "same": same, "load": (load, os.getloadavg()[0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("bench/_work/eval_biovita"))
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

    calls = whole_calls(root, images, texts, work, args.repeat)

    text_emb, image_emb = lookup(texts), lookup(images)
    b.start_ray(work)
    load = os.getloadavg()[0]
    mteb_times, ours_scoring, ours_total = [], [], []
    for i in range(args.repeat):
        t0 = time.perf_counter()
        want = mteb_scores(subsets, text_emb, image_emb)
        mteb_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = evaluate(EvalConfig(root, images, texts, str(work / f"out{i}")), log=lambda _: None)
        ours_total.append(time.perf_counter() - t0)
        ours_scoring.append(got["evaluation_time"])
        print(f"[in-process {i + 1}] mteb {mteb_times[-1]:.3f}s, mieb-ray scoring {ours_scoring[-1]:.3f}s, "
              f"whole call {ours_total[-1]:.3f}s", flush=True)
    same = same_scores(got, want["task_result"]) and abs(got["mieb_ray"]["task_score"] - want["task_score"]) < 1e-12
    scores = ", ".join(f"{s}: " + "/".join(f"{entries(got)[s][k]:.4f}" for k in KEYS) for s in biovita.SUBSETS)

    t_mteb, t_ours = min(calls["mteb"]), min(calls["ours"])
    print("\n" + "=" * 100)
    print(f"### BioVITA shape, whole call (process start to results JSON): {shape}\n")
    print(b.markdown_table(["contender", f"seconds (fastest of {args.repeat})", "x faster than mteb"], [
        ["mteb 2.26.24: `python bench/mteb_biovita_call.py` (import mteb, load, `mteb.evaluate`, write JSON)",
         f"{t_mteb:.2f}", "1.0"],
        ["mieb-ray: `python -m mieb_ray eval-biovita` (imports, Ray start-up, score, write JSON, ranks, report)",
         f"{t_ours:.2f}", f"{t_mteb / t_ours:.2f}"]]))
    print(f"\n**whole call: mieb-ray {t_ours:.2f}s vs mteb {t_mteb:.2f}s = {t_mteb / t_ours:.2f}x "
          f"({'faster' if t_ours < t_mteb else 'slower'})**; scores identical to mteb's: "
          f"{'yes' if calls['same'] else 'NO'}\n")
    b.footer(f"All runs: mteb {', '.join(f'{t:.2f}' for t in calls['mteb'])} s; mieb-ray "
             f"{', '.join(f'{t:.2f}' for t in calls['ours'])} s",
             "Each a fresh process timed from spawn to exit, one after the other; the mieb-ray CLI starts (and "
             "stops) its own local Ray.",
             f"Load average (1 min) before / after: {calls['load'][0]:.2f} / {calls['load'][1]:.2f}.")

    t_mteb, t_score, t_total = min(mteb_times), min(ours_scoring), min(ours_total)
    print(f"\n### BioVITA shape, in one process (Ray already started): {shape}\n")
    print(b.markdown_table(["contender", f"seconds (fastest of {args.repeat})", "x faster than mteb"], [
        ["mteb 2.26.24 `mteb.evaluate` (precomputed embeddings)", f"{t_mteb:.3f}", "1.0"],
        ["mieb-ray eval: scoring (top-k engine: layout, score tasks, merges)", f"{t_score:.3f}",
         f"{t_mteb / t_score:.1f}"],
        ["mieb-ray eval: whole call (read data, score, write JSON, ranks, report)", f"{t_total:.3f}",
         f"{t_mteb / t_total:.1f}"]]))
    print(f"\n**scoring {t_mteb / t_score:.1f}x faster than mteb, whole call {t_mteb / t_total:.1f}x**; scores "
          f"identical to mteb's: {'yes' if same else 'NO'} (top-1/5/10 {scores}; task score "
          f"{got['mieb_ray']['task_score']:.6f})\n")
    b.footer(f"All runs: mteb {', '.join(f'{t:.3f}' for t in mteb_times)} s; scoring "
             f"{', '.join(f'{t:.3f}' for t in ours_scoring)} s; "
             f"whole call {', '.join(f'{t:.3f}' for t in ours_total)} s",
             "Ray start-up excluded; the first run of each includes the Ray workers' first imports (torch).",
             f"Load average (1 min) before / after: {load:.2f} / {os.getloadavg()[0]:.2f}.")


if __name__ == "__main__":
    main()
