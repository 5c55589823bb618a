"""An eval run's results as mteb's results repository lays them out, for a leaderboard to read:
`DIR/<org>__<model>/<revision>/<Task>.json` (the TaskResults) and `model_meta.json` beside them (mteb's ModelMeta
fields). Point DIR at a results cache's `results/` folder (mteb.ResultCache(cache).load_results reads it) or at a
clone of embeddings-benchmark/results' `results/`.

A model trained on mieb-train has seen the train splits of every source the MIEB tasks below draw on, so its
scores on them are not zero-shot: `training_datasets` (what mteb's leaderboard filters zero-shot models by) names
those tasks, and each of their TaskResults says so under `mieb_ray`.
"""

from __future__ import annotations

import json
import os

from mieb_ray import storage
from mieb_ray.evals import registry
from mieb_ray.io import embeddings

NO_REVISION = "no_revision_available"  # what mteb names a model folder without a revision

# The MIEB tasks whose data come from mieb-train's sources (their train splits are mieb-train's rows): every
# registered task over a catalog source
MIEB_TRAIN_TASKS = tuple(sorted({task for tasks in registry.tasks_by_source().values() for task in tasks}))


def model_folder(model: dict) -> tuple[str, str]:
    """(folder name, revision) of a model as an embed manifest records it: mteb's `name` with "/" -> "__"; a
    local path is named by its last folder."""
    name = str(model.get("name") or "unknown")
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        name = os.path.basename(name.rstrip("/")) or "unknown"
    return name.replace("/", "__").replace(" ", "_"), str(model.get("revision") or NO_REVISION)


def model_meta(model: dict, trained_on_mieb_train: bool) -> dict:
    """model_meta.json: mteb's ModelMeta fields that an embed manifest knows; the rest unknown (None)."""
    folder, revision = model_folder(model)
    return {
        "name": folder.replace("__", "/"), "revision": revision, "release_date": None, "languages": None,
        "n_parameters": None, "memory_usage_mb": None, "max_tokens": model.get("max_text_length"),
        "embed_dim": model.get("dim"), "license": None, "open_weights": None, "public_training_code": None,
        "public_training_data": None, "framework": ["PyTorch"], "reference": None, "similarity_fn_name": "cosine",
        "use_instructions": False, "adapted_from": None, "superseded_by": None, "modalities": ["image", "text"],
        "model_type": ["dense"], "loader": None,
        "training_datasets": sorted(MIEB_TRAIN_TASKS) if trained_on_mieb_train else None,
    }


def write(root: str, images: str, results: dict[str, dict], trained_on_mieb_train: bool, log=print) -> str:
    """Every TaskResult and the model's model_meta.json under ROOT/<model>/<revision>/, the model as the embed
    manifest of IMAGES names it; returns that folder."""
    return lay_out(root, embeddings.model_of(images), results, trained_on_mieb_train, log)


def lay_out(root: str, model: dict, results: dict[str, dict], trained_on_mieb_train: bool, log=print) -> str:
    """Every TaskResult and model_meta.json of MODEL (an embed manifest's) under ROOT/<model>/<revision>/."""
    folder, revision = model_folder(model)
    where = storage.join(root, folder, revision)
    for name, result in results.items():
        if trained_on_mieb_train and name in MIEB_TRAIN_TASKS:
            result = {**result, "mieb_ray": {**result.get("mieb_ray", {}), "trained_on_its_train_split": True}}
        storage.write_bytes(storage.join(where, f"{name}.json"), (json.dumps(result, indent=2) + "\n").encode())
    storage.write_bytes(storage.join(where, "model_meta.json"),
                        (json.dumps(model_meta(model, trained_on_mieb_train), indent=2) + "\n").encode())
    log(f"[eval] {len(results)} task results for {folder}/{revision} -> {storage.display(where)}")
    return where
