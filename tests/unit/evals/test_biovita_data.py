"""BioVITA data: the fixture mirror, the loader (local, s3://), its errors, and the mteb reference harness."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from support.biovita import Subset, describe, load_subset
from support.embedding_fixtures import make_biovita_embeddings

from mieb_ray import storage
from mieb_ray.demo_data.biovita import SIDECAR, make_biovita_mirror
from mieb_ray.errors import UserError
from mieb_ray.evals import biovita_data as biovita
from mieb_ray.evals.biovita_data import REPO, SUBSETS
from mieb_ray.io import embeddings


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = tmp_path_factory.mktemp("biovita")
    made = make_biovita_mirror(root)
    return made | describe(made)


@pytest.fixture(scope="module")
def emb(mirror, tmp_path_factory):
    """The fixture's embeddings, written and read back: (text by text, image by corpus id, output dir)."""
    out = tmp_path_factory.mktemp("biovita-emb")
    make_biovita_embeddings(mirror, str(out / "image"), str(out / "text"))
    return _read_emb(out / "text"), _read_emb(out / "image"), out


def _read_emb(root) -> dict[str, np.ndarray]:
    table = pa.concat_tables(embeddings.open_shard(u) for u in embeddings.shard_uris(str(root)))
    return dict(zip(table["key"].to_pylist(), embeddings.matrix(table)))


def _raw(mirror: dict, config: str) -> dict[str, list]:
    """A config as written, read whole with pyarrow (independently of the loader)."""
    return pq.read_table(Path(mirror["repo"], config, "test-00000-of-00001.parquet")).to_pydict()


def _subsets(mirror) -> dict[str, Subset]:
    return {s: load_subset(mirror["root"], s) for s in SUBSETS}


# ---------------------------------------------------------------------------------------------- the loader


def test_load_subset_equals_what_was_written(mirror):
    for name in SUBSETS:
        s = load_subset(mirror["root"], name)
        corpus, queries = _raw(mirror, f"{name}-corpus"), _raw(mirror, f"{name}-queries")
        qrels, ranked = _raw(mirror, f"{name}-qrels"), _raw(mirror, f"{name}-top_ranked")
        assert (s.corpus_ids, s.corpus_taxa) == (corpus["id"], corpus["taxon"])
        assert (s.query_ids, s.query_texts, s.correct_taxa, s.candidate_taxa) == (
            queries["id"], queries["text"], queries["correct_taxon"], queries["candidate_taxa"])
        assert ranked["query-id"] != queries["id"]  # written out of order: the loader aligns by id
        assert s.top_ranked == [dict(zip(ranked["query-id"], ranked["corpus-ids"]))[q] for q in s.query_ids]
        expected: dict = {}
        for q, d, score in zip(qrels["query-id"], qrels["corpus-id"], qrels["score"]):
            expected.setdefault(q, {})[d] = score
        assert s.qrels == expected


def test_the_fixture_is_biovita_shaped(mirror):
    species, genus = (load_subset(mirror["root"], s) for s in SUBSETS)
    assert species.corpus_ids == genus.corpus_ids and species.corpus_taxa != genus.corpus_taxa  # one corpus
    assert species.query_ids[:3] == genus.query_ids[:3] == ["0", "1", "2"]  # ids repeat across subsets
    for s in (species, genus):
        taxon = dict(zip(s.corpus_ids, s.corpus_taxa))
        groups: dict[str, list[str]] = {}
        for d, t in taxon.items():
            groups.setdefault(t, []).append(d)
        assert all(len(c) == len(set(c)) == 100 for c in s.candidate_taxa)
        assert max(map(len, s.top_ranked)) > 1000  # mteb keeps the top 1,000 documents of a pool
        for qid, cands, pool, correct in zip(s.query_ids, s.candidate_taxa, s.top_ranked, s.correct_taxa):
            assert pool == [d for t in cands for d in groups.get(t, [])]  # the candidate groups, in order
            assert set(s.qrels[qid]) == set(groups[correct])
            assert any(t not in groups for t in cands)  # candidates without photos
        sizes = {len(g) for g in groups.values()}
        assert min(sizes) == 1 and max(sizes) == (18 if s is species else 95)
    assert len(set(species.query_texts)) == len(species.query_texts)
    texts = genus.query_texts
    assert len(set(texts)) < len(texts)
    tie = mirror["ties"]["genus"]
    tie_queries = [c for t, c in zip(texts, genus.candidate_taxa) if t == tie]
    assert len(tie_queries) == 3 and len({tuple(c) for c in tie_queries}) == 3  # one text, three candidate lists
    assert mirror["subsets"]["unseen_genus"]["group_sizes"] == [1, 95]


