"""Figures everywhere: a built notebook stores a PNG beside every plotly figure and a
run-the-cell sentence for every widget; one small notebook built into a temporary folder."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from workbench.views.static import RUN_THE_CELL, add_static_fallbacks, chromium
from shared_checks import load_script

ROOT = Path(__file__).resolve().parents[2]


def _build_module():
    return load_script(ROOT / "notebooks" / "build.py", "nb_build")


@pytest.mark.skipif(chromium() is None, reason="needs a headless Chromium (Debian: apt-get install chromium)")
def test_built_notebook_has_static_figures_and_widget_sentence(tmp_path):
    mod = _build_module()
    import nbformat

    code = nbformat.v4.new_code_cell
    cells = [
        code("import plotly.graph_objects as go\nimport ipywidgets as W"),
        code(mod.IGNORE + "go.Figure(go.Scatter(x=[0, 1, 2], y=[2, 0, 1], mode='markers+text', "
                          "text=['a', 'b', 'c']), layout=dict(width=400, height=300))"),
        code(mod.IGNORE + "W.VBox([W.Button(description='Step')])"),
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


def test_a_notebook_the_user_executes_stores_each_figure_as_an_image(tmp_path, monkeypatch):
    """Not only the build script: a plain `jupyter nbconvert --execute` (here nbclient, as nbconvert runs it)
    of a notebook that imports workbench.views stores a PNG with every figure, so its HTML export shows them."""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    assert chromium() is not None, "this machine needs a headless Chromium (make test installs Debian's)"
    monkeypatch.setenv("WORKBENCH_STATIC_FIGURES", "1")  # as a user's kernel has it (nbval's kernels turn it off)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import plotly.graph_objects as go\nimport workbench.views"),
                nbformat.v4.new_code_cell("go.Figure(go.Bar(y=[3, 1, 2]), layout=dict(width=320, height=240))")]
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    data = nb.cells[1].outputs[0]["data"]
    png = base64.b64decode(data["image/png"])
    assert "application/vnd.plotly.v1+json" in data and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(png[16:20], "big") == 320
    page, _ = HTMLExporter().from_notebook_node(nb)
    assert "data:image/png;base64," + data["image/png"][:200] in page


NOTEBOOK_NAMES = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("name", NOTEBOOK_NAMES)
def test_every_notebook_states_its_run_time_at_the_top(name):
    """The note right after the title gives the run time its own stored cell timings add up to (that the rest of
    the notebook is its source: tests/notebooks/test_sources.py)."""
    import re

    mod = _build_module()
    nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
    top = "".join(nb["cells"][1]["source"])
    assert nb["cells"][0]["cell_type"] == "markdown" and top.startswith(mod.RUN_TIME_MARK), f"{name}: no run-time note"
    cores = int(re.search(r"on a (\d+)-core CPU machine", top).group(1))
    assert top == mod.run_time_note(nb, cores), f"{name}: the note does not match the stored timings"
    assert re.search(r"about \d+(\.\d)? (s|min) for all cells", top)


def test_long_cells_show_progress():
    """Every benchmark and every loop over prompts in the notebooks shows a progress bar (a 19-minute cell
    once ran with none), and those cells' outputs are not compared by nbval (a bar carries timings)."""
    mod = _build_module()
    long_cells = [(name, c.source) for name, path in mod.sources().items() for c in mod.source_cells(path)
                  if c.cell_type == "code" and ("compare_policies(" in c.source or "eval_prompts()[:12]" in c.source)]
    assert len(long_cells) >= 5
    for name, src in long_cells:
        assert "progress=False" not in src and ("progress=True" in src or "tqdm(" in src), (name, src[:120])
        assert src.startswith(mod.IGNORE.strip()), (name, src[:120])
