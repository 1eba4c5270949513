"""The tree shapes ``pays-off`` decodes, and the shapes and batches it refuses before any decode (one line each;
the rest of the input is checked in ``workbench.payoff.inputs``).

Shapes, all over the same drafter: AR (no drafter), DFlash's chain (the argmax of every slot), the chain cut
to N nodes (``DDTree(N, width=1)``), the spine with k siblings (``Spine(k)``: the chain plus the k best
rank-1+ candidates over all slots, each a leaf), DDTree(N), the N best prefixes, and the calibrated policies
(``docs/calibrated-policies.md``), one budget each in the default set: PathTree(16), CostTree(64),
CutTree(16), PairTree(16), PairChain(8), and the learned head's CondTree(16) and CondChain(8).
"""
from __future__ import annotations

from dataclasses import dataclass

from workbench.engine.policies import (AR, CondChain, CondTree, CostTree, CutTree, DDTree, DFlash, PairChain, PairTree,
                                       PathTree, Spine, as_policy)

CHAIN_CUTS = (4, 8)  # the chain cut to N nodes (below the drafter's slots; at the slots it is DFlash)
SPINE_SIBLINGS = (1, 2, 4)
BUDGETS = (4, 8, 16, 32, 64)
# One size per calibrated policy: seven more shapes add 7/12 to a default run that already decodes 12 per unit.
# pays-off replaces these budgets per batch size with the ones chosen on calibration prompts
# (workbench.payoff.sizing); these are the sizes the calibration replays compared with DDTree(16)
# (docs/calibrated-policies.md), kept where a calibration holds no cost table to size with. PairChain's width 8
# is the one its head's beta was chosen on, CondChain's the one its head was compared at. The two learned-head
# policies (CondTree, CondChain) run where a head was trained on the pair. Other sizes: --policies.
CALIBRATED = (PathTree(16), CostTree(64), CutTree(16), PairTree(16), PairChain(8), CondTree(16), CondChain(8))
# The calibrated policies' families: the verdict compares each of them with the best DDTree budget.
CALIBRATED_FAMILIES = ("path-tree", "cost-tree", "cut-tree", "pair-tree", "pair-chain", "cond-tree", "cond-chain")
# what family() returns: how the tables group shapes
SHAPE_FAMILIES = ("ar", "chain", "chain-cut", "spine", "tree", *CALIBRATED_FAMILIES, "other")


@dataclass(frozen=True)
class Shape:
    """One policy of the sweep and its family (how the tables group it)."""

    policy: object
    family: str

    @property
    def label(self) -> str:
        return str(self.policy)


# A policy's family by its registered kind (the DDTree chain cut: width 1); any other kind is "other".
KIND_FAMILY = {"ar": "ar", "dflash": "chain", "spine": "spine", "ddtree": "tree", "path": "path-tree",
               "costed": "cost-tree", "cut": "cut-tree", "pairtree": "pair-tree", "pairchain": "pair-chain",
               "condtree": "cond-tree", "condchain": "cond-chain"}


def family(policy) -> str:
    fam = KIND_FAMILY.get(policy.kind, "other")
    return "chain-cut" if fam == "tree" and policy.width == 1 else fam


def check_fills(policy, slots: int, vocab: int) -> None:
    """Refuse a shape the drafter cannot fill (its tree would silently be smaller than its label)."""
    cap = policy.capacity(slots, vocab)
    if cap is not None:
        asked = policy.static_nodes(slots + 1) - 1  # drafted nodes: the static count less the root
        raise ValueError(f"{policy} asks for {asked} nodes but this drafter's block drafts {slots} slots, where "
                         f"that shape holds at most {cap}: use a budget <= {cap}")


def default_shapes(slots: int, vocab: int) -> list[Shape]:
    """AR, DFlash, the chain cut to 4 and 8, Spine(1, 2, 4), DDTree(4 ... 64) and the calibrated policies
    (``CALIBRATED``): the budgets the drafter can fill. Whether the calibrated ones can run on the pair is
    ``workbench.payoff.inputs.fit_to_engine``'s to say (it needs the loaded pair)."""
    pols = [AR(), DFlash(), *(DDTree(n, width=1) for n in CHAIN_CUTS if n < slots)]
    pols += [Spine(k) for k in SPINE_SIBLINGS]
    pols += [p for p in (*(DDTree(n) for n in BUDGETS), *CALIBRATED) if p.capacity(slots, vocab) is None]
    return [Shape(p, family(p)) for p in pols]


def shapes_of(policies, slots: int, vocab: int) -> list[Shape]:
    """The given policies (objects or 'ddtree:16'-style text) as shapes, AR and DFlash added when missing
    (every speedup is over them); a budget the drafter cannot fill is refused."""
    pols = [as_policy(p) for p in policies]
    for p in pols:
        check_fills(p, slots, vocab)
    seen = []
    for p in [AR(), DFlash(), *pols]:
        if p not in seen:
            seen.append(p)
    return [Shape(p, family(p)) for p in seen]


def check_batch_fits(engine, batch: int, context: int, nodes: int) -> None:
    """Refuse a batch whose K/V and verify activations would not fit in the device's free memory, before
    any work (``workbench.shapes.memory_fit.check_fits_loaded``: the same estimate as the forward sweep)."""
    from workbench.shapes.memory_fit import check_fits_loaded
    from workbench.shapes.families import load_config

    m = engine.models
    try:
        tcfg, dcfg = load_config(m.target_dir), load_config(m.draft_dir)
    except (OSError, ValueError):  # a pair without config files on disk: nothing to estimate from
        return
    tcfg.setdefault("_name", m.target_dir.name)
    try:
        check_fits_loaded(m, tcfg, dcfg, batch, nodes, context)
    except ValueError as e:
        raise ValueError(f"batch {batch} cannot be held: {e}") from None