def test_loading_never_reads_the_images(mirror, monkeypatch):
    """Column projection: the corpus `image` column is not read (the real one is 2,835 photos)."""
    seen = []

    class Recording(pq.ParquetFile):
        def read(self, columns=None, **kw):
            seen.append(columns)
            return super().read(columns=columns, **kw)

        def read_row_group(self, i, columns=None, **kw):
            seen.append(columns)
            return super().read_row_group(i, columns=columns, **kw)

    monkeypatch.setattr(biovita.pq, "ParquetFile", Recording)
    for name in SUBSETS:
        load_subset(mirror["root"], name)
    assert seen and all(c is not None and "image" not in c for c in seen)
    seen.clear()
    photos = biovita.read_images(mirror["root"], "unseen_genus", {"0", "5", "no-such-id"})
    assert set(photos) == {"0", "5"} and Image.open(io.BytesIO(photos["5"])).size[0] >= 64
    assert sum(c == ["image"] for c in seen) == 1  # one row group holds both ids: its images only


def test_files_come_from_the_card(mirror, tmp_path):
    files = biovita.corpus_files(mirror["root"], "unseen_species")
    assert files == [storage.join(mirror["repo"], "unseen_species-corpus/test-00000-of-00001.parquet")]
    repo = tmp_path / REPO
    shutil.copytree(mirror["repo"], repo)
    # the card's data_files patterns rule: a config may live outside its <config>/ folder
    (repo / "data").mkdir()
    (repo / "unseen_species-queries" / "test-00000-of-00001.parquet").rename(repo / "data" / "species-queries.parquet")
    card = (repo / "README.md").read_text()
    (repo / "README.md").write_text(card.replace("path: unseen_species-queries/test-*", "path: data/species-q*"))
    assert load_subset(str(tmp_path), "unseen_species") == load_subset(mirror["root"], "unseen_species")
    # without a card, `datasets` knows no such config (load_dataset(repo, name) fails): neither do we
    (repo / "README.md").unlink()
    with pytest.raises(UserError, match="no files for config unseen_species-corpus"):
        load_subset(str(tmp_path), "unseen_species")


def test_the_layout_is_the_hubs(mirror, tmp_path):
    queries = datasets.load_dataset(mirror["repo"], "unseen_species-queries", split="test",
                                    cache_dir=str(tmp_path / "cache"))
    assert queries.column_names == ["id", "text", "correct_taxon", "candidate_taxa"]
    assert queries[0]["id"] == "0" and len(queries[0]["candidate_taxa"]) == 100
    corpus = datasets.load_dataset(mirror["repo"], "unseen_genus-corpus", split="test",
                                   cache_dir=str(tmp_path / "cache"))
    assert isinstance(corpus.features["image"], datasets.Image)
    assert corpus[0]["image"].mode == "RGB" and len(corpus) == mirror["corpus"]
    assert datasets.get_dataset_config_names(mirror["repo"]) == sorted(
        f"{s}-{k}" for s in SUBSETS for k in biovita.KINDS)


