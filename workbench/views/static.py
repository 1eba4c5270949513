"""Static fallbacks for stored notebook outputs, so figures show where no plotly.js runs.

GitHub, nbviewer and ``jupyter nbconvert --to html`` render a stored output's ``image/png`` but not
its plotly JSON; JupyterLab prefers the plotly JSON and stays interactive. Inlining plotly.js per
figure (~4.6 MB) would break the 1 MB notebook limit, so each figure gets a PNG (tens of kB),
rendered offline by a headless Chromium from the plotly.js that ships inside the plotly package:
one browser start per notebook, no network. A widget output, which needs a live kernel, gets a
sentence saying to run the cell in place of its ``VBox(children=...)`` repr.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
RUN_THE_CELL = ("Interactive widget: run this cell in Jupyter with a live kernel to use it "
                "(a stored notebook keeps no widget state).")


def chromium() -> str | None:
    """The headless browser to render with: $WORKBENCH_CHROMIUM, else chromium on the PATH."""
    env = os.environ.get("WORKBENCH_CHROMIUM")
    if env:
        return env
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _page(figs: list[dict], js_uri: str) -> str:
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8"><script src="{js_uri}"></script></head><body>
<pre id="out"></pre><script>
const figs = {json.dumps(figs)};
(async () => {{
  const out = [];
  for (const f of figs) {{
    try {{
      const div = document.createElement('div'); document.body.appendChild(div);
      const lay = f.layout || {{}};
      await Plotly.newPlot(div, f.data || [], lay, {{staticPlot: true}});
      out.push(await Plotly.toImage(div, {{format: 'png', width: lay.width || 900, height: lay.height || 450}}));
      Plotly.purge(div); div.remove();
    }} catch (e) {{ out.push(null); }}
  }}
  document.getElementById('out').textContent = JSON.stringify(out);
}})();
</script></body></html>"""


def figure_pngs(figs: list[dict], timeout: float = 300) -> list[str | None]:
    """Base64 PNGs of plotly figure dicts (``fig.to_plotly_json()`` or a stored output's plotly JSON),
    one headless browser start for all. RuntimeError (one line) when no browser can render them."""
    if not figs:
        return []
    import plotly

    exe = chromium()
    if exe is None:
        raise RuntimeError("no Chromium to render static figures (install chromium or set WORKBENCH_CHROMIUM)")
    js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "figures.html"
        page.write_text(_page(figs, js.as_uri()), encoding="utf-8")
        try:
            r = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                                "--disable-background-networking", "--no-first-run", f"--user-data-dir={tmp}/profile",
                                "--virtual-time-budget=60000", "--dump-dom", page.as_uri()],
                               capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(f"rendering static figures with {exe} failed: {e}") from None
    m = re.search(r'<pre id="out">(.*?)</pre>', r.stdout, re.S)
    try:
        urls = json.loads(html.unescape(m.group(1))) if m else None
    except json.JSONDecodeError:
        urls = None
    if not isinstance(urls, list) or len(urls) != len(figs):
        raise RuntimeError(f"rendering static figures with {exe} gave no images (exit {r.returncode})")
    prefix = "data:image/png;base64,"
    return [u[len(prefix):] if isinstance(u, str) and u.startswith(prefix) else None for u in urls]


def add_static_fallbacks(nb) -> dict:
    """Give every plotly output of an executed notebook (nbformat node or dict) an ``image/png`` beside
    its JSON, and every widget output a run-the-cell sentence. Returns counts: figures, rendered, widgets."""
    plots, widgets = [], 0
    for cell in nb["cells"]:
        if cell.get("cell_type") != "code":
            continue
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if PLOTLY_MIME in data and "image/png" not in data:
                plots.append(data)
            if WIDGET_MIME in data:
                data["text/plain"] = RUN_THE_CELL
                data["text/html"] = f"<p><i>{html.escape(RUN_THE_CELL)}</i></p>"
                widgets += 1
    pngs = figure_pngs([dict(d[PLOTLY_MIME]) for d in plots])
    for data, png in zip(plots, pngs):
        if png:
            data["image/png"] = png
    return {"figures": len(plots), "rendered": sum(1 for p in pngs if p), "widgets": widgets}


# ------------------------------------------------------------------------------------------ in a live kernel
RENDERER = "workbench_png"
ENV_SWITCH = "WORKBENCH_STATIC_FIGURES"  # "0": no PNG at display time (nbval, which ignores PNGs; the build)


class _PngRenderer:
    """A plotly mimetype renderer that adds the figure's PNG (headless Chromium) to what a cell stores, so a
    notebook a user executes (``jupyter nbconvert --execute``, Run All then save) shows its figures in an
    HTML export, on GitHub and in nbviewer, as a built one does. Without a browser: no PNG, said once."""

    warned = False

    def to_mimebundle(self, fig_dict):
        try:
            png = figure_pngs([dict(fig_dict)])[0]
        except RuntimeError as e:
            if not _PngRenderer.warned:
                _PngRenderer.warned = True
                import sys

                print(f"workbench: figures are stored without a static image ({e})", file=sys.stderr)
            return {}
        return {"image/png": png} if png else {}


def install_png_renderer() -> bool:
    """In a Jupyter kernel, add ``workbench_png`` to plotly's default renderers (once); elsewhere, or with
    $WORKBENCH_STATIC_FIGURES=0, do nothing. Returns whether it is on."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return False
    import plotly.io as pio
    from plotly.io._base_renderers import MimetypeRenderer

    if RENDERER not in pio.renderers:
        pio.renderers[RENDERER] = type("WorkbenchPngRenderer", (_PngRenderer, MimetypeRenderer), {})()
    names = [n for n in (pio.renderers.default or "plotly_mimetype").split("+") if n]
    if RENDERER not in names:
        pio.renderers.default = "+".join([*names, RENDERER])
    return True


def widget_bundle(widget, **kw):
    """A widget's display bundle with ``RUN_THE_CELL`` as its plain text: the live widget in a kernel,
    a sentence to run the cell where none runs (a stored notebook on GitHub)."""
    bundle = widget._repr_mimebundle_(**kw)
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    if isinstance(data, dict):
        data["text/plain"] = RUN_THE_CELL
    return bundle
