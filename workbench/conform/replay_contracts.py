"""Each contract of ``workbench.conform.contracts.CONTRACTS`` held on one replayed cycle, one function each.

Every function takes the replay (``workbench.conform.replay.Replay``: its ``needs`` / ``skip`` / ``verdict``
bookkeeping, the loaded pair, the reference drafter, the tolerances) and the ``Cycle``
(``workbench.conform.replay_reference``), feeds the contract's pure function (``workbench.conform.contracts``)
the record's fields and the reference's side, and records one verdict, or why the cycle was not checked.
``CHECKS`` maps each contract's name to its function, in the order data flows through a step.
"""
from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from workbench.conform import contracts as C
from workbench.conform import features
from workbench.conform.calibrated_trees import calibrated_tree, is_calibrated
from workbench.conform.feature_contract import features_problem
from workbench.conform.replay_reference import Cycle, chain_logits

NEEDS = {  # the fields each contract reads (besides the committed context); a cycle without them is not checked
    "drafter context": ("draft_context_tokens", "draft_context_positions"),
    "drafter features": ("draft_context_positions",),  # and the features, whole or their digest (has_features)
    "drafter output": ("draft_topk_ids", "draft_topk_values"),
    "tree": ("tree_tokens", "tree_parents"),
    "verify positions": ("verify_positions", "tree_parents"),
    "visibility": ("visibility_form", "tree_parents"),
    "recurrent-state parents": ("state_from", "tree_parents"),
    "target logits": ("target_topk_ids", "target_topk_values", "tree_tokens", "tree_parents"),
    "accept walk": ("tree_tokens", "tree_parents", "accepted_nodes"),
    "committed tokens": ("accepted_nodes", "tree_tokens"),
}
# these read the committed context too
CONTEXT_CONTRACTS = ("drafter context", "drafter features", "drafter output", "target logits")
# counted "not checked" on a cycle whose request's committed context is unknown
UNKNOWN_CONTEXT = ("drafter context", "drafter output", "target logits")
NO_REQUEST = "no request record (the committed context is unknown)"
# a malformed tree is named by the tree contract; these cannot read it
READ_THE_TREE = C.CONTRACTS[C.CONTRACTS.index("verify positions"):]
DIAGNOSED_CYCLES = 8  # broken features cycles whose rows are also held against the previous tree's nodes


def as_list(rec, name: str) -> list | None:
    """A record's field as a list, None when the record lacks it."""
    return rec[name].tolist() if name in rec else None


def drafter_context(replay, cy: Cycle) -> None:
    """Every committed position reached the drafter, with its own token; the block after the root as the drafter
    takes it."""
    rec, ctx, start, mask = cy.rec, cy.ctx, cy.start, cy.models.mask_token_id
    if ctx is None or not replay.needs("drafter context", rec):
        return
    pos, tok = rec["draft_context_positions"].tolist(), rec["draft_context_tokens"].tolist()
    cy.rq.seen.update(zip(pos, tok))
    problem = C.drafter_context_problem(cy.rq.seen, ctx, start)
    if problem is None and ("draft_block_tokens" in rec or "draft_block_positions" in rec):
        problem = C.block_problem(as_list(rec, "draft_block_tokens"), as_list(rec, "draft_block_positions"), ctx[-1],
                                  mask, start)
    replay.verdict("drafter context", rec, problem, cy.cost, C.context_facts(
        as_list(rec, "draft_block_tokens"), as_list(rec, "draft_block_positions"), ctx[-1], mask,
        start) if problem is not None else None)


def drafter_features(replay, cy: Cycle) -> None:
    """The drafter-features contract (``workbench.conform.feature_contract``): each context row the drafter
    was handed against the target's own features at its position and the drafter's layers, and what a differing
    row equals instead (the previous step's tree nodes only for the first few broken cycles: a forward of its
    paths each)."""
    rec, rq = cy.rec, cy.rq
    if cy.ctx is None:
        return
    if not features.has_features(rec) or "draft_context_positions" not in rec:
        replay.skip("drafter features", "no draft_context_features (nor its digest)" if "draft_context_positions"
                    in rec else "no draft_context_positions")
        return
    if replay.features is None:  # prescan refused features without a header form
        return
    previous = None
    if rq.previous is not None and replay.diagnosed < DIAGNOSED_CYCLES:
        previous = partial(_previous_tree, replay, cy.ctx, rq.previous[0])
    engine = features.EngineRows(rec, replay.features, replay.feature_tol)
    v = features_problem(engine, rec["draft_context_positions"].tolist(), cy.states(),
                         list(replay.models.target_layer_ids), previous)
    if not v.checked:
        replay.skip("drafter features", "no context row at a committed position")
        return
    replay.verdict("drafter features", rec, v.problem, cy.cost, v.facts if v.problem else None)


def _previous_tree(replay, ctx: list, prev):
    """(the previous step's tree nodes' states, its accepted nodes), a forward of its paths; None when its record
    lacks the fields."""
    need = ("tree_tokens", "tree_parents", "accepted_nodes", "context_len")
    if not all(f in prev for f in need):
        return None
    replay.diagnosed += 1
    nodes = replay.ref.node_states(ctx[: prev["context_len"]], prev["tree_tokens"].tolist(),
                                   prev["tree_parents"].tolist())
    return nodes, set(prev["accepted_nodes"].tolist())


