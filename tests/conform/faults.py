"""Planted faults (test-only): each breaks one contract of the workbench's own engine by monkeypatching a stage, a
kernel the stage calls, or a model state, the way a production integration gets it wrong. Every fault keeps the
engine running (and its output close to lossless): only a checker that holds each contract against the reference
can say which one broke. Nothing here is imported by the package.

Each function takes pytest's ``monkeypatch`` and names, in ``CONTRACT``, the contract the checker must name first.
"""
from __future__ import annotations

import dataclasses
import importlib

import torch

from ddtree_kernels import Tree


def positions_by_index(monkeypatch) -> str:
    """Tree positions by node index instead of depth (siblings at different positions)."""
    stage = importlib.import_module("workbench.engine.stages.tree_compile")  # the module (the package exports the function)
    original = stage.compile_tree

    def compile_tree(tree, start, max_depth=None):
        c = original(tree, start, max_depth)
        n = tree.tokens.shape[1]
        return dataclasses.replace(c, positions=c.positions[:, :1] + torch.arange(n, device=c.positions.device))

    monkeypatch.setattr(stage, "compile_tree", compile_tree)
    return "verify positions"


def ancestor_dropped(monkeypatch) -> str:
    """One ancestor dropped from the visibility: the deepest node does not see its parent."""
    stage = importlib.import_module("workbench.engine.stages.tree_compile")  # the module (the package exports the function)
    original = stage.compile_tree

    def compile_tree(tree, start, max_depth=None):
        c = original(tree, start, max_depth)
        depth = tree.depth[0]
        if int(depth.max()) < 2:
            return c
        i = int(torch.nonzero(depth == depth.max())[-1])
        vis = c.visibility.clone()
        vis[0, i, int(tree.parents[0, i])] = False
        return dataclasses.replace(c, visibility=vis)

    monkeypatch.setattr(stage, "compile_tree", compile_tree)
    return "visibility"


def siblings_dropped(monkeypatch) -> str:
    """Siblings dropped from the tree: only the rank-0 chain of the built tree is verified."""
    from workbench.engine import stages

    build = importlib.import_module("workbench.engine.stages.tree_build")  # the checked build calls it by name
    original = build.tree_build_rows

    def tree_build_rows(policies, drafted, roots, device, sync_free=False):
        return [chain_of(t) for t in original(policies, drafted, roots, device, sync_free)]

    def chain_of(t):
        keep, on_chain = [], {}
        for i, (p, r) in enumerate(zip(t.parents[0].tolist(), t.rank[0].tolist())):
            if p < 0 or (r == 0 and on_chain.get(p)):
                on_chain[i] = True
                keep.append(i)
        idx = torch.tensor(keep, device=t.tokens.device)
        n = len(keep)
        par = torch.arange(-1, n - 1, device=t.tokens.device)[None]
        return Tree(t.tokens[:, idx], par, t.depth[:, idx], t.rank[:, idx], t.score[:, idx])

    monkeypatch.setattr(stages, "tree_build_rows", tree_build_rows)
    monkeypatch.setattr(build, "tree_build_rows", tree_build_rows)
    return "tree"


def drafter_context_shifted(monkeypatch) -> str:
    """The drafter's context one row off: the first row a commit hands it (the previous root's) is lost, so
    every later row lands one K/V slot early (a host mirror of the drafter's length off by one)."""
    from workbench.models import DraftKV

    original = DraftKV.add_context

    def add_context(self, features):
        return original(self, [None if f is None else f[:, 1:] for f in features])

    monkeypatch.setattr(DraftKV, "add_context", add_context)
    return "drafter context"


def stale_state_parent(monkeypatch) -> str:
    """Hybrid targets: every node's recurrent state continues from the node before it in the flattened order
    (a stale parent index, as a naive flattened scan reads it), not from its own parent."""
    from workbench.models import HybridGDN

    original = HybridGDN.verify

    def verify(self, layout, mode=None):
        n = layout.N
        stale = torch.arange(-1, n - 1, device=layout.parents.device).expand_as(layout.parents).clone()
        t = layout.tree
        wrong = dataclasses.replace(layout, tree=Tree(t.tokens, stale, t.depth, t.rank, t.score), _hops=None)
        return original(self, wrong) if mode is None else original(self, wrong, mode)

    monkeypatch.setattr(HybridGDN, "verify", verify)
    return "recurrent-state parents"


