"""The eval job on BioVITA-shaped data: per-subset scores and the task score equal mteb 2.26.24's own
(`mteb.evaluate` with an encoder returning the same embeddings); the outputs; the errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from support.biovita import Subset, describe, load_subset
from support.embedding_fixtures import make_biovita_embeddings
from support.evaluation import run_suite
from support.mteb_reference import mteb_scores, rank_bounds

from mieb_ray import storage
from mieb_ray.cli import main
from mieb_ray.demo_data.biovita import make_biovita_mirror
from mieb_ray.errors import UserError
from mieb_ray.evals import biovita_data as biovita
from mieb_ray.evals.biovita import RESULTS_FILE, BioVITASuite, chance_scores
from mieb_ray.io import embeddings

pytestmark = pytest.mark.timeout(600)
TAXON_KEYS = [f"taxon_top_{k}_accuracy" for k in (1, 5, 10)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("biovita"))
    made = make_biovita_mirror(root)
    return root, made | describe(made)


def lookup(uri: str) -> dict[str, np.ndarray]:
    return dict(zip(*embeddings.read_all(uri)))


# BioVITASuite's settings; the rest the eval job's
_SUITE = ("subsets", "query_block", "partitions", "gallery", "exclude")


def evaluate(data, images, texts, out, log=print, **settings):
    """BioVITA's TaskResult, scored by the eval job from a suite made with these settings."""
    suite = BioVITASuite(data, **{k: v for k, v in settings.items() if k in _SUITE})
    job = {k: v for k, v in settings.items() if k not in _SUITE}
    return run_suite(suite, out, images, texts, log=log, **job)[biovita.TASK]


@pytest.mark.parametrize("grid", [256, None], ids=["exact-grid-vectors", "plain-float-vectors"])
def test_scores_equal_mteb(ray_local, data, tmp_path, grid):
    root, _ = data
    images, texts = str(tmp_path / "img"), str(tmp_path / "txt")
    make_biovita_embeddings(root, images, texts, grid=grid)
    result = evaluate(root, images, texts, str(tmp_path / "out"), query_block=7, partitions=3, log=lambda _: None)
    subsets = {name: load_subset(root, name) for name in biovita.SUBSETS}
    want = mteb_scores(subsets, lookup(texts), lookup(images), return_results=grid is None)
    got = {e["hf_subset"]: e for e in result["scores"]["test"]}
    if grid:  # exact cosines: mteb's numbers on any CPU
        for name in biovita.SUBSETS:
            for key in TAXON_KEYS + ["main_score"]:
                assert got[name][key] == round(want[name][key], 6), (name, key)
        assert result["mieb_ray"]["task_score"] == pytest.approx(want["task_score"], abs=1e-12)
    else:
        assert_ranks_within_mteb(tmp_path / "out", subsets, got, want)
    # the results file has the layout mteb writes (taxon metrics only)
    mteb_entry = want["task_result"]["scores"]["test"][0]
    ours = json.loads((tmp_path / "out" / RESULTS_FILE).read_text())
    assert set(want["task_result"]) <= set(ours)
    assert {k for k in ours["scores"]["test"][0]} <= set(mteb_entry)
    assert ours["task_name"] == "BioVITAT2IReranking" and ours["dataset_revision"] == biovita.REVISION


def without(s: Subset, photos: set[str]) -> Subset:
    """The subset as the hub would lay it out without these photos: not in the corpus, the top-ranked pools or the
    qrels (mteb's evaluation then drops a query left with no positive)."""
    kept = [i for i, c in enumerate(s.corpus_ids) if c not in photos]
    return Subset(s.name, [s.corpus_ids[i] for i in kept], [s.corpus_taxa[i] for i in kept], s.query_ids,
                  s.query_texts, s.correct_taxa, s.candidate_taxa, [[d for d in p if d not in photos]
                                                                    for p in s.top_ranked],
                  {q: {d: r for d, r in docs.items() if d not in photos} for q, docs in s.qrels.items()})


