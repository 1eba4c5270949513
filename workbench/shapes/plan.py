"""Shapes per forward mode from configs alone, on the meta device, with SGLang's layout of each line."""
from __future__ import annotations

import copy
import html
from dataclasses import dataclass, field

import torch

from workbench.shapes.hooks import TARGET_MODULES, ShapeCapture
from workbench.records.forward import ForwardMode
from workbench.shapes import families
from workbench.shapes.rows import CompareTable, LayoutTable, fmt_bytes
from workbench.shapes.tables import compare, forward_mode, sglang_view, table

CONFIGS = families.CONFIGS  # the shipped configs by name (wb.shapes.CONFIGS)

@dataclass
class ShapePlan:
    """Shapes per forward mode computed on the meta device from configs alone (see ``plan``)."""

    settings: dict
    forwards: list = field(default_factory=list)  # (label, ForwardRecord)
    notes: list = field(default_factory=list)
    facts: families.ModelFacts | None = None  # the target's family facts (params, experts, state widths)
    states: dict = field(default_factory=dict)  # label -> [StateSpec] held after that target forward
    tokens: dict = field(default_factory=dict)  # label -> tokens in that forward (SGLang's flat count)

    @property
    def experts(self) -> dict:
        """{label: routed experts one MoE layer runs in that target forward} (families.experts_touched)."""
        if self.facts is None or not self.facts.experts:
            return {}
        return {lbl: families.experts_touched(self.facts, n) for lbl, n in self.tokens.items()}

    def state_bytes(self, label: str) -> dict:
        """{state kind: bytes} after the target forward ``label`` (per_token, per_request, scratch_per_node)."""
        if label not in self.states:
            raise KeyError(f"no planned target forward {label!r}; planned: {', '.join(self.states)}")
        out: dict = {}
        for spec in self.states[label]:
            out[spec.kind] = out.get(spec.kind, 0) + spec.bytes
        return out

    def table(self, mode=None, model=None, layers=None, collapse=True, view: str = "ours"):
        return table(self, mode=mode, model=model, layers=layers, collapse=collapse, view=view)

    def compare(self, model=None, mode=None, sglang: bool = True) -> CompareTable:
        """The planned forwards side by side: prefill, decode, DFlash verify, DDTree verify and, with a
        draft config, the drafter's block. ``model`` keeps one model's; ``sglang`` adds SGLang's layout rows."""
        if model not in (None, "target", "draft"):
            raise ValueError(f"model={model!r} must be None, 'target' or 'draft'")
        recs = {lbl: r for lbl, r in self.forwards
                if (model is None or r.model == model) and (mode is None or r.mode == forward_mode(mode))}
        if not recs:
            raise ValueError(f"no planned {model or ''} forward{'' if mode is None else ' in mode ' + str(mode)}")
        cmp = compare(recs, mode=mode, sglang=sglang)
        have_kv = any(r["module"] == "(kv cache)" for r in cmp)
        for spec_name in dict.fromkeys(sp.name for lbl in recs for sp in self.states.get(lbl, ())):
            row = {"module": "(state)", "layers": "", "io": "state", "tensor": spec_name}
            for lbl in cmp.labels:
                sp = next((x for x in self.states.get(lbl, ()) if x.name == spec_name), None)
                if sp is not None and not (have_kv and spec_name == "keys + values"):
                    row["layers"] = f"x{sp.layers}"
                    row[lbl] = {"shape": [sp.layers, *sp.shape], "dtype": sp.dtype, "bytes": sp.bytes}
                else:
                    row[lbl] = None
            if any(row[lbl] for lbl in cmp.labels):
                cmp.append(row)
        return cmp

    def sglang(self, mode=None, model=None) -> LayoutTable:
        """SGLang's layout of every planned forward (flat tokens, indptrs, masks, kept logits rows)."""
        picked = [(lbl, r) for lbl, r in self.forwards
                  if (model is None or r.model == model) and (mode is None or r.mode == forward_mode(mode))]
        if not picked:
            raise ValueError(f"no planned forward matches mode={mode!r}, model={model!r}")
        rows = sglang_view(self, picked)
        if self.facts is None:
            return rows
        from workbench.shapes.sglang_layout import state_rows

        out = LayoutTable()
        out.title = rows.title
        for lbl, r in picked:  # each forward's tensors, then the states SGLang holds for it
            fwd = f"{lbl}: {r.model} {r.mode.value}"
            out += [x for x in rows if x["forward"] == fwd]
            if r.model == "target":
                out += [dict(x, forward=fwd) for x in state_rows(
                    self.facts, self.settings["batch"], r.kv_after, self.tokens[lbl],
                    nodes=r.kv_after - r.kv_before if r.mode == ForwardMode.TARGET_VERIFY else 0,
                    dtype=self.settings["dtype"])]
        return out

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
        return "\n".join([head] + rows + self._family_lines() + [f"  note: {n}" for n in self.notes])

    def _family_lines(self) -> list[str]:
        f = self.facts
        if f is None:
            return []
        dt = self.settings["dtype"]
        out = [f"  {f.model_type} ({f.family}): {f.layers} layers ({f.attention_layers} attention"
               + (f", {f.linear_layers} linear" if f.linear else "") + f"), params {f.params['total'] / 1e9:.2f}B, "
               f"active per token {f.active_params / 1e9:.2f}B; cache {fmt_bytes(families.kv_bytes_per_token(f, dt))}"
               f" per token ({' + '.join(f'{n} {w}' for n, w in f.kv_parts)} per attention layer)"]
        for lbl, e in self.experts.items():
            out.append(f"  experts {lbl}: {e['per_token']} of {f.experts} per token (+{e['shared']} shared), "
                       f"{e['max']} at most in the batch, {e['uniform']:.1f} if routing were uniform")
        if f.linear is not None:
            P = self.settings["prompt_len"]
            cross = families.crossover_budget(f, P, dt)
            out.append(f"  linear attention per request: {fmt_bytes(families.linear_state_bytes_per_request(f))} "
                       f"(conv {list(f.linear.conv_shape)} {families.SGLANG_CONV_DTYPE}, state "
                       f"{list(f.linear.state_shape)} {f.ssm_dtype}, x{f.linear_layers}); per verified node "
                       f"{fmt_bytes(families.per_node_state_bytes(f))}, prompt KV "
                       f"{fmt_bytes(P * families.kv_bytes_per_token(f, dt))}: per-node states outweigh it from "
                       f"budget {cross}")
        return out

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
# Per family, module names hooked beyond the default capture (capture.TARGET_MODULES): the MoE router
# (its outputs: router logits [T, E], top-k weights and expert ids [T, k]), MLA's projections (the latent
# c_kv + k_pe is kv_a_proj_with_mqa's output) and the linear-attention layers.
FAMILY_MODULES = {
    "dense": (),
    "moe": (r"model\.layers\.\d+\.mlp\.gate",),
    "mla": (r"model\.layers\.\d+\.mlp\.gate",
            r"model\.layers\.\d+\.self_attn\.(q_a_proj|q_b_proj|q_proj|kv_a_proj_with_mqa|kv_b_proj)"),
    "hybrid": (r"model\.layers\.\d+\.mlp\.gate",
               r"model\.layers\.\d+\.linear_attn(\.(in_proj_qkvz|in_proj_ba|in_proj_qkv|in_proj_z|conv1d))?"),
}


