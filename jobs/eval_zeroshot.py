"""`ray job submit --working-dir . -- python jobs/eval_zeroshot.py --sources hf --model ... --out ...`

The zero-shot eval job as a Ray job entrypoint: the same flags as `mieb-ray eval-zeroshot`. It joins the
cluster it was submitted to (RAY_ADDRESS), prints progress and a summary line, and exits non-zero on failure.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the submitted checkout's mieb_ray, not another
from mieb_ray.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["eval-zeroshot", *sys.argv[1:]]))
