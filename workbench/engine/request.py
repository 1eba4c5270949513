"""A request: one generation's settings, outputs and trace, and the record of each of its cycles.

What steps it (its model state, the cycle) is a driver's business: ``workbench.engine.session.Session``
is a request with a driver of its own (or its batch's, or a server's scheduler).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ddtree_kernels import check_backend
from workbench.engine import validate
from workbench.engine.loading import model_ref
from workbench.models.identity import pair_identity
from workbench.interface.base import DEFAULT_MAX_NEW_TOKENS  # noqa: F401  (re-exported by session and core)
from workbench.engine.policies import Policy, as_policy
from workbench.engine.prompting import Prompt
from workbench.engine.hooks import HookPoints, as_pairs, refuse_after_prefill
from workbench.engine.stopwatch import clock
from workbench.engine.sampling import Sampling
from workbench.records.build import CycleParts, cycle_record
from workbench.records.cycle import Cycle, Trace, setting_label
from workbench.records.forward import ForwardRecord

class SessionState:
    """What a session's state means, shared by a local ``Session`` and a ``RemoteSession``: both hold
    ``prompt_ids``, ``generated``, ``finish_reason`` and ``trace``."""

    @property
    def start(self) -> int:
        """Position of the pending bonus token (= tokens in the target cache)."""
        return len(self.prompt_ids) + len(self.generated) - 1

    @property
    def bonus(self) -> int:
        return self.generated[-1]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def cycles(self) -> list[Cycle]:
        return self.trace.cycles

    @property
    def tokens(self) -> list[int]:
        """Generated token ids (the pending bonus included)."""
        return list(self.generated)


class Request(SessionState):
    """One generation's settings, outputs and trace; the cycle (``workbench.engine.runner.Rows``) steps it as
    one of its rows and hands it its share of each cycle (``extend``, ``record``). It holds no model state."""

    def __init__(self, engine, prompt: "str | Prompt", policy: Policy, sampling: Sampling, seed: int,
                 max_new_tokens: int, kernel_backend: str, record_topk: int, capture, static_shapes: bool | None = False):
        """``static_shapes``: recorded in the trace (None: not this request's own setting, as in a batch)."""
        t_start = clock(engine.models.device)
        m = engine.models
        if not isinstance(prompt, Prompt):
            prompt = engine.encode(prompt)
        validate.record_topk(record_topk), validate.capture(capture)
        policy = validate.policy_fits(policy, m.block_size - 1, pair_identity(m))  # bound to this pair, checked
        check_backend(kernel_backend, m.device)
        self.check_max_new(max_new_tokens)
        self.engine, self.models = engine, m
        self.hook_points = HookPoints()  # this request's own hooks (workbench.engine.hooks); a capture is one
        self._capture, self._capture_off = None, ()
        self._policy, self.sampling = policy, sampling
        self.kernel_backend, self.record_topk, self.capture = kernel_backend, record_topk, capture
        self._max_new_tokens = max_new_tokens
        self.prompt = prompt.text  # the raw text, the rendered chat, or the decoded ids
        self.prompt_ids: list[int] = list(prompt.ids)
        self.generator = torch.Generator(device=m.device)
        self.trace = None  # (a setting changed before the trace exists is not a change)
        self.seed = seed  # validated and applied to the generator by the setter
        self.generated: list[int] = []
        self.finish_reason: str | None = None
        # What session keywords attached to this request, by name (workbench.engine.observers): e.g. "dump",
        # the cycle dump's writer on its hook points. The cycle never reads this.
        self.observers: dict[str, object] = {}
        # Every setting that changes results, as the session starts; a later change is appended to
        # meta["changes"] with the cycle it applies from (``Trace.note_change``), so ``replay`` re-runs it.
        self.trace = Trace(meta={
            **prompt.trace_meta(), "policy": str(policy), "temperature": sampling.temperature,
            "top_p": sampling.top_p, "top_k": sampling.top_k, "seed": seed, "max_new_tokens": max_new_tokens,
            "kernel_backend": kernel_backend, **({} if static_shapes is None else {"static_shapes": bool(static_shapes)}),
            "target": model_ref(m.target_dir), "draft": model_ref(m.draft_dir), "device": str(m.device),
            "dtype": str(m.dtype).replace("torch.", ""), "block_size": m.block_size,
        })
        self.trace.setup_seconds = clock(m.device) - t_start

    # ---------------------------------------------------------------- settings for the next cycle
    @property
    def policy(self) -> Policy:
        return self._policy

    @policy.setter
    def policy(self, p) -> None:
        self._policy = validate.policy_fits(as_policy(p), self.models.block_size - 1, pair_identity(self.models))
        self._changed("policy", str(self._policy))

    def _changed(self, name: str, value) -> None:
        """A setting set between cycles: the trace records it with the cycle it applies from."""
        if self.trace is not None:
            self.trace.note_change(len(self.trace.cycles), name, value)

    @property
    def capture(self):
        """The shape capture its one-row forwards record into (``wb.shapes.capture``), or None. Set between
        cycles; it rides on this request's hook points (``capture_hooks``), so the cycle knows no capture."""
        return self._capture

    @capture.setter
    def capture(self, cap) -> None:
        for off in self._capture_off:
            off()
        self._capture, self._capture_off = cap, ()
        if cap is not None:
            self._capture_off = tuple(self.hook_points.add(name, fn) for name, fn in capture_hooks(cap))

    @property
    def dump(self):
        """The cycle dump writing this request's cycles (``session(..., dump=PATH)``; its ``close()`` writes the
        end line now), or None."""
        return self.observers.get("dump")

    @contextmanager
    def hooks(self, *hooks):
        """``with s.hooks(("cycle.hook_tree", fn), ("accept", g)):`` -- ``fn(value, hook)`` runs at that point
        of every cycle of this request inside the block (a stage's name stands for the point at its output;
        ``workbench.engine.hooks.POINTS``); all are removed at the block's end, also when it raises. A list
        of pairs or a dict works too. Other requests never see them. A prefill point is refused once the
        prefill has run (give it to ``engine.session(..., hooks=...)``)."""
        pairs = as_pairs(hooks[0] if len(hooks) == 1 else hooks)
        if self.generated:  # the prefill ran: its points will not come again
            refuse_after_prefill(pairs)
        removers = []
        try:
            for name, fn in pairs:
                removers.append(self.hook_points.add(name, fn))
            yield self
        finally:
            for off in reversed(removers):
                off()

    @property
    def seed(self) -> int:
        return self._seed

    @seed.setter
    def seed(self, s: int) -> None:
        """Re-seed the sampler: the next cycle's draws come from ``s`` (greedy decoding ignores it)."""
        self._seed = validate.seed(s)
        self.generator.manual_seed(s)
        self._changed("seed", s)  # even the same seed again: the generator starts over

    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    @temperature.setter
    def temperature(self, t: float) -> None:
        self._set_sampling(Sampling(t, self.sampling.top_p, self.sampling.top_k), "temperature")

    def _set_sampling(self, new: Sampling, name: str) -> None:
        old, self.sampling = self.sampling, new
        if getattr(new, name) != getattr(old, name):
            self._changed(name, getattr(new, name))

    @property
    def top_p(self) -> float:
        return self.sampling.top_p

    @top_p.setter
    def top_p(self, p: float) -> None:
        self._set_sampling(Sampling(self.sampling.temperature, p, self.sampling.top_k), "top_p")

    @property
    def top_k(self) -> int:
        return self.sampling.top_k

    @top_k.setter
    def top_k(self, k: int) -> None:
        self._set_sampling(Sampling(self.sampling.temperature, self.sampling.top_p, k), "top_k")

    @property
    def max_new_tokens(self) -> int:
        """The limit on new tokens in all (the prefill's first token included)."""
        return self._max_new_tokens

    @max_new_tokens.setter
    def max_new_tokens(self, n: int) -> None:
        """Raise or lower the limit. Below the tokens already generated is refused; a session that
        ended at the old limit goes on under a larger one; reaching the new one ends it now."""
        self.check_max_new(n)
        have = len(self.generated)
        if n < have:
            raise ValueError(f"max_new_tokens={n} is below the {have} new tokens this session already has; "
                             f"the limit counts all new tokens, so give at least {have}")
        if n != self._max_new_tokens:
            self._changed("max_new_tokens", n)
        self._max_new_tokens = n
        if self.finish_reason and self.finish_reason.startswith("reached max_new_tokens"):
            self.finish_reason = None
        if self.finish_reason is None and have >= n:
            self.finish_reason = f"reached max_new_tokens={n}"
        self.trace.finish_reason = self.finish_reason

    @staticmethod
    def check_max_new(n) -> None:
        """A positive integer, or a one-line ValueError naming ``max_new_tokens`` (sessions and batches alike)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"max_new_tokens={n!r} must be a positive integer")


    @property
    def text(self) -> str:
        """The generated text so far (without the prompt)."""
        return self.models.tokenizer.decode(self.generated)

    @property
    def full_text(self) -> str:
        return self.prompt + self.text

    def __repr__(self) -> str:
        state = f"finished: {self.finish_reason}" if self.finished else "running"
        sp = self.sampling
        setting = setting_label(str(self.policy), sp.temperature, sp.top_p, sp.top_k)
        return (f"Session({setting}, {len(self.cycles)} cycles, "
                f"{len(self.generated)} new tokens, {state})")

    # ---------------------------------------------------------------- what the cycle hands the request
    def begin(self, token: int, prefill: ForwardRecord, seconds: float, top2: dict) -> None:
        """The prefill ran: its record, its time, the first token and its runner-up (``top2``)."""
        self.trace.meta["prefill_top2"] = top2
        self.trace.prefill, self.trace.prefill_seconds = prefill, seconds
        self.extend([token])

    def extend(self, toks: list[int]) -> int:
        """Extend the output, stopping at end-of-text or the token limit. -> tokens kept."""
        kept = 0
        for t in toks:
            if len(self.generated) >= self.max_new_tokens:
                self.finish_reason = f"reached max_new_tokens={self.max_new_tokens}"
                break
            self.generated.append(t)
            kept += 1
            if t in self.models.eos_token_ids:
                self.finish_reason = "end of text"
                break
        if self.finish_reason is None:
            if len(self.generated) >= self.max_new_tokens:
                self.finish_reason = f"reached max_new_tokens={self.max_new_tokens}"
            elif self.start >= self.models.max_positions - 1:
                self.finish_reason = f"reached the target's {self.models.max_positions} positions"
        self.trace.finish_reason = self.finish_reason
        self.trace.new_tokens = len(self.generated)
        return kept

    def record(self, parts: CycleParts) -> Cycle:
        """This request's record of the cycle just committed, appended to its trace."""
        cyc = cycle_record(len(self.trace.cycles), parts, self.record_topk, self.sampling)
        self.trace.append(cyc)
        return cyc


def capture_hooks(capture) -> list[tuple[str, object]]:
    """The hooks through which a request's shape capture sees its forwards: the model states record into
    ``capture`` during a one-row prefill or cycle (a batch's forwards are the batch's, not one request's),
    and stop at its end, also when it raised."""
    def on(value, hook) -> None:
        if hook.batch == 1:
            hook.rows.target.capture = hook.rows.draft.capture = capture

    def off(value, hook) -> None:
        hook.rows.target.capture = hook.rows.draft.capture = None

    return [("prefill.hook_begin", on), ("prefill.hook_end", off), ("cycle.hook_begin", on), ("cycle.hook_end", off)]
