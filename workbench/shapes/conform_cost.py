"""What checking one cycle of a dump costs (``wb.conform``), from configs alone: the checker's own forwards,
priced by the roofline cost model (``workbench.shapes.cost``), so a check can be sized before it runs.

    from workbench.shapes.conform_cost import conform_cycle_cost
    c = conform_cycle_cost("qwen3-8b", "qwen3-8b-dflash-b16", gpu="H200", context=4096, nodes=17, depth=15)
    c["seconds"], c["rows"]          # roofline seconds per cycle; one row per forward

The checker (``workbench.conform.check``) replays every cycle from scratch on the request's committed context
(``context`` tokens before the root); it keeps no cache from one cycle to the next, so a cycle's cost grows
with its context. Per cycle it runs, whatever the engine under test did:

- the path oracle (``check.chain_logits``): the context prefilled once through the target (transformers'
  forward, logits on every row), then one batch whose row i is node i's root-to-node path, right-padded to
  the deepest node (``nodes`` rows x ``depth + 1`` tokens after the cached context, the LM head on one
  position per row). A hybrid target's cache (linear-attention state) cannot be repeated over rows, so each
  row runs its whole context instead: ``nodes`` x (``context`` + ``depth`` + 1) tokens, no cache;
- the reference drafter (``models.drafter_reference.Reference.draft_logits``): the target over the context
  for its features (transformers' forward with hidden states, logits on every row), then the drafter's block
  (``block_size`` tokens) over those ``context`` feature rows, no cache.

A cycle some contract breaks adds the acceptance it cost: the target's greedy continuation (the context
prefilled, then ``depth`` one-token steps), reported apart as ``broken_extra``. Roofline seconds are a floor:
a real kernel reaches a fraction of either peak, and launch overhead is not modelled.
"""
from __future__ import annotations

from workbench.shapes import families
from workbench.shapes.cost import arch, forward_cost, resolve_gpu


def conform_cycle_cost(target_config, draft_config=None, gpu="H200", context: int = 1024, nodes: int = 17,
                       depth: int = 15, dtype: str = "bfloat16", leaves: int | None = None) -> dict:
    """The checker's forwards for one cycle at ``context`` committed tokens before the root, a tree of ``nodes``
    nodes (the root included) whose deepest node is at ``depth`` and which has ``leaves`` leaves (default
    nodes - depth, the most such a tree has): {"rows": [{"forward", "flops", "bytes", "seconds"}, ...], "flops",
    "bytes", "seconds", "broken_extra": {...}}. Without ``draft_config`` the reference drafter's block forward is
    left out (its target-features forward stays: it is the target's)."""
    for name, v, least in (("context", context, 1), ("nodes", nodes, 1), ("depth", depth, 0)):
        families.integer(v, name, least=least)
    if depth >= nodes:
        raise ValueError(f"depth={depth} with nodes={nodes}: a tree's deepest node is at most nodes - 1 deep")
    leaves = nodes - depth if leaves is None else leaves
    families.integer(leaves, "leaves", least=1)
    if leaves > nodes - depth:
        raise ValueError(f"leaves={leaves} with nodes={nodes} and depth={depth}: such a tree has at most "
                         f"{nodes - depth} leaves (its deepest path holds depth + 1 nodes)")
    e = families.dtype_bytes(dtype)
    g = resolve_gpu(gpu)
    t = arch(target_config, "target")
    d = arch(draft_config, "draft") if draft_config is not None else None
    if d is not None:
        families.check_pair(t.facts, d.facts)
    hybrid = any(layer.kind == "linear" for layer in t.layers)
    L = context
    # the path oracle: a row per leaf (its root-to-leaf path, padded to depth + 1), the head over each node's one
    # read position (nodes rows of logits, not leaves x (depth + 1))
    if hybrid:  # linear-attention caches cannot be repeated over rows: every row runs its whole context, unprefilled
        c = forward_cost(t, "EXTEND", leaves, L + depth + 1, 0, 1, e)
        rows = [(f"path oracle: {leaves} paths, each with its whole context", with_logits(c, t, nodes - leaves, e))]
    else:
        c = forward_cost(t, "TARGET_VERIFY", leaves, depth + 1, L, 1, e)
        # the rows share one row of positions (from the cache), so the rotary table is computed once, not per row
        c["flops"] -= (leaves - 1) * t.rope_dim * (depth + 1)
        rows = [("path oracle: the context prefilled", forward_cost(t, "EXTEND", 1, L, 0, L, e)),
                (f"path oracle: {leaves} paths of {depth + 1} tokens after the cached context",
                 with_logits(c, t, nodes - leaves, e))]
    rows.append(("reference drafter: the target's features over the context", forward_cost(t, "EXTEND", 1, L, 0, L, e)))
    if d is not None:
        B = d.draft["block_size"]
        rows.append((f"reference drafter: the block ({B} tokens) over {L} context rows",
                     forward_cost(d, "DRAFT", 1, B, 0, B - 1, e, context=L)))
    out = [_priced(name, c, g) for name, c in rows]
    extra = [_priced("greedy continuation: the context prefilled", forward_cost(t, "EXTEND", 1, L + 1, 0, L + 1, e), g)]
    extra += [_priced(f"greedy continuation: {depth} one-token steps",
                      _times(forward_cost(t, "DECODE", 1, 1, L + 1 + depth // 2, 1, e), depth), g)] if depth else []
    return {"target": t.name, "draft": d.name if d else None, "gpu": g.name, "dtype": dtype, "context": L,
            "nodes": nodes, "depth": depth, "hybrid": hybrid, "rows": out,
            **{k: sum(r[k] for r in out) for k in ("flops", "bytes", "seconds")},
            "broken_extra": {"rows": extra, **{k: sum(r[k] for r in extra) for k in ("flops", "bytes", "seconds")}}}


def with_logits(c: dict, a, more: int, e: int) -> dict:
    """Cost ``c`` with ``more`` rows of logits (the LM head over that many more positions)."""
    return {**c, "flops": c["flops"] + 2 * more * a.hidden * a.vocab, "bytes": c["bytes"] + more * a.vocab * e}


def _times(c: dict, n: int) -> dict:
    """``n`` forwards of cost ``c`` (the greedy steps, each priced at the middle one's context)."""
    return {k: v * n if isinstance(v, (int, float)) else v for k, v in c.items()}


def _priced(name: str, c: dict, g) -> dict:
    seconds = max(c["flops"] / g.flops, c["bytes"] / g.bandwidth)
    return {"forward": name, "flops": c["flops"], "bytes": c["bytes"], "seconds": seconds}
