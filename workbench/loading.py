"""Loading a target and a DFlash drafter from local directories: one code path for everything.

The embedded default and real checkpoints (e.g. Qwen3-8B + its DFlash-b16 drafter on
a GPU host) go through the same functions. Nothing is ever downloaded: every
``from_pretrained`` call is local-only, and a path that is not a model directory
fails at once with a message naming it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

ASSETS = Path(__file__).parent / "assets"
DEFAULT_TARGET = ASSETS / "target"
DEFAULT_DRAFT = ASSETS / "draft"
# Embedded pairs by name: wb.load("hybrid") (a Qwen3.5-text target; see workbench/assets/hybrid).
PAIRS = {"hybrid": (ASSETS / "hybrid" / "target", ASSETS / "hybrid" / "draft")}
PACKAGE_PREFIX = "workbench/"  # a model path stored relative to the package's parent folder


def model_ref(path) -> str:
    """How a trace names a model directory: 'workbench/assets/target' for the embedded pair (relative to
    the package, so a trace still finds it on another machine or checkout), else the absolute path."""
    p = Path(path).resolve()
    try:
        return PACKAGE_PREFIX + p.relative_to(ASSETS.parent.resolve()).as_posix()
    except ValueError:
        return str(p)


def resolve_model_ref(ref) -> Path | None:
    """The directory a trace's model entry names, if it exists here. A package-relative entry resolves
    against this checkout; an absolute path from another machine that ends in the embedded pair's
    'workbench/assets/<name>' falls back to this checkout's copy."""
    if not ref:
        return None
    ref = str(ref)
    if ref.startswith(PACKAGE_PREFIX):
        p = ASSETS.parent / ref[len(PACKAGE_PREFIX):]
        return p if p.is_dir() else None
    p = Path(ref)
    if p.is_dir():
        return p
    parts = p.parts
    if len(parts) >= 3 and parts[-3:-1] == ("workbench", "assets") and (ASSETS / parts[-1]).is_dir():
        return ASSETS / parts[-1]
    return None

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


class ModelPairError(ValueError):
    """The target and the drafter do not fit together, or a path is not a model directory."""


@dataclass
class Models:
    """A loaded target, drafter and tokenizer, with the facts the engine needs."""

    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    target_dir: Path
    draft_dir: Path
    device: torch.device
    dtype: torch.dtype

    @property
    def block_size(self) -> int:
        return int(self.draft.block_size)

    @property
    def mask_token_id(self) -> int:
        return int(self.draft.mask_token_id)

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.draft.target_layer_ids)

    @property
    def max_positions(self) -> int:
        return int(self.target.config.max_position_embeddings)

    @property
    def eos_token_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        eos = getattr(self.target.config, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos])
        return {int(i) for i in ids if i is not None}


def resolve_dtype(dtype) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise ValueError(f"dtype={dtype!r} is not one of {', '.join(sorted(_DTYPES))} or a torch.dtype")


def resolve_device(device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={str(device)!r} but CUDA is not available on this machine; use device='cpu'")
    return dev


def model_dir(path, role: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ModelPairError(f"{role} path '{p}' is not a directory; pass a local model directory (nothing is downloaded)")
    if not (p / "config.json").is_file():
        raise ModelPairError(f"{role} path '{p}' is not a model directory: it has no config.json")
    return p


def read_config(p: Path) -> dict:
    try:
        return json.loads((p / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise ModelPairError(f"{p / 'config.json'} is not valid JSON: {e}") from None


def check_pair(tcfg: dict, dcfg: dict, tokenizer, target_dir: Path, draft_dir: Path) -> None:
    """Raise ModelPairError naming both values when the drafter cannot serve the target."""
    dfc = dcfg.get("dflash_config")
    if not isinstance(dfc, dict):
        raise ModelPairError(f"draft config {draft_dir / 'config.json'} has no 'dflash_config'; is '{draft_dir}' a DFlash drafter?")
    mask = dfc.get("mask_token_id", dcfg.get("mask_token_id"))
    if mask is None:
        raise ModelPairError(f"draft config {draft_dir / 'config.json'} has no 'mask_token_id' in its dflash_config")
    tv, dv = tcfg.get("vocab_size"), dcfg.get("vocab_size")
    if tv != dv:
        raise ModelPairError(f"vocab size differs: target {tv} ({target_dir}) vs draft {dv} ({draft_dir})")
    th, dh = tcfg.get("hidden_size"), dcfg.get("hidden_size")
    if th != dh:
        raise ModelPairError(f"hidden size differs: target {th} ({target_dir}) vs draft {dh} ({draft_dir})")
    n_layers = tcfg.get("num_hidden_layers")
    layer_ids = dfc.get("target_layer_ids")
    if layer_ids is None:
        from dflash.model import build_target_layer_ids

        layer_ids = build_target_layer_ids(dcfg.get("num_target_layers", n_layers), dcfg.get("num_hidden_layers", 1))
    bad = [i for i in layer_ids if not 0 <= int(i) < n_layers]
    if bad:
        raise ModelPairError(
            f"draft target_layer_ids {list(layer_ids)} out of range for a target with {n_layers} layers (bad: {bad})"
        )
    if not 0 <= int(mask) < tv:
        raise ModelPairError(f"draft mask_token_id {mask} is outside the target vocabulary of {tv} tokens")
    token = tokenizer.convert_ids_to_tokens(int(mask))
    if token is None or int(mask) >= len(tokenizer):
        raise ModelPairError(
            f"tokenizer in '{target_dir}' has no token for the drafter's mask_token_id {mask} (tokenizer size {len(tokenizer)})"
        )


def load_models(target=None, draft=None, device="cpu", dtype=None) -> Models:
    """Load and validate a (target, drafter) pair from local directories (defaults: the embedded pair;
    ``target`` may name an embedded pair in PAIRS instead, e.g. "hybrid")."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from dflash.model import DFlashDraftModel

    if isinstance(target, str) and target in PAIRS and draft is None and not Path(target).is_dir():
        name, (target, draft) = target, PAIRS[target]
        if not (target / "config.json").is_file():
            raise ModelPairError(f"the embedded {name!r} pair is not in '{target.parent}'; train it: make train-{name}")
    tdir = model_dir(target or DEFAULT_TARGET, "target")
    ddir = model_dir(draft or DEFAULT_DRAFT, "draft")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype)
    tcfg, dcfg = read_config(tdir), read_config(ddir)
    if not any((tdir / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        raise ModelPairError(f"target path '{tdir}' has no tokenizer (tokenizer.json)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(tdir, local_files_only=True)
    check_pair(tcfg, dcfg, tokenizer, tdir, ddir)
    from transformers.utils import logging as hf_logging

    # Weight-loading progress bars are noise in a notebook (and in nbval's stored outputs).
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tmodel = AutoModelForCausalLM.from_pretrained(tdir, local_files_only=True, dtype=dt).to(dev).eval()
        dmodel = DFlashDraftModel.from_pretrained(ddir, local_files_only=True, dtype=dt).to(dev).eval()
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return Models(tmodel, dmodel, tokenizer, tdir, ddir, dev, dt)