def kv_out_of_path_order(monkeypatch) -> str:
    """After accept, K/V rows kept in tree order, not path order: the first L + 1 rows of the verified tree stay
    (no compaction), so wherever the accepted path is not nodes 0..L, rows of rejected nodes stand in for it."""
    from workbench.models import DenseKV

    original = DenseKV.commit

    def commit(self, layout, nodes):
        return original(self, layout, [torch.arange(x.shape[0], device=x.device) for x in nodes])

    monkeypatch.setattr(DenseKV, "commit", commit)
    return "committed tokens"


def vllm_block_positions_shifted(monkeypatch) -> str:
    """vLLM (0.32): its DFlash proposer writes the block's positions (root, then masks) into ``self.positions``;
    move them one on after it has (the context's positions and every slot mapping are left as they were)."""
    from vllm.v1.spec_decode.dflash import DFlashProposer

    original = DFlashProposer.set_inputs_first_pass

    def shifted(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        self.positions[: out[0]] += 1  # out[0]: the block's rows over the batch
        return out

    monkeypatch.setattr(DFlashProposer, "set_inputs_first_pass", shifted)
    return "drafter context"


# ------------------------------------------------------------------------------------------ integrators' bugs
# The bugs integrators report publicly (shared/reference/field-2026-12-05.md, section 2), planted the way
# each happens in an engine. CAUSE names the catalogue entry (workbench.conform.causes) its evidence must match.


def bonus_missing_from_block(monkeypatch) -> str:
    """The block's slot 0 filled with the mask token instead of the bonus token (warpfront/hipfire #483)."""
    from workbench.models import DraftKV

    original = DraftKV.draft

    def draft(self, roots, starts, observe=None):
        return original(self, [self.models.mask_token_id] * len(roots), starts, observe)

    monkeypatch.setattr(DraftKV, "draft", draft)
    return "drafter context"


def target_layer_off_by_one(monkeypatch) -> str:
    """The target's features read one layer early: transformers' ``hidden_states[k]`` where the drafter's layer k
    is ``hidden_states[k + 1]`` (vllm-project/vllm #42704). The target's own logits are untouched."""
    from workbench.models import dense_target, hybrid
    from workbench.models.run import run_target

    def shifted(target, ids, positions, cache, mode, layer_ids, *args, **kwargs):
        return run_target(target, ids, positions, cache, mode, None if layer_ids is None else
                          [i - 1 for i in layer_ids], *args, **kwargs)

    for module in (dense_target, hybrid):
        monkeypatch.setattr(module, "run_target", shifted)
    return "drafter features"


def features_off_by_a_row(monkeypatch) -> str:
    """Every committed row hands the drafter the features of the row before it (a host mirror indexed one
    off): position p carries p - 1's features. One state's rows as they start (a session's; a batch that retires
    rows would misalign the tails, and the tests run it solo)."""
    from workbench.models import DraftKV

    start, add = DraftKV.start, DraftKV.add_context
    tails: dict = {}  # id(state) -> per row, the last feature row handed over [1, 1, F]

    def begin(self, features):
        tails[id(self)] = [f[:, -1:] for f in features]
        return start(self, features)

    def add_context(self, features):
        lagged = []
        for b, f in enumerate(features):
            if f is None:
                lagged.append(None)
                continue
            joined = torch.cat([tails[id(self)][b], f], dim=1)  # [1, 1 + k, F]
            tails[id(self)][b] = f[:, -1:]
            lagged.append(joined[:, :-1])
        return add(self, lagged)

    monkeypatch.setattr(DraftKV, "start", begin)
    monkeypatch.setattr(DraftKV, "add_context", add_context)
    return "drafter features"


def features_not_compacted(monkeypatch) -> str:
    """After accept, the drafter gets the features of the verified tree's first L + 1 nodes in tree order, not of
    the accepted path (a host mirror of hidden states not compacted: warpfront/hipfire #272)."""
    from workbench.engine import stages

    original = stages.commit

    def commit(state, layout, accepted, features, *rest):
        out = original(state, layout, accepted, features, *rest)
        if features is None:
            return out
        return [dataclasses.replace(c, context=features[b : b + 1, : c.nodes.shape[0]]) for b, c in enumerate(out)]

    monkeypatch.setattr(stages, "commit", commit)
    return "drafter features"


def positions_off_by_one(monkeypatch) -> str:
    """Every verified node one position past its own (start + depth + 1): a flat position / tree node off by one
    (patrickbdevaney docs/DDTREE.md)."""
    stage = importlib.import_module("workbench.engine.stages.tree_compile")
    original = stage.compile_tree

    def compile_tree(tree, start, max_depth=None):
        c = original(tree, start, max_depth)
        return dataclasses.replace(c, positions=c.positions + 1)

    monkeypatch.setattr(stage, "compile_tree", compile_tree)
    return "verify positions"


def drafter_head_not_shared(monkeypatch) -> str:
    """The drafter projects with an LM head of its own (random, as an unloaded one is) instead of the target's
    (local-inference-lab/vllm #54: acceptance length 1.00)."""
    from workbench.models import drafter

    original = drafter.run_draft
    heads: dict = {}

    class OwnHead:
        """The target as the drafter's forward sees it, but for its LM head."""

        def __init__(self, target):
            w = target.lm_head.weight
            self.target, self.lm_head = target, torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
            g = torch.Generator().manual_seed(0)
            self.lm_head.weight.data = (torch.randn(w.shape, generator=g) * float(w.float().std())).to(w.dtype)

        def __getattr__(self, name):
            return getattr(self.target, name)

    def run_draft(draft, target, *args, **kwargs):
        return original(draft, heads.setdefault(id(target), OwnHead(target)), *args, **kwargs)

    monkeypatch.setattr(drafter, "run_draft", run_draft)
    return "drafter output"


def recurrent_state_from_wrong_node(monkeypatch) -> str:
    """Hybrid targets: after accept, the linear layers keep the recurrent state of the accepted path's
    second-to-last node (one token short), while the attention layers keep the right K/V rows (an approximate
    rollback: Luce-Org/lucebox #414)."""
    from workbench.models import HybridGDN, hybrid

    commit, commit_nodes = HybridGDN.commit, hybrid.commit_nodes
    short: dict = {}

    def nodes_short(conv, ssm, last):
        return commit_nodes(conv, ssm, short.get("last", last))

    def wrong(self, layout, nodes):
        short["last"] = torch.stack([x[-2] if x.shape[0] > 1 else x[-1] for x in nodes])
        try:
            return commit(self, layout, nodes)
        finally:
            short.clear()

    monkeypatch.setattr(hybrid, "commit_nodes", nodes_short)
    monkeypatch.setattr(HybridGDN, "commit", wrong)
    return "committed tokens"


def features_before_final_norm(monkeypatch) -> str:
    """For a drafter that reads the target's last layer: that layer's features taken before the final norm (as
    vLLM 0.32 does). Only a pair whose drafter reads the last layer shows it (tests/vllm_pairs.last_layer_pair)."""
    from workbench.models import dense_target
    from workbench.models.run import run_target

    def prenorm(target, ids, positions, cache, mode, layer_ids, *args, **kwargs):
        seen = []  # a pre-hook on the final norm reads its input (the engine's own forward steps aside for it)
        handle = target.model.norm.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0]))
        try:
            out = run_target(target, ids, positions, cache, mode, layer_ids, *args, **kwargs)
        finally:
            handle.remove()
        if out.features is not None and layer_ids and layer_ids[-1] == target.config.num_hidden_layers - 1:
            H = seen[-1].shape[-1]
            out.features[..., -H:] = seen[-1]  # the last chunk is the last layer's: now before the norm
        return out

    monkeypatch.setattr(dense_target, "run_target", prenorm)
    return "drafter features"


