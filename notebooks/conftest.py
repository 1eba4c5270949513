"""nbval: compare stable text outputs only; figures, widgets, HTML and scripts carry random ids."""
from __future__ import annotations

import os

# nbval ignores image/png, so its kernels skip the per-figure PNG a user's kernel stores (workbench.views.static)
os.environ.setdefault("WORKBENCH_STATIC_FIGURES", "0")

SKIP_MIME = (
    "text/html",
    "application/javascript",
    "application/vnd.plotly.v1+json",
    "application/vnd.jupyter.widget-view+json",
    "application/vnd.jupyter.widget-state+json",
    "image/svg+xml",
)


def pytest_collectstart(collector):
    if getattr(collector, "skip_compare", None) is not None:
        collector.skip_compare = tuple(collector.skip_compare) + SKIP_MIME
