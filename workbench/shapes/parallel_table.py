"""Does a tree change the parallelism calculus? The verify forward at 1, 17, 33 and 65 nodes per request,
per tensor-parallel degree and interconnect, for the shipped targets, from the cost model.

    t = wb.shapes.parallelism_table()          # kimi-k2, qwen3-coder-30b-a3b, qwen3-8b at TP1/4/8, NVLink and PCIe
    print(t); t.headline()

A tree's extra nodes add FLOPs and all-reduce bytes but no weight bytes: while a forward is memory-bound
they are nearly free, and TP divides the weights per GPU by TP while the all-reduces (two per layer) add a
floor of latency and a term that grows with the tokens. The table says, per system, how much dearer the
65-node verify is than the 1-node one at each TP degree.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

from workbench.shapes import parallel
from workbench.shapes.cost import cost, resolve_gpu

CONFIGS = ("kimi-k2", "qwen3-coder-30b-a3b", "qwen3-8b")
SYSTEMS = (("H200", "nvlink"), ("RTX PRO 6000 Blackwell", "pcie5"))
NODES = (1, 17, 33, 65)
TPS = (1, 4, 8)


@dataclass
class ParallelTable:
    rows: list  # {config, gpu, interconnect, tp, nodes: {n: seconds}, ratio: {n: x over 1 node}, comm_share, weights_gb_per_gpu, fits}
    settings: dict
    notes: list = field(default_factory=list)

    def headline(self) -> list[str]:
        """One line per (config, system): the 65-node verify's cost over the 1-node one at each TP."""
        top = max(self.settings["nodes"])
        out = []
        for gpu, link in self.settings["systems"]:
            for cfg in self.settings["configs"]:
                same = [x for x in self.rows if x["config"] == cfg and x["system"] == [gpu, link]]
                parts = ", ".join(f"TP{x['tp']} {x['ratio'][top]:.2f}x" for x in same)
                out.append(f"{cfg} on {same[0]['gpu']} ({link}): verify({top}) / verify(1) = {parts}")
        return out

    def as_dict(self) -> dict:
        return {"settings": self.settings, "rows": self.rows, "headline": self.headline(), "notes": self.notes}

    def __repr__(self) -> str:
        s = self.settings
        ns = s["nodes"]
        lines = [f"verify time per GPU (ms) at nodes {', '.join(map(str, ns))} per request; batch {s['batch']}, "
                 f"prompt {s['prompt_len']}, {s['dtype']}",
                 f"  {'config':<22}{'gpu':<24}{'link':<8}{'TP':>3}" + "".join(f"{f'N={n}':>9}" for n in ns)
                 + f"{'N=' + str(ns[-1]) + '/1':>9}{'comm':>7}{'GB/GPU':>8}"]
        for r in self.rows:
            lines.append(f"  {r['config']:<22}{r['gpu']:<24}{r['interconnect'] or '-':<8}{r['tp']:>3}"
                         + "".join(f"{r['nodes'][n] * 1e3:>9.3f}" for n in ns)
                         + f"{r['ratio'][ns[-1]]:>8.2f}x{r['comm_share']:>6.0%}{r['weights_gb_per_gpu']:>7.0f}"
                         + ("" if r["fits"] else " (does not fit)"))
        return "\n".join(lines + [f"  {h}" for h in self.headline()] + [f"  note: {n}" for n in self.notes])

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(repr(self))}</pre>"


def parallelism_table(configs=CONFIGS, tps=TPS, systems=SYSTEMS, nodes=NODES, batch: int = 1,
                      prompt_len: int = 2048, dtype: str = "bfloat16") -> ParallelTable:
    """Verify seconds per GPU at each of ``nodes`` (root included) for every config x system x TP degree;
    ``systems``: (gpu, interconnect) pairs. ``comm_share``: the collectives' part of the largest verify.
    ``fits``: weights / TP + the K/V of ``batch`` x (prompt + nodes) within the GPU's memory."""
    import json

    nodes = sorted(set(nodes))
    if not nodes or nodes[0] < 1:
        raise ValueError(f"nodes={nodes!r} must be integers >= 1 (the root counts)")
    for tp in tps:
        parallel.check_tp(tp)
    mem = {k: v.get("memory_gb") for k, v in json.loads(parallel.GPUS_FILE.read_text()).items()
           if not k.startswith("_")}
    rows = []
    for cfg in configs:
        for gpu, link in systems:
            g = resolve_gpu(gpu)
            for tp in tps:
                t = cost(cfg, gpu=g, batch=batch, prompt_len=prompt_len, budgets=[n - 1 for n in nodes],
                         dtype=dtype, tp=tp, interconnect=link)
                fw = {n: t.forward("TARGET_VERIFY", n - 1) for n in nodes}
                sec = {n: fw[n]["seconds"] for n in nodes}
                top = fw[nodes[-1]]
                kv = top["kv_bytes"] / parallel.kv_split(t.target, tp)
                w = t.target.params * t.settings["dtype_bytes"] / tp  # all weights, not only those touched
                cap = mem.get(g.name)
                rows.append({"config": cfg, "system": [gpu, link], "gpu": g.name, "interconnect": link if tp > 1 else None, "tp": tp,
                             "nodes": sec, "ratio": {n: sec[n] / sec[nodes[0]] for n in nodes},
                             "comm_share": top["comm_s"] / top["seconds"], "weights_gb_per_gpu": w / 1e9,
                             "fits": cap is None or (w + kv) <= cap * 1e9})
    notes = ["per-GPU roofline of 1/TP of the FLOPs and weights (K/V split by K/V heads, MLA's latent whole) + two "
             "ring all-reduces of the hidden states per layer + the logits' all-gather (workbench.shapes.parallel); "
             "no launch overhead, no per-step machinery: add the measured overhead per cycle with cost(overhead_s=)",
             f"weights in {dtype} (Kimi-K2 ships FP8 weights: its bytes would halve); 'does not fit': weights/TP + K/V "
             "exceed one GPU's memory, so that TP degree cannot serve it"]
    settings = {"configs": list(configs), "tps": list(tps), "systems": [list(s) for s in systems], "nodes": nodes,
                "batch": batch, "prompt_len": prompt_len, "dtype": dtype}
    return ParallelTable(rows, settings, notes)
