"""Figures everywhere (issue 26, item 3): a built notebook stores a PNG beside every plotly figure and a
run-the-cell sentence for every widget; one small notebook built into a temporary folder."""
from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

import pytest

from workbench.views.static import RUN_THE_CELL, add_static_fallbacks, chromium

ROOT = Path(__file__).resolve().parents[1]


def _build_module():
    spec = importlib.util.spec_from_file_location("nb_build", ROOT / "notebooks" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(chromium() is None, reason="needs a headless Chromium (Debian: apt-get install chromium)")
def test_built_notebook_has_static_figures_and_widget_sentence(tmp_path):
    mod = _build_module()
    cells = [
        mod.code("import plotly.graph_objects as go\nimport ipywidgets as W"),
        mod.code(mod.IGNORE + "go.Figure(go.Scatter(x=[0, 1, 2], y=[2, 0, 1], mode='markers+text', "
                              "text=['a', 'b', 'c']), layout=dict(width=400, height=300))"),
        mod.code(mod.IGNORE + "W.VBox([W.Button(description='Step')])"),
    ]
    path = mod.build("tiny_static", cells, out_dir=tmp_path)
    nb = json.loads(path.read_text())
    outs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    fig = next(o for o in outs if "application/vnd.plotly.v1+json" in o.get("data", {}))
    png = base64.b64decode(fig["data"]["image/png"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and 1_000 < len(png) < 200_000
    assert int.from_bytes(png[16:20], "big") == 400  # the figure's own width
    widget = next(o for o in outs if "application/vnd.jupyter.widget-view+json" in o.get("data", {}))
    text = widget["data"]["text/plain"]
    assert ("".join(text) if isinstance(text, list) else text) == RUN_THE_CELL  # nbformat may store lines
    assert "VBox(" not in json.dumps(widget["data"])
    assert path.stat().st_size < mod.MAX_NOTEBOOK_BYTES


def test_widget_sentence_and_missing_browser_is_one_line(monkeypatch):
    nb = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "execute_result", "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "x"},
                                                   "text/plain": "VBox(children=(HBox(...)))"}}]}]}
    counts = add_static_fallbacks(nb)  # no figure: no browser needed
    assert counts == {"figures": 0, "rendered": 0, "widgets": 1}
    assert nb["cells"][0]["outputs"][0]["data"]["text/plain"] == RUN_THE_CELL
    nb["cells"][0]["outputs"].append({"output_type": "display_data",
                                      "data": {"application/vnd.plotly.v1+json": {"data": [], "layout": {}}}})
    import workbench.views.static as st

    monkeypatch.setattr(st, "chromium", lambda: None)
    with pytest.raises(RuntimeError, match="no Chromium"):
        add_static_fallbacks(nb)


def test_stepper_repr_says_to_run_the_cell(tiny_engines):
    import workbench as wb
    from workbench.views import Stepper

    st = Stepper(tiny_engines["l4-h32"].session("t1 t2", policy=wb.DDTree(4), max_new_tokens=8))
    bundle = st._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert data["text/plain"] == RUN_THE_CELL and "application/vnd.jupyter.widget-view+json" in data


@pytest.mark.parametrize("notebook", sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb")))
def test_every_committed_notebook_stores_its_figures_as_images(notebook):
    """What GitHub, nbviewer and an HTML export show: each stored plotly figure has a PNG beside it and each
    widget output says to run the cell (a notebook built before the fallbacks, or by hand, fails here)."""
    nb = json.loads((ROOT / "notebooks" / notebook).read_text())
    outs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    for o in outs:
        data = o.get("data", {})
        if "application/vnd.plotly.v1+json" in data:
            assert base64.b64decode(data.get("image/png", ""))[:4] == b"\x89PNG", f"{notebook}: a figure without a PNG"
        if "application/vnd.jupyter.widget-view+json" in data:
            text = data.get("text/plain", "")
            assert ("".join(text) if isinstance(text, list) else text) == RUN_THE_CELL, f"{notebook}: a bare widget repr"