def test_clean_scores_equal_mteb_on_the_subsets_without_the_flagged_photos(ray_local, data, tmp_path):
    """--exclude with an audit that flagged some of BioVITA's photos (keyed by corpus id, as the audit keys its
    corpus): the clean scores per subset are mteb's on the subsets without those photos, a query whose every
    relevant photo was flagged dropped as mteb drops it; the official scores stand. (BioVITA had no clean block:
    photos the audit flagged were silently scored, and the clean means counted it as clean.)"""
    from support.contamination import audit_output

    root, _ = data
    images, texts = str(tmp_path / "img"), str(tmp_path / "txt")
    make_biovita_embeddings(root, images, texts, grid=256)  # exact cosines: mteb's numbers on any CPU
    subsets = {name: load_subset(root, name) for name in biovita.SUBSETS}
    first = subsets[biovita.SUBSETS[0]]
    gone = set(first.qrels[first.query_ids[0]]) | set(first.top_ranked[1][::3]) | set(first.corpus_ids[::9])
    audit = audit_output(tmp_path / "audit", [(f"train/{i}", k, "near") for i, k in enumerate(sorted(gone))],
                         audited=[biovita.TASK])
    settings = dict(query_block=7, partitions=3, log=lambda _: None)
    result = evaluate(root, images, texts, str(tmp_path / "out"), exclude=audit, **settings)
    want = mteb_scores({n: without(s, gone) for n, s in subsets.items()}, lookup(texts), lookup(images))
    clean = result["mieb_ray"]["clean"]
    got = {e["hf_subset"]: e for e in clean["scores"]["test"]}
    for name in biovita.SUBSETS:
        for key in TAXON_KEYS + ["main_score"]:
            assert got[name][key] == round(want[name][key], 6), (name, key)
    assert clean["main_score"] == pytest.approx(want["task_score"], abs=1e-12)
    assert clean["left_out"]["eval"] == {"any": len(gone), "near": len(gone)}
    official = mteb_scores(subsets, lookup(texts), lookup(images))
    assert {e["hf_subset"]: e["main_score"] for e in result["scores"]["test"]} == \
        {n: round(official[n]["main_score"], 6) for n in biovita.SUBSETS} != {n: got[n]["main_score"] for n in got}

    every = audit_output(tmp_path / "every", [(f"train/{i}", k, "exact") for i, k in enumerate(first.corpus_ids)])
    clean = evaluate(root, images, texts, str(tmp_path / "out-every"), exclude=every, **settings)["mieb_ray"]["clean"]
    assert clean["error"] == "cannot score BioVITAT2IReranking without the flagged rows: the audit flagged every " \
                             f"relevant photo of {biovita.SUBSETS[0]}'s queries" and "scores" not in clean
    # an audit that never read BioVITA's photos: no clean score equal to its own
    elsewhere = audit_output(tmp_path / "elsewhere", [("train/0", "cifar10/test/0", "exact")], audited=["CIFAR10"])
    clean = evaluate(root, images, texts, str(tmp_path / "out-elsewhere"), exclude=elsewhere,
                     **settings)["mieb_ray"]["clean"]
    assert clean["error"] == f"cannot score BioVITAT2IReranking without the flagged rows: the audit at {elsewhere} " \
                             "read none of its photos (an audit against other tables): audit --against mieb again"


def assert_ranks_within_mteb(out: Path, subsets: dict, got: dict, want: dict, atol: float = 1e-6) -> None:
    """Random floats: every query's rank lies within what mteb's own cosines +- atol allow (a tie between two
    identical photos breaks by the BLAS kernel's last bit, in mteb too: tests/support/numerics.py), each accuracy is the
    share of those ranks within k, and equals mteb's wherever no query's rank is in doubt."""
    bounds = rank_bounds(subsets, want["results"], atol)
    ranks = {(r["subset"], r["query_id"]): r["rank"] for r in pq.read_table(out / "ranks.parquet").to_pylist()}
    assert set(ranks) == set(bounds)
    assert not {q: (ranks[q], b) for q, b in bounds.items() if not b[0] <= ranks[q] <= b[1]}
    # not vacuous: in doubt are the fixture's designed ties (one photo in two taxa), 7 of its 60 queries
    doubtful = sum(lo != hi for lo, hi in bounds.values())
    assert doubtful <= len(bounds) // 5, doubtful
    for name in biovita.SUBSETS:
        n, mine = len(subsets[name].query_ids), [r for (s, _), r in ranks.items() if s == name]
        for k in (1, 5, 10):
            key = f"taxon_top_{k}_accuracy"
            sure, maybe = (sum(b[i] <= k for (s, _), b in bounds.items() if s == name) for i in (1, 0))
            assert got[name][key] == round(sum(r <= k for r in mine) / n, 6), (name, key)
            assert sure / n <= want[name][key] <= maybe / n, (name, key)
            if sure == maybe:
                assert got[name][key] == round(want[name][key], 6), (name, key)
        assert got[name]["main_score"] == got[name]["taxon_top_1_accuracy"]


