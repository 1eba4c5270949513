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
    """Tree positions by node index instead of depth (siblings no longer share a position)."""
    stage = importlib.import_module("workbench.engine.stages.tree_compile")  # the module (the package exports the function)
    original = stage.compile_tree

    def compile_tree(tree, start, max_depth=None):
        c = original(tree, start, max_depth)
        n = tree.tokens.shape[1]
        return dataclasses.replace(c, positions=c.positions[:, :1] + torch.arange(n, device=c.positions.device))

    monkeypatch.setattr(stage, "compile_tree", compile_tree)
    return "verify positions"


def ancestor_dropped(monkeypatch) -> str:
    """One ancestor dropped from the visibility: the deepest node no longer sees its parent."""
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

    original = stages.tree_build

    def tree_build(policy, drafted, root, device, sync_free=False):
        t = original(policy, drafted, root, device, sync_free)
        keep, on_chain = [], {}
        for i, (p, r) in enumerate(zip(t.parents[0].tolist(), t.rank[0].tolist())):
            if p < 0 or (r == 0 and on_chain.get(p)):
                on_chain[i] = True
                keep.append(i)
        idx = torch.tensor(keep, device=t.tokens.device)
        n = len(keep)
        par = torch.arange(-1, n - 1, device=t.tokens.device)[None]
        return Tree(t.tokens[:, idx], par, t.depth[:, idx], t.rank[:, idx], t.score[:, idx])

    monkeypatch.setattr(stages, "tree_build", tree_build)
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


FAULTS = {f.__name__: f for f in (positions_by_index, ancestor_dropped, siblings_dropped, drafter_context_shifted,
                                  kv_out_of_path_order)}
