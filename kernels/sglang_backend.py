"""SGLang's own tree-verify kernel (``verify_tree_greedy_triton``), called directly.

The dispatching wrapper ``verify_tree_greedy_func`` picks a device path at import
time and silently does nothing on a plain CPU machine, so we never call it. On a
CPU the Triton kernel runs in Triton's interpreter: ``TRITON_INTERPRET=1`` must be
set before sglang's ``spec_tree`` module is first imported (``@triton.jit`` reads
it at definition time), and must never be set on a CUDA machine.
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

INSTALL_HINT = "install it with `make install-sglang` (pip install --no-deps sglang==0.5.23 plus its light imports)"
_module = None


def load_spec_tree(device: torch.device):
    """Import sglang's spec_tree, under the Triton interpreter when the tensors live on a CPU."""
    global _module
    if _module is not None:
        return _module
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            import sys

            if "sglang.kernels.ops.speculative.spec_tree" in sys.modules:
                raise RuntimeError(
                    "sglang's spec_tree was imported without TRITON_INTERPRET=1, so its Triton kernels "
                    "cannot run on the CPU; import workbench before sglang, or set TRITON_INTERPRET=1"
                )
            os.environ["TRITON_INTERPRET"] = "1"
    try:
        from sglang.kernels.ops.speculative import spec_tree
    except ImportError as e:
        raise RuntimeError(f"kernel backend 'sglang' is unavailable ({e}); {INSTALL_HINT}") from e
    _module = spec_tree
    return spec_tree


def verify_tree_greedy(candidates: Tensor, retrieve_index: Tensor, next_token: Tensor, next_sibling: Tensor,
                       target_predict: Tensor, max_depth: int) -> tuple[Tensor, Tensor, Tensor]:
    """Run SGLang's kernel. All inputs int64 [bs, n]. -> (accept_index int32 [bs, max_depth+1] flat rows,
    accept_token_num int32 [bs], predicts int32 [bs*n])."""
    spec_tree = load_spec_tree(candidates.device)
    bs, n = candidates.shape
    predicts = torch.zeros(bs * n, dtype=torch.int32, device=candidates.device)
    accept_index = torch.full((bs, max_depth + 1), -1, dtype=torch.int32, device=candidates.device)
    accept_token_num = torch.zeros(bs, dtype=torch.int32, device=candidates.device)
    spec_tree.verify_tree_greedy_triton(
        predicts, accept_index, accept_token_num,
        candidates.contiguous(), retrieve_index.contiguous(), next_token.contiguous(),
        next_sibling.contiguous(), target_predict.contiguous(),
    )
    return accept_index, accept_token_num, predicts


def build_tree_efficient(parent_list: Tensor, selected_index: Tensor, seq_lens: Tensor, topk: int, steps: int,
                         num_verify_tokens: int, mode: str = "FULL_MASK") -> dict[str, Tensor]:
    """SGLang's EAGLE tree compile (``build_tree_kernel_efficient`` of ``eagle_utils``) on its Triton kernel.

    ``eagle_utils`` itself cannot be imported without a GPU stack (it reaches image processors and
    tvm_ffi), so this allocates the buffers as it does (mask all True, retrieve arrays -1) and calls
    ``sgl_build_tree_kernel_triton``. parent_list / selected_index: int64, SGLang's layout
    (``ddtree_kernels.eagle_tree.EagleSelection``); seq_lens: int64 [bs] committed tokens per request.
    -> tree_mask bool (flat, ``mode`` layout), positions int64 [bs*n], retrieve_index /
    retrieve_next_token / retrieve_next_sibling int64 [bs, n].
    """
    spec_tree = load_spec_tree(seq_lens.device)
    mask_mode = getattr(spec_tree.TreeMaskMode, mode)
    bs, n, dev = seq_lens.numel(), num_verify_tokens, seq_lens.device
    size = int(seq_lens.sum()) * n + n * n * bs if mode == "FULL_MASK" else n * n * bs
    tree_mask = torch.full((size,), True, dtype=torch.bool, device=dev)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.long, device=dev)
    positions = torch.empty(bs * n, dtype=torch.long, device=dev)
    spec_tree.sgl_build_tree_kernel_triton(
        parent_list.contiguous(), selected_index.contiguous(), seq_lens.contiguous(), tree_mask, positions,
        retrieve[0], retrieve[1], retrieve[2], topk, steps, n, mask_mode,
    )
    return {"tree_mask": tree_mask, "positions": positions, "retrieve_index": retrieve[0],
            "retrieve_next_token": retrieve[1], "retrieve_next_sibling": retrieve[2]}
