"""mteb's whole call on a set of MIEB tasks from precomputed embeddings, as one process: the baseline of
bench/eval_types.py.

import mteb; read the embeddings, keyed by content (an image: `sha256:<hex of its stored bytes>`, or mteb's own
pixel hash for a picture a task makes in memory; a text: itself), into one lookup table; each task pointed at its
fixture mirror (root/<its hub path>: tests/support/mteb_tasks.redirect); one `mteb.evaluate` of every task with an
encoder that answers each input from the table (mieb_ray.evals.mteb_suite.server: an input of an image and a text
gets the sum of the two, as mteb's CLIP wrapper adds them); mteb loads each task's data itself (a warm `datasets`
cache); each TaskResult written as mteb writes it (`TaskResult.to_disk`).

    .venv/bin/python bench/contenders/mteb_types_call.py --tasks A,B --sources MIRROR --vectors TABLE.parquet \
        --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import mteb  # noqa: E402  imported up front: part of the call's cost
import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from support.mteb_tasks import redirect  # noqa: E402

from mieb_ray.evals import embed_cache  # noqa: E402
from mieb_ray.evals.mteb_suite import server  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ("--tasks", "--sources", "--vectors", "--out"):
        ap.add_argument(flag, required=True)
    args = ap.parse_args()
    table = pq.read_table(args.vectors)
    matrix = np.asarray(table["vector"].combine_chunks().flatten(), np.float32).reshape(table.num_rows, -1)
    vectors = embed_cache.Given(zip(table["key"].to_pylist(), matrix))
    tasks = [redirect(mteb.get_task(name), args.sources) for name in args.tasks.split(",")]
    result = mteb.evaluate(server(vectors, matrix.shape[1], "mteb"), tasks, cache=None, show_progress_bar=False,
                           co2_tracker=False)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for task_result in result.task_results:
        task_result.to_disk(Path(args.out, f"{task_result.task_name}.json"))


if __name__ == "__main__":
    main()
