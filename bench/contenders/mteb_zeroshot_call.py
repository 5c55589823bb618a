"""mteb's whole zero-shot call on precomputed embeddings, as one process: the baseline of bench/eval_zeroshot.py.

import mteb; per task, load its eval split from the mirror with `datasets` (through a persistent cache, as a
user's warm hub cache), `mteb.evaluate` with an encoder that looks the precomputed embeddings up, write the
TaskResult JSON mteb writes (tests/support/mteb_reference.py).

    .venv/bin/python bench/contenders/mteb_zeroshot_call.py --tasks A,B --data ROOT --image-embeddings IMG \
        --text-embeddings TXT --cache DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import mteb  # noqa: E402,F401  imported up front: part of the call's cost
import numpy as np  # noqa: E402
from support.mteb_reference import mteb_zeroshot  # noqa: E402

from mieb_ray.evals.zeroshot_tasks import select_tasks  # noqa: E402
from mieb_ray.io import embeddings  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ("--tasks", "--data", "--image-embeddings", "--text-embeddings", "--cache", "--out"):
        ap.add_argument(flag, required=True)
    args = ap.parse_args()
    images = dict(zip(*embeddings.read_all(args.image_embeddings)))
    texts = dict(zip(*embeddings.read_all(args.text_embeddings)))
    os.makedirs(args.out, exist_ok=True)
    for task in select_tasks(args.tasks):
        prefix = task.key_prefix()
        rows = np.stack([images[f"{prefix}{i}"] for i in range(sum(k.startswith(prefix) for k in images))])
        result = mteb_zeroshot(task.name, os.path.join(args.data, task.source.repo), task.split, texts, rows,
                               cache_dir=args.cache)
        Path(args.out, f"{task.name}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