def test_s3_gives_the_same_subsets(mirror, s3):
    storage.reset_clients()  # the S3 environment arrived with the `s3` fixture
    client = s3.client()
    for path in Path(mirror["repo"]).rglob("*"):
        if path.is_file():
            key = f"biovita-mirror/{REPO}/{path.relative_to(mirror['repo']).as_posix()}"
            client.upload_file(str(path), s3.bucket, key)
    root = f"s3://{s3.bucket}/biovita-mirror"
    for name in SUBSETS:
        assert load_subset(root, name) == load_subset(mirror["root"], name)
    assert biovita.corpus_files(root, "unseen_genus") == [
        f"{root}/{REPO}/unseen_genus-corpus/test-00000-of-00001.parquet"]
    local = biovita.read_images(mirror["root"], "unseen_genus", {"7"})
    assert biovita.read_images(root, "unseen_genus", {"7"}) == local and len(local) == 1


# ---------------------------------------------------------------------------------------------- errors


def _rewrite(repo: Path, config: str, change) -> None:
    path = repo / config / "test-00000-of-00001.parquet"
    table = pq.read_table(path)
    rows = change(table.to_pylist())
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)


@pytest.fixture
def broken(tmp_path):
    """A fresh image-less mirror to break: (root, repo dir)."""
    make_biovita_mirror(tmp_path, with_images=False)
    return str(tmp_path), tmp_path / REPO


def _error(root: str, subset: str = "unseen_species") -> str:
    with pytest.raises(UserError) as err:
        load_subset(root, subset)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"BioVITA subset {subset}: ")
    return message


def test_missing_config(broken):
    root, repo = broken
    shutil.rmtree(repo / "unseen_species-qrels")
    assert _error(root) == (f"BioVITA subset unseen_species: no files for config unseen_species-qrels "
                            f"under {storage.join(root, REPO)}")
    with pytest.raises(UserError, match="no files for config unseen_genus-corpus under"):
        biovita.corpus_files(str(repo), "unseen_genus")  # the repo folder is not the mirror root


def test_no_queries(broken):
    root, repo = broken
    _rewrite(repo, "unseen_species-queries", lambda rows: [])
    assert _error(root) == "BioVITA subset unseen_species: no queries in config unseen_species-queries"


def test_correct_taxon_not_a_candidate(broken):
    root, repo = broken

    def change(rows):
        rows[4]["candidate_taxa"] = [t for t in rows[4]["candidate_taxa"] if t != rows[4]["correct_taxon"]]
        return rows

    _rewrite(repo, "unseen_genus-queries", change)
    assert "query '4': correct taxon" in _error(root, "unseen_genus")
    assert "is not among its 99 candidate taxa" in _error(root, "unseen_genus")


def test_top_ranked_for_an_unknown_query(broken):
    root, repo = broken
    _rewrite(repo, "unseen_species-top_ranked", lambda rows: rows + [{"query-id": "999", "corpus-ids": ["0"]}])
    assert _error(root) == ("BioVITA subset unseen_species: top_ranked has an entry for query '999', "
                            "which is not in config unseen_species-queries")


def test_pool_names_an_unknown_photo(broken):
    root, repo = broken

    def change(rows):
        row = next(r for r in rows if r["query-id"] == "2")
        row["corpus-ids"] = row["corpus-ids"] + ["123456"]
        return rows

    _rewrite(repo, "unseen_genus-top_ranked", change)
    assert _error(root, "unseen_genus") == ("BioVITA subset unseen_genus: the pool of query '2' names corpus id "
                                            "'123456', which is not in config unseen_genus-corpus")


def test_unknown_subset(mirror):
    with pytest.raises(UserError, match="unknown BioVITA subset 'unseen_family'; valid: unseen_species, unseen_genus"):
        load_subset(mirror["root"], "unseen_family")


# ---------------------------------------------------------------------------------------------- embeddings