# ------------------------------------------------------------------------------------------ diagnosed classes
# Bug classes the diagnosis reproduces (workbench.conform.suspects), planted the way an integration gets them wrong.


def compile_with(monkeypatch, edit) -> None:
    """Every cycle's tree compile, each row's ``CompiledTree`` passed through ``edit(c, tree, b, starts)``."""
    from workbench.engine import stages

    stage = importlib.import_module("workbench.engine.stages.tree_compile")
    original, inner = stages.tree_compile, stage.compile_tree

    def tree_compile(trees, starts, max_depths, nodes=None):
        row = iter(range(len(trees)))

        def compile_tree(tree, start, max_depth=None):
            return edit(inner(tree, start, max_depth), tree, next(row), starts)

        stage.compile_tree = compile_tree  # for this call only: the module's own name, restored after
        try:
            return original(trees, starts, max_depths, nodes)
        finally:
            stage.compile_tree = inner

    monkeypatch.setattr(stages, "tree_compile", tree_compile)


def positions_from_first_row(monkeypatch) -> str:
    """Batches: every row's tree positions computed from the first row's start (one base for the batch)."""
    compile_with(monkeypatch, lambda c, tree, b, starts: dataclasses.replace(c, positions=c.positions - starts[b]
                                                                              + starts[0]))
    return "verify positions"


