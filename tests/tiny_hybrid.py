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


def make_hybrid_target(root: Path, kind: str = "qwen3_5", *, seed: int = 0, **config) -> Path:
    """Write a random ``kind`` target (``Qwen3NextForCausalLM`` or ``Qwen3_5ForCausalLM``) and the tiny
    tokenizer to ``root / kind``; returns that directory."""
    from transformers import Qwen3_5ForCausalLM, Qwen3NextForCausalLM

    cfg = hybrid_config(kind, **config)
    torch.manual_seed(seed)
    model = (Qwen3NextForCausalLM if kind == "qwen3_next" else Qwen3_5ForCausalLM)(cfg)
    out = Path(root) / kind
    model.save_pretrained(out)
    make_tokenizer(cfg.vocab_size).save_pretrained(out)
    return out