def drafter_output(replay, cy: Cycle) -> None:
    """The engine's top-k per slot against the reference drafter on the same context."""
    rec = cy.rec
    if cy.ctx is None or not replay.needs("drafter output", rec):
        return
    ids, vals = rec["draft_topk_ids"], rec["draft_topk_values"]
    logprobs = cy.kind == "logprobs"
    ref = cy.ref_logprobs(ids.shape[0]) if logprobs else cy.ref_logits(ids.shape[0])
    problem, near = C.topk_problem(ids, vals, ref, replay.tol, "slot", "log-prob" if logprobs else "logit")
    replay.results["drafter output"].near_ties += near
    replay.verdict("drafter output", rec, problem, cy.cost, C.top1_facts(ids, ref) if problem is not None else None)


def tree(replay, cy: Cycle) -> None:
    """The exact best-N tree for the engine's own drafter output; a malformed tree needs no drafter output to be
    named."""
    rec, drafted = cy.rec, ("draft_topk_ids", "draft_topk_values")
    if cy.shape is not None and not all(f in rec for f in drafted):
        replay.verdict("tree", rec, cy.shape, lambda: (None, None))
    elif replay.needs("tree", rec, drafted):
        _tree_verdict(replay, cy)


def _tree_verdict(replay, cy: Cycle) -> None:
    rec, tokens, parents, shape, policy = cy.rec, cy.tokens, cy.parents, cy.shape, cy.rq.policy
    if is_calibrated(policy):  # rebuilt from the pair's calibration, or not checked, saying what it would need
        want, why = calibrated_tree(policy, rec, cy.kind, replay.models) if shape is None else (None, "")
        if shape is None and want is None:
            replay.skip("tree", why)
        else:  # a malformed tree is broken whatever the policy's rule
            replay.verdict("tree", rec, shape or C.tree_problem(tokens, parents, want), cy.cost)
        return
    if not C.rebuilds(policy):
        replay.skip("tree", f"policy {policy} (the checker rebuilds DFlash, DDTree, PathTree, PairTree and "
                            "PairChain trees)")
        return
    if shape is not None:
        replay.verdict("tree", rec, shape, lambda: (None, None))
        return
    ids, vals = rec["draft_topk_ids"].long(), rec["draft_topk_values"].float()
    if policy.kind == "dflash":
        replay.verdict("tree", rec, C.tree_problem(tokens, parents, _argmax_chain(tokens, ids, vals)), cy.cost)
        return
    if cy.kind != "logprobs":
        replay.skip("tree", "draft values are logits' top-k: a DDTree's path scores need log-probs")
        return
    D, k = ids.shape
    lp = torch.full((D, replay.models.target.config.get_text_config(decoder=True).vocab_size), float("-inf"))
    lp.scatter_(1, ids, vals)
    want = C.reference_tree(lp, tokens[0], policy)
    need = min(policy.budget, policy.width or policy.budget)
    if k < need and not _exact_from_topk(want, lp, vals):
        replay.skip("tree", f"the draft top-{k} is too short to rebuild a {policy} tree exactly")
        return
    replay.verdict("tree", rec, C.tree_problem(tokens, parents, want), cy.cost)


def _argmax_chain(tokens: list[int], ids: Tensor, vals: Tensor) -> dict:
    """DFlash's tree: the argmax chain, the top-1 of each slot (log-probs or logits alike) after the root."""
    best = vals.max(dim=1, keepdim=True).values
    first = torch.where(vals == best, ids, torch.iinfo(torch.long).max).min(dim=1).values  # lowest id on ties
    n = min(len(tokens) - 1, first.shape[0])  # a chain cut short by the token limit verifies fewer slots
    chain = [int(t) for t in first[:n]] if len(tokens) - 1 <= first.shape[0] else [int(t) for t in first]
    return {"tokens": [tokens[0]] + chain, "parents": list(range(-1, len(chain)))}


def _exact_from_topk(want: dict, lp: Tensor, vals: Tensor) -> bool:
    """A tree rebuilt from each slot's top-k is the exact one when no token past rank k could have entered it:
    every node's best unseen child (its score plus the slot's k-th value, an upper bound) scores below the
    tree's last node."""
    tokens, parents = want["tokens"], want["parents"]
    depth = C.depths_from(parents)
    score = [0.0] * len(tokens)
    for i in range(1, len(tokens)):
        score[i] = score[parents[i]] + float(lp[depth[i] - 1, tokens[i]])
    floor = min(score[1:], default=0.0)
    kth = vals[:, -1].tolist()
    return all(score[i] + kth[depth[i]] < floor for i in range(len(tokens)) if depth[i] < len(kth))


