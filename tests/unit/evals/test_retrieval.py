"""MIEB's SciMMIR retrieval tasks: our TaskResult equals `mteb.evaluate`'s on the same embeddings (mteb's own task
reading a fixture mirror in the hub's layout), through ties, float16 and shuffled shards, extra keys, relevant
documents past the top 1,000, and the clean scores against mteb's on the filtered split."""

from __future__ import annotations

import glob
import io
import json
import math
import os
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from support.embedding_fixtures import write_embeddings
from support.mteb_reference import mteb_retrieval

from mieb_ray.demo_data import mirror as fixture_mirror
from mieb_ray.demo_data.mirror import make_mirror
from mieb_ray.evals import metrics, registry, retrieval
from mieb_ray.evals.job import evaluate

pytestmark = pytest.mark.timeout(600)
TASKS = [t.name for t in retrieval.TASKS]


def test_every_task_is_mtebs():
    import mteb

    for task in retrieval.TASKS:
        theirs = mteb.get_task(task.name)
        assert (theirs.metadata.dataset["path"], theirs.metadata.dataset["revision"]) == \
            (task.source.repo, task.source.revision)
        assert theirs.metadata.eval_splits == [task.split] and theirs.metadata.main_score == "ndcg_at_10"
        assert theirs.metadata.category == ("i2t" if task.queries == "image" else "t2i")
        assert tuple(theirs.k_values) == metrics.K_VALUES and not theirs.ignore_identical_ids


def test_metrics_equal_mtebs_from_a_run():
    """metrics.retrieval of each query's rank and confidence equals mteb's calculate_retrieval_scores (pytrec_eval)
    on the run itself: every rank from 1 to past the top 1,000, exact ties broken by doc id."""
    from mteb._evaluators.retrieval_metrics import calculate_retrieval_scores, make_score_dict

    rng = np.random.default_rng(0)
    n, top = 1_100, 1_000
    scores = np.round(rng.random((n, n)) * 64) / 64  # ties everywhere
    ids = [f"corpus-test-{i}" for i in range(n)]
    results, ranks, conf = {}, [], {"max": [], "std": [], "diff1": []}
    for q in range(n):
        order = sorted(range(n), key=lambda d: (scores[q, d], ids[d]), reverse=True)[:top]
        results[f"query-test-{q}"] = {ids[d]: float(scores[q, d]) for d in order}
        ranks.append(order.index(q) + 1 if q in order else top + 1)
        for k, v in metrics.confidence(scores[q, order]).items():
            conf[k].append(v)
    qrels = {f"query-test-{q}": {ids[q]: 1} for q in range(n)}
    parts = calculate_retrieval_scores(results, qrels, metrics.K_VALUES)[1:]
    names = ("ndcg", "_map", "recall", "precision", "naucs", "mrr", "naucs_mrr", "hit_rate")
    theirs = make_score_dict(**dict(zip(names, parts)), task_scores={})
    mine = metrics.retrieval(ranks, {k: np.array(v) for k, v in conf.items()})
    assert list(mine) == list(theirs)
    assert max(ranks) > top and min(ranks) == 1
    for key, value in theirs.items():
        assert mine[key] == value or (math.isnan(value) and math.isnan(mine[key])) or \
            ("_std" in key and abs(mine[key] - value) < 1e-9), key  # std: a sum in another order


def _captions(mirror: str) -> list[str]:
    [path] = glob.glob(os.path.join(mirror, "mteb/SciMMIR/data/test-*.parquet"))
    return ["" if t is None else t for t in pq.read_table(path, columns=["text"])["text"].to_pylist()]


def _texts(captions: list[str]) -> list[str]:
    """Every text mteb passes: the captions as queries, and stripped as documents."""
    return list(dict.fromkeys(captions + [c.strip() for c in captions]))


def _lattice(n: int, dim: int, rng) -> np.ndarray:
    """Rows of four ones: unit vectors of 0.5s, every cosine exact (0, 1/4, ..., 1) and most of them tied."""
    out = np.zeros((n, dim), np.float32)
    for row in out:
        row[rng.choice(dim, 4, replace=False)] = 1
    return out


PADDED = {6: "  Figure 9: a caption with spaces around it.\n"}  # fixture rows 6, 1006: stripped as documents


