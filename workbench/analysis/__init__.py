"""Analyses over recorded runs: how reliable are the drafter's probabilities, and how large a tree was needed?

    rel = wb.analysis.reliability([trace1, trace2])      # drafted path probability vs acceptance
    rel.ece, rel.table(); wb.views.reliability_figure(rel)
    need = wb.analysis.budget_needed(trace)              # ranks of the target's continuation
    need.tau_at(16); wb.views.budget_needed_figure(need)
    wb.analysis.order_verdict(bench_result.summary)    # an order only where a paired test separates it
    wb.analysis.paired_ratio(a_tok_s, b_tok_s, "A", "B")  # per-prompt ratios, Wilcoxon and sign test
    wb.analysis.branching(trace)                         # target token ranks per depth; continuation rates
    wb.analysis.acceptance(trace)                        # per request in AIPerf's record shape; vllm bench serve's keys

Pure data (numpy); no model runs, no plotting.
"""
from workbench.analysis.acceptance import Acceptance, RequestAcceptance, acceptance, from_vllm_counters
from workbench.analysis.branching import Branching, branching
from workbench.analysis.budget import BudgetNeeded, budget_needed
from workbench.analysis.reliability import Reliability, reliability
from workbench.analysis.paired import PairedRatio, paired_ratio
from workbench.analysis.spread import OrderVerdict, order_values, order_verdict

__all__ = ["Acceptance", "Branching", "BudgetNeeded", "OrderVerdict", "PairedRatio", "Reliability", "RequestAcceptance",
           "acceptance", "branching", "budget_needed", "from_vllm_counters", "order_values",
           "order_verdict", "paired_ratio", "reliability"]
