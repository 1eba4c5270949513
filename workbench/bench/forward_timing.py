"""The forwards a sweep times, each the engine's own through its own model states, and the clock around a call.

``TargetForward``: a target state of ``rows`` rows holding ``context`` committed tokens, verifying a
``TreeLayout`` compiled by ``stages.tree_compile`` from DDTree-built random trees (the real visibility mask).
``DraftForward``: a drafter state drafting one block after ``block_size`` new context rows (a cycle that
accepted its whole block). ``time_call``: seconds of one call, the device synchronised on both sides.
"""
from __future__ import annotations

import time

import torch


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def tree_layout(models, rows: int, nodes: int, start: int, seed: int):
    """The engine's TreeLayout of ``rows`` random DDTree-built trees of exactly ``nodes`` nodes, rooted at
    ``start`` (tokens from a small slice of the vocabulary: cost does not depend on which)."""
    from ddtree_kernels import build_tree

    from workbench.engine.policies import AR
    from workbench.engine.stages.tree_build import tree_build
    from workbench.engine.stages.tree_compile import tree_compile

    g = torch.Generator().manual_seed(seed)
    depth = models.block_size - 1
    trees = []
    for _ in range(rows):
        lp = torch.log_softmax(torch.randn(1, depth, 64, generator=g) * 2, dim=-1)
        root = torch.randint(0, 64, (1,), generator=g)
        if nodes == 1:  # the root alone, as the engine's tree build gives AR
            trees.append(tree_build(AR(), None, int(root), models.device))
            continue
        t = build_tree(lp.to(models.device), root.to(models.device), nodes - 1)
        if t.n != nodes:
            raise ValueError(f"a tree of {nodes} nodes cannot be built below a block of {models.block_size}")
        trees.append(t)
    return tree_compile(trees, [start] * rows, [depth] * rows)


class TargetForward:
    """One target state of ``rows`` rows holding ``context`` committed tokens each."""

    def __init__(self, models, rows: int, context: int, max_nodes: int, seed: int):
        from workbench.models.registry import new_target_state

        self.models, self.rows = models, rows
        self.state = new_target_state(models)
        if self.state.supports_static_shapes:
            self.keys = context + max_nodes
            self.state.preallocate(rows, self.keys)
            self.state.cache.set_lengths([context] * rows)  # committed K/V of zeros: its values do not change cost
            self.state.static.set_lengths([context] * rows)
            self.static = True
        else:  # a real prefill of random tokens (dynamic shapes: attention sees context + nodes columns)
            g = torch.Generator().manual_seed(seed)
            vocab = models.target.config.get_text_config(decoder=True).vocab_size
            prompts = torch.randint(0, vocab, (rows, context), generator=g).tolist()
            with torch.no_grad():
                self.state.prefill(prompts)
            self.keys = None
            self.static = False
        self.layouts: dict = {}
        self.context = context

    def layout(self, nodes: int):
        if nodes not in self.layouts:
            self.layouts[nodes] = tree_layout(self.models, self.rows, nodes, self.context, 1000 * self.rows + nodes)
        return self.layouts[nodes]

    def call(self, nodes: int):
        return lambda: self.state.verify(self.layout(nodes))

    def key_columns(self, nodes: int) -> int:
        return self.keys if self.static else self.context + nodes


class DraftForward:
    """One drafter state of ``rows`` rows: ``context - block`` tokens in its cache and ``block`` pending
    context rows (the features of a fully accepted block), drafting the block after ``context``."""

    def __init__(self, models, rows: int, context: int, seed: int):
        from workbench.models.registry import new_draft_state

        m = models
        self.models, self.rows, self.block = m, rows, m.block_size
        if context < self.block:
            raise ValueError(f"context={context} must be at least the drafter's block of {self.block}")
        self.state = new_draft_state(m)
        self.keys = context + self.block
        self.state.preallocate(rows, self.keys)
        F = m.draft.fc.in_features
        g = torch.Generator().manual_seed(seed)
        self.features = (torch.randn(rows, self.block, F, generator=g) * 0.5).to(m.device, m.dtype)
        self.context = context
        self.state.start([self.features[b : b + 1] for b in range(rows)])

    def reset(self) -> None:
        self.state.crop([self.context - self.block] * self.rows)
        self.state.cache.set_lengths([self.context - self.block] * self.rows)
        self.state.context = [self.features[b : b + 1] for b in range(self.rows)]

    def call(self):
        def run():
            self.reset()
            return self.state.draft([1] * self.rows, [self.context] * self.rows)
        return run


def time_call(fn, device) -> float:
    """Seconds of one call of ``fn``: a GPU runs asynchronously, so the device is synchronised before the clock
    starts (nothing earlier counted) and before it stops (all of ``fn``'s work counted)."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0