def _mirror(root: str, rows: int, image_bytes=None) -> str:
    """The test split with a caption that has spaces around it in place of the fixture's null and blank ones."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fixture_mirror, "SCIMMIR_NO_CAPTION", PADDED)
        make_mirror(root, rows=2, datasets=["scimmir"], files=1, eval_rows=rows, image_bytes=image_bytes)
    return root


def _small_figure(source, index: int) -> bytes:
    """A 16 x 12 PNG of its own colour per row: mteb's loader decodes every figure of the 1,030 (about 3 ms each
    at the fixture pictures' size), and what a figure shows does not enter scores of given embeddings."""
    out = io.BytesIO()
    Image.new("RGB", (16, 12), (index % 256, index // 256, 99)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    return _mirror(str(tmp_path_factory.mktemp("scimmir")), 1_030, _small_figure)


def _embeddings(tmp_path, mirror: str, lattice: bool, dtype: str = "float32", drop: int | None = None):
    """Image embeddings (shuffled, with keys of other splits and tasks to ignore) and caption embeddings."""
    rng = np.random.default_rng(1)
    captions = _captions(mirror)
    n, texts = len(captions), _texts(captions)
    if lattice:
        images, text_vectors = _lattice(n, 12, rng), _lattice(len(texts), 12, rng)
        images[7::9] = images[6::9][:len(images[7::9])]  # identical figures: ties in the corpus
    else:
        text_vectors = rng.normal(size=(len(texts), 16)).astype(np.float32)
        by_text = dict(zip(texts, text_vectors))
        images = np.stack([by_text[c.strip()] for c in captions]) + 1.5 * rng.normal(size=(n, 16)).astype(np.float32)
    images = images.astype(dtype).astype(np.float32)  # what a float16 shard holds
    keys = [f"scimmir/test/{i}" for i in range(n)] + ["scimmir/0", "scimmir/validation/3", "cifar10/test/0"]
    rows = np.concatenate([images, np.ones((3, images.shape[1]), np.float32)])
    keep = [i for i in range(len(keys)) if i != drop]
    order = rng.permutation(keep)
    image_uri, text_uri = str(tmp_path / "images"), str(tmp_path / "texts")
    write_embeddings(image_uri, [keys[i] for i in order], rows[order], "image", dtype, 3, {})
    write_embeddings(text_uri, texts + ["an extra caption"], np.concatenate([text_vectors, text_vectors[:1]]),
                     "text", "float32", 2, {})
    return image_uri, text_uri, images, dict(zip(texts, text_vectors))


@contextmanager
def one_thread():
    """numpy's BLAS and torch on one thread each: random-float cosines summed in one order on both sides, so that
    near-tied confidences (the nAUCs rank queries by them) break alike in mteb and here."""
    import torch
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("lattice", [True, False], ids=["lattice", "random"])
def test_each_task_equals_mteb(mirror, tmp_path, lattice):
    with one_thread():
        _each_task_equals_mteb(mirror, tmp_path, lattice)


def _each_task_equals_mteb(mirror, tmp_path, lattice):
    image_uri, text_uri, images, by_text = _embeddings(tmp_path, mirror, lattice, "float32" if lattice else "float16")
    results = evaluate(registry.select(",".join(TASKS)), registry.Options(mirror), str(tmp_path / "out"),
                                      images=image_uri, texts=text_uri, executor="local", log=print)
    for task in retrieval.TASKS:
        theirs = mteb_retrieval(task.name, os.path.join(mirror, task.source.repo), images, by_text)
        mine, ref = results[task.name]["scores"][task.split][0], theirs["scores"][task.split][0]
        assert list(mine) == list(ref), task.name
        for key, value in ref.items():
            if lattice and "_std" not in key:  # exact cosines: every rank, hence every score, is mteb's
                assert mine[key] == value or (value != value and mine[key] != mine[key]), (task.name, key)
            elif isinstance(value, float):
                assert mine[key] == pytest.approx(value, abs=1e-6, nan_ok=True), (task.name, key)
        assert 0 < mine["ndcg_at_10"] < 1 and (mine["recall_at_1000"] < 1 or not lattice)  # ranks past 1,000 too
        assert results[task.name]["mieb_ray"]["queries"] == len(images)


def test_missing_image_is_one_line(mirror, tmp_path, capsys):
    from mieb_ray.cli import main

    image_uri, text_uri, _, _ = _embeddings(tmp_path, mirror, True, drop=5)
    code = main(["eval", "--tasks", TASKS[0], "--sources", mirror, "--image-embeddings", image_uri,
                 "--text-embeddings", text_uri, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert "SciMMIRI2TRetrieval: 1 of the 1,030 eval images have no embedding" in err[0] and "scimmir/test/5" in err[0]
    texts = str(tmp_path / "texts-8d")  # captions of another dimension
    write_embeddings(texts, _texts(_captions(mirror)), np.ones((len(_texts(_captions(mirror))), 8), np.float32), "text",
                     "float32", 1, {})
    image_uri, _, _, _ = _embeddings(tmp_path / "full", mirror, True)
    code = main(["eval", "--tasks", TASKS[0], "--sources", mirror, "--image-embeddings", image_uri,
                 "--text-embeddings", texts, "--out", str(tmp_path / "out"), "--allow-mixed-models"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1] == ("mieb-ray: error: query embeddings have dim 12 but the corpus's dim 8 (image and "
                                     "text embeddings of different models?)")


def test_clean_scores_are_mtebs_on_the_filtered_split(mirror, tmp_path):
    """--exclude: the flagged rows leave queries and corpus; the clean scores equal mteb's on a split without them."""
    from support.contamination import audit_output

    image_uri, text_uri, images, by_text = _embeddings(tmp_path, mirror, True)
    flagged = [3, 4, 500, 1_029]
    audit = audit_output(tmp_path / "audit", [(f"scimmir/{i}", f"scimmir/test/{i}", "exact") for i in flagged])
    results = evaluate(registry.select(",".join(TASKS)), registry.Options(mirror, exclude=audit),
                                      str(tmp_path / "out"), images=image_uri, texts=text_uri, executor="local",
                                      log=print)
    repo = os.path.join(mirror, "mteb/SciMMIR")
    filtered = str(tmp_path / "filtered" / "mteb/SciMMIR")
    [path] = glob.glob(os.path.join(repo, "data/test-*.parquet"))
    table = pq.read_table(path)
    keep = np.ones(table.num_rows, bool)
    keep[flagged] = False
    os.makedirs(os.path.join(filtered, "data"))
    pq.write_table(table.filter(pa.array(keep)), os.path.join(filtered, "data", os.path.basename(path)))
    for task in retrieval.TASKS:
        clean = results[task.name]["mieb_ray"]["clean"]
        theirs = mteb_retrieval(task.name, filtered, images[keep], by_text)["scores"][task.split][0]
        assert clean["images"] == len(images) - len(flagged) and clean["left_out"]["eval"]["exact"] == len(flagged)
        for key, value in theirs.items():
            if isinstance(value, float) and "_std" not in key:
                assert round(clean[key], 6) == value or (value != value and clean[key] != clean[key]), (task.name, key)
        assert clean["main_score"] == clean["ndcg_at_10"] != results[task.name]["scores"][task.split][0]["ndcg_at_10"]


def test_cli_with_model_embeds_figures_and_captions(ray_local, tiny_clip, tmp_path):
    """--model: the test split built and embedded (figures keyed scimmir/test/<index>, captions by their text as
    mteb reads them), scored as mteb scores those same embeddings."""
    from mieb_ray.cli import main
    from mieb_ray.io import embeddings

    mirror = _mirror(str(tmp_path / "mirror"), 12)
    out = str(tmp_path / "out")
    assert main(["eval", "--tasks", ",".join(TASKS), "--sources", mirror, "--model", tiny_clip, "--out", out,
                 "--workers", "1"]) == 0
    figures = dict(zip(*embeddings.read_all(os.path.join(out, "embeddings", "images"))))
    texts = dict(zip(*embeddings.read_all(os.path.join(out, "embeddings", "texts"))))
    captions = _captions(mirror)
    assert set(texts) == set(_texts(captions)) and PADDED[6] in texts and PADDED[6].strip() in texts
    images = np.stack([figures[f"scimmir/test/{i}"] for i in range(len(captions))])
    for task in retrieval.TASKS:
        ours = json.loads(open(os.path.join(out, f"{task.name}.json")).read())["scores"][task.split][0]
        theirs = mteb_retrieval(task.name, os.path.join(mirror, task.source.repo), images, texts)
        theirs = theirs["scores"][task.split][0]
        assert ours["main_score"] == ours["ndcg_at_10"] > 0
        for key, value in theirs.items():
            if isinstance(value, float):
                assert ours[key] == pytest.approx(value, abs=1e-6, nan_ok=True), (task.name, key)


def test_a_split_with_blank_captions_is_one_line(tmp_path, capsys):
    from mieb_ray.cli import main

    mirror = str(tmp_path / "mirror")
    make_mirror(mirror, rows=2, datasets=["scimmir"], files=1, eval_rows=12)  # the fixture's rows 5 (null), 6 ("  ")
    images, texts = str(tmp_path / "images"), str(tmp_path / "texts")
    write_embeddings(images, [f"scimmir/test/{i}" for i in range(12)], np.ones((12, 4), np.float32), "image",
                     "float32", 1, {})
    write_embeddings(texts, ["a"], np.ones((1, 4), np.float32), "text", "float32", 1, {})
    assert main(["eval", "--tasks", TASKS[1], "--sources", mirror, "--image-embeddings", images, "--text-embeddings",
                 texts, "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"mieb-ray: error: SciMMIRT2IRetrieval: 2 rows of the test split in {mirror} have no caption (rows 5, 6); "
        "the hub's split has none"]
