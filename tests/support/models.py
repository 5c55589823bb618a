"""Random-weight models of the other families and of the benchmarks' sizes, saved the way hub repos are, as the
demo's tiny CLIP is (mieb_ray/demo_data/models.py: save_clip, seeded, the same seeds, byte-identical files); no hub
needed. Each directory holds config.json, model.safetensors, preprocessor_config.json, processor_config.json and a
char-level tokenizer of the family's own class.

Families (mieb_ray/encode/families.py): CLIP of ViT-B/32 and L/14 sizes for benchmarks (`make_clip_b32`,
`make_clip_l14`), SigLIP (`make_tiny_siglip`: SiglipTokenizer over a sentencepiece model written here, so it needs
the sentencepiece package), SigLIP2 at a fixed resolution (`make_tiny_siglip2`: SiglipModel with a Gemma
tokenizer, as google/siglip2-*-224 are), NaFlex SigLIP2 (`make_tiny_siglip2_naflex`: Siglip2Model) and a
generic get_*_features model (`make_tiny_chinese_clip`: ChineseCLIPModel with a BERT tokenizer).
"""

from __future__ import annotations

import os
import string

from mieb_ray.demo_data.models import save_clip, seeded


def make_clip_b32(path: str, seed: int = 0) -> str:
    """ViT-B/32-sized (CLIPConfig() defaults: vision 768 x 12 layers, patch 32, 224 px; text 512 x 12; dim 512),
    with the real vocabulary size so the parameter count (151M) and file (~600 MB) match openai's."""
    return save_clip(path, dict(vocab_size=49408), dict(image_size=224, patch_size=32), 512, seed)


def make_clip_l14(path: str, seed: int = 0) -> str:
    """ViT-L/14-sized (vision 1024 x 24 layers, 16 heads, patch 14, 224 px; text 768 x 12; dim 768; 428M params)."""
    text = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_attention_heads=12)
    vision = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                  image_size=224, patch_size=14)
    return save_clip(path, text, vision, 768, seed)


# ---- other families: 2-layer towers of width 64, patch 16, 64 px, seeded as the CLIP above ----------------

SIGLIP_MAX_TEXT = 64  # SigLIP's and SigLIP2's text length: their processors pad every text to it
_TOWER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
_CHARS = [c for c in string.printable if not c.isspace()]


def sentencepiece_model() -> bytes:
    """A unigram sentencepiece model over single characters, written with protobuf alone (no trainer):
    <pad>, </s>, <unk> at 0, 1, 2 as in SigLIP's spiece.model, then "▁", the characters and "▁"+character."""
    from transformers.utils import sentencepiece_model_pb2_new as pb

    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.UNIGRAM
    m.trainer_spec.pad_id, m.trainer_spec.eos_id, m.trainer_spec.unk_id, m.trainer_spec.bos_id = 0, 1, 2, -1
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = m.normalizer_spec.remove_extra_whitespaces = True
    m.normalizer_spec.escape_whitespaces = True
    piece = pb.ModelProto.SentencePiece
    for token, kind in (("<pad>", piece.CONTROL), ("</s>", piece.CONTROL), ("<unk>", piece.UNKNOWN)):
        m.pieces.add(piece=token, score=0.0, type=kind)
    for token in ["▁", *_CHARS, *("▁" + c for c in _CHARS)]:
        m.pieces.add(piece=token, score=-1.0 if len(token) == 1 else -1.5)  # a word start is one piece
    return m.SerializeToString()


def _siglip_config(vocab_size: int, pad: int, eos: int, image_size: int):
    from transformers import SiglipConfig

    text = dict(_TOWER, vocab_size=vocab_size, max_position_embeddings=SIGLIP_MAX_TEXT, pad_token_id=pad,
                bos_token_id=None, eos_token_id=eos)
    return SiglipConfig(text_config=text, vision_config=dict(_TOWER, image_size=image_size, patch_size=16))


