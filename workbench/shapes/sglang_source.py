"""SGLang's installed source, read without importing it: where each rule lives, and one definition run alone.

``SGLANG_RULES`` names every SGLang expression the workbench mirrors (file, function, expression);
``rule_holds`` checks the installed source still contains it (tests/shapes/test_sglang_layout.py runs it
for each). ``sglang_def`` compiles one function or class from an installed file and returns it, for
modules that cannot be imported on this machine (see sglang_layout's docstring for why).
"""
from __future__ import annotations

import __future__
import ast
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

SGLANG_VERSION = "0.5.23"

# Files (relative to the installed ``sglang`` package) each rule comes from.
FORWARD_BATCH_INFO = "srt/model_executor/forward_batch_info.py"
LOGITS_PROCESSOR = "srt/layers/logits_processor.py"
DFLASH_INFO = "srt/speculative/dflash_info.py"
DFLASH_WORKER = "srt/speculative/dflash_worker_v2.py"
RAGGED_VERIFY = "srt/speculative/ragged_verify.py"
EAGLE_UTILS = "srt/speculative/eagle_utils.py"
AUX_HIDDEN = "srt/layers/aux_hidden_states.py"
FLASHINFER = "srt/layers/attention/flashinfer_backend.py"
CUDA_GRAPH_RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"
SPEC_TREE = "kernels/ops/speculative/spec_tree.py"
MAMBA_UTILS = "srt/configs/mamba_utils.py"
QWEN3_NEXT_CONFIG = "srt/configs/qwen3_next.py"
MEMORY_POOL = "srt/mem_cache/memory_pool.py"
HYBRID_LINEAR = "srt/layers/attention/hybrid_linear_attn_backend.py"


@dataclass(frozen=True)
class Rule:
    """One SGLang rule this module relies on: where it is and the expression (``ast.unparse`` form)."""

    name: str
    file: str
    where: str  # "function" or "Class.method"
    expression: str

    def __str__(self) -> str:
        return f"{self.file} ({self.where}): {self.expression}"


