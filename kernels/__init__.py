"""DDTree tree kernels: pure functions over tensors, importable as ``ddtree_kernels``.

The directory is ``kernels/`` (design card); the import name is not the bare word
``kernels``, which is a PyPI package that sglang depends on.

Data flow of one cycle: ``build_tree`` -> ``compile_tree`` -> (target verify, then
``greedy_choice``) -> ``accept`` -> ``compact_kv``. Each kernel has an independent reference in
``ddtree_kernels.oracles`` used by the parity tests; backend choice (torch, SGLang's
CUDA JIT kernel or its Triton kernel) happens only in ``ddtree_kernels.dispatch``.
"""
from ddtree_kernels.accept import Accepted, accept_walk
from ddtree_kernels.dispatch import BACKENDS, accept, check_backend
from ddtree_kernels.greedy import greedy_choice
from ddtree_kernels.kv_compact import compact_kv, compact_kv_
from ddtree_kernels.tree_build import Tree, build_tree, build_tree_from_topk, chain_tree
from ddtree_kernels.tree_compile import CompiledTree, compile_tree
from ddtree_kernels.tree_check import InvalidTree, validate_tree
from ddtree_kernels.eagle_tree import EagleSelection, build_eagle_tree, eagle_select

__all__ = [
    "Accepted", "BACKENDS", "CompiledTree", "EagleSelection", "InvalidTree", "Tree", "accept", "accept_walk",
    "build_eagle_tree", "build_tree", "build_tree_from_topk", "chain_tree", "check_backend", "compact_kv", "compact_kv_",
    "compile_tree", "eagle_select", "greedy_choice", "validate_tree",
]
