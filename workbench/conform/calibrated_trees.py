"""The tree contract for the calibrated policies (``docs/calibrated-policies.md``): the tree a policy builds from a
dump's drafter top-k, rebuilt here, or one line saying what a rebuild would need.

PathTree, PairTree and PairChain are deterministic given the pair's calibration file and each slot's top-k
log-probs. The calibration turns every candidate into an increment (PathTree: the path model's log q for each
path state of the parent; PairTree and PairChain: the pair head's log q for each parent token); the tree is then
the best prefixes under the documented tie rule (``ddtree_kernels.path_tree``) and the chain the best path
through the slots. The selection is written here from the rule's words with plain lists (a linear scan over
every open candidate, a dynamic programme for the chain), sharing no code with the engine's builds (its heap,
its per-depth beams, its tensor Viterbi); the increments are the calibration's own, which is what defines these
policies. Scores add in the same order as the builds (parent's score + increment, float64), so equal inputs give
equal sums.

CostTree and CutTree are not rebuilt: what a cycle of theirs verifies depends on how the engine ran it, which a
cycle record does not hold (CostTree's node count and CutTree's calibrated threshold are chosen for the rows
drafting together; under static shapes both verify their whole tree). The contract reports them as not checked,
with the reason, never as passed.
"""
from __future__ import annotations

from ddtree_kernels.path_tree import OFF, SIBLING, SPINE

# what a rebuild of the policies this module does not rebuild would need, by registered kind
NOT_REBUILT = {
    "costed": "the rows that drafted together in each cycle and whether shapes were static (its node count is "
              "chosen per cycle from the step cost at those rows)",
    "cut": "the rows that drafted together in each cycle and whether shapes were static (its cut is read at a "
           "threshold chosen per batch size, and static shapes verify the whole tree)",
}
# CutTree with its threshold given: the cut depends only on static shapes, not on the rows
CUT_AT_GIVEN_THRESHOLD = ("whether shapes were static (static shapes verify the whole tree, dynamic ones cut it at "
                          "the threshold)")
REBUILT = ("path", "pairtree", "pairchain")


def is_calibrated(policy) -> bool:
    """Whether the tree contract of ``policy`` is this module's (a label the registry could not parse is not)."""
    return getattr(policy, "kind", None) in (*REBUILT, *NOT_REBUILT)


def candidates(policy, cal) -> int:
    """The top-k per slot the policy's build reads (its settings, capped by what the calibration was fitted on)."""
    size = policy.width if policy.kind == "pairchain" else policy.budget
    return min(size, cal.width)


def calibrated_tree(policy, rec, kind: str, models) -> tuple[dict | None, str]:
    """The tree ``policy`` builds from the cycle record's drafter top-k on ``models``' pair: ({"tokens",
    "parents"}, '') or (None, '<policy> rebuilds need <what>')."""
    from workbench.models.identity import pair_identity
    from workbench.engine.policies.pair_head import conditioned_increments

    if policy.kind in NOT_REBUILT:
        given = policy.kind == "cut" and policy.threshold is not None
        return None, f"{policy} rebuilds need {CUT_AT_GIVEN_THRESHOLD if given else NOT_REBUILT[policy.kind]}"
    if kind != "logprobs":
        return None, f"{policy} rebuilds need the drafter's log-probs (the dump holds its logits' top-k)"
    pair = pair_identity(models)
    try:
        cal = policy.for_pair(pair).calibration_data()
        head = None if policy.kind == "path" else cal.head(pair)
    except ValueError as e:  # CalibrationError: the file, or the shipped one for this pair, cannot be used here
        return None, f"{policy} rebuilds need a calibration made on this pair ({e})"
    ids, vals = rec["draft_topk_ids"].long(), rec["draft_topk_values"].float()  # [D, K], rank order
    vocab = int(models.target.config.get_text_config().vocab_size)
    k = min(candidates(policy, cal), vocab)
    if ids.shape[1] < k:
        return None, (f"{policy} rebuilds need the drafter's top-{k} per slot (the dump holds its top-{ids.shape[1]}: "
                      f"write it with record_topk={k} or more)")
    topv, topi, root = vals[None, :, :k], ids[None, :, :k], int(rec["tree_tokens"][0])
    if policy.kind == "path":
        inc = cal.model.log_q(topv)[0].tolist()  # [D][k][state]
        return best_prefixes(inc, topi[0].tolist(), root, policy.budget, path_state, SPINE), ""
    head_model, beta = head
    inc = conditioned_increments(head_model, topv, topi, topi.new_tensor([root]), beta)[0].tolist()  # [D][k][parent]
    if policy.kind == "pairtree":
        return best_prefixes(inc, topi[0].tolist(), root, policy.budget, parent_rank, 0), ""
    return best_chain(inc, topi[0].tolist(), root), ""


