"""Small random pairs that vLLM loads, written with save_pretrained in the embedded pair's layout.

``last_layer_pair`` reads the target's last layer (target_layer_ids [1, 3, 5] of 6), and its drafter's
norms are random, so that a production engine that treats the last layer's feature or the per-layer
``k_norm`` weights differently from the reference drafts differently from it: the comparison report
must find that by itself. The tokenizer is the embedded pair's (vLLM needs one on disk)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from workbench.engine.loading import DEFAULT_TARGET

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _randomise_norms(model, gen: torch.Generator) -> None:
    """Norm weights drawn around 1 (as trained ones are), each layer its own."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=gen))


def last_layer_pair(root: Path, seed: int = 0, layer_ids=(1, 3, 5), max_positions: int = 1024) -> tuple[Path, Path]:
    """(target dir, drafter dir): a 6-layer Qwen3 target (hidden 128, head_dim 64) and a 2-layer DFlash
    drafter reading ``layer_ids``, random weights with a spread wide enough that greedy choices are far
    from ties (vLLM's kernels and transformers' sum in different orders)."""
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    tcfg = Qwen3Config(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=max_positions,
                       tie_word_embeddings=True, initializer_range=0.2, bos_token_id=0, eos_token_id=0,
                       pad_token_id=0, architectures=["Qwen3ForCausalLM"])
    target = Qwen3ForCausalLM(tcfg).eval()
    _randomise_norms(target, gen)
    tdir, ddir = root / "target", root / "draft"
    target.save_pretrained(tdir)
    dcfg = Qwen3Config(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=max_positions,
                       tie_word_embeddings=False, initializer_range=0.2, architectures=["DFlashDraftModel"])
    dcfg.num_target_layers = 6
    dcfg.block_size = 16
    dcfg.dflash_config = {"mask_token_id": 1, "target_layer_ids": list(layer_ids), "block_size": 16}
    draft = DFlashDraftModel(dcfg).eval()
    _randomise_norms(draft, gen)
    draft.save_pretrained(ddir)
    for d in (tdir, ddir):
        for f in TOKENIZER_FILES:
            shutil.copy(DEFAULT_TARGET / f, d / f)
    gen_cfg = DEFAULT_TARGET / "generation_config.json"
    if gen_cfg.exists():
        shutil.copy(gen_cfg, tdir / "generation_config.json")
    json.loads((ddir / "config.json").read_text())  # written whole
    return tdir, ddir
