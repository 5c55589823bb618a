"""The two rules transformers has had for making a transparent image RGB (its `convert_to_rgb`, which every image
processor applies first), to put either in place in one environment: 5.21 on composites transparency onto white;
5.0 to 5.20 use PIL's plain convert("RGB"), which drops it. The CPU path follows the installed release
(mieb_ray/encode/pixels.py `to_rgb`); tests/unit/encode/test_preprocess.py holds it to both rules, and
bench/gpu_eval.py scores a GPU machine's embeddings against mteb under that machine's rule."""

from __future__ import annotations

import contextlib
import sys

import numpy as np
from PIL import Image


def release_rule(onto_white: bool):
    """transformers' convert_to_rgb for PIL images as one side of the 5.21 change has it."""
    def convert_to_rgb(image, return_numpy=False, input_data_format=None):
        if onto_white and ("A" in image.getbands() or image.info.get("transparency") is not None):
            rgba = image.convert("RGBA")
            image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
        rgb = image.convert("RGB")
        return np.array(rgb) if return_numpy else rgb
    return convert_to_rgb


@contextlib.contextmanager
def rule(onto_white: bool, monkeypatch):
    """transformers' convert_to_rgb swapped for one rule wherever its loaded modules hold it, and the CPU path
    asking transformers afresh (it asks once per process)."""
    import transformers.image_transforms

    from mieb_ray.encode import pixels

    original = transformers.image_transforms.convert_to_rgb
    with monkeypatch.context() as m:
        for module in [v for k, v in sys.modules.items() if k.startswith("transformers") and v is not None]:
            for attr in ("convert_to_rgb", "convert_to_rgb_pil"):  # 5.21 on imports it as the latter
                if vars(module).get(attr) is original:  # not getattr: a lazy module would import more
                    m.setattr(module, attr, release_rule(onto_white))
        pixels.alpha_onto_white.cache_clear()
        try:
            yield
        finally:
            pixels.alpha_onto_white.cache_clear()