def path_state(parent_state: int, rank: int) -> int:
    """The path state a node hands its children: a rank >= 1 node starts a sibling path; a top-1 node keeps the
    spine only below the spine, and is off it below anything else."""
    if rank > 0:
        return SIBLING
    return SPINE if parent_state == SPINE else OFF


def parent_rank(parent_class: int, rank: int) -> int:
    """PairTree's classes: a node's children are scored given its own token, i.e. its rank in its slot."""
    return rank


def best_prefixes(inc: list, ids: list, root: int, budget: int, child_class, root_class: int) -> dict:
    """The ``budget`` best prefixes, one node at a time, by the rule's own words: among every child of every node
    not yet taken, the best by score descending, then depth ascending, then parent index ascending, then the
    child's position among its siblings (increment descending, equal increments by rank).

    inc [D][k][class]: candidate j of slot d's increment under a parent of that class; ids [D][k]."""
    D, k = len(inc), len(ids[0])
    tokens, parents, depth, score, cls = [root], [-1], [0], [0.0], [root_class]
    open_: dict = {}  # (parent node, rank) -> sort key

    def open_children(node: int) -> None:
        d = depth[node]
        if d == D:
            return
        c = cls[node]
        order = sorted(range(k), key=lambda j: (-inc[d][j][c], j))
        for pos, j in enumerate(order):
            s = score[node] + inc[d][j][c]
            open_[node, j] = (-s, d + 1, node, pos, s)

    open_children(0)
    while open_ and len(tokens) <= budget:
        (par, j), (_, d, _, _, s) = min(open_.items(), key=lambda kv: kv[1][:4])
        del open_[par, j]
        tokens.append(ids[d - 1][j])
        parents.append(par)
        depth.append(d)
        score.append(s)
        cls.append(child_class(cls[par], j))
        open_children(len(tokens) - 1)
    return {"tokens": tokens, "parents": parents}


def best_chain(inc: list, ids: list, root: int) -> dict:
    """PairChain's chain: one candidate per slot, the sequence with the highest summed increment (each under the
    previous slot's chosen candidate; slot 0 under the root, class 0), the first index winning a tie at every
    choice. inc [D][k][parent rank]; ids [D][k]."""
    D, k = len(inc), len(ids[0])
    best = [inc[0][j][0] for j in range(k)]  # the best chain ending in candidate j of the slot so far
    back = []
    for d in range(1, D):
        new, arg = [], []
        for j in range(k):
            cand = [best[c] + inc[d][j][c] for c in range(k)]
            top = max(cand)
            new.append(top)
            arg.append(cand.index(top))
        best = new
        back.append(arg)
    ranks = [best.index(max(best))]
    for arg in reversed(back):
        ranks.append(arg[ranks[-1]])
    ranks.reverse()
    return {"tokens": [root] + [ids[d][r] for d, r in enumerate(ranks)], "parents": list(range(-1, D))}


__all__ = ["NOT_REBUILT", "REBUILT", "best_chain", "best_prefixes", "calibrated_tree", "is_calibrated"]
