"""An audit's findings written as `mieb-ray audit` leaves them, for the tests of what reads them (build --exclude,
the evals' clean scores: mieb_ray/io/contamination.py)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

from mieb_ray import storage


def audit_output(path, pairs: list[tuple[str, str, str]], audited: list[str] | None = None,
                 tasks: dict[str, str] | None = None) -> str:
    """An audit output as `mieb-ray audit` leaves it, holding these (train key, eval key, detector) pairs; with
    `audited`, its summary.json naming those eval tasks as the ones whose images it read; with `tasks`, each eval
    key's eval_task (the tasks holding it, '/'-joined)."""
    os.makedirs(path, exist_ok=True)
    if audited is not None:
        with open(os.path.join(path, "summary.json"), "w") as f:
            json.dump({"eval_tasks": {task: {"eval_rows": 1} for task in audited}}, f)
    train, evaluated, method = zip(*pairs)
    table = pa.table({"train_key": list(train), "eval_task": [(tasks or {}).get(k) for k in evaluated],
                      "eval_key": list(evaluated), "method": list(method), "score": [1.0] * len(pairs)})
    pq.write_table(table, os.path.join(path, "contamination.parquet"))
    storage.write_manifest(str(path), {"format": "mieb-audit"})
    return str(path)
