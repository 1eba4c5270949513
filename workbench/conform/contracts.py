"""The contracts of one speculative step, as pure functions over plain tensors and lists.

Each ``*_problem`` function takes what an engine handed one contract (as a cycle dump holds it,
docs/dump-format.md) and what the reference says it should have been, and returns None when they agree
or one line of evidence naming the first difference. ``workbench.conform.check`` feeds them a dump's
records and the reference's replay; nothing here loads a model or reads a file.

The contracts, in the order data flows through a step (the checker reports broken ones in this order
within a cycle: an input's fault explains what follows it):
drafter context, drafter features, drafter output, tree, verify positions, visibility, recurrent-state
parents, target logits, accept walk, committed tokens (the drafter features' contract and its diagnosis:
``workbench.conform.feature_contract``).

Beside the evidence line, ``*_facts`` give a broken cycle's evidence as data (a constant offset, slot 0 holding
the mask token, ...): ``workbench.conform.causes`` matches known bug classes against them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree_kernels.oracles import accept_walk_python, ancestors_python, build_tree_greedy_exact

CONTRACTS = ("drafter context", "drafter features", "drafter output", "tree", "verify positions", "visibility",
             "recurrent-state parents", "target logits", "accept walk", "committed tokens")


@dataclass(frozen=True)
class Tolerance:
    """How far a float a production engine computed may sit from the reference's and count as equal:
    ``atol + rtol * |reference|``, per value. A top-1 that differs from the reference's counts as a
    near tie, not a fault, when the reference's own values of the two tokens are within ``near_tie``."""

    dtype: str
    atol: float
    rtol: float
    near_tie: float

    def __str__(self) -> str:
        return (f"{self.dtype}: values within {self.atol:g} + {self.rtol:g} x |reference|; a different top-1 is a "
                f"near tie when the reference's values of the two tokens are within {self.near_tie:g}")


# Measured on the embedded pair (docs/conformance.md): the engine against the references differs by at most
# 1.5e-5 in float32, 0.008 (target logits) / 0.019 (draft log-probs) in float16, 0.0625 / 0.18 in bfloat16;
# each tolerance leaves room above that (float32: 60x; the half types about 2x: a larger model needs more).
TOLERANCES = {
    "float32": Tolerance("float32", 1e-3, 1e-4, 1e-3),
    "float16": Tolerance("float16", 4e-2, 5e-3, 8e-2),
    "bfloat16": Tolerance("bfloat16", 2.5e-1, 2e-2, 5e-1),
}


def tolerance(dtype) -> Tolerance:
    name = str(dtype).replace("torch.", "")
    if name not in TOLERANCES:
        raise ValueError(f"dtype {name!r}: the checker has tolerances for {', '.join(TOLERANCES)}")
    return TOLERANCES[name]


# ------------------------------------------------------------------------------------------ trees
def depths_from(parents: list[int]) -> list[int]:
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


def tree_shape_problem(tokens: list[int], parents: list[int], depths: list[int] | None = None) -> str | None:
    """A tree the other contracts can read: the root at 0 (parent -1), every parent before its child,
    depth = parent's + 1 where depths are given."""
    n = len(tokens)
    if len(parents) != n or (depths is not None and len(depths) != n):
        return f"tree arrays differ in length: {n} tokens, {len(parents)} parents" + (
            f", {len(depths)} depths" if depths is not None else "")
    if n == 0 or parents[0] != -1:
        return "node 0 is not a root (parent -1)"
    for i in range(1, n):
        if not 0 <= parents[i] < i:
            return f"node {i} has parent {parents[i]}; every parent comes before its child"
    if depths is not None:
        want = depths_from(parents)
        bad = next((i for i in range(n) if depths[i] != want[i]), None)
        if bad is not None:
            return f"node {bad} has depth {depths[bad]} but its parent chain makes it {want[bad]}"
    return None


def paths(tokens: list[int], parents: list[int]) -> dict[tuple, int]:
    """Each node's token path from the root's child down (the root's own token left out) -> node index."""
    out: dict[tuple, int] = {}
    path: list[tuple] = []
    for i, p in enumerate(parents):
        path.append(() if p < 0 else path[p] + (tokens[i],))
        out[path[-1]] = i
    return out


