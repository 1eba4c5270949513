"""SGLang's own tree-verify kernels, called directly: the CUDA JIT one and the Triton one.

On CUDA, SGLang's dispatcher ``verify_tree_greedy_func`` calls
``sglang.kernels.ops.speculative.tree.verify_tree_greedy``, a CUDA kernel that
``apache-tvm-ffi`` JIT-compiles with nvcc at first use (about 20 s, then cached).
``kernel_backend="sglang"`` calls that same kernel on CUDA tensors and SGLang's
Triton kernel ``verify_tree_greedy_triton`` on CPU tensors (under Triton's
interpreter); ``kernel_backend="sglang-triton"`` calls the Triton kernel everywhere.

The dispatcher itself picks a device path at import time and silently does
nothing on a plain CPU machine, so we never call it. For the interpreter,
``TRITON_INTERPRET=1`` must be set before sglang's ``spec_tree`` module is first
imported (``@triton.jit`` reads it at definition time), and never on a CUDA machine.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys

import torch
from torch import Tensor

INSTALL_HINT = "install it with `make install-sglang` (pip install --no-deps sglang==0.5.23 plus its light imports)"
TVM_FFI_PIN = "apache-tvm-ffi==0.1.11"  # the version sglang 0.5.23 pins
JIT_KERNEL = "sglang.kernels.ops.speculative.tree.verify_tree_greedy"
TRITON_KERNEL = "sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_triton"
_spec_tree = None
_jit = None


def uses_jit(backend: str, device: torch.device) -> bool:
    """True where ``backend`` runs SGLang's CUDA JIT kernel on tensors of ``device``."""
    return backend == "sglang" and torch.device(device).type == "cuda"


def kernel_name(backend: str, device) -> str:
    """Which SGLang kernel ``backend`` runs on ``device``, in words (for notebooks and reports)."""
    if uses_jit(backend, device):
        return f"{JIT_KERNEL} (CUDA, JIT-compiled by apache-tvm-ffi)"
    where = "Triton interpreter on the CPU" if torch.device(device).type == "cpu" else "Triton"
    return f"{TRITON_KERNEL} ({where})"


def import_triton_module(name: str, device):
    """Import the sglang module ``name`` so that its Triton kernels run on tensors of ``device``:
    under Triton's interpreter when that is a CPU (``TRITON_INTERPRET=1`` before the module is first
    imported, since ``@triton.jit`` reads it at definition time), natively otherwise."""
    if torch.device(device).type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        if name in sys.modules:
            raise RuntimeError(
                f"{name} was imported without TRITON_INTERPRET=1, so its Triton kernels cannot run on the CPU; "
                "import workbench before sglang, or set TRITON_INTERPRET=1"
            )
        os.environ["TRITON_INTERPRET"] = "1"
    if os.environ.get("TRITON_INTERPRET") == "1":
        _interpreter_fixes()
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise RuntimeError(f"kernel backend 'sglang' is unavailable ({e}); {INSTALL_HINT}") from e


_fixed = False


def _interpreter_fixes() -> None:
    """Two things Triton 3.9's interpreter gets wrong for SGLang's mamba / FLA kernels (never used natively):

    - ``triton.language`` helpers that are themselves ``@jit`` functions (``tl.zeros``, ``tl.sum``, ...)
      stay compiled-only when triton was imported before ``TRITON_INTERPRET=1`` was set, which happens
      whenever a transformers model class is imported first (``torch._dynamo`` imports triton), and a
      kernel calling one fails with "Cannot call @triton.jit'd outside of the scope of a kernel". Wrap them
      as the interpreter would have.
    - a comparison keeps its operands' dtype tag on a bool array, so splatting a scalar comparison to a
      block (``(slot < num_cache_lines) & mask_2d`` in ``causal_conv1d_update``) makes an int64 mask and
      ``tl.load`` fails with "mask has unsupported dtype". Keep splatted bools bool.
    """
    global _fixed
    if _fixed:
        return
    import numpy as np
    import triton.language as tl
    import triton.language.standard as standard
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    for mod in (tl, standard, tl.math):
        for attr, value in list(vars(mod).items()):
            if isinstance(value, JITFunction):
                setattr(mod, attr, interpreter.InterpretedFunction(value.fn))
    splat = interpreter.InterpreterBuilder.create_splat

    def create_splat(self, ret_ty, arg):
        out = splat(self, ret_ty, arg)
        if arg.data.dtype == np.bool_ and out.data.dtype != np.bool_:
            out = interpreter.TensorHandle(out.data.astype(np.bool_), out.dtype)
        return out

    interpreter.InterpreterBuilder.create_splat = create_splat
    _fixed = True


