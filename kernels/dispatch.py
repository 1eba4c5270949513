"""The one place where a kernel backend is chosen.

- ``torch`` (default): the vectorized accept walk in ``ddtree_kernels.accept``.
- ``sglang``: the kernel SGLang itself runs on that device: its CUDA JIT
  ``verify_tree_greedy`` on CUDA tensors, its Triton ``verify_tree_greedy_triton``
  (under Triton's interpreter) on CPU tensors.
- ``sglang-triton``: SGLang's Triton kernel on every device.
"""
from __future__ import annotations

import importlib.util

import torch
from torch import Tensor

from ddtree_kernels.accept import Accepted, accept_walk
from ddtree_kernels.tree_build import Tree
from ddtree_kernels.tree_compile import CompiledTree

BACKENDS = ("torch", "sglang", "sglang-triton")


def check_backend(name: str, device=None) -> None:
    """Fail early, in one line, when a backend is unknown or not installed. With a CUDA ``device``,
    ``sglang`` also builds (or loads the cached build of) SGLang's JIT kernel now, not mid-run."""
    if name not in BACKENDS:
        raise ValueError(f"kernel_backend={name!r} is not one of {', '.join(BACKENDS)}")
    if name.startswith("sglang"):
        from ddtree_kernels.sglang_backend import INSTALL_HINT

        for mod in ("sglang", "triton"):
            if importlib.util.find_spec(mod) is None:
                raise RuntimeError(f"kernel_backend={name!r} needs the {mod!r} package; {INSTALL_HINT}")
    if device is not None:
        from ddtree_kernels.sglang_backend import load_jit, uses_jit

        if uses_jit(name, device):
            load_jit()


def accept(backend: str, tree: Tree, compiled: CompiledTree, choice: Tensor, max_depth: int) -> Accepted:
    """Accept walk through the chosen backend. choice: [bs, n] target argmax or samples."""
    if backend == "torch":
        return accept_walk(tree.tokens, tree.parents, tree.depth, compiled.visibility, choice, max_depth)
    if backend in ("sglang", "sglang-triton"):
        from ddtree_kernels.sglang_backend import uses_jit, verify_tree_greedy

        bs, n = tree.tokens.shape
        index, num, predicts = verify_tree_greedy(
            tree.tokens, compiled.retrieve_index, compiled.retrieve_next_token,
            compiled.retrieve_next_sibling, choice, max_depth, jit=uses_jit(backend, tree.tokens.device),
        )
        index = index.long()  # [bs, max_depth + 1] flat rows -> node indices within each request
        local = torch.where(index >= 0, index - torch.arange(bs, device=index.device)[:, None] * n, -1)
        num = num.long()
        last_row = index.gather(1, num[:, None])[:, 0]
        bonus = predicts.long()[last_row]
        return Accepted(local, num, bonus)
    check_backend(backend)
    raise AssertionError("unreachable")


def gdn_tree_conv(backend: str, x: Tensor, conv_window: Tensor, weight: Tensor, bias: Tensor | None,
                  activation: str | None, parents: Tensor, next_token: Tensor, next_sibling: Tensor
                  ) -> tuple[Tensor, Tensor]:
    """A GatedDeltaNet layer's short conv over each tree node's ancestors, through the chosen backend.

    x [bs, n, dim]; conv_window [bs, dim, K-1]; weight [dim, K]; parents / next_token / next_sibling int64 [bs, n]
    (the oracle reads parents, SGLang's kernel the links). -> out [bs, n, dim], windows [bs, n, dim, K-1]."""
    if backend == "torch":
        from ddtree_kernels.gdn_tree import tree_causal_conv1d

        return tree_causal_conv1d(x, conv_window, weight, bias, activation, parents)
    if backend in ("sglang", "sglang-triton"):  # one Triton kernel for both: SGLang has no other for trees
        from ddtree_kernels.sglang_gdn import tree_causal_conv1d

        out, windows, _ = tree_causal_conv1d(x, conv_window, weight, bias, activation, next_token, next_sibling)
        return out, windows
    check_backend(backend)
    raise AssertionError("unreachable")


def gdn_tree_delta_rule(backend: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                        parents: Tensor, scale: float | None = None) -> tuple[Tensor, Tensor]:
    """The gated delta rule from each tree node's parent state, through the chosen backend.

    q, k [bs, n, H, Dk]; v [bs, n, HV, Dv]; g, beta [bs, n, HV]; state [bs, HV, Dk, Dv]; parents int64 [bs, n].
    -> out [bs, n, HV, Dv], states [bs, n, HV, Dk, Dv] float32 (q, k l2-normalised inside, as transformers)."""
    if backend == "torch":
        from ddtree_kernels.gdn_tree import tree_gated_delta_rule
    elif backend in ("sglang", "sglang-triton"):
        from ddtree_kernels.sglang_gdn import tree_gated_delta_rule
    else:
        check_backend(backend)
        raise AssertionError("unreachable")
    return tree_gated_delta_rule(q, k, v, g, beta, state, parents, scale)


def gdn_tree_delta_rule_gated(backend: str, q: Tensor, k: Tensor, v: Tensor, A_log: Tensor, dt_bias: Tensor,
                              a: Tensor, b: Tensor, state: Tensor, parents: Tensor, scale: float | None = None
                              ) -> tuple[Tensor, Tensor]:
    """``gdn_tree_delta_rule`` from the layer's raw gate inputs (A_log, dt_bias [HV]; a, b [bs, n, HV]): the oracle
    computes the gates with ``gdn_gates``; SGLang's backends run its fused-gating kernel, as SGLang's GDN
    target verify does. -> out [bs, n, HV, Dv], states [bs, n, HV, Dk, Dv] float32."""
    if backend == "torch":
        from ddtree_kernels.gdn_tree import gdn_gates, tree_gated_delta_rule

        return tree_gated_delta_rule(q, k, v, *gdn_gates(A_log, dt_bias, a, b), state, parents, scale)
    if backend in ("sglang", "sglang-triton"):
        from ddtree_kernels.sglang_gdn import tree_gated_delta_rule_from_gates

        return tree_gated_delta_rule_from_gates(q, k, v, A_log, dt_bias, a, b, state, parents, scale)
    check_backend(backend)
    raise AssertionError("unreachable")
