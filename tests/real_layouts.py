"""Tiny random checkpoints in the on-disk layouts of published targets and DFlash drafters.

Each writer puts a randomly initialised model in a directory the way its published counterpart is laid
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
from contextlib import contextmanager
from pathlib import Path

import torch

VOCAB = 64  # embedding rows of every tiny target
HIDDEN = 32
LAYERS = 4  # target depth
LAYER_IDS = [1, 2]  # target layers the drafters read
BLOCK = 6

QWEN_TEMPLATE = (  # Qwen3's shape: im_start/im_end turns and the enable_thinking switch
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
LLAMA_TEMPLATE = (  # Llama 3's shape: the template writes the BOS itself
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def make_tokenizer(family: str = "qwen3"):
    """A word-level tokenizer over 't0'..'tN' plus the family's special tokens, ``VOCAB - 4`` ids in all,
    so the embedding has rows no token names (as Qwen3's 151669 tokens for 151936 rows): the drafter's mask
    id is ``len(tokenizer)``. ``family="llama3"`` adds a BOS the tokenizer's own call puts first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    n = VOCAB - 4
    if family == "llama3":
        special = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    else:
        special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    words = n - len(special)
    vocab = {f"t{i}": i for i in range(words)}
    vocab.update({tok: words + i for i, tok in enumerate(special)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    if family == "llama3":
        bos = vocab["<|begin_of_text|>"]
        tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                           special_tokens=[("<|begin_of_text|>", bos)])
        out = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                      pad_token="<|end_of_text|>", additional_special_tokens=special[2:4])
        out.chat_template = LLAMA_TEMPLATE
    else:
        out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                      additional_special_tokens=special[1:2] + special[3:])
        out.chat_template = QWEN_TEMPLATE
    assert len(out) == n
    return out


def _common(**kw) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_attention_heads=2,
                num_key_value_heads=1, head_dim=HIDDEN // 2, max_position_embeddings=256, initializer_range=0.4,
                **kw)


@contextmanager
def quiet():
    """No 'Writing model shards' bars (noise in test logs and in a notebook's stored outputs)."""
    from transformers.utils import logging as hf_logging

    on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if on:
            hf_logging.enable_progress_bar()


def _save(model, tokenizer, directory: Path, **kw) -> Path:
    with quiet():
        model.save_pretrained(directory, **kw)
    tokenizer.save_pretrained(directory)
    return directory


# ------------------------------------------------------------------------------------------------ targets
def write_qwen3(d: Path, seed: int = 0, dtype=torch.float32, max_shard_size=None) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    tok = make_tokenizer()
    cfg = Qwen3Config(num_hidden_layers=LAYERS, tie_word_embeddings=False, eos_token_id=tok.eos_token_id,
                      bos_token_id=None, **_common())
    model = Qwen3ForCausalLM(cfg).to(dtype)
    return _save(model, tok, d, **({"max_shard_size": max_shard_size} if max_shard_size else {}))


def write_qwen3_moe(d: Path, seed: int = 1) -> Path:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    tok = make_tokenizer()
    cfg = Qwen3MoeConfig(num_hidden_layers=LAYERS, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                         decoder_sparse_step=1, tie_word_embeddings=False, eos_token_id=tok.eos_token_id, **_common())
    return _save(Qwen3MoeForCausalLM(cfg), tok, d)


