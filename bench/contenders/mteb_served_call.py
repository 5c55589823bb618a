"""One mteb task scored by `mteb.evaluate` in this process, its inputs answered from precomputed raw embeddings (an
image: the vector of sha256:<hex of its stored bytes>): the user's alternative in bench/eval_corpus_memory.py. mteb's
own search (SearchEncoderWrapper) ranks the corpus. Prints the process's peak RSS in bytes (VmHWM) on its last line.

    python bench/contenders/mteb_served_call.py TASK MIRROR EMBEDDINGS OUT_JSON
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import numpy as np  # noqa: E402

from mieb_ray.evals.embed_cache import vectors as cached_vectors  # noqa: E402
from mieb_ray.evals.mteb_suite import _encoder_base, _quiet_evaluate, inputs, load_task  # noqa: E402
from mieb_ray.io import embeddings  # noqa: E402


def main(task: str, root: str, vectors_uri: str, out: str) -> None:
    vectors, dim = cached_vectors(embeddings.roots(vectors_uri))

    class Served(_encoder_base(dim)):  # an encoder only: mteb wraps it in its own search
        def encode(self, inputs_, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            rows = [vectors[key] for keys, _, _ in inputs(inputs_, payload=False) for key in keys]
            return np.stack(rows).astype(np.float32)

    Path(out).write_text(json.dumps(_quiet_evaluate(Served(), load_task(task, root))))
    print("peak", [int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM")][0])


if __name__ == "__main__":
    main(*sys.argv[1:])
