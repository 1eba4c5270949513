"""``Stepper``: step a session a cycle at a time in a notebook and watch the tree, the text and the stats.

The widget only wires controls to the pure figure functions; all of its logic is
callable from Python (``step()``, ``run(n)``, ``reset()``, ``show_cycle(i)``), and
the figures are ``go.FigureWidget`` objects updated in place (no re-creation).
"""
from __future__ import annotations

import html

import ipywidgets as W
import plotly.graph_objects as go

from workbench.engine import policies
from workbench.records.cycle import Trace
from workbench.views.figures import empty_figure, token_stream, tree_figure
from workbench.views.stepper_base import StepperBase


def steady_rate_html(trace) -> str:
    """Tokens per second of the cycles after the first (the first is cold: allocation, kernel selection),
    labelled as such; the first cycle's own time beside it."""
    cs = trace.cycles
    if len(cs) < 2:
        return "<p>steady tok/s: needs two cycles (the first, cold cycle is left out)</p>"
    secs = sum(c.seconds for c in cs[1:])
    rate = sum(c.committed for c in cs[1:]) / secs if secs > 0 else 0.0
    return (f"<p><b>steady: {rate:.1f} tok/s</b> over cycles 1-{len(cs) - 1} (cycle 0, cold, left out: "
            f"{1e3 * cs[0].seconds:.1f} ms). The summary below counts every cycle and the prefill.</p>")


