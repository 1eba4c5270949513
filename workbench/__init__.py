"""ddtree-workbench: step through DFlash / DDTree speculative decoding one cycle at a time.

    import workbench as wb
    engine = wb.load()                                   # the embedded target + DFlash drafter
    s = engine.session("def parse(line):", policy=wb.DDTree(budget=32))
    c = s.step()                                         # one cycle -> wb.Cycle
    t = s.run(max_new_tokens=128)                        # -> wb.Trace
    print(s.text, t.summary())
"""
from workbench.cycle import Cycle, Summary, Trace, TraceFileError
from workbench.engine import Engine, Session, SessionFinished, load
from workbench.forward import ForwardMode, ForwardRecord
from workbench.loading import ModelPairError, load_models
from workbench.policies import AR, DDTree, DFlash, EagleTree, TreePolicy, parse_policy
from workbench import analysis, shapes, views  # after the engine: they read its records
from workbench.views import Stepper

__all__ = [
    "AR", "Cycle", "DDTree", "DFlash", "Engine", "ForwardMode", "ForwardRecord", "ModelPairError", "Session",
    "SessionFinished", "Stepper", "Summary", "Trace", "TraceFileError", "load", "load_models", "parse_policy",
    "shapes", "views", "EagleTree", "TreePolicy", "analysis",
]
__version__ = "0.1.0"
