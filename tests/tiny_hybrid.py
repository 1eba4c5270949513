"""Randomly initialised tiny hybrid targets (GatedDeltaNet linear attention + gated full attention) written as
HF directories with ``save_pretrained``: Qwen3-Next (MoE MLP) and Qwen3.5-text. Imported by tests as
``tiny_hybrid``; the tokenizer is ``tiny_models.make_tokenizer``'s."""
from __future__ import annotations

from pathlib import Path

import torch

from tiny_models import make_tokenizer

KINDS = ("qwen3_next", "qwen3_5")
DEFAULT_LAYERS = ("linear_attention", "linear_attention", "full_attention", "linear_attention")


def hybrid_config(kind: str, *, vocab: int = 64, hidden: int = 32, layer_types=DEFAULT_LAYERS, conv: int = 4,
                  init_std: float = 0.4, max_positions: int = 256, eos: bool = True):
    """A tiny config of ``kind``: 2 attention heads of 16 (1 KV head, a quarter rotary), 1 key and 2 value
    linear heads of 8, a width-``conv`` short conv; Qwen3-Next adds 4 experts (top 2) and a shared expert."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not one of {', '.join(KINDS)}")
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=len(layer_types), layer_types=list(layer_types), num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
                  linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=conv,
                  max_position_embeddings=max_positions, initializer_range=init_std, tie_word_embeddings=True,
                  eos_token_id=vocab - 2 if eos else None)
    if kind == "qwen3_next":
        from transformers import Qwen3NextConfig

        return Qwen3NextConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden,
                               shared_expert_intermediate_size=hidden, decoder_sparse_step=1, **common)
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(**common)


def make_hybrid_target(root: Path, kind: str = "qwen3_5", *, seed: int = 0, nested: bool = False, **config) -> Path:
    """Write a random ``kind`` target (``Qwen3NextForCausalLM`` or ``Qwen3_5ForCausalLM``) and the tiny
    tokenizer to ``root / kind`` (``root / "qwen3_5_nested"`` with ``nested``); returns that directory.

    ``nested`` (qwen3_5 only): the layout Qwen3.5 / 3.6 ship in, ``Qwen3_5ForConditionalGeneration`` with the
    text model under ``text_config`` and a one-block vision tower (``AutoModelForCausalLM`` loads its text part).
    """
    from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3NextForCausalLM

    if nested and kind != "qwen3_5":
        raise ValueError(f"nested=True is the Qwen3.5 layout; kind={kind!r} has no nested text_config")
    cfg = hybrid_config(kind, **config)
    torch.manual_seed(seed)
    if nested:
        vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=cfg.hidden_size,
                      patch_size=4, spatial_merge_size=1, temporal_patch_size=1)
        model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=cfg.to_dict(), vision_config=vision,
                                                              tie_word_embeddings=cfg.tie_word_embeddings))
    else:
        model = (Qwen3NextForCausalLM if kind == "qwen3_next" else Qwen3_5ForCausalLM)(cfg)
    out = Path(root) / (f"{kind}_nested" if nested else kind)
    model.save_pretrained(out)
    make_tokenizer(cfg.vocab_size).save_pretrained(out)
    return out
