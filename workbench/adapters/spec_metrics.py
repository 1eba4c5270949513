"""vLLM's speculative-decoding counters, as its server's ``/metrics`` (Prometheus text) and its in-process
``LLM.get_metrics()`` give them: the one reader both the served client (``served.py``) and the in-process
engine (``vllm_engine.py``) use.
"""
from __future__ import annotations

import re

VLLM_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

class ServedError(RuntimeError):
    """A URL that is not a server, a server without speculative counters, or a refused request."""


# ---------------------------------------------------------------------------------------------- counters
def parse_prometheus(text: str) -> dict:
    """{metric name (``_total`` dropped): summed value} and {name: {position: value}} for per-position ones."""
    sums: dict = {}
    per_pos: dict = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        try:
            v = float(value)
        except ValueError:
            continue
        name = name[:-6] if name.endswith("_total") else name
        pos = re.search(r'position="(\d+)"', labels)
        if name == PER_POS and pos:
            per_pos.setdefault(name, {})
            per_pos[name][int(pos.group(1))] = per_pos[name].get(int(pos.group(1)), 0.0) + v
        else:
            sums[name] = sums.get(name, 0.0) + v
    return {"sums": sums, "per_pos": per_pos.get(PER_POS, {})}


def counters(parsed: dict) -> dict:
    """{"drafts", "draft_tokens", "accepted", "per_pos": [..]} from parsed metrics; ServedError without them."""
    sums = parsed["sums"]
    missing = [v for v in VLLM_COUNTERS.values() if v not in sums]
    if missing:
        raise ServedError(f"the server's /metrics has no speculative counters ({', '.join(missing)} missing): "
                          "is speculative decoding on (vllm serve --speculative-config ...)?")
    out = {k: sums[v] for k, v in VLLM_COUNTERS.items()}
    pp = parsed["per_pos"]
    out["per_pos"] = [pp[i] for i in sorted(pp)]
    return out


def spec_counters_from_metrics(metrics) -> dict:
    """The same counters from ``LLM.get_metrics()`` (vLLM's in-process metric objects)."""
    sums: dict = {}
    per_pos: list = []
    for m in metrics:
        name = getattr(m, "name", "")
        if name == PER_POS:
            per_pos = [float(v) for v in getattr(m, "values", [])]
        elif name in VLLM_COUNTERS.values():
            sums[name] = sums.get(name, 0.0) + float(getattr(m, "value", 0.0))
    return counters({"sums": sums, "per_pos": dict(enumerate(per_pos))})


def delta(before: dict, after: dict) -> dict:
    d = {k: after[k] - before[k] for k in VLLM_COUNTERS}
    n = max(len(before["per_pos"]), len(after["per_pos"]))
    b = before["per_pos"] + [0.0] * (n - len(before["per_pos"]))
    a = after["per_pos"] + [0.0] * (n - len(after["per_pos"]))
    d["per_pos"] = [x - y for x, y in zip(a, b)]
    return d
