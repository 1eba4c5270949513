"""PathTree: the N prefixes most likely to be accepted whole, by a calibrated path-conditioned estimate."""
from __future__ import annotations

from dataclasses import dataclass

from workbench.engine.policies.base import register
from workbench.engine.policies.calibrated import Calibrated, check_budget, check_calibration_field


@register
@dataclass(frozen=True)
class PathTree(Calibrated):
    """The ``budget`` prefixes whose whole path the target most likely accepts (TAPS-like).

    DDTree ranks a prefix by the product of the drafter's per-slot marginals, which ignore the branch a token
    sits on: after a sibling (a rank >= 1 candidate) the drafter's next slot is right far less often than
    after its own top-1 (pays-off's branching table). Here a node's score is the calibrated estimate of
    P(the target accepts the whole root-to-node path), the product over the path of q(depth, rank, the
    drafter's log-probs, spine / sibling / off state of the path above), fitted on the pair's own traces
    (``calibration``: 'dense', 'hybrid', a file from ``python -m workbench.calibrate``, or None for the one
    shipped for the pair). The tree holds the ``budget`` best such prefixes.
    """

    budget: int = 32
    calibration: str | None = None
    kind = "path"
    usage = "path:N"
    knobs = ("budget",)
    batched_build = True  # its build takes a cycle's rows at once (the stage groups them)

    def __post_init__(self):
        check_budget("PathTree", self.budget)
        check_calibration_field("PathTree", self.calibration)

    def static_nodes(self, block_size: int) -> int:
        return self.budget + 1

    def build_tree(self, drafted, roots, sync_free):
        return self.likely_tree(drafted, roots, self.budget, None, sync_free)
