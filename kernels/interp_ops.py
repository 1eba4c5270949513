"""``@triton.jit`` stand-ins for aliases that Triton's interpreter cannot run; imported only once
``TRITON_INTERPRET=1`` is set (``@triton.jit`` reads it at definition time), by ``sglang_gdn``."""
import triton
import triton.language as tl


@triton.jit
def exp(x):
    # A call of ``tl.exp`` resolved while the kernel runs, which the interpreter has patched;
    # FLA's module-level ``exp = tl.exp`` holds the unpatched builtin.
    return tl.exp(x)