def test_the_driver_never_opens_an_image_embedding(ray_local, data, tmp_path, monkeypatch):
    """Corpus, pools and embeddings are read by Ray workers (other processes): in this process every shard
    reader raises, and the scores are still mteb's (executor ray: in-process, the driver reads them itself)."""
    root, _ = data
    images, texts = str(tmp_path / "img"), str(tmp_path / "txt")
    make_biovita_embeddings(root, images, texts, image_shards=3)  # exact cosines: mteb's numbers on any CPU
    subsets = {name: load_subset(root, name) for name in biovita.SUBSETS}
    want = mteb_scores(subsets, lookup(texts), lookup(images))

    def forbidden(*args, **kwargs):
        raise AssertionError("the driver opened an embedding shard")

    monkeypatch.setattr(embeddings, "open_shard", forbidden)
    monkeypatch.setattr(embeddings, "read_all", forbidden)
    monkeypatch.setattr(embeddings, "matrix", forbidden)
    result = evaluate(root, images, texts, str(tmp_path / "out"), query_block=50, partitions=2, executor="ray",
                      log=lambda _: None)
    got = {e["hf_subset"]: e for e in result["scores"]["test"]}
    for name in biovita.SUBSETS:
        for key in TAXON_KEYS:
            assert got[name][key] == round(want[name][key], 6), (name, key)


def _outputs(out: Path) -> tuple[list[dict], list[dict]]:
    """The results' scores and the per-query ranks: what must not change with the executor."""
    result = json.loads((out / RESULTS_FILE).read_text())
    return result["scores"]["test"], pq.read_table(out / "ranks.parquet").to_pylist()


def test_in_process_equals_ray_and_mteb(ray_local, data, tmp_path):
    """executor local (the engine's tasks inline, several partitions and query blocks) = executor ray = mteb,
    score for score and rank for rank (exact cosines: on any CPU); auto keeps the Ray this process already runs."""
    root, _ = data
    images, texts = str(tmp_path / "img"), str(tmp_path / "txt")
    make_biovita_embeddings(root, images, texts)
    lines = []
    for where in ("local", "ray", "auto"):
        evaluate(root, images, texts, str(tmp_path / where), query_block=7, partitions=3, executor=where,
                 log=lines.append)
    assert any(line.startswith("[eval] in this process (--executor local") for line in lines)
    assert any(line.startswith("[eval] on Ray (Ray already running in this process") for line in lines)
    local = _outputs(tmp_path / "local")
    assert local == _outputs(tmp_path / "ray") == _outputs(tmp_path / "auto")
    subsets = {name: load_subset(root, name) for name in biovita.SUBSETS}
    want = mteb_scores(subsets, lookup(texts), lookup(images))
    for entry in local[0]:
        for key in TAXON_KEYS + ["main_score"]:
            assert entry[key] == round(want[entry["hf_subset"]][key], 6), (entry["hf_subset"], key)


def test_a_small_eval_never_starts_ray(data, tmp_path):
    """The command line, no cluster asked for, a small corpus: scored in this process, Ray not even imported,
    the same outputs as on Ray (as test_in_process_equals_ray_and_mteb shows)."""
    root, _ = data
    images, texts = str(tmp_path / "img"), str(tmp_path / "txt")
    make_biovita_embeddings(root, images, texts)
    script = ("import sys; from mieb_ray.cli import main; code = main(sys.argv[1:]); "
              "print('ray imported' if 'ray' in sys.modules else 'no ray'); sys.exit(code)")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", script, "eval-biovita", "--data", root, "--image-embeddings",
                           images, "--text-embeddings", texts, "--out", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == f"[eval] 1 task (biovita 1) -> {tmp_path / 'out'}"
    assert lines[-1] == "no ray" and lines[1].startswith("[eval] in this process (") and "Ray not started" in lines[1]
    assert (tmp_path / "out" / "report.html").exists() and (tmp_path / "out" / "_manifest.json").exists()


def test_ties_and_repeated_genus_queries_rank_as_designed(ray_local, data, tmp_path):
    root, description = data
    images, texts = str(tmp_path / "img"), str(tmp_path / "txt")
    make_biovita_embeddings(root, images, texts)
    evaluate(root, images, texts, str(tmp_path / "out"), log=lambda _: None)
    ranks = pq.read_table(tmp_path / "out" / "ranks.parquet").to_pylist()
    by = {(r["subset"], r["query_id"]): r["rank"] for r in ranks}
    ties = description["ties"]
    assert by[("unseen_species", ties["species_query"])] == 2  # tied with an earlier candidate: after it
    genus = {case: by[("unseen_genus", q)] for case, q in ties["genus_queries"].items()}
    # one genus asked three times; its rival photo ties with it: ahead of it only when listed before it
    assert genus == {"rival_before": 2, "rival_after": 1, "rival_absent": 1}
    assert len(ranks) == sum(len(load_subset(root, s).query_ids) for s in biovita.SUBSETS)


