"""Tensor parallelism in the cost model: a forward's FLOPs and bytes split TP ways, plus the collectives.

With TP degree t (Megatron-style, as SGLang and vLLM shard a decoder):
- every matmul weight is split t ways (column-parallel q/k/v/gate/up, row-parallel o/down, experts sharded,
  the vocabulary-parallel embedding and LM head), so each GPU does 1/t of the FLOPs and reads 1/t of the
  weights;
- K/V heads are split min(t, kv_heads) ways (a GQA head is replicated once t exceeds the K/V heads); MLA's
  latent is one "head" and every GPU holds it whole; linear-attention state is split by value heads (t ways);
- a degree no engine can shard is refused (``check_split``): attention heads (and linear attention's key and
  value heads) must split t ways, K/V heads too or t must be a multiple of them (replication, as vLLM and
  SGLang do);
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


class TensorParallelError(ValueError):
    """A TP degree or interconnect the cost model cannot use: one line naming it and what would do."""


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
            raise TensorParallelError(f"interconnect={link!r}: a custom link is (bandwidth in bytes/s > 0, latency in s >= 0)")
        return Interconnect(f"custom ({link[0]:.3g} B/s, {link[1]:.3g} s)", float(link[0]), float(link[1]))
    known = interconnects()
    if isinstance(link, str) and link.lower() in known:
        return known[link.lower()]
    raise TensorParallelError(f"unknown interconnect={link!r}; known: {', '.join(known)}; or pass (bandwidth, latency)")


def check_tp(tp) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise TensorParallelError(f"tp={tp!r} must be a positive integer (GPUs the model is split across)")
    return tp


def split_problem(arch, tp: int) -> str | None:
    """Why ``tp`` GPUs cannot shard ``arch`` the way vLLM and SGLang do, in words; None when they can.

    Attention heads (query heads; MLA's too) split evenly across the GPUs, as do a GatedDeltaNet layer's key
    and value heads. K/V heads split evenly too, or, once ``tp`` exceeds them, are replicated: both engines
    then give each GPU one K/V head, which needs ``tp`` to be a multiple of the K/V heads. MLA's latent is
    one cache every GPU holds whole, so it adds no rule."""
    att, lin = arch.facts.attention, arch.facts.linear
    if att is not None and att.heads % tp:
        return f"its {att.heads} attention heads do not split {tp} ways"
    if att is not None and not att.mla and att.kv_heads:
        kv = att.kv_heads
        if kv % tp and tp % kv:
            return (f"its {kv} K/V heads neither split {tp} ways nor replicate evenly (vLLM and SGLang replicate "
                    f"K/V heads when tp exceeds them, which needs tp to be a multiple of {kv})")
    if lin is not None:
        for n, what in ((lin.key_heads, "linear-attention key"), (lin.value_heads, "linear-attention value")):
            if n % tp:
                return f"its {n} {what} heads do not split {tp} ways"
    return None


def valid_tp(arch) -> list[int]:
    """Every TP degree that can shard ``arch`` (``split_problem`` finds nothing): at most its attention heads."""
    att = arch.facts.attention
    top = att.heads if att is not None else arch.facts.linear.value_heads
    return [t for t in range(1, top + 1) if split_problem(arch, t) is None]


def check_split(arch, tp: int) -> int:
    """``tp`` when it can shard ``arch``; else one line naming the model, the reason and the valid degrees
    (costing a split no engine can make would give a number for a deployment that cannot exist)."""
    why = split_problem(arch, check_tp(tp))
    if why is not None:
        raise TensorParallelError(f"tp={tp} cannot shard {arch.name}: {why}; valid tp for it: "
                                  f"{', '.join(map(str, valid_tp(arch)))}")
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
