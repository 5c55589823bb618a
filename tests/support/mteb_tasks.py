"""mteb's own run of a MIEB task on a fixture mirror, the reference the eval job's scores are compared with.

`redirect(task, root)` points a task (and an aggregate's sub-tasks) at root/<its hub path>, so that mteb's own
`load_data` reads the mirror with `datasets.load_dataset(path=<folder>, ...)` (a local folder: the revision is
ignored, the data files resolve as on the hub). `mteb_result` runs `mteb.evaluate` with mteb's own CLIP wrapper
(mteb.models.model_implementations.clip_models.CLIPModel: AutoModel + AutoProcessor, float32, Pillow) on a model
folder written by save_pretrained, and returns the TaskResult JSON mteb writes."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from support.mteb_reference import quiet_env


def redirect(task, root: str):
    """The task, its metadata (a class attribute: copied, not changed in place) and an aggregate's sub-tasks' reading
    from root/<hub path> instead of the hub."""
    subs = getattr(task.metadata, "tasks", None)  # AbsTaskAggregate: mteb.evaluate runs metadata.tasks
    if subs:
        for sub in subs:
            redirect(sub, root)
        return task
    hub = (type(task).metadata.dataset or {}).get("path")  # the class's: a sub-task instance may be redirected already
    if hub:
        task.metadata = type(task).metadata.model_copy(deep=True)
        task.metadata.dataset["path"] = os.path.join(root, hub)
    return task


def clip_model(path: str):
    """mteb's CLIP wrapper on a saved model folder, on the CPU, with the metadata mteb.evaluate reads."""
    from mteb.models.model_implementations.clip_models import CLIPModel
    from mteb.models.model_meta import ModelMeta, ScoringFunction
    from transformers import AutoConfig

    model = CLIPModel(path, revision=None, device="cpu")
    dim = AutoConfig.from_pretrained(path).projection_dim
    model.mteb_model_meta = ModelMeta.create_empty({
        "name": "mieb-ray/tiny-clip", "revision": "0", "similarity_fn_name": ScoringFunction.COSINE,
        "modalities": ["image", "text"], "embed_dim": dim, "framework": ["PyTorch"]})
    return model


def mteb_result(task_name: str, root: str, model_path: str) -> dict:
    """The TaskResult JSON (as TaskResult.to_disk writes it) of mteb.evaluate on `task_name` read from the mirror
    under `root`, with mteb's CLIP wrapper on the model at `model_path`."""
    import mteb

    with tempfile.TemporaryDirectory() as tmp, quiet_env(tmp):
        task = redirect(mteb.get_task(task_name), root)
        result = mteb.evaluate(clip_model(model_path), task, cache=None, show_progress_bar=False)
        path = Path(tmp, f"{task_name}.json")
        result.task_results[0].to_disk(path)
        return json.loads(path.read_text())


def ours(task_names: list[str], root: str, model_path: str, out: str, exclude: str | None = None,
         **settings) -> dict[str, dict]:
    """The eval job's TaskResults of `task_names` read from the mirror under `root`, embedded with the model at
    `model_path` (in this process unless settings say otherwise), scored clean too against the audit `exclude`:
    {task: TaskResult JSON}."""
    from mieb_ray.evals import job, registry

    settings = {"executor": "local", "log": lambda *a: None, **settings}
    return job.evaluate(registry.select(",".join(task_names)), registry.Options(root, exclude), out,
                        model=model_path, **settings)


# CUB200, SOP, Stanford Cars and RP2k query their own corpus (the hub's layout: same images, same ids): each query's
# first hit is itself at cosine 1 up to float32 rounding (mteb gets 0.99999988 to 1.00000012, as the two sides'
# embeddings and their norms round). nAUC's "max" confidence then orders the queries by that rounding alone, so
# nauc_*_max there is float noise, equal only for bit-equal embeddings: not compared. Every other metric is,
# nauc_*_std and nauc_*_diff1 included (1 - the second cosine: far apart).
SELF_RETRIEVAL = {"CUB200I2IRetrieval", "SOPI2IRetrieval", "StanfordCarsI2IRetrieval", "RP2kI2IRetrieval"}


def noise_decided(name: str, key: str) -> bool:
    return name in SELF_RETRIEVAL and key.startswith("nauc_") and key.endswith("_max")


def assert_same_scores(ours_: dict, theirs: dict, skip=lambda key: False, tolerance=lambda key: 1e-6) -> None:
    """Every metric of every split and subset of two TaskResults equal: the same task and revision, splits, subsets
    (each once), metric names; numbers within 1e-6 (mteb rounds to 6 decimals; one step computes as
    1.000000000001e-06, hence 1e-12 of slack), NaN where NaN; dicts and lists item by item; anything else exactly.
    `skip(metric)`: a metric decided by float noise alone in mteb's own run; `tolerance(metric)`: a wider one for a
    metric that float noise moves by more than 1e-6 in mteb's own runs (each said where it is used)."""
    name = theirs["task_name"]
    assert (ours_["task_name"], ours_["dataset_revision"]) == (name, theirs["dataset_revision"])
    assert set(ours_["scores"]) == set(theirs["scores"]), (name, sorted(ours_["scores"]), sorted(theirs["scores"]))
    for split, entries in theirs["scores"].items():
        mine = {e["hf_subset"]: e for e in ours_["scores"][split]}
        want = {e["hf_subset"]: e for e in entries}
        assert len(mine) == len(ours_["scores"][split]) and set(mine) == set(want), (name, split, sorted(mine))
        for subset, entry in want.items():
            kept = {k: _ordered(k, v) for k, v in entry.items() if not skip(k)}
            got = {k: _ordered(k, v) for k, v in mine[subset].items() if not skip(k)}
            assert set(got) == set(kept), (name, split, subset, sorted(set(got) ^ set(kept)))
            for key in kept:
                _same(got[key], kept[key], f"{name}/{split}/{subset}/{key}", tolerance(key))


def _ordered(key: str, value):
    """An aggregate's `languages` in a fixed order: mteb builds that list from a set, so its order follows the
    process's hash seed."""
    return sorted(value) if key == "languages" and isinstance(value, list) else value


def _same(mine, ref, where: str, tolerance: float = 1e-6) -> None:
    if isinstance(ref, dict):
        assert isinstance(mine, dict) and set(mine) == set(ref), (where, sorted(set(mine or {}) ^ set(ref)))
        for key in ref:
            _same(mine[key], ref[key], f"{where}/{key}", tolerance)
    elif isinstance(ref, list):
        assert isinstance(mine, list) and len(mine) == len(ref), (where, mine, ref)
        for i, (a, b) in enumerate(zip(mine, ref)):
            _same(a, b, f"{where}[{i}]", tolerance)
    elif isinstance(ref, float | int) and not isinstance(ref, bool):
        assert isinstance(mine, float | int) and not isinstance(mine, bool), (where, mine, ref)
        assert (math.isnan(ref) and math.isnan(mine)) or abs(mine - ref) <= tolerance + 1e-12, (where, mine, ref)
    else:
        assert mine == ref, (where, mine, ref)
