"""Shapes per forward mode from configs alone, on the meta device, with SGLang's layout of each line."""
from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workbench.capture import ShapeCapture
from workbench.forward import ForwardMode
from workbench.shapes.tables import CompareTable, LayoutTable, _mode, compare, sglang_view, table

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

@dataclass
class ShapePlan:
    """Shapes per forward mode computed on the meta device from configs alone (see ``plan``)."""

    settings: dict
    forwards: list = field(default_factory=list)  # (label, ForwardRecord)
    notes: list = field(default_factory=list)

    def table(self, mode=None, model=None, layers=None, collapse=True, view: str = "ours"):
        return table(self, mode=mode, model=model, layers=layers, collapse=collapse, view=view)

    def compare(self, model=None, mode=None, sglang: bool = True) -> CompareTable:
        """The planned forwards side by side: prefill, decode, DFlash verify, DDTree verify and, with a
        draft config, the drafter's block. ``model`` keeps one model's; ``sglang`` adds SGLang's layout rows."""
        if model not in (None, "target", "draft"):
            raise ValueError(f"model={model!r} must be None, 'target' or 'draft'")
        recs = {lbl: r for lbl, r in self.forwards
                if (model is None or r.model == model) and (mode is None or r.mode == _mode(mode))}
        if not recs:
            raise ValueError(f"no planned {model or ''} forward{'' if mode is None else ' in mode ' + str(mode)}")
        return compare(recs, mode=mode, sglang=sglang)

    def sglang(self, mode=None, model=None) -> LayoutTable:
        """SGLang's layout of every planned forward (flat tokens, indptrs, masks, kept logits rows)."""
        picked = [(lbl, r) for lbl, r in self.forwards
                  if (model is None or r.model == model) and (mode is None or r.mode == _mode(mode))]
        if not picked:
            raise ValueError(f"no planned forward matches mode={mode!r}, model={model!r}")
        return sglang_view(self, picked)

    def __repr__(self) -> str:
        s = self.settings
        head = (f"ShapePlan({s['model']}, batch={s['batch']}, prompt_len={s['prompt_len']}, budget={s['budget']}, "
                f"block_size={s['block_size']}, dtype={s['dtype']}, prompt_logprobs={s['prompt_logprobs']})")
        rows, lines = [], self.sglang_lines
        for lbl, r in self.forwards:
            lg = r.outputs.get("logits", {}).get("shape")
            kv = f"kv {r.kv_before}->{r.kv_after}"
            rows.append(f"  {lbl:<37} {r.model:<6} {r.mode.value:<13} {kv:<14} "
                        f"ours [bs, n]: logits {lg}; sglang flat: {lines.get(lbl, '')}")
        return "\n".join([head] + rows + [f"  note: {n}" for n in self.notes])

    @property
    def sglang_lines(self) -> dict:
        """{label: one-line summary of SGLang's layout} (tokens, logits rows, mask)."""
        out = {}
        for lbl, r in self.forwards:
            t = sglang_view(self, [(lbl, r)])
            tok = t.row("input_ids")["shape"][0]
            lg = next((x for x in t if "logits" in x["tensor"]), None)
            masks = [x for x in t if x["tensor"].startswith("custom_mask") and x["shape"]]
            m = f", mask FULL {masks[0]['shape'][0]}" if masks else ""
            out[lbl] = f"{tok} tokens, logits rows {lg['shape'][0] if lg else '-'}{m}"
        return out

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(repr(self))}</pre>" + self.compare()._repr_html_()




# --------------------------------------------------------------------------------------------- shapes without weights
TARGET_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings")
DRAFT_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim")


def _read_config(cfg, what: str) -> dict:
    if isinstance(cfg, dict):
        return dict(cfg)
    p = Path(cfg)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"{what} config {cfg!s} is not a file or a directory with config.json")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} config {p} is not valid JSON ({e})") from None


def _require(cfg: dict, fields, what: str) -> None:
    for f in fields:
        if cfg.get(f) is None:
            raise ValueError(f"{what} config lacks the field {f!r}, needed to compute shapes")


def _draft_get(cfg: dict, name: str):
    return (cfg.get("dflash_config") or {}).get(name, cfg.get(name))


