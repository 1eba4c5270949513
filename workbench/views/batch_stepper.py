"""``BatchStepper``: step a ``BatchSession`` and look at one request's tree at a time.

A request selector picks whose cycles the slider walks; every batched cycle built one tree per live
request, and the figure is the same ``tree_figure`` the single-request Stepper draws. The line under
the controls shows the batched verify of the newest cycle: padded ``[bs, N]`` rows against SGLang's
flattened rows.
"""
from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go

from workbench.engine.core import SessionFinished
from workbench.views.figures import empty_figure, tree_figure
from workbench.views.stepper import StatusLine, Stepper


class BatchStepper(StatusLine):
    """Step / Run N over a BatchSession, a request selector and a cycle slider. Display it as a cell's
    last expression; everything is callable from Python (``step()``, ``run(n)``, ``show(request, cycle)``)."""

    def __init__(self, batch, tokenizer=None, max_nodes: int | None = 512):
        self.batch = batch
        self.tokenizer = tokenizer if tokenizer is not None else batch.engine.tokenizer
        self.max_nodes = max_nodes
        self.step_button = W.Button(description="Step", button_style="primary", tooltip="one cycle for the batch")
        self.run_button = W.Button(description="Run N", tooltip="run N cycles")
        self.run_n = W.BoundedIntText(value=10, min=1, max=100000, description="N", layout=W.Layout(width="130px"))
        self.request = W.Dropdown(options=[(f"request {i}: {s.policy}", i) for i, s in enumerate(batch.sessions)],
                                  value=0, description="request", layout=W.Layout(width="300px"))
        self.slider = W.IntSlider(value=0, min=0, max=0, description="cycle", disabled=True, continuous_update=False,
                                  layout=W.Layout(width="520px"))
        self.status = W.HTML()
        self.tree = go.FigureWidget(empty_figure("no cycles yet: press Step"))
        self._shown: tuple[int, int] | None = None
        self.step_button.on_click(lambda _b: self._guard(self.step))
        self.run_button.on_click(lambda _b: self._guard(lambda: self.run(self.run_n.value)))
        self.request.observe(lambda _c: self._guard(self._refresh), names="value")
        self.slider.observe(lambda c: self._guard(lambda: self._draw(int(c["new"]))), names="value")
        self.widget = W.VBox([W.HBox([self.step_button, self.run_button, self.run_n, self.request]),
                              self.slider, self.status, self.tree])
        self._refresh()

    @property
    def shown(self) -> tuple[int, int] | None:
        """(request, cycle) drawn in the tree figure, or None."""
        return self._shown

    def step(self):
        """One batched cycle; shows the selected request's newest tree. -> BatchCycle (None if finished)."""
        try:
            bc = self.batch.step()
        except SessionFinished as e:
            self._say(str(e), error=True)
            return None
        self._refresh()
        return bc

    def run(self, n: int = 10) -> list:
        out = []
        for _ in range(int(n)):
            if self.batch.finished:
                break
            out.append(self.batch.step())
        self._refresh()
        return out

    def show(self, request: int, cycle: int = -1) -> None:
        """Draw request ``request``'s cycle ``cycle`` (negative counts from the end)."""
        n = len(self.batch.sessions[request].cycles)
        if not -n <= cycle < n:
            raise IndexError(f"cycle {cycle} out of range: request {request} has {n} cycles")
        if self.request.value != request:
            self.request.value = request  # redraws at its newest cycle
        cycle %= n
        if self.slider.value != cycle:
            self.slider.value = cycle
        else:
            self._draw(cycle)

    def _draw(self, i: int) -> None:
        r = self.request.value
        cycles = self.batch.sessions[r].cycles
        if not cycles:
            return
        Stepper.redraw(self.tree, tree_figure(cycles[i], self.tokenizer, max_nodes=self.max_nodes))
        self._shown = (r, i)

    def _refresh(self) -> None:
        s = self.batch.sessions[self.request.value]
        n = len(s.cycles)
        self.slider.disabled = n == 0
        if n:
            self.slider.max = n - 1
            if self.slider.value != n - 1:
                self.slider.value = n - 1
            else:
                self._draw(n - 1)
        else:
            self._shown = None
            Stepper.redraw(self.tree, empty_figure("no cycles yet for this request: press Step"))
        msg = repr(self.batch)
        if self.batch.cycles:
            lay = self.batch.verify_layout()
            msg += (f"; last verify: padded {lay['padded']['logits'][:2]} = {lay['padded']['rows']} logits rows "
                    f"({lay['padded']['padding_rows']} padding), SGLang ragged {lay['ragged']['rows']} rows")
        msg += f"; request {self.request.value}: {len(s.generated)} tokens" + (
            f", finished: {s.finish_reason}" if s.finished else "")
        self._say(msg)
        done = self.batch.finished
        self.step_button.disabled = self.run_button.disabled = done


    def _repr_mimebundle_(self, **kw):
        from workbench.views.static import widget_bundle

        return widget_bundle(self.widget, **kw)
