"""Which tensor each engine hands a DFlash drafter as the feature of target layer k, on a real forward.

Three capture rules, each computed on the loaded target with transformers (no production engine runs):
- ours (and z-lab's dflash, and our training): ``hidden_states[k + 1]``, whose last entry (k = N - 1) is
  the final-normed output;
- vLLM: the residual stream after layer k, captured inside the layer loop (``_maybe_add_hidden_state(...,
  idx + 1, ...)`` in its model files), so before the final norm for every k;
- SGLang: the residual stream "before layer k + 1" (``set_dflash_layers_to_capture``: ``val + 1``), so
  nothing for k = N - 1 (there is no layer N).
Where the rule is read from each engine's installed source, the table says whether the line is there.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from workbench.models.drafter_reference import rel_diff, rms

# (engine, module file under its package, the line that states its capture rule)
SOURCES = {
    "vllm": ("model_executor/models/qwen2.py", "aux_hidden_states, idx + 1, hidden_states, residual"),
    "sglang": ("srt/models/qwen3.py", "self.model.layers_to_capture = [val + 1 for val in layer_ids]"),
}


def rule_in_source(engine: str) -> str:
    """"found", "changed" (the file is there, the line is not: read it again) or "not installed"."""
    spec = importlib.util.find_spec(engine)
    if spec is None or spec.origin is None:
        return "not installed"
    rel, line = SOURCES[engine]
    path = Path(spec.origin).parent / rel
    if not path.is_file():
        return "changed"
    return "found" if line in path.read_text(errors="replace") else "changed"


@torch.inference_mode()
def feature_conventions(models, prompt_ids: list[int], same: float = 1e-5) -> list[dict]:
    """Per target layer id of the drafter: the three engines' features for ``prompt_ids`` and whether
    each production rule gives our tensor (relative difference at most ``same``)."""
    target = models.target
    layers = target.model.layers if hasattr(target, "model") else target.get_decoder().layers
    n = len(layers)
    outs, ins = {}, {}
    hooks = []
    for k in models.target_layer_ids:
        hooks.append(layers[k].register_forward_hook(
            lambda mod, a, out, k=k: outs.__setitem__(k, out[0] if isinstance(out, tuple) else out)))
        if k + 1 < n:
            hooks.append(layers[k + 1].register_forward_pre_hook(
                lambda mod, a, kw, k=k: ins.__setitem__(k, (a[0] if a else kw["hidden_states"])), with_kwargs=True))
    try:
        ids = torch.tensor([prompt_ids], device=target.get_input_embeddings().weight.device)
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
    finally:
        for h in hooks:
            h.remove()
    rows = []
    for k in models.target_layer_ids:
        ours = hs[k + 1]
        row = {"layer": k, "last_layer": k == n - 1, "ours_rms": rms(ours)}
        for engine, got in (("vllm", outs.get(k)), ("sglang", ins.get(k))):
            if got is None:
                row[engine] = {"captured": False, "same": False}
            else:
                d = rel_diff(got, ours)
                row[engine] = {"captured": True, "rel_diff": d, "rms": rms(got), "same": d <= same}
        rows.append(row)
    return rows


def conventions_report(models, prompt_ids: list[int]) -> dict:
    """The table's rows, and whether each engine's rule is still what its installed source says."""
    return {"rows": feature_conventions(models, prompt_ids),
            "source": {e: rule_in_source(e) for e in SOURCES}, "prompt_tokens": len(prompt_ids)}


def conventions_table(rep: dict) -> str:
    """The report as text: one row per feature layer."""
    src = rep["source"]
    lines = [f"feature of target layer k, as each engine hands it to the drafter ({rep['prompt_tokens']} prompt tokens; "
             f"rules: vLLM {src['vllm']} in its source, SGLang {src['sglang']})",
             f"{'layer':>5}  {'ours: hidden_states[k+1]':<26} {'vLLM: after layer k, pre-norm':<32} "
             f"{'SGLang: before layer k+1':<26}"]

    def cell(c: dict) -> str:
        if not c["captured"]:
            return "not captured"
        return f"{'same' if c['same'] else 'DIFFERS'} (rel. diff {c['rel_diff']:.1e})"

    for r in rep["rows"]:
        lines.append(f"{r['layer']:>5}  {'RMS ' + format(r['ours_rms'], '.3g') + (' (final norm)' if r['last_layer'] else ''):<26} "
                     f"{cell(r['vllm']):<32} {cell(r['sglang']):<26}")
    return "\n".join(lines)
