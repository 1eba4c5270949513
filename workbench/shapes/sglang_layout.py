"""The tensors SGLang builds for each forward mode, computed from per-request token counts (ragged).

SGLang flattens a batch into one token dimension: ``input_ids``/``positions`` are ``[sum tokens]``,
``qo_indptr``/``kv_indptr`` (int32, ``[bs + 1]``) mark where each request's rows and KV start, a
tree's custom mask is one flat bool vector, and the logits processor keeps only some rows. This
engine runs Hugging Face forwards on ``[bs, n]`` tensors with a 4-D mask; ``layout(...)`` gives
SGLang's view of the same forward so both can be read side by side.

Where SGLang 0.5.23's code runs here it computes the numbers (``by`` column):

- ``sglang import``: ``ragged_verify`` (``RaggedVerifyLayout``, ``build_ragged_target_verify_geometry``)
  and ``aux_hidden_states.pack_aux_hidden_states`` import on a CPU machine;
- ``sglang source``: ``dflash_info``, ``logits_processor``, ``eagle_utils`` and ``forward_batch_info``
  do not import here: ``sglang/srt/configs`` registers image processors with transformers 5.15's
  ``AutoImageProcessor``, which wants torchvision, and torchvision 0.28.0 on PyPI is built against
  CUDA torch (its ``_C.so`` needs ``libtorch_cuda.so``; with the CPU torch 2.13.0 it fails on
  ``torchvision::nms``); ``apache-tvm-ffi==0.1.11`` installs cleanly but alone does not help. So the
  one function needed is read from the installed file with ``ast`` and executed alone
  (``sglang_source.sglang_def``) with the module globals it uses;
- ``workbench rule``: our pure-Python rule, used where sglang is absent or the batch is ragged
  beyond what SGLang's uniform code takes. Every such rule names the SGLang expression it mirrors
  in ``SGLANG_RULES`` (sglang_source.py); tests/shapes/test_sglang_layout.py fails when the installed source stops
  containing it.

``custom_mask_elements`` is the one place for mask sizes (FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Sequence

import torch

from ddtree_kernels.mask_layout import mask_elements
from workbench.shapes.rows import LayoutTable, fmt_shape
from workbench.shapes.sglang_source import (  # noqa: F401  (re-exported: the rules and source helpers)
    AUX_HIDDEN, CUDA_GRAPH_RUNNER, DFLASH_INFO, DFLASH_WORKER, EAGLE_UTILS, FLASHINFER, FORWARD_BATCH_INFO,
    LOGITS_PROCESSOR, RAGGED_VERIFY, SGLANG_RULES, SGLANG_VERSION, SPEC_TREE, Rule, sglang_enums, expressions_in,
    find_def, rule_holds, sglang_available, sglang_def, sglang_dir, sglang_file, sglang_forward_modes,
)

MASK_MODES = ("FULL_MASK", "QLEN_ONLY", "QLEN_ONLY_BITPACKING")
SGLANG_MODES = ("EXTEND", "DECODE", "TARGET_VERIFY")


# --------------------------------------------------------------------------------------------- workbench rules
def _lens(name: str, v, bs: int | None = None) -> list[int]:
    """A per-request list of non-negative ints from an int (broadcast to ``bs``) or a sequence."""
    if isinstance(v, torch.Tensor):
        v = v.tolist()
    if isinstance(v, int) and not isinstance(v, bool):
        if bs is None:
            raise ValueError(f"{name}={v!r}: give one value per request (a list) or pass bs")
        v = [v] * bs
    v = list(v)
    if not v or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v):
        raise ValueError(f"{name}={v!r} must be a non-empty list of non-negative integers, one per request")
    return v


def _batch(prefix_lens, token_lens) -> tuple[list[int], list[int]]:
    """(prefix_lens, token_lens) as equal-length lists; either may be an int shared by every request."""
    n = None
    for v in (prefix_lens, token_lens):
        if not isinstance(v, int):
            n = len(v.tolist() if isinstance(v, torch.Tensor) else list(v))
    if n is None:
        raise ValueError("give prefix_lens or token_lens as a per-request list (the batch size comes from it)")
    p, t = _lens("prefix_lens", prefix_lens, n), _lens("token_lens", token_lens, n)
    if len(p) != len(t):
        raise ValueError(f"prefix_lens has {len(p)} requests but token_lens has {len(t)}")
    if min(t) < 1:
        raise ValueError(f"token_lens={t}: every request forwards at least one token")
    return p, t


def flat_positions(prefix_lens, token_lens) -> list[int]:
    """``positions [sum tokens]``: request i counts from its prefix length (rule "positions")."""
    p, t = _batch(prefix_lens, token_lens)
    return [a + j for a, n in zip(p, t) for j in range(n)]


def indptr(lens: Sequence[int]) -> list[int]:
    """``[0, l0, l0 + l1, ...]``: SGLang's qo_indptr over token counts, kv_indptr over KV lengths."""
    out = [0]
    for v in lens:
        out.append(out[-1] + int(v))
    return out


