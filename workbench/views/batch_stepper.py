"""``BatchStepper``: step a ``BatchSession`` and look at one request's tree at a time.

A request selector picks whose cycles the slider walks; every batched cycle built one tree per live
request, and the figure is the same ``tree_figure`` the single-request Stepper draws. The line under
the controls shows the batched verify of the newest cycle: padded ``[bs, N]`` rows against SGLang's
flattened rows.
"""
from __future__ import annotations

import ipywidgets as W

from workbench.views.figures import empty_figure, tree_figure
from workbench.views.stepper_base import StepperBase


class BatchStepper(StepperBase):
    """Step / Run N over a BatchSession, a request selector and a cycle slider. Display it as a cell's
    last expression; everything is callable from Python (``step()``, ``run(n)``, ``show(request, cycle)``)."""

    step_tooltip = "one cycle for the batch"

    def __init__(self, batch, tokenizer=None, max_nodes: int | None = 512):
        self.batch = batch
        self.shared_controls(tokenizer if tokenizer is not None else batch.engine.tokenizer, max_nodes)
        self.request = W.Dropdown(options=[(f"request {i}: {s.policy}", i) for i, s in enumerate(batch.sessions)],
                                  value=0, description="request", layout=W.Layout(width="300px"))
        self._shown: tuple[int, int] | None = None
        self.request.observe(lambda _c: self._guard(self._refresh), names="value")
        self.slider.observe(lambda c: self._guard(lambda: self._draw(int(c["new"]))), names="value")
        self.widget = W.VBox([W.HBox([self.step_button, self.run_button, self.run_n, self.request]),
                              self.slider, self.status, self.tree])
        self._refresh()

    @property
    def shown(self) -> tuple[int, int] | None:
        """(request, cycle) drawn in the tree figure, or None."""
        return self._shown

    # step() and run(n) are StepperBase's: one batched cycle each (a BatchCycle), the selected request's newest
    # tree shown after.
    @property
    def stepped(self):
        return self.batch

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
        self.redraw(self.tree, tree_figure(cycles[i], self.tokenizer, max_nodes=self.max_nodes))
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
            self.redraw(self.tree, empty_figure("no cycles yet for this request: press Step"))
        msg = repr(self.batch)
        if self.batch.cycles:
            lay = self.batch.verify_layout()
            msg += (f"; last verify: padded {lay['padded']['logits'][:2]} = {lay['padded']['rows']} logits rows "
                    f"({lay['padded']['padding_rows']} padding), SGLang ragged {lay['ragged']['rows']} rows")
        msg += f"; request {self.request.value}: {len(s.generated)} tokens" + (
            f", finished: {s.finish_reason}" if s.finished else "")
        self._say(msg)
        self._sync_buttons()
