"""``python -m workbench.calibrate``: a calibration file for the calibrated tree policies on one pair.

A calibration (``workbench.engine.policies.calibration``) holds what ``PathTree``, ``CostTree`` and ``CutTree``
need to know about a target + drafter pair: how often the target accepts the drafter's candidates given their
path (fitted on greedy decodes of calibration prompts, never evaluation prompts: ``prompts.py``), the pair's
step time over rows x nodes (``costs.py``), and CutTree's thresholds (``choose.py``). Modules, in the order the
command runs them: ``prompts`` -> ``collect`` -> ``fit`` -> ``choose`` -> ``command`` (which writes the file).
"""