def test_embeddings_are_in_our_format_with_exact_ties(mirror, emb, tmp_path):
    text, image, out = emb
    subsets = _subsets(mirror)
    manifest = json.loads((out / "image" / "_manifest.json").read_text())
    assert manifest["format"] == "mieb-embeddings" and manifest["dim"] == 32 and len(manifest["shards"]) == 2
    assert sorted(image, key=int) == subsets["unseen_species"].corpus_ids
    assert sorted(text) == sorted({t for s in subsets.values() for t in s.query_texts})  # one row per text
    vectors = np.stack([*text.values(), *image.values()])
    assert np.array_equal((vectors.astype(np.float64) ** 2).sum(1), np.ones(len(vectors)))  # exactly unit
    # on the 1/256 grid, float32 cosines are exact whatever the summation order
    some = vectors[::37]
    assert np.array_equal(some @ vectors.T, (some.astype(np.float64) @ vectors.T.astype(np.float64)))
    ties = mirror["ties"]
    for a, b in ties["duplicates"]:
        assert np.array_equal(image[a], image[b])
    assert all(np.array_equal(image[i], text[ties["species_taxa"][0]]) for i in ties["species_photos"])
    # from the root (sidecar) and in float16: the same vectors
    assert json.loads(Path(mirror["repo"], SIDECAR).read_text()) == mirror["params"]
    make_biovita_embeddings(mirror["root"], str(tmp_path / "image"), str(tmp_path / "text"), dtype="float16")
    half = _read_emb(tmp_path / "image")
    assert all(half[k].dtype == np.float16 and np.array_equal(half[k].astype(np.float32), v) for k, v in image.items())


# ---------------------------------------------------------------------------------------------- mteb


def taxon_topk(subset: Subset, text, image, ks=(1, 5, 10)) -> tuple[dict, dict]:
    """reference/biovita-scoring.md §3.4, written out again: (accuracies, rank of the correct taxon per query)."""
    doc_taxon = dict(zip(subset.corpus_ids, subset.corpus_taxa))
    hits, ranks = dict.fromkeys(ks, 0), {}
    for qid, query, cand, correct, ids in zip(subset.query_ids, subset.query_texts, subset.candidate_taxa,
                                              subset.correct_taxa, subset.top_ranked):
        q = text[query] / max(np.linalg.norm(text[query]), 1e-12)
        docs = np.stack([image[i] for i in ids])
        docs = docs / np.maximum(np.linalg.norm(docs, axis=1, keepdims=True), 1e-12)
        s = (docs @ q).astype(np.float32)
        best: dict[str, float] = {}
        for j in np.argsort(-s, kind="stable")[:1000]:
            t = doc_taxon[ids[j]]
            if t in cand:
                best[t] = max(best.get(t, -np.inf), float(s[j]))
        order = sorted(range(len(cand)), key=lambda i: (-best.get(cand[i], -np.inf), i))
        ranks[qid] = order.index(cand.index(correct)) + 1
        for k in ks:
            hits[k] += ranks[qid] <= k
    return {f"taxon_top_{k}_accuracy": hits[k] / len(subset.query_ids) for k in ks}, ranks


def test_mteb_harness_agrees_with_a_reimplementation(mirror, emb):
    from support.mteb_reference import mteb_scores

    text, image, _ = emb
    subsets = _subsets(mirror)
    scores = mteb_scores(subsets, text, image, return_results=True)
    print({k: v for k, v in scores.items() if k not in ("task_result", "results")})
    for name, s in subsets.items():
        mine, ranks = taxon_topk(s, text, image)
        assert {k: scores[name][k] for k in mine} == mine
        assert scores[name]["main_score"] == mine["taxon_top_1_accuracy"]
        assert 0 < mine["taxon_top_1_accuracy"] < mine["taxon_top_10_accuracy"] < 1
        assert max(len(r) for r in scores["results"][name].values()) == 1000  # mteb's cap was exercised
        if name == "unseen_species":
            assert ranks[mirror["ties"]["species_query"]] == 2  # tied with an earlier and a later candidate
        else:
            assert {k: ranks[q] for k, q in mirror["ties"]["genus_queries"].items()} == {
                "rival_before": 2, "rival_after": 1, "rival_absent": 1}
    assert scores["task_score"] == pytest.approx(
        (scores["unseen_species"]["main_score"] + scores["unseen_genus"]["main_score"]) / 2, abs=1e-15)
    result = scores["task_result"]
    assert result["task_name"] == "BioVITAT2IReranking"
    assert [s["hf_subset"] for s in result["scores"]["test"]] == list(SUBSETS)
    assert not os.path.exists(os.path.expanduser("~/.cache/mteb/results/mieb-ray__precomputed"))