def write_llama3(d: Path, seed: int = 7) -> Path:
    """Llama 3.1: llama3 RoPE scaling, BOS from the tokenizer, tied-free head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tok = make_tokenizer("llama3")
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32, "rope_theta": 500000.0}
    cfg = LlamaConfig(num_hidden_layers=LAYERS, rope_parameters=rope, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **_common())
    return _save(LlamaForCausalLM(cfg), tok, d)


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
    tok = make_tokenizer()
    cfg = DeepseekV3Config(**_deepseek_text(eos_token_id=tok.eos_token_id, bos_token_id=None))
    return _save(DeepseekV3ForCausalLM(cfg), tok, d)


NESTED_PREFIX = "language_model."  # where Kimi-K2.5's checkpoint keeps its text model and head


def write_kimi_k25(d: Path, seed: int = 4) -> Path:
    """Kimi-K2.5: ``KimiK25ForConditionalGeneration`` with a DeepSeek-V3 ``text_config``; the text model's
    tensors under ``language_model.`` beside a vision tower and projector. Written tensor by tensor (the
    published layout; transformers' own reverse mapping for kimi_k25 renames text layers to ``blocks``)."""
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    from transformers.models.kimi_k25 import Kimi_K25Config

    torch.manual_seed(seed)
    tok = make_tokenizer()
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
    tok = make_tokenizer()
    text = dict(_common(), num_hidden_layers=LAYERS, layer_types=["full_attention"] * LAYERS,
                eos_token_id=tok.eos_token_id)
    cfg = Qwen3_5Config(text_config=text, vision_config=dict(depth=1, hidden_size=8, num_heads=2, intermediate_size=16,
                                                             out_hidden_size=HIDDEN))
    return _save(Qwen3_5ForConditionalGeneration(cfg), tok, d)


def write_remote_code_config(d: Path) -> Path:
    """Kimi-K2's config: ``model_type: kimi_k2`` with ``auto_map`` to the checkpoint's own code."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = {**_deepseek_text(), "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"],
           "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                        "AutoModel": "modeling_deepseek.DeepseekV3Model",
                        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}}
    (d / "config.json").write_text(json.dumps(cfg))
    make_tokenizer().save_pretrained(d)
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


# ------------------------------------------------------------------------------------------------ drafters
def _draft_config(*, dflash2: bool = False, sliding: bool = False, seed_layers: int = 1):
    from transformers import Qwen3Config

    kw = _common()
    if sliding:  # z-lab's Qwen3.6 drafters: windowed, causal layers among full ones
        kw.update(use_sliding_window=True, sliding_window=3, max_window_layers=0,
                  layer_types=["sliding_attention", "full_attention"][:seed_layers])
    cfg = Qwen3Config(num_hidden_layers=seed_layers, tie_word_embeddings=False, **kw)
    cfg.dflash_config = {"mask_token_id": VOCAB - 4, "target_layer_ids": list(LAYER_IDS)}
    cfg.block_size = BLOCK
    cfg.num_target_layers = LAYERS
    if dflash2:
        cfg.dflash_config.update(conv_kernel_size=3, conv_group_size=8, selector_rank=4, selector_top_k=4)
    return cfg


def write_draft(d: Path, kind: str = "zlab", seed: int = 10) -> Path:
    """A DFlash drafter for the tiny targets above, in one of the published config layouts:

    - ``zlab``: z-lab's (``architectures``, ``auto_map``, top-level ``block_size`` / ``num_target_layers``,
      ``dflash_config`` with ``mask_token_id`` = ``len(tokenizer)`` and ``target_layer_ids``);
    - ``toplevel``: every key at the top level and no ``dflash_config`` (read by dflash and SGLang alike);
    - ``dflash2``: ``DFlash2DraftModel`` with its convolutions and candidate selector;
    - ``sliding``: a sliding-window (causal, windowed) first layer and a full one.
    """
    from dflash.model import DFlash2DraftModel, DFlashDraftModel

    torch.manual_seed(seed)
    cfg = _draft_config(dflash2=kind == "dflash2", sliding=kind == "sliding",
                        seed_layers=2 if kind == "sliding" else 1)
    model = (DFlash2DraftModel if kind == "dflash2" else DFlashDraftModel)(cfg)
    if kind == "dflash2":  # dflash leaves the convolutions' base kernels uninitialised (torch.empty)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("base_kernel"):
                    p.normal_(0, 0.3)
    with quiet():
        model.save_pretrained(d)
    path = d / "config.json"
    c = json.loads(path.read_text())
    name = "DFlash2DraftModel" if kind == "dflash2" else "DFlashDraftModel"
    c["architectures"] = [name]
    c["auto_map"] = {"AutoModel": f"dflash.{name}"}
    if kind == "toplevel":
        c.update(c.pop("dflash_config"))
    path.write_text(json.dumps(c, indent=2))
    if kind == "dflash2":  # the published files store the codebooks as bare tensors (dflash maps them back)
        from safetensors.torch import load_file, save_file

        f = d / "model.safetensors"
        t = load_file(f)
        for name in ("predecessor_codebook", "successor_codebook"):
            t[f"candidate_selector.{name}"] = t.pop(f"candidate_selector.{name}.weight")
        save_file(t, f, metadata={"format": "pt"})
    return d
