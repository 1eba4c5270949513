"""A target and a DFlash drafter with random weights in a shipped (or given) config's layout, for the forward
sweep (``workbench.bench.sweep``): cost does not depend on weight values, so no checkpoint is loaded.

    from workbench.bench.random_models import cut_configs, random_models
    models = random_models("qwen3-8b", "qwen3-8b-dflash-b16", device="cuda", dtype="bfloat16", layers=4)

``check_configs`` refuses a config the cost model cannot read or a drafter that does not fit its target, and
``random_models`` a sweep whose weights + K/V + activations exceed the device's free memory
(``workbench.shapes.memory_fit.check_fits``), both before any weight is allocated.
"""
from __future__ import annotations

from pathlib import Path

import torch

from workbench.bench.sweep import SweepInputError
from workbench.models.registry import pair_mismatch
from workbench.shapes import families
from workbench.shapes.families import config_name, load_config
from workbench.shapes.memory_fit import check_fits


def _label(config, cfg: dict) -> str:
    """How the caller named a config: the path or shipped name given, else its own name."""
    return str(config) if isinstance(config, (str, Path)) else config_name(config, cfg)


def check_configs(target_config, t: dict, draft_config=None, d: dict | None = None) -> None:
    """The configs as given (``t``, ``d``: their dicts, before any cut) describe a target the cost model
    reads and a DFlash drafter that fits it: the same width and vocabulary (it uses the target's embedding
    and LM head) and target layers the target has. A mismatch would otherwise surface only as a shape
    error inside the first forward, after every random weight was built (seconds to minutes at full width)."""
    facts = {}
    for what, config, cfg in (("target", target_config, t), ("draft", draft_config, d)):
        if cfg is None:
            continue
        try:
            facts[what] = families.facts(cfg, what, purpose="cost model")
        except ValueError as e:
            raise SweepInputError(f"{_label(config, cfg)}: {e}") from None
    tname = _label(target_config, t)
    if facts["target"].draft is not None:
        raise SweepInputError(f"target config {tname} is a DFlash drafter; give a target config (target_config=, "
                              "--config) and the drafter as draft_config= (--draft-config)")
    if d is None:
        return
    dname, df, tf = _label(draft_config, d), facts["draft"], facts["target"]
    if df.draft is None:
        raise SweepInputError(f"draft config {dname} is not a DFlash drafter (no dflash_config / target_layer_ids); "
                              "give a DFlash drafter's config (draft_config=, --draft-config)")
    wrong = pair_mismatch((tf.vocab_size, tf.hidden_size, tf.layers),
                          (df.vocab_size, df.hidden_size, tuple(df.draft.target_layer_ids)))
    if wrong is not None:
        raise SweepInputError(f"draft config {dname} does not fit target config {tname}: {wrong[0]}; give a drafter "
                              f"config made for {tname} (draft_config=, --draft-config)")


def _cut(cfg: dict, config, layers: int | None, what: str, param: str) -> dict:
    """``cfg`` with ``layers`` decoder layers (None: as it is) and a ``_name`` that says so."""
    full = int(cfg["num_hidden_layers"])
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= full:
            raise ValueError(f"{param}={layers!r} must be an integer from 1 to the {what}'s {full}")
        cfg["num_hidden_layers"] = layers
        if cfg.get("layer_types"):
            cfg["layer_types"] = list(cfg["layer_types"])[:layers]
    n = cfg["num_hidden_layers"]
    cfg["_name"] = config_name(config, cfg) + (f" ({n} of {full} layers)" if n != full else "")
    return cfg


def cut_configs(target_config, draft_config=None, layers: int | None = None,
                draft_layers: int | None = None) -> tuple[dict, dict | None]:
    """Shipped (or given) configs as dicts, the target cut to ``layers`` decoder layers and the drafter to
    ``draft_layers`` (each None: as shipped). Every width stays; a cut drafter keeps as many target layers
    as it reads (its fc's width), clamped into the cut target. ``_name`` says what was cut. The configs are
    checked first, as given (``check_configs``)."""
    t = load_config(target_config, "target")
    d = load_config(draft_config, "draft") if draft_config is not None else None
    check_configs(target_config, t, draft_config, d)
    t = _cut(t, target_config, layers, "config", "layers")
    if d is None:
        return t, None
    d = _cut(d, draft_config, draft_layers, "drafter", "draft_layers")
    dfc = dict(d.get("dflash_config") or {})
    ids = dfc.get("target_layer_ids") or d.get("target_layer_ids")
    n = t["num_hidden_layers"]
    if ids:
        dfc["target_layer_ids"] = [min(int(i), n - 1) for i in ids]
    dfc.setdefault("mask_token_id", int(t["vocab_size"]) - 1)  # shipped layouts omit it; any id < vocab runs
    dfc.setdefault("block_size", int(d.get("block_size", 16)))
    d["dflash_config"], d["num_target_layers"] = dfc, n
    return t, d


def _hf_config(cfg: dict):
    from transformers import AutoConfig

    fields = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "model_type"}
    return AutoConfig.for_model(cfg["model_type"], **fields)


def _fill(model: torch.nn.Module, seed: int) -> None:
    """Random weights of a trained model's scale: N(0, 0.02) matrices, unit norms (values do not change
    cost, but a zero or huge weight could make a CPU take a denormal or NaN path)."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)


def random_models(target_config="qwen3-8b", draft_config="qwen3-8b-dflash-b16", device="cpu", dtype="bfloat16",
                  layers: int | None = None, draft_layers: int | None = None, seed: int = 0, rows: int = 1,
                  nodes: int = 64, context: int = 512):
    """A target and a DFlash drafter with random weights in a shipped config's layout, built on ``device``
    without loading a checkpoint (``layers`` / ``draft_layers`` cut the depth). Checks first that the
    sweep of ``rows`` x ``nodes`` after ``context`` fits (``check_fits``). -> workbench Models."""
    from workbench.engine.loading import Models, resolve_device, resolve_dtype

    dev, dt = resolve_device(device), resolve_dtype(dtype)
    t, d = cut_configs(target_config, draft_config, layers, draft_layers)
    if d is None:
        raise ValueError("random_models needs a draft_config (the drafter's block forward is swept too)")
    check_fits(t, d, rows, nodes, context, dt, dev)
    from dflash.model import DFlashDraftModel
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    tcfg, dcfg = _hf_config(t), _hf_config(d)
    dcfg.num_target_layers, dcfg.dflash_config = d["num_target_layers"], d["dflash_config"]
    dcfg.block_size = d["dflash_config"]["block_size"]
    for c in (tcfg, dcfg):
        c._attn_implementation = "sdpa"
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dt)
        with torch.device(dev), no_init_weights():  # _fill sets every weight once, below
            target = AutoModelForCausalLM.from_config(tcfg, dtype=dt)
            draft = DFlashDraftModel(dcfg).to(dt)
    finally:
        torch.set_default_dtype(old)
    _fill(target, seed)
    _fill(draft, seed + 1)
    path = Path(t["_name"])
    return Models(target.eval(), draft.eval(), None, path, Path(d["_name"]), dev, dt,
                  (f"random weights in the layout of {t['_name']} + {d['_name']}",))

