"""Benchmarks only (bench/embed_driver.py puts this folder on PYTHONPATH): an instant encoder.

Python imports `sitecustomize` at start-up in the driver and in every Ray worker; this one makes
`Encoder.encode_texts` return a fixed unit vector per text, so that a benchmark measures the pipeline around
the model and not the model. The model is still loaded, as the real one would be.
"""

import numpy as np

try:
    from mieb_ray.encode import model as _model
except ImportError:  # a process that has no mieb_ray on its path
    _model = None


def _instant(self, texts):
    out = np.zeros((len(texts), self.info.dim), np.float32)
    out[:, 0] = 1.0
    return out


if _model is not None:
    _model.Encoder.encode_texts = _instant
