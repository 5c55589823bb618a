"""Calibrate the audit's near-duplicate threshold for a model on planted pairs: precision and recall per cosine.

Data (tests/support/planted.py): tiles of the demo's real photos (mieb_ray/demo_data/images; no two share a pixel). Each
tile is a train image; its planted copies are the changes the audit must see through (PLANTS' near ones but PNG ->
JPEG): JPEG quality 90 -> 50, resized by 1 px, crops off a side and a corner, mirrored, downscaled to 64 px. Every
other (eval tile, train tile) pair is a distinct image. The embeddings are the model's, computed in this process
with transformers (CLIPModel, its processor).

For each threshold it prints recall (planted pairs at or above it) and precision (planted among all pairs at
or above it), the lowest planted cosine and the highest distinct one: the threshold is calibrated when a value
separates them. Run through the harness (wrapped): what it prints becomes bench/records/audit_threshold.json.
Run from the repository root:
    .venv/bin/python bench/calibration/audit_threshold.py --model NAME_OR_PATH
    .venv/bin/python bench/calibration/audit_threshold.py --tiny   # a tiny random CLIP: the method, not a threshold
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness

import harness as h  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

h.use_test_fixtures()
from support.pictures import jpeg  # noqa: E402
from support.planted import PLANTS, plant, tiles  # noqa: E402

THRESHOLDS = (0.80, 0.85, 0.90, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99)
# PNG -> JPEG needs a PNG train image: these train tiles are JPEGs, whose re-encode the quality change covers
KINDS = [k for k, detectors in PLANTS.items() if "near" in detectors and k != "PNG -> JPEG"]


def embed(model_path: str, images: list[bytes]) -> np.ndarray:
    import torch
    from transformers import CLIPImageProcessor, CLIPModel

    model = CLIPModel.from_pretrained(model_path).eval()
    processor = CLIPImageProcessor.from_pretrained(model_path)
    pictures = [Image.open(io.BytesIO(d)).convert("RGB") for d in images]
    with torch.no_grad():
        out = model.get_image_features(**processor(images=pictures, return_tensors="pt"))
    out = getattr(out, "pooler_output", out)
    return torch.nn.functional.normalize(out, dim=-1).numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a CLIP model: hub name or local directory")
    ap.add_argument("--tiny", action="store_true", help="a tiny random CLIP made on the spot")
    args = ap.parse_args()
    model = args.model
    if args.tiny:
        from mieb_ray.demo_data.models import make_tiny_clip

        model = make_tiny_clip(tempfile.mkdtemp() + "/tiny-clip")
    if not model:
        ap.error("give --model or --tiny")
    train = [jpeg(t) for t in tiles()]
    copies = [(i, kind, plant(kind, train[i])) for i in range(len(train)) for kind in KINDS]
    vectors = embed(model, train + [c[2] for c in copies])
    t, e = vectors[:len(train)], vectors[len(train):]
    scores = e @ t.T
    truth = np.zeros_like(scores, bool)
    truth[np.arange(len(copies)), [c[0] for c in copies]] = True
    planted, distinct = scores[truth], scores[~truth]
    rows = []
    for th in THRESHOLDS:
        hit = scores >= th
        tp = int((hit & truth).sum())
        rows.append([f"{th:.2f}", f"{tp / truth.sum():.3f}", f"{tp / max(hit.sum(), 1):.3f}", int(hit.sum() - tp)])
    per_kind = {k: float(min(scores[n, c[0]] for n, c in enumerate(copies) if c[1] == k)) for k in KINDS}
    print("\n" + "=" * 100)
    print(f"### Near-duplicate threshold for {'a tiny random CLIP' if args.tiny else model}: {len(train)} tiles, "
          f"{len(copies)} planted copies ({', '.join(KINDS)}), {distinct.size:,} distinct pairs\n")
    print(h.markdown_table(["cosine >=", "recall", "precision", "distinct pairs flagged"], rows))
    print(f"\nLowest planted cosine {planted.min():.4f} (per change: "
          + ", ".join(f"{k} {v:.4f}" for k, v in per_kind.items())
          + f"); highest distinct cosine {distinct.max():.4f}: "
          + ("**separable**" if planted.min() > distinct.max() else "**not separable by any threshold**") + "\n")
    h.footer()


if __name__ == "__main__":
    h.wrap(main, "audit_threshold", "Near-duplicate threshold on planted pairs", kind="calibration", group="Audit")
