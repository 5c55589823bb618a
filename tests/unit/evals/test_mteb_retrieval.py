"""MIEB's retrieval tasks scored through mteb's own code (mieb_ray/evals/mteb_suite.py) equal `mteb.evaluate` with
mteb's CLIP wrapper: the 43 Any2AnyRetrieval tasks but SciMMIR's two, the 3 Any2AnyMultilingualRetrieval T2I tasks
and the 10 ViDoRe DocumentUnderstanding tasks, each read from a fixture mirror in its hub repo's layout
(support/hub_tasks/retrieval.py: the layouts and the pitfalls they hold). Every metric of every split and
hf_subset is compared, and mteb is shown to have read each mirror: the queries and documents its retrieval
evaluator was handed are the ones written."""

from __future__ import annotations

import pytest
from support import mteb_tasks
from support.hub_tasks import retrieval as hub
from support.mteb_tasks import assert_same_scores, mteb_result, noise_decided

pytestmark = pytest.mark.timeout(900)
NAMES = list(hub.TASKS)
@pytest.fixture(scope="module")
def mirror(tmp_path_factory, tiny_clip) -> tuple[str, str]:
    """Every task's repo under one root (a repo two tasks share written once) and the tiny CLIP: (root, model).
    The fixtures' salts keep every query's documents apart under this model's weights (make_tiny_clip's seed)."""
    root = tmp_path_factory.mktemp("mirror")
    for path in dict.fromkeys(hub.PATHS.values()):
        hub.TASKS[next(n for n in NAMES if hub.PATHS[n] == path)](str(root))
    return str(root), tiny_clip


@pytest.fixture(scope="module")
def theirs(mirror) -> tuple[dict[str, dict], dict[str, dict]]:
    """mteb.evaluate's TaskResult of each task, and what its retrieval evaluator was handed:
    {task: {hf_subset: {split: {"queries": n, "corpus": n}}}}."""
    import mteb.abstasks.retrieval as mteb_retrieval

    root, model = mirror
    handed: dict[str, dict] = {}
    real = mteb_retrieval.RetrievalEvaluator

    def recording(corpus, queries, *, task_metadata, hf_split, hf_subset, **kwargs):
        handed.setdefault(task_metadata.name, {}).setdefault(hf_subset, {})[hf_split] = {
            "queries": len(queries), "corpus": len(corpus)}
        return real(corpus, queries, task_metadata=task_metadata, hf_split=hf_split, hf_subset=hf_subset, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mteb_retrieval, "RetrievalEvaluator", recording)
        results = {name: mteb_result(name, root, model) for name in NAMES}
    return results, handed


@pytest.fixture(scope="module")
def ours(mirror, tmp_path_factory) -> dict[str, dict]:
    """The eval job's TaskResults of all the tasks, from one run."""
    root, model = mirror
    return mteb_tasks.ours(NAMES, root, model, str(tmp_path_factory.mktemp("out")))


def test_the_table_is_mieb_retrieval():
    """The mirrors cover MIEB's retrieval tasks but SciMMIR's (tested elsewhere), each at its hub path."""
    import mteb

    retrieval_types = ("Any2AnyRetrieval", "Any2AnyMultilingualRetrieval", "DocumentUnderstanding")
    mieb = {t.metadata.name for t in mteb.get_benchmark("MIEB(Multilingual)").tasks
            if t.metadata.type in retrieval_types}
    assert set(NAMES) == mieb - {"SciMMIRI2TRetrieval", "SciMMIRT2IRetrieval"}
    for name in NAMES:
        assert hub.PATHS[name] == mteb.get_task(name).metadata.dataset["path"], name


def test_mteb_reads_every_mirror(theirs):
    """What mteb's evaluator was handed is what was written: every hf_subset, the queries that have qrels (the
    v1 loader drops the others, the evaluation those without a line), the whole corpus (after HatefulMemes' text
    dedup, Memotion's drop of rows without text)."""
    results, handed = theirs
    for name in NAMES:
        assert handed[name] == hub.ROWS[name], name
        subsets = {s["hf_subset"] for s in results[name]["scores"]["test"]}
        assert subsets == set(hub.ROWS[name]), name


def test_the_scores_are_not_trivial(theirs):
    """No subset scores all 0 or all 1 (ndcg@1000 or recall@1 strictly between): a mirror read wrong, or ranked
    trivially, would."""
    results, _ = theirs
    for name in NAMES:
        for subset in results[name]["scores"]["test"]:
            assert 0 < subset["ndcg_at_1000"] < 1 or 0 < subset["recall_at_1"] < 1, (name, subset["hf_subset"])


@pytest.mark.parametrize("name", NAMES)
def test_each_task_equals_mteb(name, theirs, ours):
    assert_same_scores(ours[name], theirs[0][name], skip=lambda key: noise_decided(name, key))


# self-retrieval (skip_first_result), fused image+text queries, ViDoRe's integer ids, a multilingual task's
# subsets, ROxford's hard split, image+text documents
ENGINE = ["CUB200I2IRetrieval", "CIRRIT2IRetrieval", "VidoreArxivQARetrieval", "WITT2IRetrieval",
          "ROxfordHardI2IRetrieval", "EDIST2ITRetrieval"]


def test_a_corpus_searched_on_the_top_k_engine_scores_as_mteb(mirror, theirs, tmp_path, monkeypatch):
    """Every corpus taken for large (ENGINE_DOCS = 1): searched by the top-k engine's tasks (here in this process)
    instead of mteb's SearchEncoderWrapper, every metric of every split and subset is still mteb's."""
    from mieb_ray.evals import mteb_suite

    searched, real = [], mteb_suite.top_docs
    monkeypatch.setattr(mteb_suite, "ENGINE_DOCS", 1)
    monkeypatch.setattr(mteb_suite, "top_docs", lambda *args: searched.append(len(args[2])) or real(*args))
    root, model = mirror
    results = mteb_tasks.ours(ENGINE, root, model, str(tmp_path / "out"))
    assert len(searched) == sum(len(hub.ROWS[name]) for name in ENGINE)  # one search per subset
    for name in ENGINE:
        assert_same_scores(results[name], theirs[0][name], skip=lambda key: noise_decided(name, key))
