"""What both steppers share (``Stepper`` over one session, ``BatchStepper`` over a batch): the Step and Run N
buttons with the N box, the cycle slider, the status line, the tree figure updated in place, button actions that
show their errors in the status line, and stepping (one cycle, or up to N) with the view refreshed once after.

A stepper subclasses ``StepperBase``: it names what it steps (``stepped``: a session or a batch, anything with
``step()`` and ``finished``), builds the shared controls (``shared_controls``) beside its own, and draws
(``_refresh``); every action stays callable from Python.
"""
from __future__ import annotations

import html

import ipywidgets as W
import plotly.graph_objects as go

from workbench.engine.core import SessionFinished
from workbench.views.figures import empty_figure


class StepperBase:
    step_tooltip = "run one cycle"

    @property
    def stepped(self):
        """What Step and Run N step (a session, a batch)."""
        raise NotImplementedError

    def shared_controls(self, tokenizer, max_nodes: int | None) -> None:
        """The controls every stepper has, wired to ``step`` and ``run``; the slider and the tree start empty.
        ``tokenizer`` shows token text, ``max_nodes`` caps the nodes the tree figure draws."""
        self.tokenizer, self.max_nodes = tokenizer, max_nodes
        self.step_button = W.Button(description="Step", button_style="primary", tooltip=self.step_tooltip)
        self.run_button = W.Button(description="Run N", tooltip="run N cycles")
        self.run_n = W.BoundedIntText(value=10, min=1, max=100000, description="N", layout=W.Layout(width="130px"))
        self.slider = W.IntSlider(value=0, min=0, max=0, description="cycle", disabled=True, continuous_update=False,
                                  layout=W.Layout(width="520px"))
        self.status = W.HTML()
        self.tree = go.FigureWidget(empty_figure("no cycles yet: press Step"))
        self.step_button.on_click(lambda _b: self._guard(self.step))
        self.run_button.on_click(lambda _b: self._guard(lambda: self.run(self.run_n.value)))

    # ------------------------------------------------------------------ actions (callable from Python)
    def step(self):
        """Run one cycle and show it. Returns what ``stepped.step()`` returns (None once finished, said in the
        status line)."""
        self._before_steps()
        try:
            out = self.stepped.step()
        except SessionFinished as e:
            self._say(str(e), error=True)
            self._sync_buttons()
            return None
        self._refresh()
        return out

    def run(self, n: int = 10) -> list:
        """Run up to ``n`` cycles (stops where the stepped session or batch finishes); updates the view once at
        the end, not per cycle (drawing costs more than a small model's cycle)."""
        self._before_steps()
        out = []
        for _ in range(int(n)):
            if self.stepped.finished:
                break
            out.append(self.stepped.step())
        self._refresh()
        return out

    def _before_steps(self) -> None:
        """Called before a step or a run (the session stepper shows the settings the next cycle runs with)."""

    def _refresh(self) -> None:
        raise NotImplementedError

    def _sync_buttons(self) -> None:
        self.step_button.disabled = self.run_button.disabled = self.stepped.finished

    # ------------------------------------------------------------------ the status line
    def _guard(self, fn) -> None:
        """Run a button action; show an error in the status line instead of losing it in a callback."""
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - shown to the user in the widget
            self._say(f"{type(e).__name__}: {e}", error=True)

    def _say(self, msg: str, error: bool = False) -> None:
        color = "#b00020" if error else "#333"
        self.status.value = f"<span style='color:{color}'>{html.escape(msg)}</span>"

    # ------------------------------------------------------------------ drawing (in place)
    @staticmethod
    def redraw(fw: go.FigureWidget, fig: go.Figure) -> None:
        """Make ``fw`` show ``fig``: same trace types in the same order -> update them in place."""
        new = fig.data
        with fw.batch_update():
            same = len(fw.data) == len(new) and all(a.type == b.type for a, b in zip(fw.data, new))
            if same:
                for old, tr in zip(fw.data, new):
                    old.update(tr.to_plotly_json(), overwrite=True)
            layout = fig.layout.to_plotly_json()
            layout.pop("template", None)  # the same default template each time; resending it is waste
            for key in set(fw.layout.to_plotly_json()) - set(layout) - {"template"}:
                fw.layout[key] = None  # e.g. the "no cycles yet" annotation
            fw.layout.update(layout, overwrite=True)
        if not same:
            fw.data = ()
            fw.add_traces(list(new))

    def _repr_mimebundle_(self, **kw):
        from workbench.views.static import widget_bundle

        return widget_bundle(self.widget, **kw)
