"""Randomly initialised tiny model pairs written as HF directories (imported by tests as ``tiny_models``).

Kept out of conftest.py: notebooks/ has its own conftest (for nbval), and two modules named
``conftest`` cannot both be imported by name.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from workbench.models.stand_ins import dflash_draft as draft_model  # noqa: F401 - tests import it from here
from workbench.models.stand_ins import word_tokenizer as make_tokenizer


def tiny_qwen3_configs(vocab: int = 256, target_layer_ids=(0, 2)) -> tuple[dict, dict]:
    """A Qwen3 target layout and its DFlash drafter, small enough for the CPU (the random-weight path of
    ``workbench.bench.random_models``: configs, no checkpoint)."""
    target = dict(model_type="qwen3", vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                  tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-6, _name="tiny-qwen3")
    draft = dict(target, num_hidden_layers=2, num_target_layers=3, block_size=8,
                 dflash_config={"block_size": 8, "target_layer_ids": list(target_layer_ids)},
                 architectures=["DFlashDraftModel"], _name="tiny-dflash")
    return target, draft


def make_pair(root: Path, *, vocab: int = 64, hidden: int = 32, layers: int = 4, heads: int = 2, kv_heads: int = 1,
              draft_layers: int = 1, block_size: int = 8, layer_ids=(1, 2), seed: int = 0, init_std: float = 0.4,
              max_positions: int = 256, eos: bool = True) -> tuple[Path, Path]:
    """Write a random Qwen3 target and DFlash drafter as HF directories; returns (target_dir, draft_dir).

    A large init std spreads the logits, so argmax near-ties (where float noise
    between a tree forward and a one-token forward could flip a token) are rare.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    tok = make_tokenizer(vocab)
    eos_id = vocab - 2 if eos else None
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, head_dim=hidden // heads, max_position_embeddings=max_positions,
                  initializer_range=init_std)
    tcfg = Qwen3Config(num_hidden_layers=layers, tie_word_embeddings=True, eos_token_id=eos_id, **common)
    target = Qwen3ForCausalLM(tcfg)
    draft = draft_model(common, layers, draft_layers, layer_ids, block_size)
    tdir, ddir = root / "target", root / "draft"
    target.save_pretrained(tdir)
    draft.save_pretrained(ddir)
    tok.save_pretrained(tdir)
    if not eos:  # the tokenizer still has the token; the target simply never stops on it
        cfg = json.loads((tdir / "config.json").read_text())
        cfg["eos_token_id"] = None
        (tdir / "config.json").write_text(json.dumps(cfg))
    return tdir, ddir