# The expressions our rules mirror, as ast.unparse prints them from sglang 0.5.23.
SGLANG_RULES = {r.name: r for r in (
    Rule("positions", FORWARD_BATCH_INFO, "compute_position_torch",
         "torch.arange(prefix_len, prefix_len + extend_len, device=extend_prefix_lens.device)"),
    Rule("extend qo_indptr", FLASHINFER, "FlashInferIndicesUpdaterPrefill.call_begin_forward",
         "torch.cumsum(seq_lens - prefix_lens, dim=0)"),
    Rule("kv_indptr", FLASHINFER, "FlashInferIndicesUpdaterDecode.call_begin_forward",
         "torch.cumsum(paged_kernel_lens, dim=0)"),
    Rule("verify qo_indptr", DFLASH_INFO, "DFlashVerifyInput.generate_attn_arg_prefill",
         "torch.arange(0, (bs + 1) * self.draft_token_num, step=self.draft_token_num, dtype=torch.int32, "
         "device=device)"),
    Rule("verify kv lens", DFLASH_INFO, "DFlashVerifyInput.generate_attn_arg_prefill",
         "paged_kernel_lens + verify_lens"),
    Rule("verify mask numel", DFLASH_INFO, "DFlashVerifyInput.generate_attn_arg_prefill",
         "paged_kernel_lens_sum * self.draft_token_num + self.draft_token_num ** 2 * bs"),
    Rule("verify input_ids", DFLASH_WORKER, "DFlashWorkerV2.forward_batch_generation", "draft_tokens.reshape(-1)"),
    Rule("draft input_ids", DFLASH_WORKER, "DFlashWorkerV2.forward_batch_generation", "block_ids.flatten()"),
    Rule("dflash verify mask", DFLASH_WORKER, "DFlashWorkerV2.forward_batch_generation", "custom_mask = None"),
    Rule("dflash verify hidden", DFLASH_WORKER, "DFlashWorkerV2.forward_batch_generation",
         "hidden.view(bs, int(self.block_size), -1)"),
    Rule("dflash draft logits rows", DFLASH_WORKER, "DFlashWorkerV2.forward_batch_generation",
         "draft_hidden[:, 1:, :].reshape(-1, draft_hidden.shape[-1])"),
    Rule("dflash draft capture", DFLASH_WORKER, "DFlashWorkerV2.forward_batch_generation",
         "capture_hidden_mode=CaptureHiddenMode.NULL"),
    Rule("dflash verify capture", DFLASH_INFO, "DFlashVerifyInput",
         "capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.FULL"),
    Rule("logits all rows", LOGITS_PROCESSOR, "LogitsProcessor._get_pruned_states",
         "logits_metadata.forward_mode.is_decode_or_idle() or logits_metadata.forward_mode.is_target_verify() "
         "or logits_metadata.forward_mode.is_draft_extend_v2()"),
    Rule("logits last row", LOGITS_PROCESSOR, "LogitsProcessor._get_pruned_states",
         "torch.cumsum(logits_metadata.extend_seq_lens, dim=0) - 1"),
    Rule("logits with logprobs", LOGITS_PROCESSOR, "LogitsProcessor._get_pruned_states",
         "hidden_states[pt + start_len:pt + extend_len]"),
    Rule("mask FULL_MASK", EAGLE_UTILS, "build_tree_kernel_efficient",
         "(seq_lens_sum * num_verify_tokens + num_verify_tokens * num_verify_tokens * bs,)"),
    Rule("mask QLEN_ONLY", EAGLE_UTILS, "build_tree_kernel_efficient",
         "(num_verify_tokens * bs * num_verify_tokens,)"),
    Rule("mask QLEN_ONLY_BITPACKING", EAGLE_UTILS, "build_tree_kernel_efficient",
         "int(math.ceil(math.log2((num_verify_tokens + 7) // 8)))"),
    # State pools (sglang_layout.state_rows; sizes in workbench/shapes/families.py).
    Rule("mla kv_cache_dim", MEMORY_POOL, "MLATokenToKVPool.__init__", "kv_lora_rank + qk_rope_head_dim"),
    Rule("mamba conv_dim", MAMBA_UTILS, "Mamba2StateShape.create", "intermediate_size + 2 * n_groups * state_size"),
    Rule("mamba conv shape", MAMBA_UTILS, "Mamba2StateShape.create",
         "conv_state_shape = (divide(conv_dim, tp_world_size), conv_kernel - 1)"),
    Rule("mamba temporal shape", MAMBA_UTILS, "Mamba2StateShape.create",
         "temporal_state_shape = (divide(num_heads, tp_world_size), head_dim, state_size)"),
    Rule("gdn state params", QWEN3_NEXT_CONFIG, "Qwen3NextConfig.mamba2_cache_params",
         "self.linear_value_head_dim * self.linear_num_value_heads"),
    Rule("spec intermediate ssm", MEMORY_POOL, "MambaPool.__init__",
         "(num_mamba_layers, spec_state_size + 1, speculative_num_draft_tokens, temporal_state_shape[0], "
         "temporal_state_shape[1], temporal_state_shape[2])"),
    Rule("verify same device", "srt/speculative/dflash_utils.py", "compute_dflash_sampling_correct_drafts_and_bonus",
         "candidates.device != next_token_logits.device"),
    Rule("positions int64", FORWARD_BATCH_INFO, "compute_position_torch", "positions.to(torch.int64)"),
    Rule("ragged token grid", CUDA_GRAPH_RUNNER, "DecodeCudaGraphRunner._build_ragged_verify_token_buckets",
         "sorted({bs * self.captured_req_width for bs in self.capture_bs})"),
    # Hybrid (GatedDeltaNet) targets: per-node scratch of a tree verify, and the parent links its kernels derive.
    Rule("mamba intermediate ssm", MEMORY_POOL, "MambaPool.__init__",
         "size=(num_mamba_layers, spec_state_size + 1, speculative_num_draft_tokens, temporal_state_shape[0], "
         "temporal_state_shape[1], temporal_state_shape[2])"),
    Rule("mamba intermediate conv", MEMORY_POOL, "MambaPool.__init__",
         "size=(num_mamba_layers, spec_state_size + 1, speculative_num_draft_tokens, conv_shape[0], conv_shape[1])"),
    Rule("retrieve_parent_token", HYBRID_LINEAR, "MambaAttnBackendBase._forward_metadata",
         "torch.empty_like(retrieve_next_token)"),
)}


