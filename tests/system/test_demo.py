"""`mieb-ray demo`: build, embed and eval from fixtures made on the spot, as the README's first command runs it:
the command itself, in a fresh process."""

import json
import os
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest
from support.biovita import load_subset
from support.mteb_reference import mteb_scores, mteb_zeroshot, rank_bounds
from support.paths import tree

from mieb_ray.demo_data.mirror import hub_names
from mieb_ray.evals import biovita_data as biovita
from mieb_ray.evals.zeroshot_tasks import select_tasks
from mieb_ray.io import embeddings
from mieb_ray.sources import SOURCES


def read(path) -> dict:
    return json.loads(open(path).read())


@pytest.mark.timeout(600)
def test_the_demo_command_builds_embeds_and_scores(tmp_path):
    import datasets

    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a laptop: no cluster named
    done = subprocess.run([sys.executable, "-m", "mieb_ray", "demo", "--out", str(out)], capture_output=True,
                          text=True, env=env, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # mieb-train: the demo's mirror of 40 train rows a source, less Caltech101's background_google rows (the class
    # mieb-train leaves out), counted in the mirror's own files
    built = read(out / "mieb-train" / "_manifest.json")
    caltech = sorted((out / "mirror" / "mteb" / "Caltech101" / "data").glob("train-*.parquet"))
    label = datasets.Features.from_arrow_schema(pq.read_schema(caltech[0]))["label"].str2int("background_google")
    background = sum(pq.read_table(f, columns=["label"])["label"].to_pylist().count(label) for f in caltech)
    want = {s.slug: 40 for s in SOURCES} | {"caltech101": 40 - background}
    keys = [k for shard in built["shards"] for k in pq.read_table(out / "mieb-train" / shard["path"],
                                                                   columns=["key"])["key"].to_pylist()]
    assert background == 1 and Counter(k.split("/")[0] for k in keys) == want and len(set(keys)) == len(keys)
    assert built["counts"]["datasets"] == want and built["counts"]["total"] == sum(want.values())
    for modality in ("image", "text"):  # one embedding of each mieb-train row, keyed as the row
        m = read(out / f"embeddings-{modality}" / "_manifest.json")
        assert m["counts"] == {"total": len(keys), "errors": 0}
        assert sorted(embeddings.read_all(str(out / f"embeddings-{modality}"))[0]) == sorted(keys)
    # small work on a machine alone, all in its process, Ray never started: two builds (mieb-train, the zero-shot
    # eval splits), four embed jobs (mieb-train's images and texts; the eval's images and texts, one job each for
    # both suites) and both suites' scoring
    placed = [line for line in lines if re.match(r"\[(build|embed|eval)\] (in this process|on Ray) \(", line)]
    assert [line[1:line.index("]")] for line in placed].count("embed") == 4
    assert len(placed) == 8 and all(" in this process (" in line and line.endswith("Ray not started)")
                                    for line in placed), placed
    assert any(line.startswith("[demo] outputs:") for line in lines)
    # one eval command, two suites: each in its folder, the folders listed by the manifest written last
    evaluated = out / "eval"
    assert read(evaluated / "_manifest.json")["suites"] == {"biovita": "biovita", "zeroshot": "zeroshot"}
    assert sorted(os.listdir(evaluated)) == ["_manifest.json", "biovita", "embeddings", "report.html", "summary.json",
                                             "zeroshot"]  # embeddings: the run's cache (evals/embed_cache.py)
    assert sorted(os.listdir(evaluated / "biovita")) == ["BioVITAT2IReranking.json", "_manifest.json", "embeddings",
                                                          "ranks.parquet", "report.html"]
    assert sorted(os.listdir(evaluated / "zeroshot")) == ["CIFAR10ZeroShot.json", "_manifest.json", "embeddings",
                                                           "eval-data", "predictions.parquet", "report.html",
                                                           "summary.json"]
    # the random model's scores: mteb's own on the embeddings the eval made. BioVITA's are floats: a tie of two
    # identical photos may break either way by the last bit, in mteb too (tests/support/numerics.py), so mteb's cosines
    # give each query's best and worst rank (rank_bounds); a query's top-1/5/10 hit is mteb's wherever they agree
    # (ranks past 10 may differ: mteb keeps a query's 1,000 best photos, reference/biovita-scoring.md section 3.3)
    lookup = lambda root: dict(zip(*embeddings.read_all(str(root))))  # noqa: E731
    scored = read(evaluated / "biovita" / "BioVITAT2IReranking.json")
    subsets = {name: load_subset(str(out / "mirror"), name) for name in biovita.SUBSETS}
    theirs = mteb_scores(subsets, lookup(evaluated / "biovita" / "embeddings" / "texts"),
                         lookup(evaluated / "biovita" / "embeddings" / "images"), return_results=True)
    bounds = rank_bounds(subsets, theirs["results"], atol=1e-6)
    ranks = {(r["subset"], r["query_id"]): r["rank"]
             for r in pq.read_table(evaluated / "biovita" / "ranks.parquet").to_pylist()}
    assert set(ranks) == set(bounds)
    in_doubt = set()  # the k at which some query's hit depends on how a tie breaks
    for entry in scored["scores"]["test"]:
        name = entry["hf_subset"]
        queries = [q for q in bounds if q[0] == name]
        for k in (1, 5, 10):
            key = f"taxon_top_{k}_accuracy"
            assert all(bounds[q][0] <= k if ranks[q] <= k else bounds[q][1] > k for q in queries), (name, k)
            assert entry[key] == round(sum(ranks[q] <= k for q in queries) / len(queries), 6), (name, key)
            if any((bounds[q][0] <= k) != (bounds[q][1] <= k) for q in queries):
                in_doubt.add(k)
            else:
                assert entry[key] == round(theirs[name][key], 6), (name, key)
    if 1 not in in_doubt:
        assert scored["mieb_ray"]["task_score"] == pytest.approx(theirs["task_score"], abs=1e-12)
    zeroshot = read(evaluated / "zeroshot" / "CIFAR10ZeroShot.json")
    task = select_tasks("CIFAR10ZeroShot")[0]
    vectors, prompts = (lookup(evaluated / "zeroshot" / "embeddings" / side) for side in ("images", "texts"))
    rows = np.stack([vectors[f"{task.key_prefix()}{i}"] for i in range(100)])
    repo = str(out / "mirror" / task.source.repo)
    assert zeroshot["scores"]["test"][0] == mteb_zeroshot(task.name, repo, "test", prompts, rows)["scores"]["test"][0]
    # the fixed prompts' scores: mteb's with each class's prompt given its fixed prompt's vector
    names = hub_names(task.slug)
    fixed = dict(zip(task.mteb_prompts(names), (prompts[p] for p in task.fixed_prompts(names))))
    theirs = mteb_zeroshot(task.name, repo, "test", fixed, rows)["scores"]["test"][0]
    assert {k: v if v is None else round(v, 6) for k, v in zeroshot["mieb_ray"]["fixed_prompts"].items()} == {
        k: theirs[k] for k in zeroshot["mieb_ray"]["fixed_prompts"]}
    assert any("CIFAR10ZeroShot on 100 test images" in line for line in lines)
    # nothing but the job's own lines: no progress bars, no Ray or library log lines
    own = re.compile(r"^(\[(demo|build|embed|eval)\] |  /)")
    assert done.stderr == "" and [line for line in lines if not own.match(line)] == []
    # the summary lists every output, says why the table has a row less, and gives chance levels
    summary = "\n".join(lines[lines.index("[demo] outputs:"):])
    for name in ("mirror", "mieb-train", "tiny-clip", "embeddings-image", "embeddings-text", "eval/biovita",
                 "eval/zeroshot"):
        assert f"{out}/{name}: " in summary, name
    assert "1 fewer than the mirror's: rows of classes mieb-train leaves out (caltech101: 1" in summary
    assert "(chance: about 0.010/0.050/0.100, one right taxon among 100 candidates;" in summary
    assert "(chance: 0.100, 10 classes" in summary

    # run again into the same folder: refused, nothing touched
    before = tree(out)
    again = subprocess.run([sys.executable, "-m", "mieb_ray", "demo", "--out", str(out)], capture_output=True,
                           text=True, env=env, timeout=120)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr == (f"mieb-ray: error: {out} already holds mirror, mieb-train, tiny-clip, embeddings-image, "
                            "embeddings-text, eval (an earlier run's?); pass --overwrite to replace them, or another "
                            "--out\n")
    assert tree(out) == before


def test_the_demo_never_replaces_a_build_it_did_not_make(mirror, tmp_path):
    """A real build at DIR/mieb-train: `demo --out DIR` refuses, and the build stays byte for byte."""
    from mieb_ray.pipelines.build import BuildConfig, build

    out = tmp_path / "mine"
    build(BuildConfig(mirror[0], str(out / "mieb-train"), datasets="mnist,dtd", executor="local"),
          log=lambda line: None)
    before = tree(out)
    done = subprocess.run([sys.executable, "-m", "mieb_ray", "demo", "--out", str(out)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [f"mieb-ray: error: {out} already holds mieb-train (an earlier run's?); "
                                        "pass --overwrite to replace them, or another --out"]
    assert tree(out) == before