def plan(config, batch: int = 8, prompt_len: int = 512, budget: int = 64, draft_config=None,
         dtype="bfloat16", block_size: int | None = None, prompt_logprobs: bool = False) -> ShapePlan:
    """Shapes per forward mode for a model config alone, on the meta device: no weights, no compute.

    Builds Qwen3ForCausalLM (and the DFlash drafter when ``draft_config`` is given) under
    ``torch.device("meta")`` and runs the engine's own forward functions on meta tensors with a
    shape capture: EXTEND prefill [batch, prompt_len], AR DECODE [batch, 1], TARGET_VERIFY for
    DFlash (block_size tokens) and DDTree (1 + budget tokens) after the prompt, and the drafter's
    block forward on its first cycle (context = the whole prompt). Bytes are per tensor.

    Logits follow SGLang's LogitsProcessor: the prefill keeps each request's last row
    ([batch, 1, V]) unless ``prompt_logprobs`` asks for every prompt row; DECODE and
    TARGET_VERIFY keep every row. ``ShapePlan.sglang()`` lays every line out as SGLang would.
    """
    from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

    from workbench.forward import run_draft, run_target
    from workbench.loading import resolve_dtype

    for name, v in (("batch", batch), ("prompt_len", prompt_len), ("budget", budget)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive integer")
    tdt = resolve_dtype(dtype)
    tcfg = _read_config(config, "target")
    _require(tcfg, TARGET_FIELDS, "target")
    if tcfg.get("model_type", "qwen3") != "qwen3":
        raise ValueError(f"target config model_type={tcfg['model_type']!r}; plan() builds Qwen3 models only")
    dcfg = _read_config(draft_config, "draft") if draft_config is not None else None
    layer_ids = None
    if dcfg is not None:
        _require(dcfg, DRAFT_FIELDS, "draft")
        if _draft_get(dcfg, "block_size") is None:
            raise ValueError("draft config lacks the field 'block_size' (top level or in dflash_config)")
        layer_ids = _draft_get(dcfg, "target_layer_ids")
        if layer_ids is None:
            raise ValueError("draft config lacks the field 'target_layer_ids' (top level or in dflash_config)")
        if dcfg["hidden_size"] != tcfg["hidden_size"]:
            raise ValueError(f"draft hidden_size {dcfg['hidden_size']} != target hidden_size {tcfg['hidden_size']}; "
                             "the drafter shares the target's embedding and LM head")
        bad = [i for i in layer_ids if not 0 <= i < tcfg["num_hidden_layers"]]
        if bad:
            raise ValueError(f"draft target_layer_ids {bad} are outside the target's {tcfg['num_hidden_layers']} layers")
        block_size = block_size or int(_draft_get(dcfg, "block_size"))
    block_size = block_size or 16
    n_tree = 1 + budget
    need = prompt_len + max(n_tree, block_size)
    if need > tcfg["max_position_embeddings"]:
        raise ValueError(f"prompt_len + verify tokens = {need} exceeds max_position_embeddings "
                         f"{tcfg['max_position_embeddings']}")

    meta = torch.device("meta")
    keep = {k: v for k, v in tcfg.items() if not k.startswith("_")}
    tconf = Qwen3Config(**keep)
    with meta:
        target = Qwen3ForCausalLM(tconf).to(tdt).eval()
    models = {"target": target}
    if dcfg is not None:
        from dflash.model import DFlashDraftModel

        dkeep = {k: v for k, v in dcfg.items() if not k.startswith("_")}
        dconf = Qwen3Config(**dkeep)
        for k in ("dflash_config", "num_target_layers", "block_size"):
            if k in dcfg:
                setattr(dconf, k, dcfg[k])
        with meta:
            draft = DFlashDraftModel(dconf).to(tdt).eval()
        models["draft"] = draft
    cap = ShapeCapture(models)
    P, bs = prompt_len, batch
    ids = lambda n: torch.zeros(bs, n, dtype=torch.long, device=meta)  # noqa: E731  (meta: no data)
    pos = lambda a, n: torch.arange(a, a + n, device=meta)[None].expand(bs, n)  # noqa: E731
    forwards = []
    with torch.inference_mode():
        cache = DynamicCache(config=tconf)
        # SGLang's EXTEND keeps the last row per request unless prompt log-probs are asked for
        # (logits_processor.py, rule "logits last row"); the LM head then runs on those rows only.
        out = run_target(target, ids(P), pos(0, P), cache, ForwardMode.EXTEND, layer_ids, capture=cap,
                         logits_to_keep=0 if prompt_logprobs else 1)
        forwards.append(("prefill", out.record))
        context = out.features  # [bs, P, len(layer_ids) * H]: the drafter's first-cycle context

        def verify(label, n, mode):
            if cache.get_seq_length() > P:  # every scenario starts from the same prompt-only cache
                cache.crop(P - cache.get_seq_length())
            mask = torch.ones(bs, 1, n, P + n, dtype=torch.bool, device=meta) if n > 1 else None
            forwards.append((label, run_target(target, ids(n), pos(P, n), cache, mode, layer_ids, mask, cap).record))

        verify("AR decode", 1, ForwardMode.DECODE)
        verify(f"DFlash verify ({block_size} tokens)", block_size, ForwardMode.TARGET_VERIFY)
        verify(f"DDTree({budget}) verify ({n_tree} tokens)", n_tree, ForwardMode.TARGET_VERIFY)
        if dcfg is not None:
            dcache = DynamicCache(config=dconf)
            _, rec = run_draft(draft, target, ids(block_size), pos(0, P + block_size), context, dcache, cap)
            forwards.append((f"draft block (1st cycle, context {P})", rec))
    name = Path(config).stem if not isinstance(config, dict) else (tcfg.get("architectures") or ["Qwen3"])[0]
    settings = {"model": name, "batch": bs, "prompt_logprobs": prompt_logprobs,
                "prompt_len": P, "budget": budget, "block_size": block_size, "dtype": str(tdt).replace("torch.", ""),
                "target_layer_ids": layer_ids}
    notes = ["meta device: shapes and dtypes only; bytes = numel x element size per tensor",
             "'ours [bs, n]': this engine's Hugging Face layout, a 4-D bool mask [bs, 1, n, prefix + n] on verifies; "
             "'sglang flat': SGLang's layout of the same forward (tokens flattened, int32 indptrs, flat custom "
             "mask; p.sglang() for every tensor)",
             "prefill logits: " + ("every prompt row (prompt_logprobs=True)" if prompt_logprobs else
                                   "the last row per request, as SGLang's LogitsProcessor keeps in EXTEND")]
    if dcfg is None:
        notes.append(f"no draft config: no drafter forward, no drafter context; block_size={block_size} assumed")
    return ShapePlan(settings, forwards, notes)


