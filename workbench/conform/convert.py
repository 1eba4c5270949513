"""Another engine's verify inputs -> cycle-dump fields, and any dumped visibility form -> a dense mask.

- ``sglang_verify_fields``: SGLang's ``EagleVerifyInput`` tensors (the layout its EAGLE tree kernel and the
  DDTree pull request sgl-project/sglang#29907 verify with: ``draft_token``, ``custom_mask``, ``positions``,
  ``retrive_index``, ``retrive_next_token``, ``retrive_next_sibling``) plus the batch's ``seq_lens`` -> one
  dict of cycle fields per request. ``from_verify_input`` reads them off the object itself.
- ``bias_fields``: a vLLM-style request (its tree's tokens, parents, positions and per-request additive
  attention bias, as vLLM's tree attention held it) -> cycle fields.
- ``dense_visibility``: a dump record's visibility, in whichever form it was dumped, -> bool [n, m].

Nothing here needs a GPU or an engine: the dump writers for GPU hosts (``sglang_dump``, ``vllm_tree_dump``) call
these functions, and tests/conform/test_convert.py feeds them tensors built by SGLang's own released code.
A field the converter cannot read is left out and named in one line of the returned notes (the checker then
reports its contract as not checked); inputs that make no request readable at all raise ValueError.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ddtree_kernels.tree_compile import ancestor_matrix

SGLANG_VERIFY_TENSORS = ("draft_token", "custom_mask", "positions", "retrive_index", "retrive_next_token",
                         "retrive_next_sibling")
# sglang 0.5.23 spells them retrieve_*; older releases (and the DDTree pull request's base) retrive_*
SPELLINGS = {"retrive_index": ("retrieve_index", "retrive_index"),
             "retrive_next_token": ("retrieve_next_token", "retrive_next_token"),
             "retrive_next_sibling": ("retrieve_next_sibling", "retrive_next_sibling"),
             "retrive_parent_token": ("retrieve_parent_token", "retrive_parent_token")}


# ------------------------------------------------------------------------------------------ trees
def parents_from_links(next_token: Tensor, next_sibling: Tensor) -> Tensor:
    """EAGLE's first-child / next-sibling links [n] -> parents int64 [n] (-1 at the root, node 0).
    ValueError (one line) when the links do not make a tree over all n nodes rooted at 0."""
    nt, ns = next_token.tolist(), next_sibling.tolist()
    n = len(nt)
    parents = [-2] * n
    parents[0] = -1
    stack = [0]
    while stack:
        i = stack.pop()
        c = nt[i]
        while c != -1:
            if not 0 < c < n or parents[c] != -2:
                raise ValueError(f"retrive_next_token/retrive_next_sibling reach node {c} twice or out of range "
                                 f"(n = {n}): not a tree")
            parents[c] = i
            stack.append(c)
            c = ns[c]
    lost = [i for i, p in enumerate(parents) if p == -2]
    if lost:
        raise ValueError(f"retrive_next_token/retrive_next_sibling never reach node(s) {lost[:8]} from the root")
    return torch.tensor(parents, dtype=torch.long)


def depths_of(parents: Tensor) -> Tensor:
    """parents int64 [n] (each parent before its child) -> depths int64 [n]."""
    p = parents.tolist()
    d = [0] * len(p)
    for i in range(1, len(p)):
        if not 0 <= p[i] < i:
            raise ValueError(f"node {i} has parent {p[i]}; every parent comes before its child")
        d[i] = d[p[i]] + 1
    return torch.tensor(d, dtype=torch.long)


def ancestor_closure(parents: Tensor) -> Tensor:
    """parents int64 [n] -> bool [n, n]: node j is an ancestor of i, or i itself (what a verify must see)."""
    n = parents.shape[0]
    return ancestor_matrix(parents[None], max(n - 1, 0))[0]


# ------------------------------------------------------------------------------------------ visibility
def _need(rec, name: str):
    if name not in rec:
        raise ValueError(f"{getattr(rec, 'where', 'the record')}: visibility_form needs {name!r}, which is missing")
    return rec[name]


def dense_visibility(rec) -> Tensor:
    """A cycle record's (``Record`` or dict of fields) attention visibility as bool [n, m]: m = n (tree
    columns only) or context_len + n (prefix columns first), as the engine held it. ValueError naming the
    field when the form's fields are missing or their sizes do not fit n."""
    form = rec["visibility_form"] if "visibility_form" in rec else ("visibility" in rec and "dense")
    if not form:
        raise ValueError("the record holds no visibility (no visibility_form)")
    n = _nodes(rec)
    if form == "dense":
        v = _need(rec, "visibility")
        if v.dim() != 2 or v.shape[0] != n:
            raise ValueError(f"visibility has shape {list(v.shape)}, not [{n}, m]")
        return v.bool()
    if form == "bias":
        b = _need(rec, "attn_bias")
        if b.dim() != 2 or b.shape[0] != n:
            raise ValueError(f"attn_bias has shape {list(b.shape)}, not [{n}, m]")
        return b.float() > -math.inf  # -inf hides; 0 (or any finite value) leaves visible
    if form == "sglang_mask":
        flat = _need(rec, "sglang_custom_mask").bool().reshape(-1)
        if flat.numel() % n:
            raise ValueError(f"sglang_custom_mask has {flat.numel()} entries, not a multiple of n = {n} rows")
        return flat.reshape(n, -1)
    if form == "flashinfer_packed":
        packed = _need(rec, "fi_packed_mask").to(torch.uint8).reshape(-1)
        m = int(_need(rec, "fi_kv_len"))
        need = -(-n * m // 8)
        if packed.numel() != need:
            ptr = rec["fi_mask_indptr"].tolist() if "fi_mask_indptr" in rec else None
            raise ValueError(f"fi_packed_mask has {packed.numel()} bytes (mask_indptr {ptr}) but an [{n}, {m}] mask "
                             f"packs into {need}: the engine's indptr does not fit this request")
        bits = (packed[:, None] >> torch.arange(8, dtype=torch.uint8)[None]) & 1  # little bit order
        return bits.reshape(-1)[: n * m].bool().reshape(n, m)
    raise ValueError(f"visibility_form={form!r} is not known; forms: dense, sglang_mask, flashinfer_packed, bias")


def _nodes(rec) -> int:
    for name in ("tree_tokens", "verify_ids", "tree_parents", "verify_positions"):
        if name in rec:
            return int(rec[name].shape[0])
    raise ValueError("the record holds no per-node array (tree_tokens, verify_ids, ...), so its node count is unknown")


def pack_flashinfer(mask: Tensor) -> Tensor:
    """bool [n, m] -> uint8 bytes as FlashInfer's ``packbits(mask.flatten(), bitorder="little")`` gives them."""
    flat = mask.reshape(-1).to(torch.uint8)
    pad = (-flat.numel()) % 8
    flat = torch.cat([flat, flat.new_zeros(pad)]).reshape(-1, 8)
    return (flat << torch.arange(8, dtype=torch.uint8)[None]).sum(dim=1, dtype=torch.uint8)


# ------------------------------------------------------------------------------------------ outputs
def topk_fields(prefix: str, logits: Tensor, k: int) -> dict:
    """``{prefix}_topk_ids`` / ``{prefix}_topk_values`` of logits [rows, V] (k clamped to V), best first."""
    v, i = logits.float().topk(min(k, logits.shape[-1]), dim=-1)
    return {f"{prefix}_topk_ids": i, f"{prefix}_topk_values": v}


# ------------------------------------------------------------------------------------------ SGLang
def sglang_verify_fields(draft_token: Tensor, positions: Tensor, retrive_index: Tensor, retrive_next_token: Tensor,
                         retrive_next_sibling: Tensor, seq_lens, custom_mask: Tensor | None = None,
                         mask_mode: str = "FULL_MASK", *, logits: Tensor | None = None, topk: int = 8,
                         accept_index: Tensor | None = None, predict: Tensor | None = None,
                         retrive_parent_token: Tensor | None = None) -> tuple[list[dict], list[str]]:
    """SGLang's verify input for a batch -> (one dict of cycle fields per request, notes).

    draft_token int64 [bs * n] (root first in each request); positions int64 [bs * n]; retrive_* int64
    [bs, n] (``retrive_index[b, i] = b * n + i``); seq_lens [bs]: committed tokens per request (the root's
    position); custom_mask: SGLang's flat bool mask in ``mask_mode`` ("FULL_MASK": n rows of seq_len + n per
    request, requests one after another; "QLEN_ONLY": n * n each; "QLEN_ONLY_BITPACKING": one word per row,
    bit j = the row sees token j, read into the QLEN_ONLY form).
    Optional, after the verify: logits [bs * n, V] (the target's, one row per verified token) -> top-k and
    the argmax; accept_index int [bs, depth + 1] (flat rows, -1 padded) and predict int [bs * n] (the
    target token at accepted rows) -> accepted_nodes, bonus; retrive_parent_token [bs, n] (hybrid targets'
    recurrent-state parent) -> state_from."""
    notes: list[str] = []
    if retrive_next_token.dim() != 2:
        raise ValueError(f"retrive_next_token has shape {list(retrive_next_token.shape)}, not [bs, n]")
    bs, n = retrive_next_token.shape
    seq = [int(x) for x in (seq_lens.tolist() if isinstance(seq_lens, Tensor) else seq_lens)]
    if len(seq) != bs:
        raise ValueError(f"seq_lens has {len(seq)} entries for {bs} requests (retrive_next_token is [{bs}, {n}])")
    for name, t in (("draft_token", draft_token), ("positions", positions)):
        if t.numel() != bs * n:
            raise ValueError(f"{name} has {t.numel()} entries, not bs * n = {bs} * {n}")
    for name, t in (("retrive_index", retrive_index), ("retrive_next_sibling", retrive_next_sibling)):
        if list(t.shape) != [bs, n]:
            raise ValueError(f"{name} has shape {list(t.shape)}, not [{bs}, {n}]")
    rows = torch.arange(bs)[:, None] * n + torch.arange(n)[None]
    if not torch.equal(retrive_index.cpu().long(), rows):
        notes.append("retrive_index: not b * n + i (the rows the accept walk reads); the record's nodes are "
                     "taken in draft_token order")
    masks = _sglang_masks(custom_mask, mask_mode, seq, n, notes)
    dt, pos = draft_token.reshape(bs, n).cpu().long(), positions.reshape(bs, n).cpu().long()
    out = []
    for b in range(bs):
        f: dict = {"row": b, "rows": bs, "context_len": seq[b], "root_token": int(dt[b, 0]),
                   "tree_tokens": dt[b], "verify_ids": dt[b], "verify_positions": pos[b]}
        try:
            parents = parents_from_links(retrive_next_token[b].cpu().long(), retrive_next_sibling[b].cpu().long())
            f.update(tree_parents=parents, tree_depths=depths_of(parents))
        except ValueError as e:
            notes.append(f"request {b}: retrive_next_token / retrive_next_sibling: {e}; tree left out")
        if masks is not None:
            f.update(visibility_form="sglang_mask", sglang_custom_mask=masks[b],
                     sglang_mask_mode="QLEN_ONLY" if mask_mode == "QLEN_ONLY_BITPACKING" else mask_mode)
        if logits is not None:
            lg = logits.reshape(bs, n, -1)[b]
            f.update(topk_fields("target", lg, topk), target_choice=lg.argmax(dim=-1))
        if accept_index is not None:
            acc = [int(x) - b * n for x in accept_index[b].tolist() if int(x) >= 0]
            if not acc or not all(0 <= a < n for a in acc):
                notes.append(f"request {b}: accept_index {accept_index[b].tolist()[:8]} holds rows outside the "
                             "request; accepted_nodes left out")
            else:
                f["accepted_nodes"] = torch.tensor(acc, dtype=torch.long)
                if predict is not None:
                    f["bonus"] = int(predict.reshape(-1)[b * n + acc[-1]])
        if retrive_parent_token is not None:
            f["state_from"] = retrive_parent_token[b].cpu().long()
        out.append(f)
    return out, notes


def _sglang_masks(custom_mask, mode: str, seq: list[int], n: int, notes: list[str]) -> list[Tensor] | None:
    """SGLang's flat mask -> each request's slice (n rows), or None with a note when it cannot be read."""
    if custom_mask is None:
        notes.append("custom_mask: None (SGLang builds none for a linear DFlash verify, or the engine did not "
                     "keep it); visibility left out")
        return None
    if mode == "QLEN_ONLY_BITPACKING":  # one word per row, bit j = the row sees token j
        words = custom_mask.reshape(-1).cpu().long()
        if words.numel() < n * len(seq):
            notes.append(f"custom_mask: {words.numel()} words, but QLEN_ONLY_BITPACKING for {len(seq)} requests of "
                         f"{n} tokens needs {n * len(seq)}; visibility left out")
            return None
        bits = ((words[: n * len(seq), None] >> torch.arange(n)[None]) & 1).bool()  # [bs * n, n]
        return [bits[b * n : (b + 1) * n].reshape(-1) for b in range(len(seq))]
    if mode not in ("FULL_MASK", "QLEN_ONLY"):
        notes.append(f"custom_mask: mask mode {mode} is not one of FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING; "
                     "visibility left out")
        return None
    flat = custom_mask.reshape(-1).cpu().bool()
    widths = [s + n if mode == "FULL_MASK" else n for s in seq]
    need = sum(n * w for w in widths)
    if flat.numel() < need:
        notes.append(f"custom_mask: {flat.numel()} entries, but {mode} for seq_lens {seq[:8]} and {n} tokens per "
                     f"request needs {need}; visibility left out")
        return None
    if flat.numel() > need:  # CUDA-graph padding (SGLang pads with True): not any request's
        notes.append(f"custom_mask: {flat.numel() - need} entries past the batch's {need} (CUDA-graph padding), "
                     "ignored")
    out, at = [], 0
    for w in widths:
        out.append(flat[at : at + n * w])
        at += n * w
    return out


def from_verify_input(spec_info, seq_lens, mask_mode: str = "FULL_MASK", **outputs) -> tuple[list[dict], list[str]]:
    """``sglang_verify_fields`` on an ``EagleVerifyInput`` (or anything with its attribute names). A tensor
    the object does not hold is named in one line; without the tree links nothing can be converted."""
    def read(name):
        return next((getattr(spec_info, n) for n in SPELLINGS.get(name, (name,))
                     if getattr(spec_info, n, None) is not None), None)

    got = {name: read(name) for name in SGLANG_VERIFY_TENSORS}
    absent = [name for name, v in got.items() if v is None and name != "custom_mask"]
    if absent:
        raise ValueError(f"{type(spec_info).__name__} has no {', '.join(absent)}: not an EagleVerifyInput layout "
                         f"(needs {', '.join(SGLANG_VERIFY_TENSORS)}; retrieve_* spellings too)")
    parent = read("retrive_parent_token")
    return sglang_verify_fields(got["draft_token"], got["positions"], got["retrive_index"], got["retrive_next_token"],
                                got["retrive_next_sibling"], seq_lens, got["custom_mask"], mask_mode,
                                retrive_parent_token=parent if isinstance(parent, Tensor) else None, **outputs)


# ------------------------------------------------------------------------------------------ vLLM-style bias
def bias_fields(tokens: Tensor, positions: Tensor, attn_bias: Tensor, context_len: int,
                parents: Tensor | None = None, *, logits: Tensor | None = None, topk: int = 8,
                accepted_nodes: Tensor | None = None, bonus: int | None = None) -> tuple[dict, list[str]]:
    """One request of a vLLM-style tree verify -> (cycle fields, notes). tokens / positions int [n] (root
    first); attn_bias float [n, m]: the request's additive tree bias (0 visible, -inf hidden; m = n for the
    tree part alone, as vLLM's tree attention held it, or context_len + n); parents [n]: the proposer's tree
    (-1 at the root), or None (the tree then goes unchecked: named in the notes)."""
    notes: list[str] = []
    n = int(tokens.shape[0])
    if list(positions.shape) != [n]:
        raise ValueError(f"positions has shape {list(positions.shape)}, not [{n}] (one per token)")
    f: dict = {"context_len": int(context_len), "root_token": int(tokens[0]), "tree_tokens": tokens.cpu().long(),
               "verify_ids": tokens.cpu().long(), "verify_positions": positions.cpu().long()}
    if attn_bias.dim() != 2 or attn_bias.shape[0] != n or attn_bias.shape[1] not in (n, context_len + n):
        notes.append(f"attn_bias: shape {list(attn_bias.shape)}, not [{n}, {n}] or [{n}, {context_len + n}]; "
                     "visibility left out")
    else:
        f.update(visibility_form="bias", attn_bias=attn_bias.cpu().float())
    if parents is None:
        notes.append("tree_parents: the proposer's parents were not given; tree left out")
    else:
        try:
            f.update(tree_parents=parents.cpu().long(), tree_depths=depths_of(parents.cpu().long()))
        except ValueError as e:
            notes.append(f"tree_parents: {e}; tree left out")
    if logits is not None:
        f.update(topk_fields("target", logits.reshape(n, -1), topk), target_choice=logits.reshape(n, -1).argmax(-1))
    if accepted_nodes is not None:
        f["accepted_nodes"] = accepted_nodes.cpu().long()
    if bonus is not None:
        f["bonus"] = int(bonus)
    return f, notes
