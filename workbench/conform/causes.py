"""From a broken contract's evidence to the known bug classes it matches: a catalogue, one entry per class.

Each entry is a pattern over the evidence a contract recorded for its broken cycles (``ContractResult.facts``,
data beside the evidence line: ``contracts.*_facts``, ``feature_contract.features_problem``), the bug class in
words, and where integrators reported it (docs/conformance.md, "Likely causes"; sources in
``shared/reference/field-2026-12-05.md``, section 2). Only a matching pattern counts: an entry names a cause when
*every* broken cycle the contract recorded evidence for shows its signature and none of the contracts that feed
it (``upstream``) broke at or before its first broken step (a wrong input explains a wrong output: the cause is
the input's), and the report says "no known cause matches" for a broken contract no entry matches. A match is a
likely cause, not a proof: the signature is what that bug leaves behind, and another bug may leave the same.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Cause:
    name: str  # the bug class, short
    contract: str  # the contract whose evidence it reads
    signature: str  # what the evidence shows when it matches, in words
    reference: str  # where it was reported
    pattern: Callable  # pattern(result: ContractResult, report) -> bool
    upstream: tuple = ()  # contracts whose earlier breakage would explain this one's evidence instead

    def matches(self, report) -> bool:
        """Its pattern holds over the contract's evidence, and no upstream contract broke first."""
        return clean_before(report, self.contract, self.upstream) and bool(
            self.pattern(report.results[self.contract], report))

    def to_dict(self) -> dict:
        return {"cause": self.name, "contract": self.contract, "signature": self.signature,
                "reference": self.reference}


def every(result, test: Callable[[dict], bool]) -> bool:
    """The contract recorded evidence for its broken cycles, and all of it passes ``test``."""
    return bool(result.facts) and all(test(f) for f in result.facts)


def clean_before(report, name: str, upstream: tuple) -> bool:
    """None of ``upstream`` broke at or before ``name``'s first broken step (row)."""
    first = report.results[name].first
    at = (first["step"], first["row"]) if first else (float("inf"), 0)
    for u in upstream:
        f = report.results[u].first if u in report.results else None
        if f is not None and (f["step"], f["row"]) <= at:
            return False
    return True


def labels(result) -> set[str]:
    """Every explanation the features contract gave a differing layer-row, over its broken cycles."""
    return {label for f in result.facts for label in f.get("explained", {})}


def one_layer_offset(result) -> bool:
    found = labels(result)
    return bool(result.facts) and found in ({"layer:-1"}, {"layer:1"})


def one_shift(result) -> bool:
    found = labels(result)
    return bool(result.facts) and len(found) == 1 and next(iter(found)).startswith("shift:")


def not_compacted(result) -> bool:
    found = labels(result)
    return "rejected" in found and all(x == "rejected" or x.startswith("shift:") for x in found)


def head_not_shared(result, report) -> bool:
    """The drafter's output agrees with the reference's top-1 by chance only (on inputs that were right: the
    entry's upstream)."""
    return every(result, lambda f: f.get("top1_agree") is not None and f["top1_agree"] <= 0.25)


# What the verify's output depends on: a break there first explains the features and the committed state.
VERIFY = ("tree", "verify positions", "visibility", "recurrent-state parents")


