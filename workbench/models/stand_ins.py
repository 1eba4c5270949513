"""Tiny random checkpoints in the on-disk layouts of published targets and DFlash drafters.

Each writer puts a randomly initialised model (a few layers, hidden 32, a word-level tokenizer) in a
directory the way its published counterpart is laid out: config keys, weight names, tokenizer quirks. They
load in a fraction of a second, so a notebook or a test can run ``wb.load(target=..., draft=...)`` on a
machine without the real checkpoints (notebook 06 stands in for Qwen3-8B and z-lab's drafter this way;
notebook 08 for a nested Qwen3.5 hybrid). The outputs are random: they show shapes, layouts and the loader's
notes, never acceptance.

    from workbench.models.stand_ins import write_draft, write_qwen3
    target, draft = write_qwen3(tmp / "target"), write_draft(tmp / "draft", "zlab")

``tests/real_layouts.py`` adds the other published layouts (Qwen3-MoE, Llama 3.1, DeepSeek-V3, Kimi-K2.5,
remote code) on top of these.
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


def chat_tokenizer(family: str = "qwen3"):
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


def common_config(**kw) -> dict:
    """The config fields every tiny target and drafter here shares (vocabulary, width, heads), plus ``kw``."""
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


def save_checkpoint(model, tokenizer, directory: Path, **kw) -> Path:
    """``model`` and ``tokenizer`` saved to ``directory`` (no progress bars); returns the directory."""
    with quiet():
        model.save_pretrained(directory, **kw)
    tokenizer.save_pretrained(directory)
    return directory


# ---------------------------------------------------------------------------- a Qwen3 target and a z-lab drafter
def write_qwen3(d: Path, seed: int = 0, dtype=torch.float32, max_shard_size=None) -> Path:
    """A random 4-layer Qwen3 target with the chat tokenizer (Qwen3's template, 60 ids for 64 embedding rows)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    tok = chat_tokenizer()
    cfg = Qwen3Config(num_hidden_layers=LAYERS, tie_word_embeddings=False, eos_token_id=tok.eos_token_id,
                      bos_token_id=None, **common_config())
    model = Qwen3ForCausalLM(cfg).to(dtype)
    return save_checkpoint(model, tok, d, **({"max_shard_size": max_shard_size} if max_shard_size else {}))


def draft_config(*, dflash2: bool = False, sliding: bool = False, seed_layers: int = 1):
    """The z-lab DFlash drafter config for the tiny targets here (``dflash_config`` with the mask id and the
    target layers it reads; DFlash 2's convolutions and selector with ``dflash2``; a sliding first layer)."""
    from transformers import Qwen3Config

    kw = common_config()
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
    """A DFlash drafter for ``write_qwen3``'s target, in one of the published config layouts:

    - ``zlab``: z-lab's (``architectures``, ``auto_map``, top-level ``block_size`` / ``num_target_layers``,
      ``dflash_config`` with ``mask_token_id`` = ``len(tokenizer)`` and ``target_layer_ids``);
    - ``toplevel``: every key at the top level and no ``dflash_config`` (read by dflash and SGLang alike);
    - ``dflash2``: ``DFlash2DraftModel`` with its convolutions and candidate selector;
    - ``sliding``: a sliding-window (causal, windowed) first layer and a full one.
    """
    from dflash.model import DFlash2DraftModel, DFlashDraftModel

    torch.manual_seed(seed)
    cfg = draft_config(dflash2=kind == "dflash2", sliding=kind == "sliding",
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


# --------------------------------------- hybrid targets (GatedDeltaNet + gated attention): a word tokenizer, a drafter
def word_tokenizer(vocab_size: int):
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


def dflash_draft(common: dict, target_layers: int, draft_layers: int, layer_ids, block_size: int):
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
    word_tokenizer(cfg.vocab_size).save_pretrained(out)
    return out


def make_hybrid_pair(root: Path, kind: str = "qwen3_5", *, nested: bool = False, seed: int = 0, block_size: int = 8,
                     draft_layers: int = 1, layer_ids=(1, 2), **config) -> tuple[Path, Path]:
    """A random hybrid target (``make_hybrid_target``) and a random DFlash drafter for it (the z-lab layout:
    a Qwen3 config, the target's vocabulary and hidden size) -> (target_dir, draft_dir)."""
    tdir = make_hybrid_target(root, kind, seed=seed, nested=nested, **config)
    cfg = hybrid_config(kind, **config)
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                  num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                  head_dim=cfg.head_dim, max_position_embeddings=cfg.max_position_embeddings,
                  initializer_range=cfg.initializer_range)
    torch.manual_seed(seed + 1000)
    ddir = tdir.parent / f"{tdir.name}_draft"
    dflash_draft(common, cfg.num_hidden_layers, draft_layers, layer_ids, block_size).save_pretrained(ddir)
    return tdir, ddir
