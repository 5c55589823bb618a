"""An audit's findings written as `mieb-ray audit` leaves them, for the tests of what reads them (build --exclude,
the evals' clean scores: mieb_ray/io/contamination.py)."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from mieb_ray import storage


def audit_output(path, pairs: list[tuple[str, str, str]]) -> str:
    """An audit output as `mieb-ray audit` leaves it, holding these (train key, eval key, detector) pairs."""
    os.makedirs(path, exist_ok=True)
    train, evaluated, method = zip(*pairs)
    pq.write_table(pa.table({"train_key": list(train), "eval_task": [None] * len(pairs), "eval_key": list(evaluated),
                             "method": list(method), "score": [1.0] * len(pairs)}), os.path.join(path,
                                                                                                  "contamination.parquet"))
    storage.write_manifest(str(path), {"format": "mieb-audit"})
    return str(path)
