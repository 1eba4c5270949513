"""Views: pure "data -> plotly figure" functions, the Stepper widget, and self-contained HTML export.

    from workbench import views
    views.tree_figure(cycle, engine.tokenizer)          # -> plotly Figure
    views.Stepper(engine.session("def f(x):"))          # a notebook widget; .step(), .run(n), .reset()
    views.save_html(fig, "tree.html"); views.write_report("run.jsonl", "report.html")
"""

try:
    from workbench.views.analysis_figures import budget_needed_figure, policy_compare_figure, reliability_figure
    from workbench.views.cost_figures import speedup_figure, verify_cost_figure
    from workbench.views.payoff_figures import by_policy_figure, next_top1_figure, payoff_figure
    from workbench.views.export import save_html, to_html
    from workbench.views.figures import (
        acceptance_figure, budget_sweep_figure, draft_heatmap, mask_figure, node_outcomes, stage_times_figure, token_stream, token_text,
        tree_figure, tree_layout, tree_node_count, visible,
    )
    from workbench.views.report import report_html, write_report
    from workbench.views.stepper import Stepper
    from workbench.views.batch_stepper import BatchStepper
except ImportError as e:  # the engine runs without the notebook stack; only the views need it
    if e.name and e.name.split(".")[0] in ("plotly", "ipywidgets"):
        from workbench.extras import missing

        raise ImportError(missing("workbench.views (the engine and CLI run/bench work without it)", e.name),
                          name=e.name) from e
    raise

from workbench.views.static import install_png_renderer

install_png_renderer()  # in a kernel: every figure a cell shows also stores its PNG (an HTML export shows it)

__all__ = [
    "BatchStepper", "Stepper", "acceptance_figure", "budget_sweep_figure", "draft_heatmap", "mask_figure", "node_outcomes", "report_html", "save_html",
    "stage_times_figure", "to_html", "token_stream", "token_text", "tree_figure", "tree_layout", "tree_node_count",
    "visible", "write_report", "budget_needed_figure", "policy_compare_figure", "reliability_figure",
]
__all__ += ["speedup_figure", "verify_cost_figure"]  # the roofline cost model's figures
__all__ += ["by_policy_figure", "next_top1_figure", "payoff_figure"]  # pays-off's results and the policies' counts
