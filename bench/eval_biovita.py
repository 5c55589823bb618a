"""Eval on the BioVITA shape against mteb's own `mteb.evaluate`, same embeddings, same scores: the whole call
(process start to results JSON) and the scoring alone.

Data: the BioVITA-shaped fixture (mieb_ray/demo_data/biovita.py) at the real query counts, 288 species and
289 genus queries, with 512-d embeddings in our shard format. Not timed.

  A. Whole call, each a fresh process timed from spawn to exit (Python imports included):
     1. mteb 2.26.24   bench/contenders/mteb_biovita_call.py: import mteb, load data and embeddings (as
                       tests/support/mteb_reference.py does), `mteb.evaluate`, write the TaskResult JSON.
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
                       then scoring) and its whole call, the eval job called in this process (also writing every
                       output).

One harness table (bench/harness.py) of both blocks, each contender against its block's mteb, and the record
bench/records/eval_biovita.json; checks that every per-subset score and the task score are identical.

Run from the repository root:
    .venv/bin/python bench/eval_biovita.py [--repeat 3]
    .venv/bin/python bench/eval_biovita.py --repeat 1 --no-ray-row --records /tmp/records     # a smoke run
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import harness as h  # first: sets RAY_AUTH_MODE before Ray is imported
import numpy as np
import pyarrow as pa

h.use_test_fixtures()
from support.biovita import load_subset  # noqa: E402
from support.embedding_fixtures import make_biovita_embeddings  # noqa: E402
from support.mteb_reference import mteb_scores  # noqa: E402

from mieb_ray.demo_data.biovita import make_biovita_mirror  # noqa: E402
from mieb_ray.evals import biovita_data as biovita  # noqa: E402
from mieb_ray.evals import protocol, registry  # noqa: E402
from mieb_ray.evals.biovita import RESULTS_FILE, BioVITASuite, scored_queries, subset_scores  # noqa: E402
from mieb_ray.evals.job import evaluate  # noqa: E402
from mieb_ray.io import embeddings  # noqa: E402
from mieb_ray.runtime import tasks  # noqa: E402
from mieb_ray.topk import engine  # noqa: E402
from mieb_ray.topk.kernels import CandidateMax, Candidates  # noqa: E402

KEYS = [f"taxon_top_{k}_accuracy" for k in (1, 5, 10)]
GALLERY = BioVITASuite("").gallery  # the queries per subset whose best photos the report shows


def evaluate_in_process(root: str, images: str, texts: str, out: str) -> dict:
    """The eval's whole call in this process (executor local, no Ray): BioVITA's TaskResult."""
    return evaluate([(registry.BY_NAME["biovita"], [biovita.TASK])], registry.Options(root), out, images=images,
                    texts=texts, executor="local", log=lambda _: None)[biovita.TASK]


def lookup(uri: str) -> dict[str, np.ndarray]:
    return dict(zip(*embeddings.read_all(uri)))


def entries(result: dict) -> dict:
    return {e["hf_subset"]: e for e in result["scores"]["test"]}


def same_scores(ours: dict, theirs: dict) -> bool:
    a, b_ = entries(ours), entries(theirs)
    return all(a[s][k] == b_[s][k] for s in biovita.SUBSETS for k in KEYS + ["main_score"])


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
                                best_docs=GALLERY)  # the best photos the report shows, as the eval
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
    h.add_records_option(ap)
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    print("[setup] BioVITA-shaped mirror (288 + 289 queries) and 512-d embeddings ...", flush=True)
    root = str(work / "data")
    make_biovita_mirror(root, species_queries=288, genus_queries=289, single_genera=258)  # ~3,000 photos
    images, texts = str(work / "img"), str(work / "txt")
    make_biovita_embeddings(root, images, texts, dim=512, grid=None, spread=12.0)  # top-1 well below 1
    subsets = {name: load_subset(root, name) for name in biovita.SUBSETS}
    n_images = len(subsets["unseen_species"].corpus_ids)
    n_queries = sum(len(s.query_ids) for s in subsets.values())

    flags = ["--data", root, "--image-embeddings", images, "--text-embeddings", texts]
    text_emb, image_emb = lookup(texts), lookup(images)
    inputs = engine_inputs(root, images, texts)
    kept = {}  # the last run's outputs of the in-process contenders, for the checks

    def mteb_evaluate(i):
        kept["want"] = mteb_scores(subsets, text_emb, image_emb)

    def scoring_alone(i):
        kept["alone"] = engine_scoring(inputs)

    def eval_call(i):  # its whole call, and its own scoring phase as another contender's seconds
        got = kept["got"] = evaluate_in_process(root, images, texts, str(work / f"out{i}"))
        return {"also": {"mieb-ray eval, scoring phase": got["evaluation_time"]}}

    call, whole = "mteb, whole call", "mteb.evaluate"
    contenders = [
        h.Contender(call, "mteb 2.26.24: `python bench/contenders/mteb_biovita_call.py` (a fresh process: import "
                    "mteb, load, `mteb.evaluate`, write JSON)",
                    argv=lambda i: [sys.executable, str(h.CONTENDERS / "mteb_biovita_call.py"), *flags, "--out",
                                    str(work / f"mteb_call{i}.json")]),
        h.Contender("mieb-ray, whole call", "`python -m mieb_ray eval-biovita` (a fresh process, in-process "
                    "executor: imports, read, score, write JSON, ranks, report)", baseline=call,
                    argv=lambda i: [sys.executable, "-m", "mieb_ray", "eval-biovita", *flags, "--out",
                                    str(work / f"cli_out{i}")]),
        *([h.Contender("mieb-ray --executor ray, whole call", "the same on a local Ray it starts and stops",
                       baseline=call,
                       argv=lambda i: [sys.executable, "-m", "mieb_ray", "eval-biovita", *flags, "--executor", "ray",
                                       "--out", str(work / f"cli_ray{i}")])] if args.ray_row else []),
        h.Contender(whole, "mteb 2.26.24 `mteb.evaluate` in this process (precomputed embeddings)",
                    call=mteb_evaluate),
        h.Contender("mieb-ray scoring alone", "inputs in memory, as mteb's: the top-k engine in-process, ranks",
                    call=scoring_alone, baseline=whole),
        h.Contender("mieb-ray eval, scoring phase", "reads the task data and embeddings, then scores "
                    "(`evaluation_time` of the whole call below)", baseline=whole),
        h.Contender("mieb-ray eval, whole call in-process", "the eval job called in this process (executor local): "
                    "read data, score, write JSON, ranks, report", call=eval_call, baseline=whole),
    ]
    bench = h.Benchmark("eval_biovita", f"BioVITA shape: {n_queries} queries (288 species + 289 genus), "
                        f"{n_images:,} images, 512-d; whole calls (process start to results JSON) and in one "
                        "process (no Ray)", contenders, group="Eval", repeat=args.repeat,
                        ratio=("mieb-ray, whole call", call))
    record = h.run(bench)

    last = args.repeat - 1
    mteb_call = json.loads((work / f"mteb_call{last}.json").read_text())
    outs = [work / f"cli_out{last}"] + ([work / f"cli_ray{last}"] if args.ray_row else [])
    calls_same = all(same_scores(json.loads((o / RESULTS_FILE).read_text()), mteb_call) for o in outs)
    got, want, alone = kept["got"], kept["want"], kept["alone"]
    same = same_scores(got, want["task_result"]) and abs(got["mieb_ray"]["task_score"] - want["task_score"]) < 1e-12
    same = same and all(round(alone[s][k], 6) == entries(got)[s][k] for s in biovita.SUBSETS for k in KEYS)
    record.finish(figures={
        "scores identical to mteb's (whole calls)": calls_same,
        "scores identical to mteb's (in-process, scoring alone too)": same,
        "executor taken (manifests)": [json.loads((o / "_manifest.json").read_text()).get("executor") for o in outs],
        "top-1/5/10": {s: [entries(got)[s][k] for k in KEYS] for s in biovita.SUBSETS},
        "task score": round(got["mieb_ray"]["task_score"], 6)}, notes=[
        "Whole calls: each a fresh process timed from spawn to exit, one after the other.",
        "In-process: the first run of each includes its first imports (torch)."])


if __name__ == "__main__":
    main()