def load_spec_tree(device: torch.device):
    """Import sglang's spec_tree, under the Triton interpreter when the tensors live on a CPU."""
    global _spec_tree
    if _spec_tree is None:
        _spec_tree = import_triton_module("sglang.kernels.ops.speculative.spec_tree", device)
    return _spec_tree


def nvcc_path() -> str | None:
    """The nvcc that SGLang's JIT would run (resolved as sglang/tvm-ffi do), or None when it is missing."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home is None:
        found = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(found)) if found else "/usr/local/cuda"
    path = os.path.join(home, "bin", "nvcc")
    return path if os.path.isfile(path) else None


def ninja_on_path() -> bool:
    """SGLang's JIT runs the ``ninja`` executable. A pip-installed ninja sits next to the interpreter or in the
    ``ninja`` package, neither on PATH when a venv's python is run without activating it: add it."""
    if shutil.which("ninja"):
        return True
    dirs = [os.path.dirname(sys.executable)]
    try:
        import ninja

        dirs.append(ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    for d in dirs:
        if os.path.isfile(os.path.join(d, "ninja")):
            os.environ["PATH"] = d + os.pathsep + os.environ.get("PATH", "")
            return True
    return False


def load_jit():
    """Import SGLang's CUDA tree module and build (or load the cached build of) its kernel.

    Raises a one-line RuntimeError naming the missing piece: sglang, apache-tvm-ffi, nvcc or ninja."""
    global _jit
    if _jit is not None:
        return _jit
    fallback = "or use kernel_backend='sglang-triton' (SGLang's Triton kernel, no compiler needed)"
    if importlib.util.find_spec("tvm_ffi") is None:
        raise RuntimeError(
            f"kernel_backend='sglang' on CUDA needs SGLang's JIT kernel, which needs the 'apache-tvm-ffi' "
            f"package (tvm_ffi) to build it: pip install {TVM_FFI_PIN}; {fallback}"
        )
    try:
        from sglang.kernels.ops.speculative import tree
    except ImportError as e:
        raise RuntimeError(f"kernel backend 'sglang' is unavailable ({e}); {INSTALL_HINT}") from e
    has_ninja = ninja_on_path()
    try:
        tree._jit_tree_module()  # compiles at first use; cached under ~/.cache afterwards
    except Exception as e:  # noqa: BLE001  (any build failure becomes one line naming its cause)
        detail = " ".join(str(e).split())[:300] or type(e).__name__
        if nvcc_path() is None:
            raise RuntimeError(
                "kernel_backend='sglang' on CUDA needs nvcc to JIT-compile SGLang's tree kernel the first time, "
                f"and none was found (CUDA_HOME/CUDA_PATH, PATH, /usr/local/cuda); install the CUDA toolkit "
                f"or set CUDA_HOME; {fallback} ({detail})"
            ) from e
        if not has_ninja:
            raise RuntimeError(
                "kernel_backend='sglang' on CUDA needs the ninja build tool to JIT-compile SGLang's tree kernel "
                f"the first time: pip install ninja; {fallback} ({detail})"
            ) from e
        raise RuntimeError(f"SGLang's JIT tree kernel failed to build: {detail}; {fallback}") from e
    _jit = tree
    return tree


def verify_tree_greedy(candidates: Tensor, retrieve_index: Tensor, next_token: Tensor, next_sibling: Tensor,
                       target_predict: Tensor, max_depth: int, jit: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Run SGLang's kernel (the CUDA JIT one when ``jit``, else the Triton one). All inputs int64 [bs, n].
    -> (accept_index int32 [bs, max_depth+1] flat rows, accept_token_num int32 [bs], predicts int32 [bs*n])."""
    dev = candidates.device
    fn = load_jit().verify_tree_greedy if jit else load_spec_tree(dev).verify_tree_greedy_triton
    bs, n = candidates.shape
    predicts = torch.zeros(bs * n, dtype=torch.int32, device=dev)
    accept_index = torch.full((bs, max_depth + 1), -1, dtype=torch.int32, device=dev)
    accept_token_num = torch.zeros(bs, dtype=torch.int32, device=dev)
    fn(predicts, accept_index, accept_token_num,
       candidates.long().contiguous(), retrieve_index.long().contiguous(), next_token.long().contiguous(),
       next_sibling.long().contiguous(), target_predict.long().contiguous())
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