# --------------------------------------------------------------------------------------------- sglang's source
def sglang_dir() -> Path | None:
    """The installed ``sglang`` package directory, found without importing it (None if absent)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def sglang_file(rel: str) -> Path:
    root = sglang_dir()
    if root is None:
        raise ImportError("sglang is not installed (make install-sglang: pip install --no-deps sglang==0.5.23)")
    path = root / rel
    if not path.is_file():
        raise ImportError(f"the installed sglang has no {rel}; this module reads sglang {SGLANG_VERSION}")
    return path


@lru_cache(maxsize=None)
def parsed_source(rel: str) -> ast.Module:
    """The syntax tree of one file of the installed sglang (``rel``: its path under the package), parsed once."""
    return ast.parse(sglang_file(rel).read_text())


def find_def(tree: ast.Module, where: str) -> ast.AST:
    """The node named ``where`` ("name" or "Class.method") anywhere in ``tree``; ValueError if absent."""
    *cls, name = where.split(".")
    scope = tree
    if cls:
        scope = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls[0]), None)
        if scope is None:
            raise ValueError(f"no class {cls[0]}")
    hit = next((n for n in ast.walk(scope) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name), None)
    if hit is None:
        raise ValueError(f"no {where}")
    return hit


def expressions_in(node: ast.AST) -> set[str]:
    """``ast.unparse`` of every expression, statement and argument under ``node`` (formatting-insensitive)."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.expr, ast.stmt, ast.keyword)):
            try:
                out.add(ast.unparse(n))
            except Exception:  # noqa: BLE001  (an exotic node: not one of ours)
                pass
    return out


def rule_holds(rule: Rule, tree: ast.Module | None = None) -> bool:
    """True when ``rule.expression`` occurs in ``rule.where`` of the installed (or given) source."""
    tree = tree if tree is not None else parsed_source(rule.file)
    try:
        node = find_def(tree, rule.where)
    except ValueError:
        return False
    return rule.expression in expressions_in(node)


def sglang_def(rel: str, where: str, **globals_):
    """Execute one function or class from SGLang's installed source on its own and return it.

    For modules that cannot be imported here: the definition ``where`` ("name" or "Class.method",
    a method comes back as a plain function taking ``self``) is compiled from the file with the
    given module globals. Annotations are not evaluated (the names they use need not exist).
    """
    node = find_def(parsed_source(rel), where)
    if isinstance(node, ast.FunctionDef):
        node.decorator_list = []  # e.g. @staticmethod: the bare function is what we call
    mod = ast.Module(body=[node], type_ignores=[])
    code = compile(mod, str(sglang_file(rel)), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    ns = {"__name__": f"sglang_source:{rel}", **globals_}
    exec(code, ns)  # noqa: S102  (SGLang's own code, read from the installed wheel)
    return ns[node.name]


@lru_cache(maxsize=None)
def sglang_enums():
    """sglang's ForwardMode, CaptureHiddenMode (forward_batch_info.py) and TreeMaskMode (spec_tree.py).

    TreeMaskMode is read from source too: importing spec_tree would define its Triton kernels
    before kernels/sglang_backend.py can set the interpreter up.
    """
    from enum import IntEnum, auto
    from functools import total_ordering

    g = {"IntEnum": IntEnum, "auto": auto, "total_ordering": total_ordering}
    fm = sglang_def(FORWARD_BATCH_INFO, "ForwardMode", **g)
    chm = sglang_def(FORWARD_BATCH_INFO, "CaptureHiddenMode", **g)
    tmm = sglang_def(SPEC_TREE, "TreeMaskMode", **g)
    return fm, chm, tmm


def sglang_available() -> bool:
    return sglang_dir() is not None


def sglang_forward_modes(try_import: bool = False) -> tuple[list[str], str]:
    """Member names of sglang's ForwardMode and how they were read ("import" or "source (ast)").

    Importing ``sglang.srt.model_executor.forward_batch_info`` fails on this machine (torchvision),
    so by default the class body is read from the installed file. ImportError when sglang is absent.
    """
    import importlib
    import sys

    mod = sys.modules.get("sglang.srt.model_executor.forward_batch_info")
    if mod is None and try_import:
        try:
            mod = importlib.import_module("sglang.srt.model_executor.forward_batch_info")
        except Exception:  # noqa: BLE001  (any import failure: fall back to reading the source)
            mod = None
    if mod is not None:
        return list(mod.ForwardMode.__members__), "import"
    node = find_def(parsed_source(FORWARD_BATCH_INFO), "ForwardMode")
    names = [t.id for st in node.body if isinstance(st, ast.Assign) for t in st.targets if isinstance(t, ast.Name)]
    return names, "source (ast)"