def chain_tree(logprobs: Tensor, root: int, policy) -> dict:
    """DFlash's tree: the argmax chain (the lowest id among equal maxima)."""
    chain = [int(t) for t in logprobs.float().argmax(-1).tolist()]
    return {"tokens": [int(root)] + chain, "parents": list(range(-1, len(chain)))}


def best_prefix_tree(logprobs: Tensor, root: int, policy) -> dict:
    """DDTree's tree: the exact best ``budget`` prefixes (``oracles.build_tree_greedy_exact``)."""
    # Only a slot's best min(budget, width) tokens can enter the tree: the oracle runs over those columns,
    # kept in token-id order so that its tie rule (equal log-probs by token id) is the full vocabulary's.
    k = min(policy.budget, policy.width or policy.budget, logprobs.shape[-1])
    lp = logprobs.float()
    top = torch.topk(lp, k, dim=-1).values[:, -1:]  # [D, 1]: each slot's k-th value
    keep = [torch.nonzero(row >= kth).flatten() for row, kth in zip(lp, top)]  # ids ascending, ties kept
    width = max(x.numel() for x in keep)
    cols = torch.stack([torch.cat([x, x[-1:].expand(width - x.numel())]) for x in keep])  # [D, width]
    small = lp.gather(1, cols)
    for d, x in enumerate(keep):
        small[d, x.numel():] = float("-inf")  # padding columns: never better than a real token
    t = build_tree_greedy_exact(small, int(root), policy.budget, policy.width)
    depth = depths_from(t["parents"])
    tokens = [int(root)] + [int(cols[depth[i] - 1, c]) for i, c in enumerate(t["tokens"]) if i]
    return {"tokens": tokens, "parents": t["parents"]}


# The policies whose tree the checker rebuilds, by registered kind: an independent oracle for each.
REFERENCE_TREES = {"dflash": chain_tree, "ddtree": best_prefix_tree}


def rebuilds(policy) -> bool:
    """Whether the checker has a reference tree for this policy."""
    return policy.kind in REFERENCE_TREES


def reference_tree(logprobs: Tensor, root: int, policy) -> dict:
    """The tree the policy builds from drafter log-probs [D, V] under the workbench's tie rule
    (``REFERENCE_TREES``). Returns {"tokens", "parents"} lists, root first."""
    if not rebuilds(policy):
        raise ValueError(f"policy {policy}: the checker rebuilds {' and '.join(sorted(REFERENCE_TREES))} trees")
    return REFERENCE_TREES[policy.kind](logprobs, root, policy)


def tree_problem(tokens: list[int], parents: list[int], want: dict) -> str | None:
    """The engine's tree against the reference tree (``reference_tree``), as sets of token paths (node
    order is the engine's own business)."""
    mine, ref = paths(tokens, parents), paths(want["tokens"], want["parents"])
    missing = [p for p in ref if p not in mine]
    extra = [p for p in mine if p not in ref]
    if tokens[0] != want["tokens"][0]:
        return f"the root is token {tokens[0]}, the reference's {want['tokens'][0]}"
    if not missing and not extra:
        return None
    parts = []
    if missing:
        p = min(missing, key=len)
        parts.append(f"lacks {len(missing)} of the reference's {len(ref) - 1} drafted nodes (first: depth "
                     f"{len(p)}, path {list(p)})")
    if extra:
        p = min(extra, key=len)
        parts.append(f"holds {len(extra)} the reference does not build (first: node {mine[p]}, depth {len(p)}, "
                     f"path {list(p)})")
    return "the tree " + " and ".join(parts)


# ------------------------------------------------------------------------------------------ drafter
def drafter_context_problem(seen: dict, committed: list[int], start: int) -> str | None:
    """``seen``: position -> the token the drafter took in there as context, over every step so far (the
    latest write winning, as a K/V slot does). It must hold exactly the committed tokens at 0..start-1."""
    never = [q for q in range(start) if q not in seen]
    wrong = [q for q in range(start) if q in seen and seen[q] != committed[q]]
    if not never and not wrong:
        return None
    parts = []
    if wrong:
        q = wrong[0]
        parts.append(f"position {q} holds token {seen[q]}, the committed token is {committed[q]} "
                     f"({len(wrong)} positions differ)")
    if never:
        parts.append(f"{len(never)} committed position(s) never reached the drafter (first: {never[0]})")
    return "; ".join(parts)


