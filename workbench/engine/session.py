"""A session: one generation, stepped a cycle at a time; a batch of one for the cycle in ``workbench.engine.runner``."""
from __future__ import annotations

import torch

from ddtree_kernels import check_backend
from workbench.engine import validate
from workbench.records.cycle import Cycle, Trace, setting_label
from workbench.engine.loading import model_ref
from workbench.engine.policies import Policy, as_policy
from workbench.engine.prompting import Prompt
from workbench.engine.runner import Rows, SessionFinished, clock
from workbench.engine.sampling import Sampling

DEFAULT_MAX_NEW_TOKENS = 128  # the one default of engine.session, engine.generate and the CLI


def to_host(**tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    """CPU copies of a cycle's record tensors. From a GPU: every copy queued without waiting, then one
    wait for them all (one host synchronisation per record instead of one per tensor)."""
    cuda = any(t.device.type == "cuda" for t in tensors.values())
    out = {k: t.to("cpu", non_blocking=cuda) for k, t in tensors.items()}
    if cuda:
        torch.cuda.current_stream().synchronize()
    return out


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


class Session(SessionState):
    """One generation, stepped a cycle at a time. ``step()`` -> Cycle; ``run()`` -> Trace."""

    def __init__(self, engine, prompt: "str | Prompt", policy: Policy, sampling: Sampling, seed: int,
                 max_new_tokens: int, kernel_backend: str, record_topk: int, capture, batch=None,
                 static_shapes: bool = False):
        """``batch``: the BatchSession this request is a row of (it prefills and steps it); None: a
        session of its own, prefilled now. ``static_shapes``: see ``workbench.engine.runner.Rows``."""
        t_start = clock(engine.models.device)
        m = engine.models
        if not isinstance(prompt, Prompt):
            prompt = engine.encode(prompt)
        validate.record_topk(record_topk), validate.capture(capture)
        validate.policy_fits(policy, m.block_size - 1)
        check_backend(kernel_backend, m.device)
        self._check_max_new(max_new_tokens)
        self.engine, self.models = engine, m
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
        # Every setting that changes results, as the session starts; a later change is appended to
        # meta["changes"] with the cycle it applies from (``Trace.note_change``), so ``replay`` re-runs it.
        self.trace = Trace(meta={
            **prompt.trace_meta(), "policy": str(policy), "temperature": sampling.temperature,
            "top_p": sampling.top_p, "top_k": sampling.top_k, "seed": seed, "max_new_tokens": max_new_tokens,
            "kernel_backend": kernel_backend, **({} if batch is not None else {"static_shapes": bool(static_shapes)}),
            "target": model_ref(m.target_dir), "draft": model_ref(m.draft_dir), "device": str(m.device),
            "dtype": str(m.dtype).replace("torch.", ""), "block_size": m.block_size,
        })
        self.trace.setup_seconds = self._clock() - t_start
        self._batch = batch
        self._rows: Rows | None = None
        if batch is None:
            self._rows = Rows(m, static_shapes, getattr(engine, "graphs", None))
            with torch.inference_mode():
                self._rows.prefill([self])

    # ---------------------------------------------------------------- settings for the next cycle
    @property
    def policy(self) -> Policy:
        return self._policy

    @policy.setter
    def policy(self, p) -> None:
        self._policy = validate.policy_fits(as_policy(p), self.models.block_size - 1)
        self._changed("policy", str(self._policy))

    def _changed(self, name: str, value) -> None:
        """A setting set between cycles: the trace records it with the cycle it applies from."""
        if self.trace is not None:
            self.trace.note_change(len(self.trace.cycles), name, value)

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
        self._check_max_new(n)
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
    def _check_max_new(n) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"max_new_tokens={n!r} must be a positive integer")


    @property
    def text(self) -> str:
        """The generated text so far (without the prompt)."""
        return self.models.tokenizer.decode(self.generated)

    @property
    def full_text(self) -> str:
        return self.prompt + self.text

    def kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The target cache as (keys, values) per layer, [1, kv_heads, start, head_dim] each (empty once
        a batch has retired this request). A hybrid target's linear-attention layers give (conv window
        [1, conv_dim, K-1], recurrent state [1, HV, Dk, Dv]) instead.

        Views of the cache's buffers, valid until the next step (which writes into them); ``.clone()``
        what you keep."""
        if self._batch is not None:
            return self._batch._kv_cache(self)
        return self._rows.target.view(0)

    def cache_bytes(self) -> int:
        """Bytes of committed model state (target and drafter) this session holds."""
        if self._batch is not None:
            return self._batch._cache_bytes(self)
        return self._rows.target.nbytes() + self._rows.draft.nbytes()

    def __repr__(self) -> str:
        state = f"finished: {self.finish_reason}" if self.finished else "running"
        sp = self.sampling
        setting = setting_label(str(self.policy), sp.temperature, sp.top_p, sp.top_k)
        return (f"Session({setting}, {len(self.cycles)} cycles, "
                f"{len(self.generated)} new tokens, {state})")

    # ---------------------------------------------------------------- running
    def _clock(self) -> float:
        return clock(self.models.device)

    def _append(self, toks: list[int]) -> int:
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

    @torch.inference_mode()
    def step(self) -> Cycle:
        """Run one draft/verify cycle and return its record."""
        if self._batch is not None:
            raise RuntimeError("a request of a batch is stepped by its BatchSession: call batch.step()")
        if self.finished:
            raise SessionFinished(
                f"session finished ({self.finish_reason}) after {len(self.generated)} new tokens in "
                f"{len(self.cycles)} cycles; start a new session, or run(max_new_tokens=N) with a larger N"
            )
        cycles, _, _, sw = self._rows.step([self])
        sw.stop()
        return cycles[0]

    def _record(self, policy, start, root, drafted, tree, compiled, verified, committed, kept, times,
                state_from=None) -> Cycle:
        k = self.record_topk
        top = drafted.top(k) if drafted is not None and k > 0 else None  # shared with the tree build when it ran
        # One host copy per dtype, not one per array: the per-node int64 arrays stacked, then the floats
        # (top-2 as two rows each), split again on the host.
        ints = torch.cat([tree.tokens, tree.parents, tree.depth, tree.rank, compiled.positions,
                          compiled.retrieve_next_token, compiled.retrieve_next_sibling, verified.choice,
                          verified.top2_tokens[0].T])  # [10, n]
        floats = torch.cat([tree.score.float(), verified.choice_prob, verified.top2_logits[0].T])  # [4, n] float32 (promoted)
        dev = to_host(ints=ints, floats=floats, visibility=compiled.visibility[0], accepted_nodes=committed.nodes,
                      **({"draft_topk_logprobs": top[0][0], "draft_topk_tokens": top[1][0]} if top else {}),
                      **({} if state_from is None else {"state_from": state_from}))
        i, f = dev["ints"].unbind(0), dev["floats"].unbind(0)
        host = dict(zip(("tokens", "parents", "depth", "rank", "position_ids", "retrieve_next_token",
                         "retrieve_next_sibling", "target_choice"), i))
        host.update(score=f[0], target_prob=f[1], visibility=dev["visibility"], accepted_nodes=dev["accepted_nodes"],
                    target_top2_tokens=dev["ints"][8:].T, target_top2_logits=dev["floats"][2:].T,  # [n, 2] views
                    draft_topk_logprobs=dev["draft_topk_logprobs"] if top else torch.zeros(0, k),
                    draft_topk_tokens=dev["draft_topk_tokens"] if top else torch.zeros(0, k, dtype=torch.long),
                    **({} if state_from is None else {"state_from": dev["state_from"]}))
        return Cycle(
            index=len(self.trace.cycles), policy=str(policy), start=start, root_token=root,
            accepted_tokens=host["tokens"][host["accepted_nodes"]], bonus=committed.bonus, committed=kept,
            stage_seconds=times,
            forwards=tuple(r for r in ((drafted.record if drafted else None), verified.record) if r is not None),
            temperature=self.sampling.temperature, top_p=self.sampling.top_p, top_k=self.sampling.top_k,
            **host,
        )

    def run(self, max_new_tokens: int | None = None) -> Trace:
        """Step until end-of-text or ``max_new_tokens`` generated in all (the session's limit by default;
        a value sets the limit, as ``s.max_new_tokens = n`` does)."""
        if max_new_tokens is not None:
            self.max_new_tokens = max_new_tokens
        while not self.finished:
            self.step()
        return self.trace


REPLAYED = ("policy", "temperature", "top_p", "top_k", "seed", "max_new_tokens")  # what meta["changes"] holds


def _initial(meta: dict, key: str, default):
    """A setting as the session started: the header's value, or the first of the values it lists."""
    v = meta.get(key, default)
    return v[0] if isinstance(v, list) and v else v


