"""mteb's whole linear-probe call on precomputed embeddings, as one process: the baseline of bench/eval_probe.py.

import mteb; read the precomputed embeddings into lookup tables; per task, load its train and eval splits from
the mirror with `datasets` (through a persistent cache, as a user's warm hub cache), run the task's own
`dataset_transform`, `mteb.evaluate` with an encoder that looks the embeddings up, write the TaskResult JSON mteb
writes (`TaskResult.to_disk`, as tests/support/mteb_reference.py).

The mirror's images spell their writing index in their one pixel (bench/eval_probe.py writes them), so the
encoder knows each image mteb hands it (the undersampled train rows come in mteb's own order) and returns its
vector: train rows by `<slug>/<position>`, eval rows by `<slug>/<split>/<position>`, the keys of the embed outputs,
a row's position in its split as `datasets` reads it. A WebDataset split's tars are read in name order (`10.tar`
before `2.tar`), so there the position is not the writing index: its `__key__` column (`s%07d` of the writing
index) maps one to the other.

    .venv/bin/python bench/contenders/mteb_probe_call.py --tasks A,B --data ROOT --image-embeddings OUT1,OUT2 \
        --cache DIR --out DIR [--load-only]

--load-only loads each task's splits and stops there: the untimed warm-up that fills the `datasets` cache.
--tasks "A,B;C,D" runs one such process per group (here `;`-separated), all at once, and waits for them: mteb
given the machine's cores as a user would use them, tasks spread over processes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import mteb  # noqa: E402  imported up front: part of the call's cost
import numpy as np  # noqa: E402
from support.mteb_reference import quiet_env  # noqa: E402

from mieb_ray.evals.probe_tasks import BY_NAME  # noqa: E402
from mieb_ray.io import embeddings  # noqa: E402


def lookup_tables(outputs: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{key prefix (`<slug>/` or `<slug>/<split>/`): (row of each index, or -1; the vectors)} of the outputs."""
    tables = {}
    for root in outputs.split(","):
        keys, matrix = embeddings.read_all(root)
        by_prefix: dict[str, tuple[list[int], list[int]]] = {}
        for row, key in enumerate(keys):
            prefix, _, index = key.rpartition("/")
            rows, indices = by_prefix.setdefault(prefix + "/", ([], []))
            rows.append(row)
            indices.append(int(index))
        for prefix, (rows, indices) in by_prefix.items():
            where = np.full(max(indices) + 1, -1, np.int64)
            where[indices] = np.arange(len(rows))
            tables[prefix] = (where, matrix[rows])
    return tables


def positions(split) -> np.ndarray | None:
    """Each writing index's position in a split as loaded (None where they are the same: no `__key__`)."""
    if "__key__" not in split.column_names:
        return None
    written = np.asarray([int(k[1:]) for k in split["__key__"][:]], np.int64)  # one read: a row's costs O(rows)
    where = np.empty(len(written), np.int64)
    where[written] = np.arange(len(written))
    return where


def encoder(tables: dict[str, tuple[np.ndarray, np.ndarray]], dim: int,
            moved: dict[tuple[str, str], np.ndarray | None]):
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta, ScoringFunction

    class LookupEncoder(AbsEncoder):
        """Each image's precomputed vector: its task's slug, the split mteb names, the index its pixel spells."""

        def __init__(self):
            self.model = None
            self.mteb_model_meta = ModelMeta.create_empty({
                "name": "mieb-ray/precomputed", "revision": "0", "similarity_fn_name": ScoringFunction.COSINE,
                "modalities": ["image"], "embed_dim": dim, "framework": ["PyTorch"]})

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            task = BY_NAME[task_metadata.name]
            where, vectors = tables[task.train_key("") if hf_split == "train" else task.key_prefix()]
            index = []
            for batch in inputs:
                for image in batch["image"]:
                    r, g, b = image.getpixel((0, 0))[:3]
                    index.append((r << 16) | (g << 8) | b)
            index = np.asarray(index, np.int64)
            if moved.get((task.name, hf_split)) is not None:
                index = moved[task.name, hf_split][index]
            rows = where[index]
            if (rows < 0).any():
                raise KeyError(f"{task.name} {hf_split}: no embedding for some rows")
            return vectors[rows].astype(np.float32)

    return LookupEncoder()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ("--tasks", "--data", "--image-embeddings", "--cache", "--out"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--load-only", action="store_true", help="only load each task's splits: fills the cache")
    args = ap.parse_args()
    if ";" in args.tasks:
        at = sys.argv.index("--tasks") + 1
        children = [subprocess.Popen([sys.executable, sys.argv[0], *sys.argv[1:at], group, *sys.argv[at + 1:]])
                    for group in args.tasks.split(";")]
        sys.exit(max(child.wait() for child in children))
    import datasets

    tables = lookup_tables(args.image_embeddings)
    moved = {}
    model = encoder(tables, next(iter(tables.values()))[1].shape[1], moved)
    os.makedirs(args.out, exist_ok=True)
    for name in args.tasks.split(","):
        probe = BY_NAME[name]
        repo = os.path.join(args.data, probe.source.repo)
        with tempfile.TemporaryDirectory() as tmp, quiet_env(tmp):
            # mteb's own call (load_dataset(path, revision=...)), the hub's path replaced by the mirror's folder
            every = datasets.load_dataset(repo, cache_dir=args.cache)
            if args.load_only:
                continue
            data = datasets.DatasetDict({s: every[s] for s in ("train", probe.split)})
            moved.update({(name, s): positions(data[s]) for s in data})
            task = mteb.get_task(name)
            task.dataset = data
            task.data_loaded = True
            task.dataset_transform()
            result = mteb.evaluate(model, task, cache=None, show_progress_bar=False)
            result.task_results[0].to_disk(Path(args.out, f"{name}.json"))


if __name__ == "__main__":
    main()