def positions_counting_rejected(monkeypatch) -> str:
    """The tree's base position advanced by every node the previous step verified, not only the accepted ones (a
    host mirror of the computed length that never subtracts the rejected nodes). One session (row 0)."""
    from workbench.engine import stages

    accept, last = stages.accept, {}

    def counting(backend, layout, verified):
        out = accept(backend, layout, verified)
        last["rejected"] = layout.n[0] - 1 - int(out.length[0])  # verified drafts not accepted
        return out

    compile_with(monkeypatch, lambda c, tree, b, starts: dataclasses.replace(
        c, positions=c.positions + last.get("rejected", 0)))
    monkeypatch.setattr(stages, "accept", counting)
    return "verify positions"


def wrong_mask(parents: torch.Tensor, scheme: str) -> torch.Tensor:
    """bool [1, n, n]: a known wrong tree mask for parents [1, n] (the workbench's own rule for each scheme)."""
    from workbench.conform import contracts as C

    par = parents[0].tolist()
    n = len(par)
    vis = C.ancestor_closure(par)
    if scheme == "previous":
        vis[torch.arange(1, n), torch.arange(0, n - 1)] = True
    elif scheme == "causal":
        vis = torch.ones(n, n, dtype=torch.bool).tril()
    else:  # "depth"
        d = torch.tensor(C.depths_from(par))
        vis = (d[None, :] < d[:, None]) | torch.eye(n, dtype=torch.bool)
    return vis[None].to(parents.device)


def mask_fault(scheme: str):
    def plant(monkeypatch) -> str:
        compile_with(monkeypatch, lambda c, tree, b, starts: dataclasses.replace(
            c, visibility=wrong_mask(tree.parents, scheme)))
        return "visibility"
    plant.__name__ = f"mask_{scheme}"
    plant.__doc__ = f"The verify's tree mask built wrong ({scheme!r} in wrong_mask), as recorded and as run."
    return plant


mask_previous, mask_causal, mask_depth = (mask_fault(s) for s in ("previous", "causal", "depth"))


def bonus_one_node_early(monkeypatch) -> str:
    """The bonus read at the accepted path's second-to-last node: the target's choice there is the last accepted
    token, so the step commits it twice (where at least one draft was accepted)."""
    from workbench.engine import stages

    original = stages.accept

    def accept(backend, layout, verified):
        out = original(backend, layout, verified)
        last = out.index.gather(1, out.length[:, None])  # [B, 1]: the last accepted node
        early = layout.tree.tokens.gather(1, last.clamp(min=0))[:, 0]
        return dataclasses.replace(out, bonus=torch.where(out.length > 0, early, out.bonus))

    monkeypatch.setattr(stages, "accept", accept)
    return "accept walk"