def _meta_model(tcfg: dict, dtype):
    """(transformers config, causal LM built on the meta device) for a text config of a known family."""
    import transformers

    row = families.FAMILY_OF_MODEL_TYPE[tcfg["model_type"]]
    config_cls, model_cls = row.config_class, row.model_class
    keep = {k: v for k, v in tcfg.items() if not k.startswith("_") and k != "model_type"}
    conf = getattr(transformers, config_cls)(**keep)
    with torch.device("meta"):
        return conf, getattr(transformers, model_cls)(conf).to(dtype).eval()


def plan(config, batch: int = 8, prompt_len: int = 512, budget: int = 64, draft_config=None,
         dtype="bfloat16", block_size: int | None = None, prompt_logprobs: bool = False) -> ShapePlan:
    """See ``_plan``. transformers' notes that a kernel falls back to its PyTorch reference (Qwen3-Next's
    GatedDeltaNet without causal_conv1d / flash-linear-attention) are about speed, and nothing runs on the
    meta device: they are filtered for the plan's length."""
    from workbench.models.run import no_kernel_notes

    with no_kernel_notes():
        return _plan(config, batch, prompt_len, budget, draft_config, dtype, block_size, prompt_logprobs)


def _plan(config, batch: int = 8, prompt_len: int = 512, budget: int = 64, draft_config=None,
          dtype="bfloat16", block_size: int | None = None, prompt_logprobs: bool = False) -> ShapePlan:
    """Shapes per forward mode for a model config alone, on the meta device: no weights, no compute.

    Builds the target's transformers model (Qwen3, Llama, Qwen3-MoE, DeepSeek-V3 / Kimi-K2, Qwen3-Next,
    Qwen3.5 / 3.6 from their nested ``text_config``) and, with ``draft_config``, the DFlash drafter under
    ``torch.device("meta")``, and runs the engine's own forward functions on meta tensors with a shape
    capture: EXTEND prefill [batch, prompt_len], AR DECODE [batch, 1], TARGET_VERIFY for DFlash
    (block_size tokens) and DDTree (1 + budget tokens) after the prompt, and the drafter's block forward
    on its first cycle (context = the whole prompt). Bytes are per tensor. ``config`` / ``draft_config``:
    a dict, a path or a shipped config's name, read as ``cost()`` reads them (``families.load_config``).

    Logits follow SGLang's LogitsProcessor: the prefill keeps each request's last row
    ([batch, 1, V]) unless ``prompt_logprobs`` asks for every prompt row; DECODE and
    TARGET_VERIFY keep every row. ``ShapePlan.sglang()`` lays every line out as SGLang would, with its
    KV / MLA latent / MambaPool tensors and MoE routing tensors; ``ShapePlan.states`` has the states each
    target forward leaves (workbench.shapes.families.state_specs), ``ShapePlan.experts`` the experts touched.
    """
    from workbench.engine.loading import resolve_dtype

    for name, v in (("batch", batch), ("prompt_len", prompt_len), ("budget", budget)):
        families.integer(v, name)
    if block_size is not None:  # None: the drafter's, else 16; never a silent replacement of a bad one
        families.integer(block_size, "block_size", least=2)
    tdt = resolve_dtype(dtype)
    raw, tcfg, facts, dcfg, dfacts = _configs(config, draft_config)
    layer_ids = list(dfacts.draft.target_layer_ids) if dfacts else None
    if block_size is None:
        block_size = dfacts.draft.block_size if dfacts else 16
    need = prompt_len + max(1 + budget, block_size)
    if need > tcfg["max_position_embeddings"]:
        raise ValueError(f"prompt_len + verify tokens = {need} exceeds max_position_embeddings "
                         f"{tcfg['max_position_embeddings']}")
    sdt = str(tdt).replace("torch.", "")
    run = _MetaRun(facts, batch, prompt_len, sdt, layer_ids)
    run.forwards_of(tcfg, dcfg, tdt, budget, block_size, prompt_logprobs)
    settings = {"model": families.config_name(config, raw), "batch": batch, "prompt_logprobs": prompt_logprobs,
                "prompt_len": prompt_len, "budget": budget, "block_size": block_size, "dtype": sdt,
                "target_layer_ids": layer_ids, "model_type": facts.model_type, "family": facts.family}
    notes = _plan_notes(facts, raw, prompt_logprobs)
    if dcfg is None:
        notes.append(f"no draft config: no drafter forward, no drafter context; block_size={block_size} assumed")
    return ShapePlan(settings, run.forwards, notes, facts, run.states, run.tokens)