def logits_rows(mode: str, token_lens, return_logprob: bool = False, logprob_start_lens=None) -> list[int]:
    """Flat row indices the logits processor keeps (rules "logits all rows" / "last row" / "with logprobs").

    DECODE and TARGET_VERIFY keep every row; EXTEND keeps each request's last row, or with
    ``return_logprob`` the rows from ``logprob_start_lens[i]`` (default 0) to the end.
    """
    mode = _mode_name(mode)
    t = _lens("token_lens", token_lens)
    if mode in ("DECODE", "TARGET_VERIFY"):
        return list(range(sum(t)))
    ends = indptr(t)[1:]
    if not return_logprob:
        return [e - 1 for e in ends]
    starts = _lens("logprob_start_lens", logprob_start_lens if logprob_start_lens is not None else 0, len(t))
    out = []
    for e, n, s in zip(ends, t, starts):
        s = s - 1 if s == n else s  # sglang: a chunk with no logprob tokens still samples its last one
        out += list(range(e - n + s, e))
    return out


@dataclass(frozen=True)
class MaskSize:
    """A custom attention mask as SGLang allocates it: flat, ``numel`` entries of ``dtype``."""

    mode: str
    numel: int
    dtype: str
    bytes: int
    layout: str


_PACKED = ("uint8", "uint16", "uint32")