def drafter_block_causal(monkeypatch) -> str:
    """The drafter's block attending causally: each slot sees the context and the slots before it only (a causal
    mask laid over the block's columns of whatever mask the forward gets, one row or many)."""
    from workbench.models import drafter

    original = drafter.run_draft

    def run_draft(draft, target, block_ids, positions, context, cache, capture=None, mask=None, keep=None):
        B, Bk = block_ids.shape
        lengths = cache.lengths  # per row: its cached rows; the context's M rows follow, then the block
        width = max(lengths) + context.shape[1] + Bk
        dtype = next(draft.parameters()).dtype
        causal = torch.zeros(B, 1, Bk, width, dtype=dtype, device=block_ids.device) if mask is None else mask.clone()
        for b, L in enumerate(lengths):
            first = L + context.shape[1]
            later = torch.ones(Bk, Bk, dtype=torch.bool, device=block_ids.device).triu(1)  # slot j's later slots
            causal[b, 0, :, first : first + Bk].masked_fill_(later, torch.finfo(dtype).min)
        return original(draft, target, block_ids, positions, context, cache, capture, causal, keep)

    monkeypatch.setattr(drafter, "run_draft", run_draft)
    return "drafter output"


def drafter_block_shifted(monkeypatch) -> str:
    """The drafter's block one position on (its context's positions right), applied where the drafter's forward
    takes its positions: a writer that records the positions the block was meant to have shows nothing wrong in the
    block, only in the drafter's output."""
    from workbench.models import drafter

    original = drafter.run_draft

    def run_draft(draft, target, block_ids, positions, *args, **kwargs):
        moved = positions.clone()
        moved[:, -block_ids.shape[1]:] += 1  # [B, context + block]: the block's columns are the last
        return original(draft, target, block_ids, moved, *args, **kwargs)

    monkeypatch.setattr(drafter, "run_draft", run_draft)
    return "drafter output"


FAULTS = {f.__name__: f for f in (positions_by_index, ancestor_dropped, siblings_dropped, drafter_context_shifted,
                                  kv_out_of_path_order, bonus_missing_from_block, target_layer_off_by_one,
                                  features_off_by_a_row, features_not_compacted, positions_off_by_one,
                                  drafter_head_not_shared, mask_previous, mask_causal, mask_depth,
                                  bonus_one_node_early, drafter_block_causal,
                                  positions_counting_rejected)}
# The catalogue's cause (workbench.conform.causes) each planted fault's records must be reproduced by; None: no
# candidate reproduces them (the report says so).
CAUSE = {"positions_by_index": "tree positions by flat node index, not depth", "ancestor_dropped": None,
         "siblings_dropped": None,
         "drafter_context_shifted": "the drafter's new context starting a row late (the previous root's row dropped)",
         "kv_out_of_path_order": "K/V rows not compacted to the accepted path",
         "bonus_missing_from_block": "the bonus token missing from the block's slot 0 (the mask token instead)",
         "target_layer_off_by_one": "the target-layer index off by one",
         "features_off_by_a_row": "the drafter's features handed over a row (or more) off",
         "features_not_compacted": "hidden states not compacted to the accepted path",
         "positions_off_by_one": "the tree's base position off by a constant",
         "drafter_head_not_shared": "a drafter that does not share the target's lm_head / embeddings",
         "stale_state_parent": "stale parent indices on a hybrid target",
         "recurrent_state_from_wrong_node": "the recurrent state committed from the wrong node",
         "features_before_final_norm": "the drafter's features read before the target's final norm",
         "positions_from_first_row": "positions from another request's start plus depth (one base for the batch)",
         "positions_counting_rejected": "the base position counting the nodes the previous step rejected",
         "mask_previous": "each node also sees the node before it in the flattened order",
         "mask_causal": "a causal (chain) mask over the flattened tree",
         "mask_depth": "a mask from depths: every node sees every shallower node",
         "bonus_one_node_early": "the bonus read one node early (it repeats the last accepted token)",
         "drafter_block_causal": "the drafter's block attending causally",
         "drafter_block_shifted": "the drafter's block at shifted positions (RoPE phase skew)"}
