"""Eval on the BioVITA shape: our scoring time against mteb's own `mteb.evaluate`, same embeddings, same scores.

Data: the BioVITA-shaped fixture (mieb_ray/fixtures/biovita.py) at the real query counts, 288 species and
289 genus queries, with 512-d embeddings in our shard format. In the same process, Ray already started:

  1. mteb 2.26.24   `mteb.evaluate` of `BioVITAT2IReranking` with an encoder that returns the precomputed
                    embeddings (tests/mteb_reference.py; dataset objects built before timing).
  2. mieb-ray       `evaluate(...)`: scoring in Ray tasks (query blocks x taxon-aligned corpus blocks);
                    timed both as its scoring phase and as the whole call (reading the data and the embedding
                    shards, writing the results JSON, ranks and the HTML report).

Prints both times, the ratio (target: at least 10x faster) and checks that every per-subset score and the task
score are identical.

Run from the repository root:
    .venv/bin/python bench/eval_biovita.py
"""

from __future__ import annotations

import argparse
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
from mieb_ray.pipelines.eval_biovita import evaluate  # noqa: E402
from mieb_ray.retrieval import biovita  # noqa: E402

KEYS = [f"taxon_top_{k}_accuracy" for k in (1, 5, 10)]


def lookup(uri: str) -> dict[str, np.ndarray]:
    return dict(zip(*embeddings.read_all(uri)))


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
    text_emb, image_emb = lookup(texts), lookup(images)
    b.start_ray(work)

    mteb_times, ours_scoring, ours_total = [], [], []
    for i in range(args.repeat):
        t0 = time.perf_counter()
        want = mteb_scores(subsets, text_emb, image_emb)
        mteb_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = evaluate(root, images, texts, str(work / f"out{i}"), log=lambda _: None)
        ours_total.append(time.perf_counter() - t0)
        ours_scoring.append(got["evaluation_time"])
        print(f"[run {i + 1}] mteb {mteb_times[-1]:.3f}s, mieb-ray scoring {ours_scoring[-1]:.3f}s, "
              f"whole call {ours_total[-1]:.3f}s", flush=True)

    entries = {e["hf_subset"]: e for e in got["scores"]["test"]}
    same = all(entries[s][k] == round(want[s][k], 6) for s in biovita.SUBSETS for k in KEYS) and \
        abs(got["mieb_ray"]["task_score"] - want["task_score"]) < 1e-12
    t_mteb, t_score, t_total = min(mteb_times), min(ours_scoring), min(ours_total)
    rows = [["mteb 2.26.24 `mteb.evaluate` (precomputed embeddings)", f"{t_mteb:.3f}", "1.0"],
            ["mieb-ray eval: scoring (Ray tasks, query x corpus blocks)", f"{t_score:.3f}", f"{t_mteb / t_score:.1f}"],
            ["mieb-ray eval: whole call (read data and shards, score, write JSON, ranks, report)", f"{t_total:.3f}",
             f"{t_mteb / t_total:.1f}"]]
    print("\n" + "=" * 100)
    print(f"### BioVITA shape: {sum(len(s.query_ids) for s in subsets.values())} queries "
          f"(288 species + 289 genus), {n_images:,} images, 512-d\n")
    print(b.markdown_table(["contender", "seconds (fastest of %d)" % args.repeat, "x faster than mteb"], rows))
    scores = ", ".join(f"{s}: " + "/".join(f"{entries[s][k]:.4f}" for k in KEYS) for s in biovita.SUBSETS)
    print(f"\n**scoring {t_mteb / t_score:.0f}x faster than mteb (target >= 10x)**; scores identical to mteb's: "
          f"{'yes' if same else 'NO'} (top-1/5/10 {scores}; task score {got['mieb_ray']['task_score']:.6f})\n")
    b.footer(f"All runs: mteb {', '.join(f'{t:.3f}' for t in mteb_times)} s; scoring "
             f"{', '.join(f'{t:.3f}' for t in ours_scoring)} s; "
             f"whole call {', '.join(f'{t:.3f}' for t in ours_total)} s",
             "Ray start-up excluded.")


if __name__ == "__main__":
    main()
