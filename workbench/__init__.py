"""ddtree-workbench: step through DFlash / DDTree speculative decoding one cycle at a time.

    import workbench as wb
    engine = wb.load()                                   # the embedded target + DFlash drafter
    s = engine.session("def parse(line):", policy=wb.DDTree(budget=32))
    c = s.step()                                         # one cycle -> wb.Cycle
    t = s.run(max_new_tokens=128)                        # -> wb.Trace
    print(s.text, t.summary())
"""
from workbench.records.cycle import Cycle, Summary, Trace, TraceFileError
from workbench.records.divergence import Divergence, first_divergence
from workbench.engine.core import Engine, Session, SessionFinished, load
from workbench.records.forward import ForwardMode, ForwardRecord
from workbench.engine.loading import ModelPairError, load_models
from workbench.engine.policies import (AR, CondChain, CondTree, CostTree, CutTree, DDTree, DFlash, EagleTree, PairChain,
                                        PairTree, PathTree, Policy, Spine, TreePolicy, parse_policy)
from workbench.engine.policies import register as register_policy
from workbench.interface.base import BaseEngine, BaseSession
from workbench.interface.registry import register_engine
from workbench import analysis, shapes  # after the engine: they read its records
from workbench.serve.client import RemoteEngine, RemoteSession, connect
from workbench.serve import client as remote  # wb.remote.UnknownSession, ... (docs/wire-format.md)
# The package, callable: wb.conform(dump) is the checker whichever of workbench.conform's modules is imported
# first (a lazy __getattr__ was shadowed by the package once a dump writer imported it; conform/__init__.py)
from workbench import conform


def __getattr__(name: str):
    """``wb.views`` and ``wb.Stepper`` import plotly / ipywidgets on first use, so the engine, the CLI's
    run/bench and tests/gpu/check_cuda.py run without the notebook stack."""
    if name == "pays_off":  # does DDTree pay off here (workbench.payoff): imports the bench and analysis stack
        from workbench.payoff import pays_off

        return pays_off
    if name == "compare":  # the comparison report against a production engine (vLLM is optional)
        from workbench.adapters.compare import compare

        return compare
    if name in ("views", "Stepper"):
        import importlib

        views = importlib.import_module("workbench.views")  # a one-line ImportError names a missing package
        return views if name == "views" else views.Stepper
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


__all__ = [
    "AR", "Cycle", "compare", "conform", "pays_off", "DDTree", "DFlash", "Policy", "Spine", "register_policy",
    "BaseEngine", "BaseSession", "register_engine", "Divergence", "Engine", "ForwardMode", "ForwardRecord", "ModelPairError",
    "RemoteEngine", "RemoteSession", "Session", "SessionFinished", "Stepper", "Summary", "Trace", "TraceFileError",
    "EagleTree", "TreePolicy", "PathTree", "CostTree", "CutTree", "PairTree", "PairChain", "CondTree", "CondChain",
    "analysis", "connect",
    "first_divergence", "load", "load_models", "parse_policy",
    "shapes", "views",
]
from workbench.version import __version__  # noqa: E402,F401
