"""Decoding policies. All run on the same engine, models and stages; they differ in the tree.

``base`` declares what a policy offers (``Policy``) and holds the registry every reader goes through
(``parse_policy``, ``as_policy``, ``to_wire`` / ``from_wire``, ``choices``); each built-in policy is one
class in one module below, decorated ``@register``. Importing this package registers them, in the order
a menu lists them.
"""
from workbench.engine.policies.base import (MAX_BUDGET, Policy, as_policy, by_kind, choices, from_wire,
                                            knob_values, parse_policy, register, registered, to_wire, unregister,
                                            usages, with_knobs)
from workbench.engine.policies.ddtree import DDTree
from workbench.engine.policies.dflash import DFlash
from workbench.engine.policies.ar import AR
from workbench.engine.policies.eagle import EagleTree
from workbench.engine.policies.spine import Spine
from workbench.engine.policies.path_tree import PathTree
from workbench.engine.policies.cost_tree import CostTree
from workbench.engine.policies.cut_tree import CutTree
from workbench.engine.policies.pair_tree import PairTree
from workbench.engine.policies.pair_chain import PairChain
from workbench.engine.policies.cond_tree import CondTree
from workbench.engine.policies.cond_chain import CondChain
from workbench.engine.policies.custom import TreePolicy

__all__ = [
    "AR", "CondChain", "CondTree", "CostTree", "CutTree", "DDTree", "DFlash", "EagleTree", "MAX_BUDGET", "PairChain", "PairTree", "PathTree",
    "Policy", "Spine",
    "TreePolicy", "as_policy", "by_kind",
    "choices", "from_wire", "knob_values", "parse_policy", "register", "registered", "to_wire", "unregister",
    "usages", "with_knobs",
]

# Policies other installed packages declare (entry-point group 'workbench.policies'): imported last, so they
# register after the built-ins and every reader of a spelling (CLI, stepper, served engine, pays-off) has them.
from workbench.interface.plugins import POLICY_GROUP, import_declared  # noqa: E402

import_declared(POLICY_GROUP)