CAUSES = (
    Cause("the bonus token missing from the block's slot 0 (the mask token instead)", "drafter context",
          "slot 0 of every broken block holds the mask token, not the root",
          "github.com/warpfront/hipfire/pull/483 (tau 1.46 against the reference's 6.34)",
          lambda r, rep: every(r, lambda f: f.get("slot0_mask"))),
    Cause("the drafter's block at shifted positions (RoPE phase skew)", "drafter context",
          "every broken block sits a constant number of positions off start, start + 1, ...",
          "warpfront/hipfire #41 (RoPE phase skew)",
          lambda r, rep: every(r, lambda f: f.get("block_offset") not in (None, 0))),
    Cause("the target-layer index off by one", "drafter features",
          "every differing layer-row is the target's next (or previous) layer at its own position",
          "github.com/vllm-project/vllm/pull/42704 (wrong target-layer index offset)",
          lambda r, rep: one_layer_offset(r), VERIFY + ("target logits", "committed tokens")),
    Cause("the drafter's features handed over a row (or more) off", "drafter features",
          "every differing row is the target's features at a position a constant number of rows away",
          "the off-by-one class of patrickbdevaney docs/DDTREE.md (flat position / node off by one)",
          lambda r, rep: one_shift(r), VERIFY + ("target logits", "committed tokens")),
    Cause("the drafter's features read before the target's final norm", "drafter features",
          "every differing layer-row is the last layer's output before the final norm",
          "vLLM 0.32 on a drafter that reads the last layer (docs/production-engines.md; "
          "workbench.adapters.vllm_workarounds 'last_layer_feature')",
          lambda r, rep: bool(r.facts) and labels(r) == {"prenorm:0"}, VERIFY + ("target logits", "committed tokens")),
    Cause("hidden states not compacted to the accepted path", "drafter features",
          "differing rows are features of tree nodes the previous step did not accept (or accepted ones at other "
          "positions): kept in tree order, not the accepted path's",
          "warpfront/hipfire #272 (a host mirror of hidden states not compacted after eviction)",
          lambda r, rep: not_compacted(r), VERIFY + ("target logits", "committed tokens")),
    Cause("a drafter that does not share the target's lm_head / embeddings", "drafter output",
          "on the reference's own context and features the drafter's top-1 agrees with the reference's at a "
          "quarter of the slots or fewer, in every broken cycle",
          "github.com/local-inference-lab/vllm/pull/54 (acceptance length 1.00, citing vLLM #46435)",
          head_not_shared, ("drafter context", "drafter features")),
    Cause("a flat position / tree node off by one", "verify positions",
          "every broken cycle's verify positions are the reference's plus or minus one",
          "patrickbdevaney docs/DDTREE.md (flat-position / node off-by-one)",
          lambda r, rep: every(r, lambda f: f.get("offset") in (1, -1))),
    Cause("tree positions by flat node index, not depth", "verify positions",
          "every broken cycle's positions are the root's plus each node's index in the tree's order",
          "patrickbdevaney docs/DDTREE.md (flat-position / node confusion)",
          lambda r, rep: every(r, lambda f: f.get("by_index"))),
    Cause("stale parent indices on a hybrid target", "recurrent-state parents",
          "every node continued the recurrent state of the node before it in the flattened order",
          "github.com/sgl-project/sglang/pull/29907 (forces topk=2 on hybrids: stale parent indices at replay)",
          lambda r, rep: every(r, lambda f: f.get("flattened"))),
    Cause("the recurrent state committed from the wrong node", "committed tokens",
          "on a hybrid target the kept rows are the accepted path's, yet the committed state gives the next root "
          "the wrong logits",
          "Luce-Org/lucebox #414 (approximate rollback: the tree accepted less than the chain)",
          lambda r, rep: every(r, lambda f: f.get("state") and f.get("hybrid") and f.get("kept_as_accepted")),
          VERIFY + ("target logits",)),
    Cause("K/V rows not compacted to the accepted path", "committed tokens",
          "on an attention target the kept rows are named as the accepted path's, yet the committed K/V gives the "
          "next root the wrong logits",
          "warpfront/hipfire #272 (KV compaction and state after eviction)",
          lambda r, rep: every(r, lambda f: f.get("state") and not f.get("hybrid") and f.get("kept_as_accepted")),
          VERIFY + ("target logits",)),
)


def match_causes(report) -> dict:
    """Broken contract -> the catalogue's causes whose pattern its evidence matches ([] when none does)."""
    return {name: [c for c in CAUSES if c.contract == name and c.matches(report)] for name in report.broken}


def report_lines(broken: list[str], causes: dict) -> list[str]:
    """The report's lines: per broken contract, the causes its evidence matches, or that none does."""
    out = ["likely causes (a known bug's signature in the evidence; workbench.conform.causes):"]
    for name in broken:
        found = causes.get(name, [])
        if not found:
            out.append(f"  {name}: no known cause matches")
        for c in found:
            out.append(f"  {name}: {c.name} -- {c.signature}; reported: {c.reference}")
    return out