class Stepper(StepperBase):
    """A notebook widget over a ``Session``: Step, Run N, Reset, a slider over past cycles, and the
    budget / temperature for the next cycle. Display it as the last expression of a cell.

    The session is the source of truth: the controls show its policy and temperature (also when code
    changes them), and only a control the user changes is applied to it. The menu lists the policy
    registry's policies (and the session's own ``TreePolicy``); the two number boxes edit the policy's
    knobs, so a setting the boxes do not show (``EagleTree``'s steps) is kept until the user picks another."""

    def __init__(self, session, tokenizer=None, max_nodes: int | None = 512):
        if not callable(getattr(session, "step", None)):
            again = ", or engine.replay(trace) to step this trace's run again" if isinstance(session, Trace) else ""
            raise TypeError(f"Stepper steps a live session, got {type(session).__name__}: pass "
                            f"engine.session(...){again}")
        self.session = session
        self.shared_controls(tokenizer if tokenizer is not None else session.engine.tokenizer, max_nodes)
        self.reset_button = W.Button(description="Reset", button_style="warning",
                                     tooltip="a new session with the same prompt and the settings shown")
        # The policies of the registry (workbench.engine.policies); the two number boxes edit the chosen
        # policy's knobs (DDTree: budget, width; Spine: siblings; ...), disabled where it has fewer.
        self.policy_kind = W.Dropdown(options=policies.choices(session.policy), value=session.policy.kind,
                                      description="policy", layout=W.Layout(width="180px"))
        self._last = {session.policy.kind: session.policy}  # per kind, the policy last used: kept on a switch
        self.budget = W.BoundedIntText(value=32, min=0, max=4096, description="budget",
                                       layout=W.Layout(width="160px"))
        self.width = W.BoundedIntText(value=0, min=0, max=4096, description="width",
                                      tooltip="tokens considered per slot (0 = no cap, 1 = the argmax chain)",
                                      layout=W.Layout(width="150px"))
        self.temperature = W.BoundedFloatText(value=float(session.temperature), min=0.0, max=10.0, step=0.1,
                                              description="temp", layout=W.Layout(width="150px"))
        self.stats = W.HTML()
        self.stream = go.FigureWidget(empty_figure("no cycles yet", height=160))
        self._shown: int | None = None
        self._syncing = False

        self.reset_button.on_click(lambda _b: self._guard(self.reset))
        self.slider.observe(self._on_slider, names="value")
        for w in (self.policy_kind, self.budget, self.width):
            w.observe(lambda _c: self._guard(self._apply_settings), names="value")
        self.temperature.observe(lambda _c: self._guard(self._apply_settings), names="value")

        controls = W.HBox([self.step_button, self.run_button, self.run_n, self.reset_button])
        settings = W.HBox([self.policy_kind, self.budget, self.width, self.temperature])
        self.widget = W.VBox([controls, settings, self.slider, self.status, self.tree, self.stream, self.stats])
        self._sync_controls()
        self._refresh(show=len(session.cycles) - 1 if session.cycles else None)

    # ------------------------------------------------------------------ actions (callable from Python)
    # step() and run(n) are StepperBase's: with the session's settings, each cycle returned as a Cycle.
    @property
    def stepped(self):
        return self.session  # reset() replaces it

    def _before_steps(self) -> None:
        self._sync_controls()  # a setting changed in code shows before the cycle that uses it

    def reset(self):
        """Start a new session with the same prompt, seed, limits, policy and sampling."""
        s = self.session
        self.session = s.engine.session(
            s.prompt, policy=s.policy, temperature=s.temperature,
            top_p=s.sampling.top_p, top_k=s.sampling.top_k, seed=s.seed, max_new_tokens=s.max_new_tokens,
            kernel_backend=s.kernel_backend, record_topk=s.record_topk, capture=s.capture,
        )
        self._shown = None
        self._sync_controls()
        self._refresh(show=None)
        return self.session

    def show_cycle(self, i: int) -> None:
        """Show past cycle ``i`` (negative counts from the end) in the tree figure."""
        n = len(self.session.cycles)
        if not n:
            raise IndexError("no cycles yet; call step() first")
        if not -n <= i < n:
            raise IndexError(f"cycle {i} out of range: the session has {n} cycles")
        i %= n
        if self.slider.value != i:
            self.slider.value = i  # the observer draws it
        else:
            self._draw_tree(i)

    # ------------------------------------------------------------------ state
    @property
    def shown_cycle(self) -> int | None:
        return self._shown

    def _policy(self):
        """The policy the controls show: the kind's last policy (its defaults when new) with the boxes'
        values in its knobs (a width set in code stays shown, so a budget change keeps it)."""
        kind = self.policy_kind.value
        p = self._last.get(kind) or policies.by_kind(kind)()
        return policies.with_knobs(p, [self.budget.value, self.width.value][: len(p.knobs)])

    def _sync_controls(self) -> None:
        """Show the session's policy and temperature in the controls without applying them back."""
        p = self.session.policy
        self._last[p.kind] = p
        self._syncing = True
        try:
            options = tuple(policies.choices(p))
            if tuple(self.policy_kind.options) != options:  # a TreePolicy joins the menu while it is used
                self.policy_kind.options = options
            self.policy_kind.value = p.kind
            self._show_knobs(p)
            self.temperature.value = float(self.session.temperature)
        finally:
            self._syncing = False

    def _show_knobs(self, p) -> None:
        """The boxes show ``p``'s knobs (named after them; 0 for None), the rest disabled."""
        knobs, values = p.knobs + (None, None), policies.knob_values(p) + [None, None]
        for box, knob, value in zip((self.budget, self.width), knobs, values):
            box.disabled = knob is None
            if knob is not None:
                box.description = knob
                box.value = value or 0

    def _apply_settings(self) -> None:
        """A control changed by the user: apply it to the session's next cycle."""
        if self._syncing:
            return
        kind = self.policy_kind.value
        if kind != self.session.policy.kind:  # a new kind: its last (or default) policy, shown as it is
            p = self._last.get(kind) or policies.by_kind(kind)()
            self._syncing = True
            try:
                self._show_knobs(p)
            finally:
                self._syncing = False
        else:
            p = self._policy()
        if p != self.session.policy:
            self.session.policy = p
            self._last[p.kind] = p
        t = float(self.temperature.value)
        if t != self.session.temperature:
            self.session.temperature = t
        self._say(f"next cycle: {self.session.policy}, T={self.session.temperature}")

    # ------------------------------------------------------------------ drawing (in place)
    def _draw_tree(self, i: int) -> None:
        self.redraw(self.tree, tree_figure(self.session.cycles[i], self.tokenizer, max_nodes=self.max_nodes))
        self._shown = i

    def _on_slider(self, change) -> None:
        if self.session.cycles:
            self._guard(lambda: self._draw_tree(int(change["new"])))

    def _refresh(self, show: int | None = None) -> None:
        """Draw cycle ``show`` (None: the newest), the token stream and the stats."""
        s = self.session
        n = len(s.cycles)
        if n:
            self.slider.disabled = False
            # Grow max first so the value is valid; an unchanged value does not fire the observer.
            self.slider.max = n - 1
            target = n - 1 if show is None else show
            if self.slider.value != target:
                self.slider.value = target
            else:
                self._draw_tree(target)
            self.redraw(self.stream, token_stream(s.trace, self.tokenizer))
            self.stats.value = steady_rate_html(s.trace) + s.trace.summary()._repr_html_()
        else:
            self.slider.value = 0
            self.slider.max = 0
            self.slider.disabled = True
            self._shown = None
            self.redraw(self.tree, empty_figure("no cycles yet: press Step"))
            self.redraw(self.stream, empty_figure("no cycles yet", height=160))
            self.stats.value = ""
        state = f"finished: {s.finish_reason}" if s.finished else "running"
        self._say(f"{s.policy}, T={s.temperature}: {n} cycles, {len(s.generated)} new tokens ({state})")
        self._sync_buttons()

    # ------------------------------------------------------------------ display / export
    def export_parts(self) -> list:
        """The current view as page parts (for views.save_html)."""
        s = self.session
        parts: list = [f"<h2>{html.escape(repr(s))}</h2>", f"<p>prompt: <code>{html.escape(s.prompt)}</code></p>"]
        parts += [go.Figure(self.tree), go.Figure(self.stream), self.stats.value]
        return parts

    def __repr__(self) -> str:
        return f"Stepper({self.session!r}, showing cycle {self._shown})"
