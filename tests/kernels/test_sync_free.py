"""The tree kernels' device path never waits for the device: proved on a CPU by construction.

Under ``NoHostSync`` every operation that needs a tensor's *values* on the host (``.item()``,
``.tolist()``, ``nonzero``, boolean-mask indexing, a repeat count read from a tensor, ...) raises.
On CUDA each of these is a host synchronisation; ``tests/gpu/`` checks the same kernels under
``torch.cuda.set_sync_debug_mode("error")`` on a GPU host.
"""
from __future__ import annotations

import pytest
import torch

from ddtree_kernels import accept, compile_tree
from ddtree_kernels.tree_build import build_tree_from_topk, build_tree_vectorized, sorted_slots
from ddtree_kernels.tree_compile import ancestor_matrix
from shared_checks import NoHostSync


def test_the_guard_catches_what_it_claims():
    x = torch.arange(5)
    for bad in (lambda: x.sum().item(), lambda: x.tolist(), lambda: x[x > 2], lambda: torch.nonzero(x),
                lambda: torch.repeat_interleave(x, x), lambda: bool(x[0] > 1)):
        with pytest.raises(AssertionError, match="host sync"), NoHostSync():
            bad()


@pytest.mark.parametrize("budget", [1, 16, 64, 300])
@pytest.mark.parametrize("width", [None, 2])
def test_build_and_compile_are_sync_free_on_the_device_path(budget, width):
    g = torch.Generator().manual_seed(budget)
    lp = torch.log_softmax(torch.randn(2, 7, 50, generator=g) * 3, -1)
    roots = torch.tensor([3, 4])
    k = min(budget, width or budget, 50)
    with NoHostSync():
        tree = build_tree_vectorized(*sorted_slots(lp, k), roots, budget)  # the path CUDA runs, on a CPU
        compiled = compile_tree(tree, torch.tensor([10, 20]), max_depth=7)
        compile_tree(tree, 10, max_depth=7)
        ancestor_matrix(tree.parents, 7)
        accept("torch", tree, compiled, tree.tokens.roll(-1, dims=1), max_depth=7)
    assert compiled.visibility.shape == (2, tree.n, tree.n)
    ref = build_tree_from_topk(*sorted_slots(lp, k), roots, budget)  # the NumPy path: same tree
    for f in ("tokens", "parents", "depth", "rank", "score"):
        assert torch.equal(getattr(tree, f), getattr(ref, f)), f
