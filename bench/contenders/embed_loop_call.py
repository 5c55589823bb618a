"""A plain PyTorch loop's whole embed call, as one process: the baseline of bench/embed_cpu.py.

What a user writes instead of the embed job: import torch and transformers, read the table's image bytes
(pyarrow), a DataLoader (2 workers) whose dataset opens each image with PIL and runs CLIPProcessor,
get_image_features in float32 with 2 torch threads, L2-normalise, save the embeddings (.npy).

    .venv/bin/python bench/contenders/embed_loop_call.py --input TABLE_DIR --model MODEL_DIR --out FILE.npy [--batch 32]
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from PIL import Image


class Photos(torch.utils.data.Dataset):
    def __init__(self, blobs: list[bytes], model_dir: str):
        self.blobs, self.model_dir, self.processor = blobs, model_dir, None

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.processor is None:  # in the worker process
            from transformers import CLIPImageProcessor

            self.processor = CLIPImageProcessor.from_pretrained(self.model_dir)
        image = Image.open(io.BytesIO(self.blobs[i]))
        return self.processor(images=image, return_tensors="pt")["pixel_values"][0]


def plain_loop(blobs: list[bytes], model_dir: str, batch: int) -> np.ndarray:
    from transformers import CLIPModel

    torch.set_num_threads(2)
    model = CLIPModel.from_pretrained(model_dir).eval()
    loader = torch.utils.data.DataLoader(Photos(blobs, model_dir), batch_size=batch, num_workers=2)
    out = []
    with torch.inference_mode():
        for pixel_values in loader:
            emb = model.get_image_features(pixel_values=pixel_values).pooler_output
            out.append(torch.nn.functional.normalize(emb, dim=-1).numpy())
    return np.concatenate(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    files = sorted(Path(args.input).glob("*.parquet"))
    blobs = [image["bytes"] for f in files for image in pq.read_table(f, columns=["image"])["image"].to_pylist()]
    np.save(args.out, plain_loop(blobs, args.model, args.batch))


if __name__ == "__main__":
    main()