def block_problem(tokens: list[int] | None, positions: list[int] | None, root: int, mask_token_id: int,
                  start: int) -> str | None:
    """The drafter's block: the root then mask tokens, at positions start, start + 1, ..."""
    if tokens is not None:
        want = [root] + [mask_token_id] * (len(tokens) - 1)
        bad = next((j for j, (a, b) in enumerate(zip(tokens, want)) if a != b), None)
        if bad is not None:
            return f"block slot {bad} holds token {tokens[bad]}, the reference's block {want[bad]}"
    if positions is not None:
        bad = next((j for j, p in enumerate(positions) if p != start + j), None)
        if bad is not None:
            return f"block slot {bad} is at position {positions[bad]}, the reference's {start + bad}"
    return None


def context_facts(tokens: list[int] | None, positions: list[int] | None, root: int, mask_token_id: int,
                  start: int) -> dict:
    """A broken drafter context as data: whether the block's slot 0 holds the mask token instead of the root
    (the bonus token missing), and the block positions' constant offset from start, start + 1, ... (None: none)."""
    slot0_mask = bool(tokens) and tokens[0] == mask_token_id and root != mask_token_id
    offsets = {p - (start + j) for j, p in enumerate(positions or [])}
    return {"slot0_mask": slot0_mask, "block_offset": offsets.pop() if len(offsets) == 1 else None}


def top1_facts(ids: Tensor, reference: Tensor) -> dict:
    """A broken drafter output as data: the share of slots whose top-1 is the reference's (a drafter that shares
    nothing with the reference agrees by chance only)."""
    R = min(ids.shape[0], reference.shape[0])
    agree = sum(int(ids[r, 0]) == int(reference[r].argmax()) for r in range(R))
    return {"top1_agree": agree / R if R else None, "slots": R}


def as_logprobs(values: Tensor, kind: str) -> Tensor | None:
    """Full-vocabulary values [D, V] as log-probs (None when ``kind`` is unknown)."""
    if kind == "logprobs":
        return values.float()
    if kind == "logits":
        return torch.log_softmax(values.float(), dim=-1)
    return None


def topk_problem(ids: Tensor, values: Tensor, reference: Tensor, tol: Tolerance, what: str,
                 unit: str) -> tuple[str | None, int]:
    """One row per slot or node: the engine's best tokens ``ids`` [R, k] and their ``values`` [R, k]
    against the reference's values [R, V] (the same kind: log-probs or logits). Broken where the top-1
    differs beyond a near tie, or where a value is off by more than the tolerance. -> (evidence or None,
    near ties: rows whose top-1 differs within ``tol.near_tie``)."""
    R = min(ids.shape[0], reference.shape[0])
    if ids.shape[0] != reference.shape[0]:
        return f"{ids.shape[0]} {what}s of values, the reference has {reference.shape[0]}", 0
    ref = reference[:R].float()
    ids, values = ids[:R].long(), values[:R].float()
    near = 0
    for r in range(R):
        mine, best = int(ids[r, 0]), int(ref[r].argmax())
        if mine != best:
            gap = float(ref[r, best] - ref[r, mine])
            if gap > tol.near_tie:
                second = float(ref[r].topk(2).values[1]) if ref.shape[1] > 1 else float("nan")
                return (f"{what} {r}: the engine's top-1 is token {mine}, the reference's {best} ({unit} "
                        f"{float(ref[r, best]):.4g} vs {float(ref[r, mine]):.4g} for the engine's; the reference's "
                        f"top-1/top-2 gap is {float(ref[r, best]) - second:.3g})"), near
            near += 1
    want = ref.gather(1, ids)  # [R, k]: the reference's values of the engine's tokens
    finite = torch.isfinite(want) & torch.isfinite(values)
    off = torch.where(finite, (values - want).abs() - (tol.atol + tol.rtol * want.abs()), torch.zeros_like(want))
    both_inf = (~torch.isfinite(want)) & (~torch.isfinite(values)) & (want == values)
    off = torch.where(~finite & ~both_inf, torch.full_like(off, float("inf")), off)
    if bool((off > 0).any()):
        r, j = (int(x) for x in (off > 0).nonzero()[0])
        return (f"{what} {r}: the engine's {unit} of token {int(ids[r, j])} (rank {j}) is {float(values[r, j]):.5g}, "
                f"the reference's {float(want[r, j]):.5g} (tolerance {tol.atol:g} + {tol.rtol:g} x |value|)"), near
    return None, near