def test_outputs_and_report(ray_local, data, tmp_path):
    root, _ = data
    images, texts = str(tmp_path / "img"), str(tmp_path / "txt")
    make_biovita_embeddings(root, images, texts)
    out = tmp_path / "out"
    result = evaluate(root, images, texts, str(out), gallery=4, log=lambda _: None)
    assert json.loads((out / "_manifest.json").read_text())["task_score"] == result["mieb_ray"]["task_score"]
    html = (out / "report.html").read_text()
    assert html.count('class="card"') == 8 and "<svg" in html and "data:image/jpeg;base64," in html
    assert result["mieb_ray"]["image_embeddings"]["model"] is not None
    again = evaluate(root, images, texts, str(out), gallery=2, overwrite=True, log=lambda _: None)  # replaced whole
    assert again["mieb_ray"]["task_score"] == result["mieb_ray"]["task_score"]
    assert (out / "report.html").read_text().count('class="card"') == 4
    assert sorted(os.listdir(out)) == sorted([RESULTS_FILE, "_manifest.json", "ranks.parquet", "report.html"])


def test_the_report_gives_chance_from_each_querys_candidates(ray_local, data, tmp_path):
    """Random embeddings rank the correct taxon anywhere among the candidates with a photo in the query's pool
    (the fixture's pools leave 1 to 3 of the 100 without one): the report shows that chance beside each top-k."""
    root, _ = data
    images, texts = str(tmp_path / "img"), str(tmp_path / "txt")
    make_biovita_embeddings(root, images, texts)
    evaluate(root, images, texts, str(tmp_path / "out"), log=lambda _: None)
    html = (tmp_path / "out" / "report.html").read_text()
    for name in biovita.SUBSETS:
        s = load_subset(root, name)
        taxon = dict(zip(s.corpus_ids, s.corpus_taxa))
        pooled = [{taxon[i] for i in pool} for pool in s.top_ranked]
        assert all(t in p for t, p in zip(s.correct_taxa, pooled))  # else its rank is fixed, not random
        n = np.array([sum(t in p for t in c) for c, p in zip(s.candidate_taxa, pooled)])
        row = html.split(f"</span>{name}</td>", 1)[1].split("</tr>", 1)[0]
        want = [f"{100 * np.mean(np.minimum(k, n) / n):.1f}" for k in (1, 5, 10)]
        assert re.findall(r"chance ([\d.]+)%", row) == want
        assert f"{100 * np.mean(np.minimum(10, n) / n):.1f}" != "10.0"  # not k/100: the pools count


def test_chance_of_a_correct_taxon_without_photos_is_its_fixed_rank():
    neg = -np.inf
    best = np.array([[0.1, 0.2, 0.3, 0.4] + [0.5] * 6,  # all 10 candidates scored: k/10
                     [0.3, neg, neg, 0.2] + [neg] * 6,  # 2 scored: top-1 1/2, top-5 all
                     [0.3, neg, neg, 0.2] + [neg] * 6], np.float32)  # correct (2) unscored: rank 4, always
    got = chance_scores(best, np.array([0, 3, 2]))
    assert got == pytest.approx({"chance_top_1": (0.1 + 0.5 + 0) / 3, "chance_top_5": (0.5 + 1 + 1) / 3,
                                 "chance_top_10": 1.0})
    four = np.array([[0.1, 0.2, 0.3, 0.4] + [neg] * 6], np.float32)  # without photos, candidate order ranks
    assert [chance_scores(four, np.array([c]))["chance_top_5"] for c in (4, 5)] == [1, 0]  # 5th, 6th


@pytest.mark.parametrize("where", ["ray", "local"])
def test_missing_keys_dims_and_empty_subsets_are_clear_errors(ray_local, data, tmp_path, where):
    root, _ = data
    images, texts = str(tmp_path / "img"), str(tmp_path / "txt")
    make_biovita_embeddings(root, images, texts)
    out = str(tmp_path / "out")
    # an image embedding missing: name the subset and the ids
    shard = embeddings.shard_uris(images)[0]
    table = embeddings.open_shard(shard)
    embeddings.write_ipc(shard + ".tmp", table.slice(1))
    os.replace(shard + ".tmp", shard)
    with pytest.raises(UserError, match=r"^1 unseen_species corpus ids have no embedding in .*img \(e\.g\. '"):
        evaluate(root, images, texts, out, executor=where, log=lambda _: None)
    # dimensions that differ between texts and images
    make_biovita_embeddings(root, images, texts, dim=16)
    make_biovita_embeddings(root, str(tmp_path / "img32"), str(tmp_path / "txt32"), dim=32)
    with pytest.raises(UserError, match=r"text embeddings have dim 32 but image embeddings dim 16"):
        evaluate(root, images, str(tmp_path / "txt32"), out, executor=where, log=lambda _: None)
    # a subset whose queries file is empty
    empty = str(tmp_path / "empty")
    make_biovita_mirror(empty)
    path = biovita.config_files(empty, "unseen_species-queries")[0]
    pq.write_table(pq.read_table(path).slice(0, 0), path)
    with pytest.raises(UserError, match=r"unseen_species: no queries"):
        evaluate(empty, images, texts, out, executor=where, log=lambda _: None)