def verify_positions(replay, cy: Cycle) -> None:
    """The root's position plus depth; the tree's tokens as input ids."""
    rec, start, parents = cy.rec, cy.start, cy.parents
    if start is None:
        replay.skip("verify positions", "no context_len and no request record")
    elif replay.needs("verify positions", rec):
        pos = rec["verify_positions"].tolist()
        problem = C.positions_problem(pos, parents, start, rec["verify_ids"].tolist() if "verify_ids" in rec
                                      else None, cy.tokens)
        replay.verdict("verify positions", rec, problem, cy.cost,
                       C.positions_facts(pos, parents, start) if problem is not None else None)


def visibility(replay, cy: Cycle) -> None:
    """The ancestor closure, from whichever form the engine held."""
    from workbench.conform.convert import dense_visibility

    if cy.start is None or not replay.needs("visibility", cy.rec):
        return
    try:
        dense = dense_visibility(cy.rec)
    except ValueError as e:  # e.g. FlashInfer bytes that do not fit the request: the engine's indptr
        problem = " ".join(str(e).split())
    else:
        problem = C.visibility_problem(dense, cy.parents, cy.start)
    replay.verdict("visibility", cy.rec, problem, cy.cost)


def recurrent_state_parents(replay, cy: Cycle) -> None:
    """Each node continued its parent's recurrent state (hybrid targets)."""
    rec = cy.rec
    if not replay.hybrid:
        replay.skip("recurrent-state parents", "an attention-only target has none")
    elif replay.needs("recurrent-state parents", rec):
        state_from = rec["state_from"].tolist()
        problem = C.state_parents_problem(state_from, cy.parents)
        replay.verdict("recurrent-state parents", rec, problem, cy.cost,
                       C.state_parents_facts(state_from, cy.parents) if problem is not None else None)


def target_logits(replay, cy: Cycle) -> None:
    """Every node against the path oracle on the committed context. A wrong root, its inputs right, is the state
    the previous step committed: counted against that step's commit too (``Replay.committed_state``)."""
    rec, start = cy.rec, cy.start
    if cy.ctx is None or not replay.needs("target logits", rec):
        return
    oracle = chain_logits(replay.models.target, cy.ctx[:-1], cy.tokens, cy.parents)
    ids, vals = rec["target_topk_ids"], rec["target_topk_values"]
    problem, near = C.topk_problem(ids, vals, oracle, replay.tol, "node", "logit")
    replay.results["target logits"].near_ties += near
    replay.verdict("target logits", rec, problem, cy.cost)
    root, _ = C.topk_problem(ids[:1], vals[:1], oracle[:1], replay.tol, "node", "logit")
    root_inputs_ok = start is not None and "verify_positions" in rec and int(rec["verify_positions"][0]) == start
    if root is not None and root_inputs_ok and cy.rq.previous is not None:
        replay.committed_state(cy.rq.previous, root)


def accept_walk(replay, cy: Cycle) -> None:
    """The accept walk along the engine's own choices."""
    rec = cy.rec
    if not replay.needs("accept walk", rec):
        return
    choice = (rec["target_choice"] if "target_choice" in rec else
              rec["target_topk_ids"][:, 0] if "target_topk_ids" in rec else None)
    if choice is None:
        replay.skip("accept walk", "no target_choice or target_topk_ids")
        return
    replay.verdict("accept walk", rec, C.accept_problem(
        cy.tokens, cy.parents, choice.tolist(), rec["accepted_nodes"].tolist(), rec.get("bonus"),
        last=cy.rq.ends_with(as_list(rec, "committed_tokens"))), cy.cost)


def committed_tokens(replay, cy: Cycle) -> None:
    """The accepted drafts then the bonus, K/V kept in path order, the engine's count."""
    rec, ctx, start, tokens = cy.rec, cy.ctx, cy.start, cy.tokens
    if not replay.needs("committed tokens", rec):
        return
    acc = rec["accepted_nodes"].tolist()
    problem = None
    if start is not None and rec.get("context_len") is not None and rec["context_len"] != start:
        problem = (f"context_len {rec['context_len']} but {start} tokens are committed before the root")
    elif ctx is not None and rec.get("root_token") is not None and rec["root_token"] != ctx[-1]:
        problem = f"root_token {rec['root_token']}, the last committed token is {ctx[-1]}"
    if problem is None and all(0 <= a < len(tokens) for a in acc):
        committed = as_list(rec, "committed_tokens")
        problem = C.commit_problem(committed, [tokens[a] for a in acc], rec.get("bonus"),
                                   as_list(rec, "kv_kept_nodes"), acc, rec.get("next_context_len"),
                                   start if start is not None else 0, last=cy.rq.ends_with(committed))
    replay.verdict("committed tokens", rec, problem, cy.cost, {"state": False, "hybrid": replay.hybrid}
                   if problem is not None else None)


CHECKS = {  # in C.CONTRACTS order: the order data flows through a step
    "drafter context": drafter_context,
    "drafter features": drafter_features,
    "drafter output": drafter_output,
    "tree": tree,
    "verify positions": verify_positions,
    "visibility": visibility,
    "recurrent-state parents": recurrent_state_parents,
    "target logits": target_logits,
    "accept walk": accept_walk,
    "committed tokens": committed_tokens,
}