# ------------------------------------------------------------------------------------------ verify
def positions_problem(positions: list[int], parents: list[int], start: int, ids: list[int] | None = None,
                      tokens: list[int] | None = None) -> str | None:
    """Every verified node at the root's position plus its depth (siblings share one); its input id the
    tree's token."""
    depth = depths_from(parents)
    if len(positions) != len(parents):
        return f"{len(positions)} verify positions for {len(parents)} tree nodes"
    bad = next((i for i, p in enumerate(positions) if p != start + depth[i]), None)
    if bad is not None:
        return (f"node {bad} is verified at position {positions[bad]}, the reference's {start + depth[bad]} "
                f"(= context {start} + depth {depth[bad]})")
    if ids is not None and tokens is not None:
        bad = next((i for i, (a, b) in enumerate(zip(ids, tokens)) if a != b), None)
        if bad is not None or len(ids) != len(tokens):
            return (f"verify input id of node {bad} is {ids[bad]}, the tree's token {tokens[bad]}" if bad is not None
                    else f"{len(ids)} verify input ids for {len(tokens)} tree nodes")
    return None


def positions_facts(positions: list[int], parents: list[int], start: int) -> dict:
    """Broken verify positions as data: their constant offset from the reference's (None: none), and whether they
    are the root's position plus each node's flat index (the node's place in the tree's order, not its depth)."""
    depth = depths_from(parents)
    offsets = {p - (start + d) for p, d in zip(positions, depth)}
    by_index = len(positions) > 1 and positions == [positions[0] + i for i in range(len(positions))] and \
        positions[0] == start and depth != list(range(len(depth)))
    return {"offset": offsets.pop() if len(offsets) == 1 else None, "by_index": by_index}


def ancestor_closure(parents: list[int]) -> Tensor:
    """bool [n, n]: node j is an ancestor of node i, or i itself (the plain walk of ``oracles``, not the
    engine's kernel: a fault planted in the kernel must not reach the checker)."""
    n = len(parents)
    out = torch.zeros(n, n, dtype=torch.bool)
    for i, anc in enumerate(ancestors_python(parents)):
        out[i, sorted(anc)] = True
    return out


def visibility_problem(visible: Tensor, parents: list[int], start: int) -> str | None:
    """The verify's attention visibility bool [n, m] (m = n: tree columns; m = start + n: the prefix's
    columns first) = every prefix column and the ancestor-or-self closure over the tree."""
    n = len(parents)
    if visible.dim() != 2 or visible.shape[0] != n or visible.shape[1] not in (n, start + n):
        return f"visibility has shape {list(visible.shape)}, not [{n}, {n}] or [{n}, {start} + {n}]"
    v = visible.bool()
    if v.shape[1] == start + n:
        hidden = (~v[:, :start]).nonzero()
        if hidden.shape[0]:
            i, q = (int(x) for x in hidden[0])
            return f"node {i} does not see committed position {q} ({hidden.shape[0]} prefix entries hidden)"
        v = v[:, start:]
    want = ancestor_closure(parents)
    lost = (want & ~v).nonzero()
    if lost.shape[0]:
        i, j = (int(x) for x in lost[0])
        return f"node {i} does not see its {'own row' if i == j else f'ancestor {j}'} ({lost.shape[0]} entries lost)"
    leak = (v & ~want).nonzero()
    if leak.shape[0]:
        i, j = (int(x) for x in leak[0])
        return f"node {i} sees node {j}, which is not its ancestor ({leak.shape[0]} entries leak)"
    return None


