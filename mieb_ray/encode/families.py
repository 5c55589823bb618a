"""Model families: what differs between CLIP, SigLIP and other two-tower transformers models when they embed.

A family owns the tokenizer's arguments, which of its models' images the embed job can make (fixed-size
pixel_values only), where the embedding size is in its config, and the feature call. `load_info` picks one
by the config's model_type and records its name in ModelInfo.family; the Encoder calls through it.

Preprocessing is the model's own image processor as transformers resolves it, defaults included
(`image_config`), which preprocess.ImageSpec reproduces or refuses: CLIP resizes the shortest edge then
centre-crops with OpenAI's mean/std; SigLIP (and SigLIP2 at a fixed resolution) resizes straight to its size,
no crop, mean/std 0.5; each with the resample filter its config names.

No torch at import time: model.py imports this.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Callable

SUPPORTED = ("CLIP, SigLIP, SigLIP2 at a fixed resolution, or a transformers model with get_image_features and "
             "get_text_features")


def _projection_dim(config, modality: str) -> int:
    """CLIP: both towers project to projection_dim."""
    return int(config.projection_dim)


def _siglip_dim(config, modality: str) -> int:
    """SigLIP: the image tower's pooling head keeps its width; the text tower projects to projection_size."""
    if modality == "image":
        return int(config.vision_config.hidden_size)
    text = config.text_config
    return int(getattr(text, "projection_size", None) or text.hidden_size)


def _generic_dim(config, modality: str) -> int:
    """A best guess from the usual names; the Encoder checks it against the first embeddings it makes."""
    own = getattr(config, "vision_config" if modality == "image" else "text_config", None)
    for n in (getattr(config, "projection_dim", None), getattr(own, "projection_size", None),
              getattr(own, "hidden_size", None), getattr(config, "hidden_size", None)):
        if isinstance(n, int) and n > 0:
            return n
    raise ValueError(f"no embedding size in the config for {modality}s")


@dataclass(frozen=True)
class Family:
    name: str
    padding: bool | str  # True: to the batch's longest text; "max_length": to the model's length, as it was trained
    dim: Callable  # (transformers config, modality) -> embedding size
    no_images: str | None = None  # why the embed job cannot make this family's pixel inputs

    def tokenizer_kwargs(self, max_length: int) -> dict:
        return {"padding": self.padding, "truncation": True, "max_length": max_length, "return_tensors": "pt"}

    def image_features(self, model, pixel_values):
        return model.get_image_features(pixel_values=pixel_values)

    def text_features(self, model, batch):
        """The tokenizer's outputs that get_text_features takes (e.g. no token_type_ids where it has none)."""
        method = model.get_text_features
        params = inspect.signature(method).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            batch = {k: v for k, v in batch.items() if k in params}
        return method(**batch)


CLIP = Family("clip", padding=True, dim=_projection_dim)  # the causal text tower pools at the EOS token
# SigLIP pools the last position, so a text padded to the batch's longest is read at a pad token, not the one
# it was trained on: pad to max_length (64), as google's SigLIP and SigLIP2 processors do.
SIGLIP = Family("siglip", padding="max_length", dim=_siglip_dim)
SIGLIP2_NAFLEX = Family(
    "siglip2-naflex", padding="max_length", dim=_siglip_dim,
    no_images="a NaFlex SigLIP2 (model_type siglip2) takes patches at each image's own aspect ratio, with "
              "pixel_attention_mask and spatial_shapes, which the embed job does not make; use a fixed-resolution "
              "SigLIP2 checkpoint (model_type siglip, e.g. google/siglip2-base-patch16-224)")
GENERIC = Family("generic", padding=True, dim=_generic_dim)

# Fixed-resolution SigLIP2 checkpoints are SiglipModel (model_type siglip) with a Gemma tokenizer: SIGLIP.
BY_MODEL_TYPE = {"clip": CLIP, "siglip": SIGLIP, "siglip2": SIGLIP2_NAFLEX}
BY_NAME = {f.name: f for f in (CLIP, SIGLIP, SIGLIP2_NAFLEX, GENERIC)}


def family_of(model_type: str | None) -> Family:
    return BY_MODEL_TYPE.get(model_type or "", GENERIC)


def unsupported(family: Family, model_class, modality: str) -> str | None:
    """Why a model of this family and class cannot embed `modality` ("image" or "text"), or None."""
    method = f"get_{modality}_features"
    if model_class is None:
        return f"transformers has no class for it (remote code is never run); supported: {SUPPORTED}"
    if not callable(getattr(model_class, method, None)):
        return f"it has no {method}; supported: {SUPPORTED}"
    if modality == "image" and family.no_images:
        return family.no_images
    return None


def image_config(path: str) -> dict:
    """The model's image processor settings, defaults included, as transformers resolves them from
    preprocessor_config.json (hub repos) or processor_config.json (transformers 5). Reading the JSON alone
    would miss the class's defaults (a CLIP config without do_center_crop still crops)."""
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(path, trust_remote_code=False)
    # JSON-able and stable: enums as ints, tuples as lists, as a manifest and a resume record compare it
    return json.loads(json.dumps(processor.to_dict()))
