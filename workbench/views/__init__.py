"""Views: pure "data -> plotly figure" functions, the Stepper widget, and self-contained HTML export.

    from workbench import views
    views.tree_figure(cycle, engine.tokenizer)          # -> plotly Figure
    views.Stepper(engine.session("def f(x):"))          # a notebook widget; .step(), .run(n), .reset()
    views.save_html(fig, "tree.html"); views.write_report("run.jsonl", "report.html")
"""
from workbench.views.analysis_figures import budget_needed_figure, policy_compare_figure, reliability_figure
from workbench.views.export import save_html, to_html
from workbench.views.figures import (
    acceptance_figure, budget_sweep_figure, draft_heatmap, mask_figure, node_outcomes, stage_times_figure, token_stream, token_text,
    tree_figure, tree_layout, tree_node_count, visible,
)
from workbench.views.report import report_html, write_report
from workbench.views.stepper import Stepper

__all__ = [
    "Stepper", "acceptance_figure", "budget_sweep_figure", "draft_heatmap", "mask_figure", "node_outcomes", "report_html", "save_html",
    "stage_times_figure", "to_html", "token_stream", "token_text", "tree_figure", "tree_layout", "tree_node_count",
    "visible", "write_report", "budget_needed_figure", "policy_compare_figure", "reliability_figure",
]
