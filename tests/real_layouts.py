"""Tiny random checkpoints in the on-disk layouts of published targets and DFlash drafters.

``write_qwen3``, ``write_draft`` and the tokenizer are ``workbench.models.stand_ins``'s (notebooks use them too);
each writer puts a randomly initialised model in a directory the way its published counterpart is laid
out (config keys, weight names, shards, tokenizer quirks), small enough to load in a fraction of a
second. Reproduced from the installed dflash 0.1.0 and SGLang 0.5.23 sources and public config files:

- drafters: z-lab's config (``architectures``, ``auto_map``, top-level ``block_size`` and
  ``num_target_layers``, ``dflash_config`` with ``mask_token_id == len(tokenizer)``), keys at the top level
  only, DFlash 2 (convolutions and candidate selector, codebooks stored without ``.weight``), sliding-window
  layers (z-lab's Qwen3.6 drafters);
- targets: Qwen3, Qwen3-MoE, Llama 3.1 (llama3 RoPE, a BOS token), DeepSeek-V3 (MLA + MoE), Kimi-K2.5
  (``*ForConditionalGeneration`` with a nested DeepSeek-V3 ``text_config``), sharded bf16 with an index
  file; configs only for the refused kinds (hybrids, remote code).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from workbench.models.stand_ins import (  # noqa: F401 - the writers notebooks use too; tests take them from here
    BLOCK, HIDDEN, LAYER_IDS, LAYERS, VOCAB, chat_tokenizer, common_config, save_checkpoint, write_draft, write_qwen3,
)

# ------------------------------------------------------------------------------------------------ targets
def write_qwen3_moe(d: Path, seed: int = 1) -> Path:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    tok = chat_tokenizer()
    cfg = Qwen3MoeConfig(num_hidden_layers=LAYERS, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                         decoder_sparse_step=1, tie_word_embeddings=False, eos_token_id=tok.eos_token_id, **common_config())
    return save_checkpoint(Qwen3MoeForCausalLM(cfg), tok, d)


def write_llama3(d: Path, seed: int = 7) -> Path:
    """Llama 3.1: llama3 RoPE scaling, BOS from the tokenizer, tied-free head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tok = chat_tokenizer("llama3")
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32, "rope_theta": 500000.0}
    cfg = LlamaConfig(num_hidden_layers=LAYERS, rope_parameters=rope, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **common_config())
    return save_checkpoint(LlamaForCausalLM(cfg), tok, d)


def _deepseek_text(**kw) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, moe_intermediate_size=16,
                num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
                num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
                qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_group=1, topk_group=1,
                max_position_embeddings=256, initializer_range=0.4, tie_word_embeddings=False, **kw)


def write_deepseek_v3(d: Path, seed: int = 3) -> Path:
    """DeepSeek-V3 / Kimi-K2's architecture: MLA attention (no head_dim), a dense first layer, then MoE."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    tok = chat_tokenizer()
    cfg = DeepseekV3Config(**_deepseek_text(eos_token_id=tok.eos_token_id, bos_token_id=None))
    return save_checkpoint(DeepseekV3ForCausalLM(cfg), tok, d)


NESTED_PREFIX = "language_model."  # where Kimi-K2.5's checkpoint keeps its text model and head


def write_kimi_k25(d: Path, seed: int = 4) -> Path:
    """Kimi-K2.5: ``KimiK25ForConditionalGeneration`` with a DeepSeek-V3 ``text_config``; the text model's
    tensors under ``language_model.`` beside a vision tower and projector. Written tensor by tensor (the
    published layout; transformers' own reverse mapping for kimi_k25 renames text layers to ``blocks``)."""
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    from transformers.models.kimi_k25 import Kimi_K25Config

    torch.manual_seed(seed)
    tok = chat_tokenizer()
    text = _deepseek_text(eos_token_id=tok.eos_token_id, bos_token_id=None)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**text))
    tensors = {NESTED_PREFIX + k: v.contiguous() for k, v in model.state_dict().items()}
    tensors["vision_tower.patch_embed.proj.weight"] = torch.randn(8, 3, 2, 2)
    tensors["mm_projector.proj.0.weight"] = torch.randn(HIDDEN, 8)
    d.mkdir(parents=True, exist_ok=True)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    cfg = Kimi_K25Config(text_config={**text, "model_type": "kimi_k2"},
                         vision_config=dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                            intermediate_size=16, mm_hidden_size=8, text_hidden_size=HIDDEN))
    cfg.architectures = ["KimiK25ForConditionalGeneration"]
    cfg.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def write_qwen3_5_dense(d: Path, seed: int = 6) -> Path:
    """``Qwen3_5ForConditionalGeneration`` as save_pretrained writes it (text model under
    ``model.language_model.``, a vision tower under ``model.visual.``) with only full-attention layers:
    the nested layout with a text model the engine can verify (Qwen3.5's gated attention)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(seed)
    tok = chat_tokenizer()
    text = dict(common_config(), num_hidden_layers=LAYERS, layer_types=["full_attention"] * LAYERS,
                eos_token_id=tok.eos_token_id)
    cfg = Qwen3_5Config(text_config=text, vision_config=dict(depth=1, hidden_size=8, num_heads=2, intermediate_size=16,
                                                             out_hidden_size=HIDDEN))
    return save_checkpoint(Qwen3_5ForConditionalGeneration(cfg), tok, d)


def write_remote_code_config(d: Path) -> Path:
    """Kimi-K2's config: ``model_type: kimi_k2`` with ``auto_map`` to the checkpoint's own code."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = {**_deepseek_text(), "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"],
           "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                        "AutoModel": "modeling_deepseek.DeepseekV3Model",
                        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}}
    (d / "config.json").write_text(json.dumps(cfg))
    chat_tokenizer().save_pretrained(d)
    return d


REMOTE_CONFIG = """from transformers import Qwen3Config


class RemoteConfig(Qwen3Config):
    model_type = "qwen3_remote"
"""
REMOTE_MODELING = """from transformers import Qwen3ForCausalLM

from .configuration_remote import RemoteConfig


class RemoteForCausalLM(Qwen3ForCausalLM):
    config_class = RemoteConfig
"""


def write_remote_code_target(d: Path, seed: int = 0) -> Path:
    """A checkpoint with its own code beside the weights (as Kimi-K2 ships): ``auto_map`` to
    ``configuration_remote.py`` / ``modeling_remote.py`` (here thin subclasses of transformers' Qwen3, whose
    weight names need no conversion), loadable only with ``trust_remote_code=True``."""
    write_qwen3(d, seed=seed)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(model_type="qwen3_remote", architectures=["RemoteForCausalLM"],
               auto_map={"AutoConfig": "configuration_remote.RemoteConfig",
                         "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM"})
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "configuration_remote.py").write_text(REMOTE_CONFIG)
    (d / "modeling_remote.py").write_text(REMOTE_MODELING)
    return d
