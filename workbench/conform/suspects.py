"""Each known bug class's reproduction on one broken cycle: the input the bug hands the engine (a position
scheme, a mask, the K/V rows and recurrent state a commit keeps, the bonus, the drafter's block), rebuilt from the
cycle's own record, then held against what the engine recorded: the field itself where the dump holds it, and the
output it leads to through the reference (``workbench.conform.reproduce``) where the dump holds that.

Every function takes a ``Sample`` (``workbench.conform.replay``) and the diagnosis' ``env`` (the loaded pair, the
tolerance, whether the target is hybrid, the reference) and returns a ``Repro``, or None where the cycle lacks the
fields to try it. The catalogue (``workbench.conform.causes``) names which function reproduces which cause.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.conform import contracts as C
from workbench.conform import reproduce as R


@dataclass
class Repro:
    match: bool  # the engine's records are what the suspected input gives
    what: str  # the suspected input, in words ("positions = request 1's start + depth")
    diff: float | None = None  # the largest |difference| of the engine's values from the reproduction's


def tree_of(rec) -> tuple:
    return rec["tree_tokens"].tolist(), rec["tree_parents"].tolist()


def has(rec, *fields) -> bool:
    return all(f in rec for f in fields)


# ------------------------------------------------------------------------------------------ outputs
def target_agrees(sample, env, positions: list[int], visible=None) -> tuple[bool, float] | None:
    """The engine's recorded target top-k against the reference's logits at ``positions`` (and, with ``visible``
    bool [n, n], under that mask): (equal within the tolerance, largest difference). None: nothing to compare (no
    target values recorded, the context unknown, a mask on a hybrid target, whose recurrent layers take none, or a
    cycle after its request's first broken one, whose committed state already carries the fault)."""
    rec = sample.rec
    if not sample.clean or sample.ctx is None or not has(rec, "target_topk_ids", "target_topk_values", "tree_tokens",
                                                         "tree_parents"):
        return None
    tokens, parents = tree_of(rec)
    model = env.models.target
    if visible is None:
        logits = R.logits_at(model, sample.ctx[:-1], tokens, parents, positions)
    elif env.hybrid:
        return None
    else:
        logits = R.masked_logits(model, sample.ctx[:-1], tokens, positions, visible)
    return R.agreement(rec["target_topk_ids"], rec["target_topk_values"], logits, env.tol)


def judged(recorded: bool | None, out: tuple | None, what: str) -> Repro | None:
    """A reproduction's verdict: the recorded field is the suspected one (None: not recorded) and the recorded
    output is what it gives (None: not comparable); all there must agree. None: neither is there to hold."""
    checks = [x for x in (recorded, None if out is None else out[0]) if x is not None]
    return Repro(all(checks), what, None if out is None else out[1]) if checks else None


# ------------------------------------------------------------------------------------------ positions
MAX_OFFSET = 3  # the constant offsets a base off by one (or a few) gives


def position_schemes(sample, k_values=(1, -1)) -> list[tuple[str, str, list[int]]]:
    """Every position scheme a known bug uses on this cycle: (scheme key, in words, positions)."""
    rec, start = sample.rec, sample.start
    if start is None or not has(rec, "tree_parents"):
        return []
    depth = C.depths_from(rec["tree_parents"].tolist())
    out = [("offset", f"start + depth {k:+d}", [start + k + d for d in depth]) for k in k_values]
    out.append(("index", "start + the node's flat index", [start + i for i in range(len(depth))]))
    for row, (request, s) in sorted(sample.batch.items()):
        if s is not None and s != start:
            out.append(("row", f"request {request}'s start + depth", [s + d for d in depth]))
    prev = sample.previous
    if prev is not None and has(prev, "tree_tokens", "accepted_nodes"):
        off = len(prev["tree_tokens"]) - len(prev["accepted_nodes"])
        if off:
            out.append(("rejected", f"start + depth + the {off} node(s) the previous step rejected",
                        [start + off + d for d in depth]))
    return out


def positions_by(key: str, field: bool = True):
    """The reproduction of one position scheme: the recorded verify positions (where held, and ``field``) and the
    target's logits at them (where held) are the scheme's. ``field`` False: the recorded positions passed their
    contract (what the engine meant), so only the output it ran tells."""
    def run(sample, env) -> Repro | None:
        rec = sample.rec
        k = recorded_offset(sample) if field else None
        if k is not None and not 0 < abs(k) <= MAX_OFFSET:
            k = None  # a larger constant is another scheme's (another row's start, the rejected nodes)
        right = [sample.start + d for d in C.depths_from(rec["tree_parents"].tolist())] if sample.start is not None \
            and "tree_parents" in rec else None
        # a scheme that gives the right positions on this tree (a chain by flat index) cannot tell here
        schemes = [s for s in position_schemes(sample, (k,) if k else (1, -1)) if s[0] == key and s[2] != right]
        recorded = rec["verify_positions"].tolist() if field and "verify_positions" in rec else None
        best = None
        for _, what, pos in schemes:
            got = judged(None if recorded is None else recorded == pos,
                         target_agrees(sample, env, pos), "positions = " + what)
            if got is not None and got.match:
                return got
            best = best or got
        return best
    return run


def recorded_offset(sample) -> int | None:
    """The recorded positions' constant offset from start + depth (None: not constant, or not recorded)."""
    rec = sample.rec
    if sample.start is None or not has(rec, "verify_positions", "tree_parents"):
        return None
    return C.positions_facts(rec["verify_positions"].tolist(), rec["tree_parents"].tolist(), sample.start)["offset"]


# ------------------------------------------------------------------------------------------ masks
def mask_schemes(parents: list[int]) -> dict:
    """Every mask a known bug builds for this tree, bool [n, n] each (row: the query node)."""
    n = len(parents)
    closure = C.ancestor_closure(parents)
    prev = closure.clone()
    prev[torch.arange(1, n), torch.arange(0, n - 1)] = True
    depth = torch.tensor(C.depths_from(parents))
    return {"previous": ("each node also sees the node before it in the flattened order", prev),
            "causal": ("a causal mask over the flattened order", torch.ones(n, n, dtype=torch.bool).tril()),
            "depth": ("each node sees every node of a smaller depth (a mask from positions)",
                      (depth[None, :] < depth[:, None]) | torch.eye(n, dtype=torch.bool))}


def mask_by(key: str, field: bool = True):
    """The reproduction of one mask: the recorded visibility (where held, and ``field``) and the target's logits
    under it (where held, on an attention-only target) are the mask's."""
    def run(sample, env) -> Repro | None:
        from workbench.conform.convert import dense_visibility

        rec = sample.rec
        if sample.start is None or not has(rec, "tree_parents"):
            return None
        parents = rec["tree_parents"].tolist()
        what, vis = mask_schemes(parents)[key]
        if torch.equal(vis, C.ancestor_closure(parents)):  # the wrong mask is the right one on this tree
            return None
        recorded = None
        if field and ("visibility_form" in rec or "visibility" in rec):
            try:
                recorded = bool(torch.equal(dense_visibility(rec)[:, -len(parents):].bool(), vis))
            except ValueError:
                recorded = False
        pos = [sample.start + d for d in C.depths_from(parents)]
        return judged(recorded, target_agrees(sample, env, pos, vis), "mask: " + what)
    return run


# ------------------------------------------------------------------------------------------ commit
def kv_in_tree_order(sample, env) -> Repro | None:
    """The commit kept the K/V rows of the tree's first L + 1 nodes (tree order) instead of the accepted path's:
    the recorded kept rows (where held), and the next root's logits from such a cache (where the next cycle
    showed a wrong root)."""
    rec = sample.rec
    if not has(rec, "accepted_nodes"):
        return None
    acc = rec["accepted_nodes"].tolist()
    kept = list(range(len(acc)))
    if kept == acc:  # the tree order is the path's here: this cycle cannot tell
        return None
    recorded = rec["kv_kept_nodes"].tolist() == kept if "kv_kept_nodes" in rec else None
    out = next_root(sample, env, kept, acc[-1])
    if out is None and not recorded:  # kept rows named as meant, and no output to tell what ran
        return None
    return judged(recorded if out is None else None, out, f"K/V rows of nodes {kept} (tree order), the accepted path "
                  f"{acc}")


def state_from_other_node(sample, env) -> Repro | None:
    """The commit kept the right K/V rows but the recurrent state after an earlier node of the accepted path than
    its last (the second-to-last first): the next root's logits from such a cache."""
    rec = sample.rec
    if not env.hybrid or sample.after is None or not has(rec, "accepted_nodes", "tree_tokens"):
        return None
    acc = rec["accepted_nodes"].tolist()
    order = acc[-2::-1]  # the accepted path's nodes before its last, nearest first (a rollback short of it)
    first = None
    for node in order:
        out = next_root(sample, env, acc, node)
        if out is None:
            return None
        which = "the accepted path's second-to-last node" if len(acc) > 1 and node == acc[-2] else f"node {node}"
        got = Repro(out[0], f"the recurrent state after {which} ({node}), the K/V rows of the accepted path", out[1])
        if got.match:
            return got
        first = first or got
    return first


def next_root(sample, env, kv_nodes: list[int], state_node: int) -> tuple[bool, float] | None:
    """The next cycle's root logits (recorded there) against the reference's after a commit keeping ``kv_nodes``'
    K/V and ``state_node``'s recurrent state. None: no next cycle blamed this commit, or fields lacking."""
    nxt = sample.after
    if not sample.clean or nxt is None or sample.ctx is None or nxt.ctx is None or not has(nxt.rec, "target_topk_ids",
                                                                       "target_topk_values"):
        return None
    if "caches" not in env.memo.setdefault(id(sample), {}):
        tokens, parents = tree_of(sample.rec)
        env.memo[id(sample)]["caches"] = R.PathCaches(env.models.target, sample.ctx[:-1], tokens, parents)
    caches = env.memo[id(sample)]["caches"]
    logits = R.root_after(caches, kv_nodes, state_node, nxt.ctx[-1], len(nxt.ctx) - 1)
    rec = nxt.rec
    return R.agreement(rec["target_topk_ids"][:1], rec["target_topk_values"][:1], logits[None], env.tol)


# ------------------------------------------------------------------------------------------ accept, drafter
def bonus_one_node_early(sample, env) -> Repro | None:
    """The bonus read at the accepted path's second-to-last node: the target's choice there is the last accepted
    token, so the bonus repeats it."""
    rec = sample.rec
    if rec.get("bonus") is None or not has(rec, "accepted_nodes", "tree_tokens"):
        return None
    acc, tokens = rec["accepted_nodes"].tolist(), rec["tree_tokens"].tolist()
    choice = (rec["target_choice"] if "target_choice" in rec else rec["target_topk_ids"][:, 0]
              if "target_topk_ids" in rec else None)
    if len(acc) < 2 or (choice is not None and int(choice[acc[-1]]) == tokens[acc[-1]]):
        return None  # no node before the last accepted one, or the right bonus repeats it too: this cycle cannot tell
    return Repro(rec["bonus"] == tokens[acc[-1]], f"the bonus = the target's choice at node {acc[-2]}, one node "
                 f"early (token {tokens[acc[-1]]}, the last accepted token again)")


def block_slot0_mask(sample, env) -> Repro | None:
    rec = sample.rec
    if "draft_block_tokens" not in rec:
        return None
    block = rec["draft_block_tokens"].tolist()
    return Repro(block == [env.models.mask_token_id] * len(block), "block slot 0 = the mask token, not the root")


def block_positions_shifted(sample, env) -> Repro | None:
    rec = sample.rec
    if sample.start is None or "draft_block_positions" not in rec:
        return None
    pos = rec["draft_block_positions"].tolist()
    k = pos[0] - sample.start
    return Repro(k != 0 and pos == [sample.start + k + j for j in range(len(pos))], f"block positions = start + "
                 f"slot {k:+d}")


def context_rows_late(sample, env) -> Repro | None:
    """The drafter's new context rows starting k rows late: the rows a commit hands it begin k positions after the
    previous root's (those k committed rows never reach the drafter), each at its own position and token."""
    rec, ctx, prev = sample.rec, sample.ctx, sample.previous
    if ctx is None or prev is None or prev.get("context_len") is None or not has(
            rec, "draft_context_positions", "draft_context_tokens"):
        return None
    pos, tok = rec["draft_context_positions"].tolist(), rec["draft_context_tokens"].tolist()
    first = prev["context_len"]
    for k in (1, 2, 3):
        if pos == list(range(first + k, sample.start)) and tok == ctx[first + k: sample.start]:
            return Repro(True, f"the new context rows start {k} row(s) late: positions {first}.."
                               f"{first + k - 1} (the previous root's on) never reach the drafter")
    return Repro(False, "the new context rows start late")


def drafter_block(kind: str):
    """The drafter's block as a bug hands it (``kind``: "causal" attention over the block, the mask token in
    "slot0", positions "shifted" by one): the engine's drafter top-k against the reference drafter's so, on the same
    context and features. (Its own context and features right: the candidate's upstream.)"""
    what = {"causal": "each block slot sees only the slots before it",
            "slot0": "block slot 0 = the mask token (the drafter's output from it)",
            "shifted": "the block one position on (the drafter's output from it)"}[kind]

    def run(sample, env) -> Repro | None:
        rec, ctx = sample.rec, sample.ctx
        if ctx is None or not has(rec, "draft_topk_ids", "draft_topk_values"):
            return None
        key = ("states", tuple(ctx))
        if key not in env.memo:
            env.memo[key] = env.ref.states(ctx[:-1]).drafter_features()
        logits = R.block_logits(env.models, ctx, env.models.block_size - 1, env.memo[key], causal=kind == "causal",
                                root=env.models.mask_token_id if kind == "slot0" else None,
                                shift=1 if kind == "shifted" else 0)
        if rec.get("draft_values", "logprobs") == "logprobs":
            logits = torch.log_softmax(logits, -1)
        ok, diff = R.agreement(rec["draft_topk_ids"], rec["draft_topk_values"], logits, env.tol)
        return Repro(ok, what, diff)
    return run


def state_parents_flattened(sample, env) -> Repro | None:
    rec = sample.rec
    if not has(rec, "state_from", "tree_parents"):
        return None
    got, parents = rec["state_from"].tolist(), rec["tree_parents"].tolist()
    if parents == list(range(-1, len(parents) - 1)):  # a chain: the flattened order is its parents
        return None
    return Repro(C.state_parents_facts(got, parents)["flattened"], "state parents = the node before in the flattened "
                 "order")