def _configs(config, draft_config) -> tuple:
    """(target's raw config, its text config, its facts, the drafter's config, its facts), the pair checked:
    unknown families and missing fields are one line naming them, as is a drafter given as the target or one
    that does not fit it."""
    raw = families.load_config(config, "target")
    tcfg = families.text_config(raw)
    facts = families.facts(raw)
    dcfg = families.load_config(draft_config, "draft") if draft_config is not None else None
    dfacts = families.facts(dcfg, "draft") if dcfg is not None else None
    families.check_pair(facts, dfacts)
    return raw, tcfg, facts, dcfg, dfacts


def _meta_draft(dcfg: dict, dtype):
    """(its Qwen3Config, the DFlash drafter built on the meta device) for a draft config."""
    from transformers import Qwen3Config
    from dflash.model import DFlashDraftModel

    dkeep = {k: v for k, v in dcfg.items() if not k.startswith("_")}
    dconf = Qwen3Config(**dkeep)
    for k in ("dflash_config", "num_target_layers", "block_size"):
        if k in dcfg:
            setattr(dconf, k, dcfg[k])
    with torch.device("meta"):
        return dconf, DFlashDraftModel(dconf).to(dtype).eval()


class _MetaRun:
    """The planned forwards of one batch on the meta device, recorded by a shape capture: each forward's
    record, its tokens (SGLang's flat count) and the states the target holds after it."""

    def __init__(self, facts, batch: int, prompt_len: int, dtype: str, layer_ids):
        self.facts, self.bs, self.P, self.dtype, self.layer_ids = facts, batch, prompt_len, dtype, layer_ids
        self.forwards, self.tokens, self.states = [], {}, {}

    def ids(self, n: int) -> torch.Tensor:  # [bs, n] on the meta device: no data
        return torch.zeros(self.bs, n, dtype=torch.long, device="meta")

    def pos(self, start: int, n: int) -> torch.Tensor:  # [bs, n]
        return torch.arange(start, start + n, device="meta")[None].expand(self.bs, n)

    def record(self, label: str, out, n: int, nodes: int = 0) -> None:
        self.forwards.append((label, out.record))
        self.tokens[label] = self.bs * n
        self.states[label] = families.state_specs(self.facts, self.bs, out.record.kv_after, nodes, self.dtype)

    def forwards_of(self, tcfg: dict, dcfg, tdt, budget: int, block_size: int, prompt_logprobs: bool) -> None:
        """EXTEND prefill, AR DECODE, the DFlash and DDTree verifies after the prompt, and with a draft config
        the drafter's first block."""
        from transformers import DynamicCache

        from workbench.models.run import run_draft, run_target

        tconf, target = _meta_model(tcfg, tdt)
        models = {"target": target}
        if dcfg is not None:
            dconf, models["draft"] = _meta_draft(dcfg, tdt)
        cap = ShapeCapture(models, target_modules=TARGET_MODULES + FAMILY_MODULES[self.facts.family])
        P, n_tree = self.P, 1 + budget
        with torch.inference_mode():
            cache = DynamicCache(config=tconf)
            # SGLang's EXTEND keeps the last row per request unless prompt log-probs are asked for
            # (logits_processor.py, rule "logits last row"); the LM head then runs on those rows only.
            out = run_target(target, self.ids(P), self.pos(0, P), cache, ForwardMode.EXTEND, self.layer_ids,
                             capture=cap, logits_to_keep=0 if prompt_logprobs else 1)
            self.record("prefill", out, P)
            context = out.features  # [bs, P, len(layer_ids) * H]: the drafter's first-cycle context
            # Every scenario starts from the prompt-only state: a copy of it (a hybrid's recurrent state cannot
            # be cropped back; on the meta device the copy costs nothing).
            prompt_state = copy.deepcopy(cache)
            for label, n, mode in (("AR decode", 1, ForwardMode.DECODE),
                                   (f"DFlash verify ({block_size} tokens)", block_size, ForwardMode.TARGET_VERIFY),
                                   (f"DDTree({budget}) verify ({n_tree} tokens)", n_tree, ForwardMode.TARGET_VERIFY)):
                mask = torch.ones(self.bs, 1, n, P + n, dtype=torch.bool, device="meta") if n > 1 else None
                out = run_target(target, self.ids(n), self.pos(P, n), copy.deepcopy(prompt_state), mode,
                                 self.layer_ids, mask, cap)
                self.record(label, out, n, nodes=n if mode == ForwardMode.TARGET_VERIFY else 0)
            if dcfg is not None:
                _, rec = run_draft(models["draft"], target, self.ids(block_size), self.pos(0, P + block_size),
                                   context, DynamicCache(config=dconf), cap)
                self.forwards.append((f"draft block (1st cycle, context {P})", rec))