def custom_mask_elements(prefix_lens, token_lens, mask_mode: str = "FULL_MASK") -> MaskSize:
    """Size of a tree/verify custom mask in SGLang's layout, per request counts (ragged allowed).

    - FULL_MASK: every request's rows over its prefix and its own tokens, flat:
      ``sum_i n_i * (prefix_i + n_i)``; for a uniform n this is SGLang's
      ``seq_lens_sum * n + n * n * bs`` (eagle_utils.build_tree_kernel_efficient; the same
      ``sum(prefix) * n + n**2 * bs`` pads DFlashVerifyInput.custom_mask in dflash_info.py).
    - QLEN_ONLY: only the token-by-token block of each request: ``sum_i n_i**2`` (``n * bs * n``).
    - QLEN_ONLY_BITPACKING: one packed word per row, ``sum_i n_i`` words of uint8/16/32 chosen by
      the widest request; SGLang has no word wider than uint32, so more than 32 tokens per request is refused
      (sglang itself fails there with an IndexError).
    """
    p, t = _batch(prefix_lens, token_lens)
    if mask_mode not in MASK_MODES:
        raise ValueError(f"mask_mode={mask_mode!r} is not one of {', '.join(MASK_MODES)}")
    if mask_mode == "FULL_MASK":
        numel = mask_elements(mask_mode, p, t)
        return MaskSize(mask_mode, numel, "bool", numel, "flat bool: per request n x (prefix + n), row-major")
    if mask_mode == "QLEN_ONLY":
        numel = mask_elements(mask_mode, p, t)
        return MaskSize(mask_mode, numel, "bool", numel, "flat bool: per request n x n (prefix implied visible)")
    n_max = max(t)
    idx = math.ceil(math.log2((n_max + 7) // 8))  # sglang's packed_dtype_idx
    if idx >= len(_PACKED):
        raise ValueError(f"QLEN_ONLY_BITPACKING packs at most 32 tokens per request (one uint32 word per row); "
                         f"got {n_max}: use FULL_MASK or QLEN_ONLY")
    width = 1 << idx  # bytes per word
    numel = sum(t)
    return MaskSize(mask_mode, numel, _PACKED[idx], numel * width, f"one {_PACKED[idx]} word per row (bit j: row sees token j)")


def ragged_token_grid(capture_bs: Sequence[int], tokens_per_req: int) -> list[int]:
    """CUDA-graph token tiers of a ragged verify: ``sorted({bs * width for bs in capture_bs})``."""
    return sorted({int(b) * int(tokens_per_req) for b in capture_bs})


def _mode_name(mode) -> str:
    name = getattr(mode, "value", None) or getattr(mode, "name", None) or str(mode)
    name = str(name).upper()
    if name not in SGLANG_MODES:
        raise ValueError(f"mode={mode!r} is not one of {', '.join(SGLANG_MODES)}")
    return name


# --------------------------------------------------------------------------------------------- sglang's code
def sglang_positions(prefix_lens, token_lens) -> tuple[list[int], list[int]]:
    """forward_batch_info.compute_position_torch: (positions, extend_start_loc), by SGLang's code."""
    p, t = _batch(prefix_lens, token_lens)
    fn = sglang_def(FORWARD_BATCH_INFO, "compute_position_torch", torch=torch)
    pos, start = fn(torch.tensor(p, dtype=torch.int32), torch.tensor(t, dtype=torch.int32))
    return pos.tolist(), start.tolist()


def sglang_logits_rows(mode: str, token_lens, return_logprob: bool = False, logprob_start_lens=None) -> list[int]:
    """LogitsProcessor._get_pruned_states (logits_processor.py) run on row ids: the rows it keeps."""
    fm, _, _ = sglang_enums()
    t = _lens("token_lens", token_lens)
    starts = _lens("logprob_start_lens", logprob_start_lens if logprob_start_lens is not None else 0, len(t))
    fn = sglang_def(LOGITS_PROCESSOR, "LogitsProcessor._get_pruned_states", torch=torch,
                    is_pin_memory_available=lambda: False)
    meta = SimpleNamespace(forward_mode=fm[_mode_name(mode)], draft_extend_select_index=None,
                           extend_return_logprob=return_logprob, extend_seq_lens=torch.tensor(t),
                           extend_seq_lens_cpu=t, extend_logprob_start_lens_cpu=starts)
    rows = torch.arange(sum(t), dtype=torch.float64)[:, None]  # [T, 1]: each row carries its own index
    pruned = fn(None, rows, None, None, meta)[0]
    return [int(x) for x in pruned[:, 0].tolist()]


class _NoPack:
    """Stands in for SGLang's KV index translator: the indices' values do not change any shape."""

    def pack_read_stream(self, *a, **k):
        return None


def sglang_verify_args(prefix_lens, token_lens, with_mask: bool = False) -> dict:
    """DFlashVerifyInput.generate_attn_arg_prefill (dflash_info.py) on a batch: qo/kv indptr, kv_indices, mask.

    Uniform token counts use SGLang's ``draft_token_num`` path; ragged ones attach a real
    ``RaggedVerifyLayout`` (ragged_verify.py). ``with_mask`` hands an empty custom mask in, so
    SGLang's CUDA-graph padding grows it to the size it expects (uniform batches only: that
    padding rule is written for one ``draft_token_num``).
    """
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    p, t = _batch(prefix_lens, token_lens)
    bs = len(t)
    uniform = len(set(t)) == 1
    layout = None if uniform else RaggedVerifyLayout.from_verify_lens(
        verify_lens_cpu=t, device=torch.device("cpu"), grid=[sum(t)])
    fn = sglang_def(DFLASH_INFO, "DFlashVerifyInput.generate_attn_arg_prefill", torch=torch,
                    IdSpaceKind=SimpleNamespace(FULL="FULL"))
    me = SimpleNamespace(ragged_verify_layout=layout, draft_token_num=max(t),
                         custom_mask=torch.zeros(0, dtype=torch.bool) if with_mask and uniform else None)
    kv_indices, kv_indptr, qo_indptr, mask = fn(
        me, req_pool_indices=torch.zeros(bs, dtype=torch.int64), paged_kernel_lens=torch.tensor(p, dtype=torch.int32),
        paged_kernel_lens_sum=sum(p), translator=_NoPack(), plan=None)
    return {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr, "kv_indices": kv_indices, "custom_mask": mask,
            "layout": layout}


def sglang_tree_mask(prefix_lens, tokens_per_req: int, mask_mode: str) -> torch.Tensor:
    """eagle_utils.build_tree_kernel_efficient's mask allocation for ``mask_mode`` (the tree kernel not run)."""
    _, _, tmm = sglang_enums()
    p = _lens("prefix_lens", prefix_lens)
    bs, n = len(p), int(tokens_per_req)
    fn = sglang_def(EAGLE_UTILS, "build_tree_kernel_efficient", torch=torch, math=math, TreeMaskMode=tmm,
                    build_tree_kernel_efficient_func=lambda *a, **k: None)  # shapes only: fill nothing
    seq = torch.tensor(p, dtype=torch.int64)
    mask = fn(torch.zeros(bs, dtype=torch.int64), [], None, torch.zeros(bs, n - 1, dtype=torch.int64), seq,
              sum(p), 1, n - 1, n, tree_mask_mode=tmm[mask_mode])[0]
    return mask


def sglang_hidden_states(tokens: int, hidden_size: int, n_layers: int) -> list[int]:
    """aux_hidden_states.pack_aux_hidden_states on ``n_layers`` meta tensors [tokens, H]: the captured shape."""
    from sglang.srt.layers.aux_hidden_states import pack_aux_hidden_states

    aux = [torch.empty(tokens, hidden_size, device="meta") for _ in range(n_layers)]
    return list(pack_aux_hidden_states(aux).shape)


# --------------------------------------------------------------------------------------------- the layout view
def _try(fn, *a, **k):
    """(value, None) from SGLang's code, or (None, why) where it cannot run here."""
    if not sglang_available():
        return None, "sglang not installed"
    try:
        return fn(*a, **k), None
    except Exception as e:  # noqa: BLE001  (any failure: the workbench rule stands in, and says why)
        return None, f"{type(e).__name__}: {e}"


def _row(tensor, shape, dtype, rule=None, by="workbench rule", ours=None, note="", itemsize=None):
    numel = math.prod(shape) if shape is not None else 0
    size = itemsize if itemsize is not None else (torch.empty(0, dtype=getattr(torch, dtype)).element_size()
                                                   if dtype and hasattr(torch, dtype) else 0)
    r = SGLANG_RULES.get(rule) if rule else None
    return {"tensor": tensor, "shape": None if shape is None else list(shape), "dtype": dtype or "",
            "bytes": numel * size if shape is not None else None, "ours": ours or "",
            "by": by, "source": r.file if r else "", "rule": rule or "", "note": note}


def layout(mode, prefix_lens, token_lens, *, model: str = "target", vocab_size: int | None = None,
           hidden_size: int | None = None, aux_layers: int | None = None, dtype: str = "bfloat16",
           tree: bool = False, return_logprob: bool = False, use_sglang: bool = True, ours: dict | None = None):
    """SGLang's tensors for one forward of ``model`` in ``mode``, one row each (a ``LayoutTable``).

    ``prefix_lens``/``token_lens`` are per request (or an int shared by all, with the other a
    list): EXTEND tokens = prompt lengths, DECODE 1, TARGET_VERIFY the verified tokens (a chain or
    a tree's nodes, root included). ``tree`` adds the custom mask in each mask mode (a DFlash chain
    verifies with plain causal attention and no mask). ``model="draft"`` describes DFlash's drafter
    block forward. ``aux_layers``: target layers captured for the drafter. ``ours``: {tensor: text}
    shown beside SGLang's rows. ``use_sglang=False`` uses only the workbench rules.
    """
    mode = _mode_name(mode)
    p, t = _batch(prefix_lens, token_lens)
    ours = ours or {}
    sg = use_sglang and sglang_available()
    verify = mode == "TARGET_VERIFY" and model == "target"
    rows = _token_rows(mode, model, p, t, ours, sg, tree)
    rows += _verify_indptr_rows(p, t, ours, sg) if verify else _indptr_rows(mode, model, p, t, ours)
    if verify:
        rows += _mask_rows(p, t, ours, sg, tree)
    rows.append(_logits_row(mode, model, t, ours, sg, vocab_size, dtype, return_logprob))
    rows += _hidden_rows(mode, model, sum(t), ours, sg, hidden_size, aux_layers, dtype)
    tbl = LayoutTable(rows)
    tbl.title = (f"SGLang layout: {model} {mode}, bs {len(t)}, tokens {t if len(set(t)) > 1 else f'{t[0]} each'}, "
                 f"prefix {p if len(set(p)) > 1 else f'{p[0]} each'} (sglang {SGLANG_VERSION})")
    return tbl


def _computed(sg: bool, sglang_fn, our_value, *a, **k) -> tuple:
    """(value, by, why): SGLang's own code's value where ``sg`` and it runs, else the workbench rule's and why."""
    if not sg:
        return our_value, "workbench rule", ""
    v, why = _try(sglang_fn, *a, **k)
    return (our_value, "workbench rule", why) if why else (v, "sglang source", "")


def _token_rows(mode: str, model: str, p, t, ours: dict, sg: bool, tree: bool) -> list[dict]:
    """ids and positions: one flat token dimension."""
    ids_rule = ("draft input_ids" if model == "draft" else "verify input_ids") if mode == "TARGET_VERIFY" else None
    rows = [_row("input_ids", [sum(t)], "int64", ids_rule, "workbench rule", ours.get("input_ids"),
                 "flattened: request i's tokens at qo_indptr[i]:qo_indptr[i+1]")]
    pos, by, why = _computed(sg, lambda: sglang_positions(p, t)[0], flat_positions(p, t))
    rows.append(_row("positions", [len(pos)], "int64", "positions", by, ours.get("positions"),
                     why or ("prefix_i + j" + (" (a tree: prefix + depth, set by the tree build)" if tree else ""))))
    return rows


def _verify_indptr_rows(p, t, ours: dict, sg: bool) -> list[dict]:
    """The target's TARGET_VERIFY indptrs and KV indices (SGLang's verify arguments where it runs)."""
    v, by, why = _computed(sg, lambda: sglang_verify_args(p, t), None)
    qo = v["qo_indptr"].tolist() if v else indptr(t)
    kv = v["kv_indptr"].tolist() if v else indptr([a + n for a, n in zip(p, t)])
    kvi = int(v["kv_indices"].numel()) if v else sum(p) + sum(t)
    note = "" if len(set(t)) == 1 else "ragged: RaggedVerifyLayout.qo_indptr_device"
    return [_row("qo_indptr", [len(qo)], "int32", "verify qo_indptr", by, ours.get("qo_indptr"),
                 why or f"{qo[:6]}{'...' if len(qo) > 6 else ''} {note}".strip()),
            _row("kv_indptr", [len(kv)], "int32", "verify kv lens", by, ours.get("kv_indptr"),
                 why or f"cumsum(prefix + n): {kv[:6]}{'...' if len(kv) > 6 else ''}"),
            _row("kv_indices", [kvi], "int32", "verify kv lens", by, None,
                 why or "sum(prefix) + sum(n) KV slots read")]


def _indptr_rows(mode: str, model: str, p, t, ours: dict) -> list[dict]:
    """The indptrs of every other forward (EXTEND, DECODE, the drafter's block)."""
    bs = len(t)
    qo = indptr(t) if mode != "DECODE" else list(range(bs + 1))
    kv = indptr([a + n for a, n in zip(p, t)])
    rows = []
    if mode == "EXTEND" or model == "draft":
        rows.append(_row("qo_indptr", [bs + 1], "int32", "extend qo_indptr", "workbench rule",
                         ours.get("qo_indptr"), f"{qo[:6]}{'...' if len(qo) > 6 else ''}"))
    rows.append(_row("kv_indptr", [bs + 1], "int32", "kv_indptr", "workbench rule", ours.get("kv_indptr"),
                     f"cumsum(prefix + n): {kv[:6]}{'...' if len(kv) > 6 else ''}"))
    return rows


def _mask_rows(p, t, ours: dict, sg: bool, tree: bool) -> list[dict]:
    """The target verify's custom mask: none for a chain, else its size in each mask mode."""
    if not tree:
        return [_row("custom_mask", None, "", "dflash verify mask", "workbench rule", ours.get("attention_mask"),
                     "None: DFlash verify is causal (a chain needs no mask)")]
    rows = []
    for mm in MASK_MODES:
        try:
            ms = custom_mask_elements(p, t, mm)
        except ValueError as e:
            rows.append(_row(f"custom_mask ({mm})", None, "", f"mask {mm}", "workbench rule", None, str(e)))
            continue
        by, why = "workbench rule", ""
        if sg and len(set(t)) == 1:
            m, why = _try(sglang_tree_mask, p, t[0], mm)
            if m is not None and int(m.numel()) == ms.numel:
                by = "sglang source"
            elif m is not None:
                why = f"sglang allocates {int(m.numel())}, the workbench rule says {ms.numel}"
        elif sg:
            why = "ragged: per-request sum (SGLang's code takes one n)"
        rows.append(_row(f"custom_mask ({mm})", [ms.numel], ms.dtype, f"mask {mm}", by,
                         ours.get("attention_mask") if mm == "FULL_MASK" else None,
                         why or ms.layout, itemsize=ms.bytes // max(ms.numel, 1)))
    return rows


def _logits_row(mode: str, model: str, t, ours: dict, sg: bool, vocab_size, dtype: str,
                return_logprob: bool) -> dict:
    """The logits rows kept: the drafter's block slots, else what SGLang's LogitsProcessor keeps in ``mode``."""
    bs = len(t)
    if model == "draft":
        return _row("draft logits rows", [bs * (max(t) - 1), vocab_size] if vocab_size else [bs * (max(t) - 1)],
                    dtype, "dflash draft logits rows", "workbench rule", ours.get("logits"),
                    "the LM head on block slots 1..B-1 of each request (slot 0 is the anchor)")
    kept, by, why = _computed(sg, lambda: sglang_logits_rows(mode, t, return_logprob),
                              logits_rows(mode, t, return_logprob))
    rule = "logits all rows" if mode != "EXTEND" else ("logits with logprobs" if return_logprob else "logits last row")
    what = {"logits all rows": "every row", "logits last row": "last row per request",
            "logits with logprobs": "every prompt row (log-probs requested)"}[rule]
    return _row("next_token_logits", [len(kept), vocab_size] if vocab_size else [len(kept)], dtype, rule, by,
                ours.get("logits"), why or f"{what}: rows {kept[:4]}{'...' if len(kept) > 4 else ''}")


def _hidden_rows(mode: str, model: str, T: int, ours: dict, sg: bool, hidden_size, aux_layers,
                 dtype: str) -> list[dict]:
    """Hidden states for the DFlash drafter: the target's aux layers, or the drafter block's output."""
    if model == "target" and mode in ("EXTEND", "TARGET_VERIFY") and aux_layers and hidden_size:
        shape, by, why = _computed(sg, sglang_hidden_states, [T, aux_layers * hidden_size], T, hidden_size,
                                   aux_layers)
        if by == "sglang source":
            by = "sglang import"
        return [_row("hidden_states (aux, FULL)", shape, dtype, "dflash verify hidden", by,
                     ours.get("draft_context"), why or f"{aux_layers} target layers concatenated, every token; "
                     "written into the drafter's KV cache")]
    if model == "draft" and hidden_size:
        return [_row("hidden_states (draft out)", [T, hidden_size], dtype, "dflash draft capture", "workbench rule",
                     ours.get("hidden_states"), "capture NULL: the block's last hidden states feed the LM head")]
    return []


def layout_of_record(rec, label: str = "", tree: bool | None = None, vocab_size=None, hidden_size=None,
                     aux_layers=None, use_sglang: bool = True, return_logprob: bool = False, ragged=None):
    """``layout(...)`` for one ForwardRecord of this engine: SGLang's tensors next to the shapes we recorded.

    ``ragged``: (prefix lengths, token counts) per request for a padded batched forward (a batch
    session's verify), which SGLang flattens without the padding; by default every row has n tokens.
    """
    mode = rec.mode.value
    ids = rec.inputs.get("input_ids", {}).get("shape")
    if not ids or len(ids) != 2:
        raise ValueError(f"{label or rec.model}: input_ids shape {ids} is not [bs, n]")
    bs, n = ids
    prefix = rec.kv_before
    if rec.model == "draft":  # SGLang's drafter holds its whole context in its KV cache (see the last row)
        prefix += (rec.inputs.get("target_hidden") or {"shape": [0, 0]})["shape"][1]
    ours = {k: f"{fmt_shape(v['shape'])} {v['dtype']}" for k, v in {**rec.inputs, **rec.outputs}.items()}
    logits = rec.outputs.get("logits", {}).get("shape")
    vocab_size = vocab_size or (logits[-1] if logits else None)
    ctx = rec.outputs.get("draft_context", {}).get("shape")
    hs = rec.outputs.get("hidden_states", {}).get("shape")
    if hidden_size is None:
        hidden_size = (hs[-1] if hs else None)
    if aux_layers is None and ctx and hidden_size:
        aux_layers = ctx[-1] // hidden_size
    if tree is None:
        tree = False
    prefix_lens, token_lens = ragged if ragged is not None else ([prefix] * bs, [n] * bs)
    tbl = layout(mode, prefix_lens, token_lens, model=rec.model, vocab_size=vocab_size, hidden_size=hidden_size,
                 aux_layers=aux_layers, dtype=(rec.outputs.get("logits") or {}).get("dtype", "bfloat16"),
                 tree=tree, use_sglang=use_sglang, ours=ours, return_logprob=return_logprob)
    if rec.model == "draft" and "target_hidden" in rec.inputs:
        th = rec.inputs["target_hidden"]
        tbl.append(_row("target hidden (context)", None, "", "dflash verify hidden", "workbench rule",
                        f"{fmt_shape(th['shape'])} {th['dtype']} (an input here)",
                        "not an input in SGLang: written once into the draft KV cache after each target forward"))
    tbl += recurrent_layout(rec)
    if label:
        tbl.title = f"{label}: " + tbl.title
    return tbl


def state_rows(f, requests: int, kv_len: int, tokens: int, nodes: int = 0, dtype: str = "bfloat16") -> list[dict]:
    """SGLang's state tensors for one target forward of a model with ``families.ModelFacts`` ``f``:
    its KV pool (MHATokenToKVPool per layer [tokens, kv_heads, head_dim]; MLA's MLATokenToKVPool
    [tokens, 1, kv_lora_rank + qk_rope_head_dim]), for hybrids the MambaPool conv / temporal states per
    request and, in a verify over ``nodes`` nodes, its SpeculativeState per-node copies, and for MoE the
    routing tensors per MoE layer (router_logits [T, E], topk_ids / topk_weights [T, k]). Rows are sized
    for exactly the forward's requests and tokens (SGLang preallocates pools for many more)."""
    from workbench.shapes import families

    pool = requests * kv_len  # token slots this batch occupies after the forward
    L = f.attention_layers
    rows = []
    if f.family == "mla":
        rows.append(_row("kv_buffer (MLA latent)", [L, pool, 1, f.kv_width], dtype, "mla kv_cache_dim", "sglang source",
                         note=f"MLATokenToKVPool, one [tokens, 1, {f.kv_parts[0][1]} + {f.kv_parts[1][1]}] "
                              f"buffer per layer (x{L})"))
    else:
        heads_dim = f.kv_width // 2
        rows.append(_row("k_buffer + v_buffer", [2, L, pool, heads_dim], dtype,
                         note=f"MHATokenToKVPool, [tokens, kv_heads, head_dim] per layer (x{L} attention layers), "
                              "kv_heads x head_dim flattened here"))
    if f.linear is not None:
        Ll, conv, st = f.linear_layers, list(f.linear.conv_shape), list(f.linear.state_shape)
        cd, sd = families.SGLANG_CONV_DTYPE, f.ssm_dtype
        rows.append(_row("mamba conv", [Ll, requests, *conv], cd, "mamba conv shape", "sglang source",
                         note="MambaPool conv state [linear layers, requests, conv_dim, K - 1] (Mamba2StateShape)"))
        rows.append(_row("mamba temporal", [Ll, requests, *st], sd, "mamba temporal shape", "sglang source",
                         note="MambaPool recurrent state [linear layers, requests, HV, V, K]"))
        if nodes:
            rows.append(_row("intermediate_conv_window", [Ll, requests, nodes, *conv], cd,
                             note="SpeculativeState: each node's conv window (dense layout under tree verify)"))
            rows.append(_row("intermediate_ssm", [Ll, requests, nodes, *st], sd, "spec intermediate ssm",
                             "sglang source", note="SpeculativeState: each node's recurrent state; the accepted node's is copied "
                                  "into the request's slot after verify"))
    if f.experts:
        m = len(f.moe_layers)
        rows.append(_row("router_logits", [tokens, f.experts], dtype, note=f"per MoE layer (x{m}): StandardTopKOutput"))
        rows.append(_row("topk_ids", [tokens, f.experts_per_token], "int32", note=f"per MoE layer (x{m})"))
        rows.append(_row("topk_weights", [tokens, f.experts_per_token], "float32", note=f"per MoE layer (x{m})"))
    return rows


def recurrent_layout(rec) -> list[dict]:
    """SGLang's tensors for a hybrid target's linear-attention layers in this forward (one layer each; its mamba
    pool stacks them ``[layers, slots, ...]``), beside the recurrent tensors we recorded (``rec.states``).

    SGLang keeps the delta-rule state as ``[HV, Dv, Dk]`` where transformers (and we) keep ``[HV, Dk, Dv]``.
    A tree verify writes one conv window and one state per node (``intermediate_*``, dense layout in tree
    mode) from ``retrieve_parent_token``; EXTEND and DECODE update the request's pool rows in place."""
    st = {x["name"]: x for x in getattr(rec, "states", ())}
    if "conv_window" not in st:
        return []
    conv, ssm = st["conv_window"], st["ssm_state"]
    bs, dim, w = conv["shape"]
    HV, Dk, Dv = ssm["shape"][1:]
    n_layers = len(conv["layers"])
    ours = lambda x: f"{[*x['shape']]} {x['dtype']}"  # noqa: E731
    note = f"per layer, x{n_layers} linear layers"
    rows = [_row("mamba conv_state", [bs, dim, w], conv["dtype"], ours=ours(conv),
                 note=f"{note}; the requests' pool rows (mamba_cache_indices)"),
            _row("mamba ssm_state", [bs, HV, Dv, Dk], ssm["dtype"], ours=ours(ssm),
                 note=f"{note}; [HV, Dv, Dk]: ours is [HV, Dk, Dv]")]
    if "intermediate_ssm_state" in st and rec.mode.value == "TARGET_VERIFY":
        n = st["intermediate_ssm_state"]["shape"][1]
        rows += [
            _row("retrieve_parent_token", [bs, n], "int64", rule="retrieve_parent_token",
                 ours=ours({**rec.inputs["retrieve_parent_token"]}) if "retrieve_parent_token" in rec.inputs else None,
                 note="written by the conv kernel from retrieve_next_token / retrieve_next_sibling"),
            _row("intermediate_conv_window", [bs, n, dim, w], conv["dtype"], rule="mamba intermediate conv",
                 ours=ours(st["intermediate_conv_window"]), note=f"{note}; pool: [layers, slots + 1, draft tokens, dim, K-1]"),
            _row("intermediate_ssm_state", [bs, n, HV, Dv, Dk], ssm["dtype"], rule="mamba intermediate ssm",
                 ours=ours(st["intermediate_ssm_state"]),
                 note=f"{note}; pool: [layers, slots + 1, draft tokens, HV, Dv, Dk]"),
        ]
    return rows