def replay(engine, trace: Trace, **kw) -> Session:
    """Re-run ``trace`` on ``engine``: its prompt ids and starting settings, then each recorded change
    (``trace.changes()``) before the cycle it applied from, for as many cycles as the trace has. With
    the same models on the same device this gives the same tokens, cycle for cycle (sampling included:
    the seed and every re-seed are in the trace). ``kw`` overrides session arguments (e.g.
    ``kernel_backend``). Returns the new session."""
    from workbench.engine.policies import parse_policy

    m = trace.meta
    if not isinstance(m.get("prompt_ids"), list):
        raise ValueError("this trace has no prompt_ids in its header, so it cannot be replayed")
    changes = [c for c in m.get("changes", []) if isinstance(c, dict) and c.get("name") in REPLAYED]
    limit_changed = any(c["name"] == "max_new_tokens" for c in changes)
    args = dict(policy=parse_policy(str(_initial(m, "policy", "ddtree:32"))),
                temperature=_initial(m, "temperature", 0.0), top_p=_initial(m, "top_p", 1.0),
                top_k=_initial(m, "top_k", 0), seed=_initial(m, "seed", 0),
                # a trace written before max_new_tokens was recorded: its own length, when no change says otherwise
                max_new_tokens=m.get("max_new_tokens") or (max(trace.new_tokens, 1) if not limit_changed
                                                           else DEFAULT_MAX_NEW_TOKENS),
                kernel_backend=m.get("kernel_backend"), static_shapes=True if m.get("static_shapes") else None)
    args.update(kw)
    s = engine.session(prompt_ids=m["prompt_ids"], **args)

    def apply(i: int) -> None:
        for c in changes:
            if c.get("cycle") == i:
                setattr(s, c["name"], parse_policy(c["value"]) if c["name"] == "policy" else c["value"])

    for i in range(len(trace.cycles)):
        apply(i)
        if s.finished:
            break
        s.step()
    apply(len(trace.cycles))
    return s