def make_tiny_siglip(path: str, image_size: int = 64, seed: int = 0) -> str:
    """SigLIP as google/siglip-base-patch16-224 is laid out: SiglipModel, SiglipTokenizer (spiece.model,
    lower-casing, punctuation dropped, </s> as pad and end), SiglipImageProcessor (resize to size, no crop,
    mean/std 0.5, bicubic)."""
    from transformers import (
        SiglipImageProcessorPil,
        SiglipModel,
        SiglipProcessor,
        SiglipTokenizer,
    )

    os.makedirs(path, exist_ok=True)
    spm = os.path.join(path, "spiece.model")
    with open(spm, "wb") as f:
        f.write(sentencepiece_model())
    tok = SiglipTokenizer(vocab_file=spm, model_max_length=SIGLIP_MAX_TEXT)
    model = seeded(SiglipModel, _siglip_config(len(tok), tok.pad_token_id, tok.eos_token_id, image_size), seed)
    images = SiglipImageProcessorPil(size={"height": image_size, "width": image_size}, resample=3)
    model.save_pretrained(path)
    SiglipProcessor(image_processor=images, tokenizer=tok).save_pretrained(path)
    images.save_pretrained(path)
    return path


def _gemma_vocab() -> dict[str, int]:
    """Gemma's specials at their ids, then the characters and "▁"+character (its word-start marker)."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    return {t: i for i, t in enumerate([*specials, "▁", *_CHARS, *("▁" + c for c in _CHARS)])}


def make_tiny_siglip2(path: str, image_size: int = 64, seed: int = 0) -> str:
    """SigLIP2 at a fixed resolution, as google/siglip2-base-patch16-224 is: a SiglipModel (model_type siglip)
    with a Gemma tokenizer and a SiglipImageProcessor that resizes bilinearly."""
    from transformers import (
        GemmaTokenizer,
        SiglipImageProcessorPil,
        SiglipModel,
        SiglipProcessor,
    )

    tok = GemmaTokenizer(vocab=_gemma_vocab(), merges=[], model_max_length=SIGLIP_MAX_TEXT)
    model = seeded(SiglipModel, _siglip_config(len(tok), tok.pad_token_id, tok.eos_token_id, image_size), seed)
    images = SiglipImageProcessorPil(size={"height": image_size, "width": image_size}, resample=2)
    model.save_pretrained(path)
    SiglipProcessor(image_processor=images, tokenizer=tok).save_pretrained(path)
    images.save_pretrained(path)
    return path


def make_tiny_siglip2_naflex(path: str, seed: int = 0) -> str:
    """NaFlex SigLIP2 (Siglip2Model, model_type siglip2): texts as SigLIP2's; images in patches at their own
    aspect ratio, which the embed job refuses."""
    from transformers import (
        Siglip2Config,
        Siglip2ImageProcessorPil,
        Siglip2Model,
        Siglip2Processor,
        Siglip2Tokenizer,
    )

    tok = Siglip2Tokenizer(vocab=_gemma_vocab(), merges=[], model_max_length=SIGLIP_MAX_TEXT)
    text = dict(_TOWER, vocab_size=len(tok), max_position_embeddings=SIGLIP_MAX_TEXT, pad_token_id=tok.pad_token_id,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config = Siglip2Config(text_config=text, vision_config=dict(_TOWER, patch_size=16, num_patches=16))
    model = seeded(Siglip2Model, config, seed)
    images = Siglip2ImageProcessorPil(patch_size=16, max_num_patches=16)
    model.save_pretrained(path)
    Siglip2Processor(image_processor=images, tokenizer=tok).save_pretrained(path)
    images.save_pretrained(path)
    return path


def make_tiny_chinese_clip(path: str, image_size: int = 64, seed: int = 0) -> str:
    """A generic get_image_features/get_text_features model: ChineseCLIPModel (a BERT text tower pooled at
    [CLS]), a BERT word-piece tokenizer over characters, CLIP-style preprocessing."""
    from transformers import (
        BertTokenizer,
        ChineseCLIPConfig,
        ChineseCLIPImageProcessorPil,
        ChineseCLIPModel,
        ChineseCLIPProcessor,
    )

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_CHARS, *("##" + c for c in _CHARS)]
    tok = BertTokenizer(vocab={t: i for i, t in enumerate(words)}, model_max_length=52)
    text = dict(_TOWER, vocab_size=len(tok), max_position_embeddings=52, pad_token_id=tok.pad_token_id)
    config = ChineseCLIPConfig(text_config=text, vision_config=dict(_TOWER, image_size=image_size, patch_size=16),
                               projection_dim=32)
    model = seeded(ChineseCLIPModel, config, seed)
    images = ChineseCLIPImageProcessorPil(size={"shortest_edge": image_size},
                                          crop_size={"height": image_size, "width": image_size})
    model.save_pretrained(path)
    ChineseCLIPProcessor(image_processor=images, tokenizer=tok).save_pretrained(path)
    images.save_pretrained(path)
    return path
