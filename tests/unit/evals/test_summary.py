"""The run's summary (evals/summary.py) is mteb's: on hand-made TaskResults of MIEB(lite)'s tasks it equals mteb's
`Benchmark.get_score`, its leaderboard's summary table (read back with mteb.ResultCache from the results
repository's layout), and the means worked out by hand on scores of the 1/64 grid, where every mean is exact."""

from __future__ import annotations

from fractions import Fraction

from support.task_results import REGISTERED, task_result, with_clean

from mieb_ray.evals import benchmarks, results_repo
from mieb_ray.evals.summary import summarize

PART = ("Country211", "DTD", "TinyImageNetClustering", "CIFAR100ZeroShot", "Winoground", "STS13VisualSTS",
        "VisualSTS17Multilingual", "WITT2IRetrieval", "VidoreDocVQARetrieval")  # 9 of MIEB(lite)'s 10 types


def _on_grid(names) -> tuple[dict[str, Fraction], dict[str, Fraction]]:
    """({task: score}, {type: mean}): type j's tasks score (8 + 4j + d) / 64 with offsets d that cancel, so its mean
    is exactly (8 + 4j) / 64."""
    import mteb

    types: dict[str, list[str]] = {}
    for name in names:
        types.setdefault(mteb.get_task(name).metadata.type, []).append(name)
    scores = {}
    for j, of in enumerate(types.values()):
        for i, name in enumerate(of):
            offset = 0 if i == len(of) - 1 and len(of) % 2 else (i // 2 + 1) * (-1) ** i
            scores[name] = Fraction(8 + 4 * j + offset, 64)
    return scores, {kind: Fraction(8 + 4 * j, 64) for j, kind in enumerate(types)}


def _model(results: dict[str, dict]):
    from mteb.results import BenchmarkResults, ModelResult, TaskResult

    model = ModelResult(model_name="m", model_revision="r", task_results=[TaskResult.from_dict(r)
                                                                           for r in results.values()])
    return BenchmarkResults(model_results=[model])


def test_a_whole_benchmark_is_scored_as_mtebs_get_score_scores_it():
    import mteb

    scores, means = _on_grid(benchmarks.LITE)
    results = {name: task_result(name, float(s)) for name, s in scores.items()}
    summary = summarize(results)
    lite = summary["benchmarks"]["MIEB(lite)"]
    assert (lite["tasks"], lite["run"], lite["missing"], lite["clean_scores"]) == (51, list(benchmarks.LITE), [], None)
    [theirs] = mteb.get_benchmark("MIEB(lite)").get_score(_model(results), raise_error=True).values()
    assert {k: v for k, v in lite["scores"].items() if k != "Mean(Task)"} == \
        {k: v for k, v in theirs.items() if k != "Rank"}
    [everything] = _model(results).get_aggregated_scores().values()  # mteb's Mean(Task) of results, no benchmark
    assert lite["scores"]["Mean(Task)"] == everything["Mean(Task)"]
    # by hand
    assert {kind: lite["scores"][kind] for kind in means} == {kind: float(m) for kind, m in means.items()}
    assert {kind: t["main_score"] for kind, t in summary["types"].items()} == {k: float(m) for k, m in means.items()}
    assert lite["scores"]["Mean(TaskType)"] == float(sum(means.values()) / len(means))
    task_mean = float(sum(scores.values()) / len(scores))
    assert lite["scores"]["Mean(Task)"] == task_mean
    # MIEB(Multilingual)'s own column of MIEB(lite)'s task mean, over lite's tasks, all there
    multilingual = summary["benchmarks"]["MIEB(Multilingual)"]
    assert multilingual["scores"]["MIEB(lite) Task Mean::Task Mean"] == task_mean
    assert multilingual["scores"]["MIEB(eng) Task Mean::Task Mean"] is None  # its tasks are not all there
    assert len(multilingual["run"]) + len(multilingual["missing"]) == 130


def test_part_of_a_benchmark_is_what_its_leaderboard_shows_for_the_run(tmp_path):
    """The leaderboard's summary table of the results read back from the results repository: one row, this model,
    the means over the tasks it has; mteb's get_score of the whole benchmark has nothing for a model lacking tasks."""
    import mteb

    scores, means = _on_grid(PART)
    results = {name: task_result(name, float(s)) for name, s in scores.items()}
    lite = summarize(results)["benchmarks"]["MIEB(lite)"]
    assert lite["run"] == [n for n in benchmarks.LITE if n in PART]
    assert lite["missing"] == [n for n in benchmarks.LITE if n not in PART]
    results_repo.lay_out(str(tmp_path / "results"), REGISTERED, results, False, log=lambda *a: None)
    loaded = mteb.ResultCache(tmp_path).load_results(models=[REGISTERED["name"]], tasks="MIEB(lite)",
                                                     include_remote=False)
    [model] = loaded.model_results
    assert sorted(r.task_name for r in model.task_results) == sorted(PART)
    [row] = loaded.get_benchmark_result().to_dict("records")
    assert row["Model"] == REGISTERED["name"]
    assert row["Mean (TaskType)"] == lite["scores"]["Mean(TaskType)"] == float(sum(means.values()) / len(means))
    assert {kind: row[kind] for kind in means} == {kind: lite["scores"][kind] for kind in means} == \
        {kind: float(m) for kind, m in means.items()}
    assert set(mteb.get_benchmark("MIEB(lite)").get_score(loaded)[REGISTERED["name"]].values()) == {None}


def test_a_task_missing_a_subset_has_no_score_and_blanks_the_means_it_is_in():
    results = {"WITT2IRetrieval": task_result("WITT2IRetrieval", 0.5, drop="da"),
               "XM3600T2IRetrieval": task_result("XM3600T2IRetrieval", 0.25),
               "STS13VisualSTS": task_result("STS13VisualSTS", 0.75)}
    summary = summarize(results)
    assert [summary["tasks"][n]["main_score"] for n in results] == [None, 0.25, 0.75]
    assert summary["types"]["Any2AnyMultilingualRetrieval"]["main_score"] is None
    assert summary["types"]["VisualSTS(eng)"]["main_score"] == 0.75
    assert set(summary["benchmarks"]["MIEB(lite)"]["scores"].values()) == {None}  # mteb: all or nothing


def test_clean_means_count_a_task_without_a_clean_score_at_its_main_score():
    results = {"CIFAR100ZeroShot": with_clean(task_result("CIFAR100ZeroShot", 0.5), 0.375, 7),
               "Food101ZeroShot": task_result("Food101ZeroShot", 0.25),
               "DTD": task_result("DTD", 0.75)}
    summary = summarize(results)
    assert summary["tasks"]["CIFAR100ZeroShot"] == {"type": "ZeroShotClassification", "main_score": 0.5,
                                                    "clean_score": 0.375, "left_out": 7, "clean_error": None}
    assert summary["tasks"]["DTD"] == {"type": "ImageClassification", "main_score": 0.75, "clean_score": None,
                                       "left_out": None, "clean_error": None}
    assert summary["types"] == {
        "ZeroShotClassification": {"tasks": ["CIFAR100ZeroShot", "Food101ZeroShot"], "main_score": 0.375,
                                   "clean_score": 0.3125},
        "ImageClassification": {"tasks": ["DTD"], "main_score": 0.75, "clean_score": None}}
    lite = summary["benchmarks"]["MIEB(lite)"]
    assert (lite["scores"]["Mean(TaskType)"], lite["clean_scores"]["Mean(TaskType)"]) == (0.5625, 0.53125)
    assert (lite["scores"]["Mean(Task)"], lite["clean_scores"]["Mean(Task)"]) == (0.5, 1.375 / 3)


def test_the_mteb_suites_clean_scores_are_aggregated_as_its_scores_are():
    """The mteb suite keeps a task's clean scores per split and subset (mteb's mean of them is its clean score),
    and an error where too little is left to score: that task counts at its main score in the clean means."""
    multi = task_result("VisualSTS17Multilingual", 0.5)
    subsets = multi["scores"]["test"]
    clean = {"test": [{**s, "main_score": 0.5 - (i == 0) * len(subsets) / 64} for i, s in enumerate(subsets)]}
    error = "mteb cannot score STS13VisualSTS without the flagged rows: ValueError: too few pairs"
    results = {"VisualSTS17Multilingual": {**multi, "mieb_ray": {"clean": {"main_score": 0.0, "scores": clean,
                                                                           "left_out": {"eval": {"any": 3}}}}},
               "STS13VisualSTS": {**task_result("STS13VisualSTS", 0.25),
                                  "mieb_ray": {"clean": {"left_out": {"eval": {"any": 9}}, "error": error}}}}
    summary = summarize(results)
    assert summary["tasks"]["VisualSTS17Multilingual"]["clean_score"] == 0.5 - 1 / 64  # not the 0.0 beside them
    assert summary["tasks"]["STS13VisualSTS"] == {"type": "VisualSTS(eng)", "main_score": 0.25, "clean_score": None,
                                                  "left_out": 9, "clean_error": error}
    lite = summary["benchmarks"]["MIEB(lite)"]
    assert lite["clean_scores"]["Mean(TaskType)"] == (0.5 - 1 / 64 + 0.25) / 2


def test_the_summarys_mteb_tasks_get_the_generators_mteb_gives_them():
    """The summary makes mteb's task objects without mteb's global seeding (slow once torch is imported): each keeps
    the random and numpy generators mteb's own get_task gives it."""
    import mteb

    from mieb_ray.evals.summary import mteb_task

    def draws(task):
        return task.seed, task.rng_state.random(), task.np_rng.integers(1 << 62, size=3).tolist()

    for name in ("CIFAR10ZeroShot", "BLINKIT2IRetrieval", "BioVITAT2IReranking"):
        assert draws(mteb_task(name)) == draws(mteb.get_task(name)), name
