"""Tensor parallelism in the cost model: a forward's FLOPs and bytes split TP ways, plus the collectives.

With TP degree t (Megatron-style, as SGLang and vLLM shard a decoder):
- every matmul weight is split t ways (column-parallel q/k/v/gate/up, row-parallel o/down, experts sharded,
  the vocabulary-parallel embedding and LM head), so each GPU does 1/t of the FLOPs and reads 1/t of the
  weights;
- K/V heads are split min(t, kv_heads) ways (a GQA head is replicated once t exceeds the K/V heads); MLA's
  latent is one "head" and every GPU holds it whole; linear-attention state is split by value heads (t ways);
- each layer all-reduces the tokens' hidden states twice (after attention's o_proj, after the MLP's
  down_proj): ``tokens x hidden x bytes`` each, a ring all-reduce costing
  ``2 (t - 1) / t x bytes / bandwidth + 2 (t - 1) x latency``;
- the vocabulary-parallel LM head all-gathers the kept rows' logits once: ``(t - 1) / t x bytes / bandwidth
  + (t - 1) x latency``.
Per-GPU time = max(FLOPs / t / peak, bytes per GPU / bandwidth) + the collectives (not overlapped: a layer
waits for its all-reduce). Interconnect figures (NVLink, PCIe Gen5) are data in ``gpus.json`` with sources.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

GPUS_FILE = __import__("pathlib").Path(__file__).resolve().parent / "gpus.json"


@dataclass(frozen=True)
class Interconnect:
    """A GPU-to-GPU link as a ring all-reduce sees it: bus bandwidth (bytes/s per GPU, one direction, as
    NCCL's busbw reports it) and the latency of one ring step (seconds)."""

    name: str
    bandwidth: float
    latency: float
    source: str = ""


def interconnects() -> dict[str, Interconnect]:
    """The links shipped as data (``_interconnects`` in workbench/shapes/gpus.json), by name."""
    data = json.loads(GPUS_FILE.read_text())["_interconnects"]
    return {k: Interconnect(k, float(v["bandwidth"]), float(v["latency"]), v.get("source", ""))
            for k, v in data.items() if not k.startswith("_")}


def resolve_interconnect(link) -> Interconnect:
    """An Interconnect from a shipped name ("nvlink", "pcie5"; case ignored), an Interconnect, or a
    (bandwidth bytes/s, latency s) pair."""
    if isinstance(link, Interconnect):
        return link
    if isinstance(link, (tuple, list)):
        if len(link) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in link) \
                or not link[0] > 0:
            raise ValueError(f"interconnect={link!r}: a custom link is (bandwidth in bytes/s > 0, latency in s >= 0)")
        return Interconnect(f"custom ({link[0]:.3g} B/s, {link[1]:.3g} s)", float(link[0]), float(link[1]))
    known = interconnects()
    if isinstance(link, str) and link.lower() in known:
        return known[link.lower()]
    raise ValueError(f"unknown interconnect={link!r}; known: {', '.join(known)}; or pass (bandwidth, latency)")


def check_tp(tp) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp={tp!r} must be a positive integer (GPUs the model is split across)")
    return tp


def all_reduce_seconds(nbytes: float, tp: int, link: Interconnect) -> float:
    """Ring all-reduce of ``nbytes`` over ``tp`` GPUs: 2 (tp - 1) steps, each moving nbytes / tp."""
    if tp == 1:
        return 0.0
    return 2 * (tp - 1) / tp * nbytes / link.bandwidth + 2 * (tp - 1) * link.latency


def all_gather_seconds(nbytes: float, tp: int, link: Interconnect) -> float:
    """Ring all-gather of a tensor of ``nbytes`` in all (each GPU holds nbytes / tp): tp - 1 steps."""
    if tp == 1:
        return 0.0
    return (tp - 1) / tp * nbytes / link.bandwidth + (tp - 1) * link.latency


def kv_split(arch, tp: int) -> int:
    """How many ways the K/V cache splits at TP ``tp``: MLA's latent not at all, GQA by K/V heads (at most)."""
    att = arch.facts.attention
    if att is None or att.mla:
        return 1
    return max(1, min(tp, att.kv_heads or att.heads))


def tp_time(arch, cost: dict, tokens: int, logit_rows: int, tp: int, link, gpu, dtype_bytes: int) -> dict:
    """Per-GPU time of a forward whose whole-model ``cost`` is ``forward_cost``'s dict, split ``tp`` ways.
    ``tokens``: rows x tokens per row (what each all-reduce carries); ``logit_rows``: rows x kept logits."""
    tp = check_tp(tp)
    link = resolve_interconnect(link) if tp > 1 else None
    kv = cost["kv_bytes"]
    flops = cost["flops"] / tp
    nbytes = (cost["bytes"] - kv) / tp + kv / kv_split(arch, tp)
    compute, memory = flops / gpu.flops, nbytes / gpu.bandwidth
    hidden = tokens * arch.hidden * dtype_bytes
    reduce = 2 * len(arch.layers) * all_reduce_seconds(hidden, tp, link) if tp > 1 else 0.0
    gather = all_gather_seconds(logit_rows * arch.vocab * dtype_bytes, tp, link) if tp > 1 and logit_rows else 0.0
    return {**cost, "tp": tp, "interconnect": link.name if link else None, "flops_per_gpu": int(flops),
            "bytes_per_gpu": int(nbytes), "intensity": flops / nbytes if nbytes else math.inf,
            "compute_s": compute, "memory_s": memory, "comm_s": reduce + gather, "all_reduce_s": reduce,
            "all_gather_s": gather, "seconds": max(compute, memory) + reduce + gather,
            "bound": "compute" if compute > memory else "memory"}
