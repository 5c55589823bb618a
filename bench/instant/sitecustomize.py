"""Benchmarks only (bench/embed_driver.py and bench/embed_feed.py put this folder on PYTHONPATH): an instant encoder.

Python imports `sitecustomize` at start-up in the driver and in every Ray worker; this one makes
`Encoder.encode_texts` return a fixed unit vector per text, and `Encoder.image_features` one per image with the
pixels' normalisation skipped (on a GPU both are the device's work), so that a benchmark measures the pipeline
around the model and not the model. The model is still loaded, as the real one would be.
"""

import numpy as np

try:
    from mieb_ray.encode import model as _model
    from mieb_ray.encode import preprocess as _preprocess
except ImportError:  # a process that has no mieb_ray on its path
    _model = None


def _instant(self, texts):
    out = np.zeros((len(texts), self.info.dim), np.float32)
    out[:, 0] = 1.0
    return out


def _instant_images(self, pixels):
    import torch

    out = torch.zeros((len(pixels), self.info.dim), dtype=torch.float32, device=pixels.device)
    out[:, 0] = 1.0
    return out


if _model is not None:
    _model.Encoder.encode_texts = _instant
    _model.Encoder.image_features = _instant_images
    _preprocess.Normalizer.__call__ = lambda self, pixels, dtype=None: pixels
