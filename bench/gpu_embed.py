"""One real `mieb-ray embed` on a GPU machine (bench/gpu_check.sh runs it): a B/32-sized CLIP saved with
save_pretrained, 2,048 photos of mixed sizes in one Parquet file, the command line as a user runs it (--decode gpu,
the encoders on Ray with one GPU each). Prints the job's lines, its wall time and images/s, and exits non-zero
unless every image was decoded on the device and encoded without error.

    python bench/gpu_embed.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]  # the repo, without installing; the tests' support (models)

from support.models import make_clip_b32  # noqa: E402

from bench.gpu_encode import PICTURES, mixed_jpegs  # noqa: E402

ROWS = 2048


def main(out: str) -> int:
    work = os.path.join(out, "gpu-embed")
    os.makedirs(work, exist_ok=True)
    files = [open(os.path.join(PICTURES, n), "rb").read() for n in sorted(os.listdir(PICTURES)) if n.endswith(".jpg")]
    photos = mixed_jpegs(files, ROWS)
    pq.write_table(pa.table({"key": [f"{i:05d}" for i in range(ROWS)], "image": photos}),
                   os.path.join(work, "photos.parquet"))
    model = make_clip_b32(os.path.join(work, "clip-b32"))
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "mieb_ray", "embed", "--input", os.path.join(work, "photos.parquet"),
                           "--out", os.path.join(work, "embeddings"), "--model", model, "--decode", "gpu",
                           "--batch-size", "256", "--overwrite"], text=True)
    wall = time.time() - t0
    if done.returncode:
        print(f"gpu_embed: mieb-ray embed exited {done.returncode}")
        return 1
    with open(os.path.join(work, "embeddings", "_manifest.json")) as f:
        counts = json.load(f)["counts"]
    print(f"gpu_embed: {ROWS:,} photos in {wall:.1f} s (process start to exit, model load and Ray start included), "
          f"{ROWS / wall:,.0f} images/s; counts {counts}")
    return 0 if counts.get("decoded_on_device") == ROWS and counts["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
