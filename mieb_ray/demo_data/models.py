"""The demo's model: a tiny random-weight CLIP saved the way hub repos are (no hub needed), which the tests use too.

Its directory holds config.json, model.safetensors, preprocessor_config.json (as hub repos have it),
processor_config.json (what transformers 5 writes, so CLIPProcessor.from_pretrained works) and a char-level
CLIPTokenizer. The same seed gives the same weights and byte-identical files. The other families and the
B/32- and L/14-sized CLIPs of the benchmarks are the tests' (tests/support/models.py), saved the same way
(save_clip, seeded).
"""

from __future__ import annotations

import string

import torch
from transformers import (
    CLIPConfig,
    CLIPImageProcessorPil,
    CLIPModel,
    CLIPProcessor,
    CLIPTokenizer,
)

CLIP_MAX_TEXT = 77


def char_tokenizer() -> CLIPTokenizer:
    """CLIP's tokenizer (lower-casing, whitespace split, </w> word ends) over single characters: 190 tokens."""
    chars = [c for c in string.printable if not c.isspace()]
    vocab = {t: i for i, t in enumerate(["<|startoftext|>", "<|endoftext|>"] + chars + [c + "</w>" for c in chars])}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=CLIP_MAX_TEXT)


def seeded(model_class, config, seed: int):
    """`model_class(config)` in eval mode, its weights drawn from `seed` without disturbing the caller's RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_class(config).eval()


def save_clip(path: str, text: dict, vision: dict, projection_dim: int, seed: int) -> str:
    """A CLIPModel of these towers' settings (over char_tokenizer's vocabulary unless `text` says otherwise), with
    OpenAI's preprocessing at its image size, saved to `path`."""
    tok = char_tokenizer()
    config = CLIPConfig(text_config={"vocab_size": len(tok), "max_position_embeddings": CLIP_MAX_TEXT,
                                     "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
                                     "pad_token_id": tok.pad_token_id, **text},
                        vision_config=vision, projection_dim=projection_dim)
    model = seeded(CLIPModel, config, seed)
    size = vision["image_size"]
    # OpenAI's preprocessing: bicubic resize of the shortest edge, centre crop, CLIP mean/std (the defaults)
    images = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size},
                                   resample=3)
    model.save_pretrained(path)
    CLIPProcessor(image_processor=images, tokenizer=tok).save_pretrained(path)
    images.save_pretrained(path)
    return path


def make_tiny_clip(path: str, image_size: int = 64, projection_dim: int = 32, seed: int = 0) -> str:
    """A 0.2M-parameter CLIP: 2-layer towers of width 64, patch 16; 77 text positions, as CLIP truncates."""
    tower = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
    return save_clip(path, tower, dict(tower, image_size=image_size, patch_size=16), projection_dim, seed)
