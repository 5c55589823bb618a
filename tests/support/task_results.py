"""TaskResult JSON made by hand in mteb's schema, for the tests of the run's summary and page: a task's every eval
split and subset (from mteb's metadata of it) with one given main score, so that the scores, and the means of
scores chosen on the 1/64 grid, are exact."""

from __future__ import annotations

# a model mteb's registry knows: its leaderboard's summary table keeps only those
REGISTERED = {"name": "openai/clip-vit-base-patch32", "revision": "3d74acf9a28c67741b2f4f2ea7635f0aaf6f0268"}


def task_result(name: str, score: float, drop: str | None = None) -> dict:
    """A TaskResult of mteb's task `name` scoring `score` on every split and subset (but the subset `drop`)."""
    import mteb

    task = mteb.get_task(name)
    langs = task.metadata.hf_subsets_to_langscripts
    return {"dataset_revision": task.metadata.dataset["revision"], "task_name": name, "mteb_version": mteb.__version__,
            "evaluation_time": 1.0, "kg_co2_emissions": None,
            "scores": {split: [{"hf_subset": s, "languages": langs[s], "main_score": score}
                               for s in task.hf_subsets if s != drop] for split in task.eval_splits}}


def with_clean(result: dict, clean: float, left_out: int) -> dict:
    """The TaskResult with a clean score as an --exclude run records it."""
    return {**result, "mieb_ray": {"clean": {"main_score": clean, "left_out": {"eval": {"any": left_out}}}}}