def _plan_notes(facts: families.ModelFacts, raw: dict, prompt_logprobs: bool) -> list[str]:
    notes = ["meta device: shapes and dtypes only; bytes = numel x element size per tensor",
             "'ours [bs, n]': this engine's Hugging Face layout, a 4-D bool mask [bs, 1, n, prefix + n] on verifies; "
             "'sglang flat': SGLang's layout of the same forward (tokens flattened, int32 indptrs, flat custom "
             "mask; p.sglang() for every tensor)",
             "prefill logits: " + ("every prompt row (prompt_logprobs=True)" if prompt_logprobs else
                                   "the last row per request, as SGLang's LogitsProcessor keeps in EXTEND")]
    return notes + _family_notes(facts, raw)


def _family_notes(f: families.ModelFacts, raw: dict) -> list[str]:
    out = []
    if "text_config" in raw:
        out.append(f"nested checkpoint ({raw.get('model_type')}): the text model's text_config is planned")
    if f.family == "mla":
        out.append("MLA: no head_dim; the cache is the latent c_kv (kv_lora_rank) + k_pe (qk_rope_head_dim) per "
                   "token per layer, as SGLang's MLATokenToKVPool holds it")
    if f.experts:
        out.append("MoE: router logits [tokens, experts] and top-k ids / weights [tokens, k] per MoE layer "
                   f"({len(f.moe_layers)} of {f.layers} layers); p.experts has the experts touched per forward")
    if f.linear is not None:
        out.append("hybrid: transformers runs linear-attention layers as a chain, so these shapes are a chain "
                   "verify's; SGLang's tree verify keeps a conv window and recurrent state per node "
                   "(MambaPool.SpeculativeState, rows 'per-node ...' in p.states and p.sglang())")
    return out
