"""mteb's whole BioVITA call on precomputed embeddings, as one process: the baseline of bench/eval_biovita.py.

import mteb, load the subsets and the embeddings (as tests/support/mteb_reference.py does: our loader for the data, an
encoder that looks the embeddings up), `mteb.evaluate` of BioVITAT2IReranking, write the TaskResult JSON.

    .venv/bin/python bench/contenders/mteb_biovita_call.py --data ROOT --image-embeddings IMG \
        --text-embeddings TXT --out FILE
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import mteb  # noqa: E402,F401  imported up front: part of the call's cost
from support.biovita import load_subset  # noqa: E402
from support.mteb_reference import mteb_scores  # noqa: E402

from mieb_ray.evals import biovita_data as biovita  # noqa: E402
from mieb_ray.io import embeddings  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ("--data", "--image-embeddings", "--text-embeddings", "--out"):
        ap.add_argument(flag, required=True)
    args = ap.parse_args()
    subsets = {name: load_subset(args.data, name) for name in biovita.SUBSETS}
    texts, images = (dict(zip(*embeddings.read_all(u))) for u in (args.text_embeddings, args.image_embeddings))
    result = mteb_scores(subsets, texts, images)
    Path(args.out).write_text(json.dumps(result["task_result"], indent=2) + "\n")


if __name__ == "__main__":
    main()