def test_cli_with_a_model_embeds_first(ray_local, data, tiny_clip, tmp_path, capsys):
    """--model embeds the photos and the query texts first; --executor local does all of it in this process."""
    root, _ = data
    out = tmp_path / "out"
    assert main(["eval-biovita", "--data", root, "--model", tiny_clip, "--out", str(out), "--executor", "local"]) == 0
    logged = capsys.readouterr().out.splitlines()
    assert [line for line in logged if line.startswith(("[embed] in this process", "[embed] on Ray"))] == \
        ["[embed] in this process (--executor local)"] * 2
    assert any(line.startswith("[eval] in this process (--executor local") for line in logged)
    results = json.loads((out / RESULTS_FILE).read_text())
    assert results["mieb_ray"]["text_embeddings"]["model"]["name"] == tiny_clip
    texts = lookup(str(out / "embeddings" / "texts"))
    genus = load_subset(root, "unseen_genus")
    assert set(genus.query_texts) <= set(texts) and len(texts) < len(genus.query_ids) + 30  # a text embeds once
    assert main(["eval-biovita", "--data", root, "--model", tiny_clip, "--image-embeddings", root,
                 "--out", str(out)]) == 1
    assert "give either --model, or --image-embeddings" in capsys.readouterr().err.strip().splitlines()[-1]
    assert storage.exists(str(out / "report.html"))


@pytest.mark.parametrize("command", ["eval", "eval-biovita", "eval-zeroshot"])
def test_swapped_embeddings_are_one_line_before_any_scoring(data, tmp_path, capsys, command):
    """The embed job's manifests say which side each output holds: given the wrong way round, every eval command
    says so in one line, before it reads a shard (no Ray: nothing is scored)."""
    root, _ = data
    images, texts = str(tmp_path / "img"), str(tmp_path / "txt")
    make_biovita_embeddings(root, images, texts)

    def error(image_flag: str, text_flag: str) -> list[str]:
        args = ["--image-embeddings", image_flag, "--text-embeddings", text_flag, "--out", str(tmp_path / "out")]
        assert main([command, "--sources", root, *args]) == 1
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err and "[eval]" not in out
        return err.strip().splitlines()

    assert error(texts, images) == [f"mieb-ray: error: --image-embeddings {texts} holds text embeddings and "
                                    f"--text-embeddings {images} holds image embeddings (their manifests say so): "
                                    "swapped?"]
    assert error(texts, texts) == [f"mieb-ray: error: --image-embeddings {texts} holds text embeddings (its "
                                   "manifest says so), not image embeddings"]
    assert error(images, images) == [f"mieb-ray: error: --text-embeddings {images} holds image embeddings (its "
                                     "manifest says so), not text embeddings"]


@pytest.mark.parametrize("model", ["another-tool/model-name", None, 7])
def test_another_tools_manifest_still_scores_and_reports(ray_local, data, tmp_path, model):
    """A manifest whose `model` is a string, missing or a number, and that says nothing of which side it holds
    (as another tool may write): the eval reads the shards by their contract and writes its results, report and
    manifest."""
    root, _ = data
    images, texts = str(tmp_path / "img"), str(tmp_path / "txt")
    make_biovita_embeddings(root, images, texts)
    for uri in (images, texts):
        manifest = json.loads((Path(uri) / "_manifest.json").read_text())
        manifest.pop("model")
        manifest["config"].pop("modality")
        if model is not None:
            manifest["model"] = model
        (Path(uri) / "_manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "out"
    assert main(["eval-biovita", "--data", root, "--image-embeddings", images, "--text-embeddings", texts,
                 "--out", str(out)]) == 0
    result = json.loads((out / RESULTS_FILE).read_text())
    assert result["mieb_ray"]["image_embeddings"]["model"] == ({"name": str(model)} if model is not None else {})
    assert (out / "report.html").exists() and (out / "_manifest.json").exists()