def state_parents_problem(state_from: list[int], parents: list[int]) -> str | None:
    """A recurrent layer's state for node i continues from i's parent (-1: the committed state, the root's)."""
    if len(state_from) != len(parents):
        return f"state_from has {len(state_from)} entries for {len(parents)} nodes"
    bad = next((i for i, (s, p) in enumerate(zip(state_from, parents)) if s != p), None)
    if bad is None:
        return None
    return (f"node {bad} continued the recurrent state of {'the committed state' if state_from[bad] < 0 else 'node ' + str(state_from[bad])}, "
            f"its parent is {'the committed state' if parents[bad] < 0 else 'node ' + str(parents[bad])}")


# ------------------------------------------------------------------------------------------ accept, commit
def state_parents_facts(state_from: list[int], parents: list[int]) -> dict:
    """Broken recurrent-state parents as data: whether each node continued the node before it in the flattened
    order (a scan that reads the tree as a chain: stale parent indices)."""
    return {"flattened": len(state_from) > 1 and state_from == list(range(-1, len(state_from) - 1)),
            "wrong": sum(s != p for s, p in zip(state_from, parents))}


def accept_problem(tokens: list[int], parents: list[int], choice: list[int], accepted: list[int],
                   bonus: int | None, last: bool = False) -> str | None:
    """The accepted path and bonus = the walk down the tree along the engine's own per-node choices (on the
    request's last step, where its token limit or end-of-text may stop it, a start of that walk)."""
    path, want_bonus = accept_walk_python(tokens, parents, choice)
    if last and 0 < len(accepted) < len(path) and list(accepted) == path[: len(accepted)]:
        return None
    if list(accepted) != path:
        return f"the engine accepted nodes {list(accepted)}, the walk along its own choices gives {path}"
    if bonus is not None and bonus != want_bonus:
        return f"bonus {bonus}, the engine's own choice at the last accepted node {path[-1]} is {want_bonus}"
    return None


def commit_problem(committed: list[int] | None, path_tokens: list[int], bonus: int | None,
                   kv_kept: list[int] | None, accepted: list[int], next_len: int | None, context_len: int,
                   last: bool) -> str | None:
    """The step appends the accepted drafts then the bonus (a prefix of them on the request's last step:
    end-of-text or its limit may cut it), keeps the accepted nodes' K/V rows in path order, and counts its
    cache as the context plus the accepted path."""
    if committed is not None:
        want = path_tokens[1:] + ([bonus] if bonus is not None else [])
        ok = committed == want or (last and committed == want[: len(committed)])
        if not ok:
            j = next((i for i, (a, b) in enumerate(zip(committed, want)) if a != b), min(len(committed), len(want)))
            return (f"committed tokens {committed[:8]}{'...' if len(committed) > 8 else ''} are not the accepted drafts "
                    f"then the bonus {want[:8]}{'...' if len(want) > 8 else ''} (first difference at {j})")
    if kv_kept is not None and list(kv_kept) != list(accepted):
        return f"the K/V rows kept are nodes {list(kv_kept)}, in that order; the accepted path is {list(accepted)}"
    if next_len is not None and next_len != context_len + len(accepted):
        return (f"the engine counts {next_len} tokens in its cache after the step, the context {context_len} plus "
                f"the {len(accepted)} accepted nodes make {context_len + len(accepted)}")
    return None


def accept_length(tokens: list[int], parents: list[int], greedy: list[int]) -> int:
    """Tokens one step commits (accepted drafts + the bonus) when the target's greedy continuation of the
    committed context is ``greedy`` (its first token follows the root)."""
    kids: dict[int, dict[int, int]] = {}
    for i, p in enumerate(parents):
        if p >= 0:
            kids.setdefault(p, {})[tokens[i]] = i
    node, n = 0, 0
    for t in greedy:
        nxt = kids.get(node, {}).get(t)
        if nxt is None:
            break
        node, n = nxt, n + 1
    return n + 1
