"""Randomly initialised tiny model pairs written as HF directories (imported by tests as ``tiny_models``).

Kept out of conftest.py: notebooks/ has its own conftest (for nbval), and two modules named
``conftest`` cannot both be imported by name.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch


def make_tokenizer(vocab_size: int):
    """A word-level tokenizer over tokens 't0'..'t{V-3}', plus end-of-text and mask."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size - 2)}
    vocab["<|endoftext|>"] = vocab_size - 2
    vocab["<|mask|>"] = vocab_size - 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", mask_token="<|mask|>",
                                   pad_token="<|endoftext|>")


def draft_model(common: dict, target_layers: int, draft_layers: int, layer_ids, block_size: int):
    """A random DFlash drafter (z-lab layout: a Qwen3 config with ``dflash_config``) for a target of
    ``target_layers`` layers; ``common``: the Qwen3 config fields it shares with the target (vocab, hidden, heads)."""
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    dcfg = Qwen3Config(num_hidden_layers=draft_layers, tie_word_embeddings=False, **common)
    dcfg.num_target_layers = target_layers
    dcfg.dflash_config = {"mask_token_id": common["vocab_size"] - 1, "target_layer_ids": list(layer_ids),
                          "block_size": block_size}
    dcfg.block_size = block_size
    return DFlashDraftModel(dcfg)


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
