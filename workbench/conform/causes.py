"""The catalogue of known bug classes, one entry per class and contract: what it hands the engine, where it was
published, when it fits a broken contract's evidence, and how the reference reproduces it.

An entry is a candidate for a broken contract when its ``fits`` holds on the evidence the contract recorded
(``ContractResult.facts``: ``contracts.*_facts``, ``feature_contract.features_problem``) and none of the contracts
that feed it (``upstream``) broke at or before its first broken step (a wrong input explains a wrong output: the
cause is the input's). The diagnosis (``workbench.conform.diagnosis``) then reproduces each candidate on the
contract's first broken cycles (``workbench.conform.suspects``) and names the one whose reproduction matches what
the engine recorded; an entry with no reproduction (``reproduce`` None) can only be said to match its signature.
Fitting is cheap and never names a cause by itself: a target's kind only rules out what it cannot have (no
recurrent state on an attention-only target).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workbench.conform import suspects as S


@dataclass(frozen=True)
class Cause:
    name: str  # the bug class, short
    contract: str  # the contract whose evidence it explains
    source: str  # where it was published (a port's finding, an engine's PR or issue thread, a paper)
    fits: Callable  # fits(result: ContractResult, hybrid: bool) -> bool: its evidence allows this cause
    reproduce: Callable | None  # per broken cycle (suspects.*) -> Repro | None; None: a signature only
    upstream: tuple = ()  # contracts whose earlier breakage would explain this one's evidence instead
    over_facts: bool = False  # reproduced by the contract itself on every broken cycle (``reproduce(result)``)

    def to_dict(self) -> dict:
        return {"cause": self.name, "contract": self.contract, "source": self.source}


def every(result, test: Callable[[dict], bool]) -> bool:
    """The contract recorded evidence for its broken cycles, and all of it passes ``test``."""
    return bool(result.facts) and all(test(f) for f in result.facts)


def labels(result) -> set[str]:
    """Every explanation the features contract gave a differing layer-row, over its broken cycles."""
    return {label for f in result.facts for label in f.get("explained", {})}


def rows_explained(want: Callable[[set], bool], what: str):
    """A features cause reproduced by the contract itself: it held every differing layer-row against the suspected
    row (another layer, position, the pre-norm output, a rejected node) within the features' tolerance.
    -> reproduce(result) -> (cycles whose rows all equal it, cycles, in words)."""
    def run(result):
        hit = sum(bool(f.get("explained")) and want(set(f["explained"])) for f in result.facts)
        return hit, len(result.facts), what
    return run


def one_layer_offset(found: set) -> bool:
    return found in ({"layer:-1"}, {"layer:1"})


def one_shift(found: set) -> bool:
    return len(found) == 1 and next(iter(found)).startswith("shift:")


def not_compacted(found: set) -> bool:
    return "rejected" in found and all(x == "rejected" or x.startswith("shift:") for x in found)


def always(result, hybrid) -> bool:
    return True


def offset_fits(result, hybrid) -> bool:
    """A constant nonzero offset, the same over every broken cycle."""
    offs = {f.get("offset") for f in result.facts}
    return len(offs) == 1 and None not in offs and 0 not in offs


# What the verify's output depends on: a break there first explains the features and the committed state.
VERIFY = ("tree", "verify positions", "visibility", "recurrent-state parents")
DEPDFLASH = "github.com/patrickbdevaney/dflash-caddtree-integrations docs/DDTREE.md (flat position / node off by one)"
ROWS = ("github.com/rasbt/reasoning-from-scratch/issues/33 (position ids computed once for the batch, not per "
        "sequence); github.com/vllm-project/vllm/issues/40809 (tree verify needs per-request tree RoPE)")
REJECTED = ("github.com/vllm-project/vllm-ascend/pull/14883 (seq_lens not reduced by the rejected-token count); "
            "rmagur1203/vllm-ddtree docs/DDTREE-FINDINGS-EN.md (host mirror of computed tokens off by +4 to +10)")
NEIGHBOUR = ("github.com/NVIDIA/TensorRT-LLM/pull/13081 (packed tree-mask rows not cleared: old bits widen the mask); "
             "github.com/sgl-project/sglang/pull/36201 (the tree builder's ancestor walk reads another row)")
CAUSAL = "github.com/sgl-project/sglang-jax/pull/1569 (sibling branches must not see each other: a causal mask cannot)"
BY_DEPTH = ("github.com/NVIDIA/TensorRT-LLM/pull/12962 (tree positions and topology out of step); a mask from "
            "positions instead of parents")


def positions_and_logits(contract: str, field: bool, upstream: tuple, fits_offset=offset_fits) -> tuple:
    """The position schemes as causes of ``contract``: from the recorded positions (``field``) or from the logits
    only (the recorded positions passed their contract)."""
    return (
        Cause("the tree's base position off by a constant", contract, DEPDFLASH, fits_offset,
              S.positions_by("offset", field), upstream),
        Cause("tree positions by flat node index, not depth", contract, DEPDFLASH,
              (lambda r, h: every(r, lambda f: f.get("by_index"))) if field else always,
              S.positions_by("index", field), upstream),
        Cause("positions from another request's start plus depth (one base for the batch)", contract, ROWS, always,
              S.positions_by("row", field), upstream),
        Cause("the base position counting the nodes the previous step rejected", contract, REJECTED, always,
              S.positions_by("rejected", field), upstream),
    )


def masks(contract: str, field: bool, upstream: tuple) -> tuple:
    """The known wrong masks as causes of ``contract`` (from the recorded visibility, or the logits only)."""
    return (
        Cause("each node also sees the node before it in the flattened order", contract, NEIGHBOUR, always,
              S.mask_by("previous", field), upstream),
        Cause("a causal (chain) mask over the flattened tree", contract, CAUSAL, always, S.mask_by("causal", field),
              upstream),
        Cause("a mask from depths: every node sees every shallower node", contract, BY_DEPTH, always,
              S.mask_by("depth", field), upstream),
    )


CAUSES = (
    Cause("the bonus token missing from the block's slot 0 (the mask token instead)", "drafter context",
          "github.com/warpfront/hipfire/pull/483 (tau 1.46 against the reference's 6.34)",
          lambda r, h: any(f.get("slot0_mask") for f in r.facts), S.block_slot0_mask),
    Cause("the drafter's block at shifted positions (RoPE phase skew)", "drafter context",
          "warpfront/hipfire #41 (RoPE phase skew)",
          lambda r, h: any(f.get("block_offset") not in (None, 0) for f in r.facts), S.block_positions_shifted),
    Cause("the drafter's new context starting a row late (the previous root's row dropped)", "drafter context",
          "rmagur1203/vllm-ddtree docs/DDTREE-FINDINGS-EN.md (a host mirror of computed tokens off); "
          "github.com/vllm-project/vllm/pull/9730 (the bonus token's row missing from the draft's K/V)",
          always, S.context_rows_late),
    Cause("the target-layer index off by one", "drafter features",
          "github.com/vllm-project/vllm/pull/42704 (wrong target-layer index offset)",
          lambda r, h: one_layer_offset(labels(r)),
          rows_explained(one_layer_offset, "features = the target's next (or previous) layer at each position"),
          VERIFY + ("target logits", "committed tokens"), True),
    Cause("the drafter's features handed over a row (or more) off", "drafter features", DEPDFLASH,
          lambda r, h: one_shift(labels(r)),
          rows_explained(one_shift, "features = the target's at a position a constant number of rows away"),
          VERIFY + ("target logits", "committed tokens"), True),
    Cause("the drafter's features read before the target's final norm", "drafter features",
          "vLLM 0.32 on a drafter that reads the last layer (docs/production-engines.md; "
          "workbench.adapters.vllm_workarounds 'last_layer_feature')",
          lambda r, h: labels(r) == {"prenorm:0"},
          rows_explained(lambda s: s == {"prenorm:0"}, "features = the last layer's output before the final norm"),
          VERIFY + ("target logits", "committed tokens"), True),
    Cause("hidden states not compacted to the accepted path", "drafter features",
          "warpfront/hipfire #272 (a host mirror of hidden states not compacted after eviction); "
          "github.com/SafeAILab/EAGLE/issues/336 (the draft layer's K/V keeps rejected nodes)",
          lambda r, h: not_compacted(labels(r)),
          rows_explained(not_compacted, "features = those of nodes of the previous tree it did not accept"),
          VERIFY + ("target logits", "committed tokens"), True),
    Cause("a drafter that does not share the target's lm_head / embeddings", "drafter output",
          "github.com/local-inference-lab/vllm/pull/54 (acceptance length 1.00, citing vLLM #46435)",
          lambda r, h: every(r, lambda f: f.get("top1_agree") is not None and f["top1_agree"] <= 0.25), None,
          ("drafter context", "drafter features")),
    Cause("the drafter's block attending causally", "drafter output",
          "github.com/microsoft/onnxruntime/pull/32225 (a hard-coded causal mask where a block drafter's slots see "
          "each other); github.com/z-lab/dflash/issues/122 (causal vs bidirectional block attention)",
          always, S.drafter_block("causal"), ("drafter context", "drafter features")),
    Cause("the bonus token missing from the block's slot 0 (the mask token instead)", "drafter output",
          "github.com/warpfront/hipfire/pull/483 (tau 1.46 against the reference's 6.34)", always,
          S.drafter_block("slot0"), ("drafter context", "drafter features")),
    Cause("the drafter's block at shifted positions (RoPE phase skew)", "drafter output",
          "warpfront/hipfire #41 (RoPE phase skew)", always, S.drafter_block("shifted"),
          ("drafter context", "drafter features")),
    *positions_and_logits("verify positions", True, ("tree",)),
    *masks("visibility", True, ("tree",)),
    Cause("stale parent indices on a hybrid target", "recurrent-state parents",
          "github.com/sgl-project/sglang/pull/29907 (forces topk=2 on hybrids: stale parent indices at replay)",
          lambda r, h: h, S.state_parents_flattened, ("tree",)),
    *positions_and_logits("target logits", False, VERIFY + ("accept walk", "committed tokens"), always),
    *masks("target logits", False, VERIFY + ("accept walk", "committed tokens")),
    Cause("the bonus read one node early (it repeats the last accepted token)", "accept walk",
          "github.com/kekzl/imp/issues/683 (verify emits a duplicated token at the bonus position)",
          always, S.bonus_one_node_early, VERIFY + ("target logits",)),
    Cause("K/V rows not compacted to the accepted path", "committed tokens",
          "warpfront/hipfire #272 (KV compaction and state after eviction)", always, S.kv_in_tree_order,
          VERIFY + ("target logits", "accept walk")),
    Cause("the recurrent state committed from the wrong node", "committed tokens",
          "Luce-Org/lucebox #414 (approximate rollback: the tree accepted less than the chain)",
          lambda r, h: h, S.state_from_other_node, VERIFY + ("target logits", "accept walk")),
)
