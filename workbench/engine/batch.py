"""Batched DDTree: several requests drafted in one drafter forward and verified in one target forward.

The cycle is the one every session runs (``workbench.engine.runner.Rows``); a ``BatchSession`` gives it more
rows. Layout (padding, not packing), owned by the model states (``workbench.models``): every request
keeps its own left-aligned rows in shared buffers with its own length; a forward writes each request's
new rows at that request's offset, and the state's mask hides every column a request does not own.
Positions are per request (``[bs, q]``), so no request sees another's offsets.

- Prefill: one EXTEND over the prompts right-padded to the longest, causal mask limited to each prompt.
- Draft: one drafter forward; each request's pending context is right-padded to the longest, the padding
  columns hidden (per layer kind: full, causal or sliding, by each key's real position); afterwards each
  drafter cache holds exactly its request's committed positions.
- Tree: built and compiled per request (budgets and depths differ) exactly as a single session does, then
  padded to a common node count N with inert nodes (``workbench.models.layout.pad_trees``), which no accept walk
  can take.
- Verify: one TARGET_VERIFY forward over ``[bs, N]``; accept: one batched accept over the padded trees;
  commit: one batched compaction, told each row's accepted nodes.
- Retirement: a finished request leaves the buffers (``select``) at the end of its cycle; the others go on.
- Sampling: request i draws from its own generator seeded ``seed + i``, over its own nodes only, so a batch
  consumes each generator as that request's single session would.

SGLang's view of the same verify flattens the batch into one token dimension (``qo_indptr``); see
``BatchSession.verify_layout``.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor

from workbench.records.cycle import Trace
from workbench.records.forward import ForwardRecord
from workbench.models.layout import pad_trees as _pad_trees  # noqa: F401  (tests import it from here)
from workbench.engine.policies import as_policy
from workbench.engine.hooks import as_pairs
from workbench.engine.runner import Rows, SessionFinished
from workbench.engine.stopwatch import clock
from workbench.engine.sampling import Sampling
from workbench.engine.session import Session, shapes_of


def check_prompt_texts(prompts) -> None:
    from workbench.engine.prompting import Prompt

    for i, p in enumerate(prompts):
        if not isinstance(p, (str, Prompt)):
            raise ValueError(f"prompts[{i}]={p!r:.60} is not a string")


@dataclass(frozen=True)
class BatchCycle:
    """One batched cycle: which requests ran, their Cycle records, and the batched forwards."""

    index: int
    requests: tuple  # request indices (into BatchSession.sessions), batch-row order
    cycles: tuple  # Cycle per request, same order
    verify_lens: tuple  # tree nodes per request (root included): the ragged rows
    policies: tuple  # the policy label per request ('DDTree(16)', 'Spine(2)')
    padded_nodes: int  # N: the common node count of the padded verify
    forwards: tuple  # ForwardRecord of the batched draft (if it ran) and verify forwards
    stage_seconds: dict = field(default_factory=dict)


class BatchSession:
    """Several generations stepped together. ``step()`` -> BatchCycle; ``run()`` -> the per-request traces."""

    def __init__(self, engine, prompts, policy=None, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                 seed: int = 0, max_new_tokens: int | list[int] = 256, kernel_backend: str | None = None,
                 record_topk: int = 8, static_shapes: bool | None = None):
        """``static_shapes``: every draft and verify forward with the same shapes and storage (see
        ``workbench.engine.runner.Rows``; default: when the engine captures CUDA graphs)."""
        from workbench.engine.policies import DDTree

        if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts={prompts!r:.60} must be a list of strings (one per request)")
        if not prompts:
            raise ValueError("prompts=[] is empty; give at least one prompt")
        check_prompt_texts(prompts)
        policy = DDTree(32) if policy is None else policy
        policies = list(policy) if isinstance(policy, (list, tuple)) else [policy] * len(prompts)
        if len(policies) != len(prompts):
            raise ValueError(f"{len(policies)} policies for {len(prompts)} prompts; give one policy, or one per prompt")
        limits = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
        if len(limits) != len(prompts):
            raise ValueError(f"{len(limits)} max_new_tokens for {len(prompts)} prompts; give one, or one per prompt")
        m = engine.models
        t0 = clock(m.device)
        self.engine, self.models = engine, m
        self.seed, self.record_topk = seed, record_topk  # what ``admit`` gives the requests it starts
        self.sampling = Sampling(temperature, top_p, top_k)
        backend = kernel_backend or engine.kernel_backend
        self.kernel_backend = backend
        self.sessions: list[Session] = [
            Session(engine, p, as_policy(pol), self.sampling, seed + i, n, backend, record_topk, None, driver=self,
                    static_shapes=None)
            for i, (p, pol, n) in enumerate(zip(prompts, policies, limits))
        ]
        self.cycles: list[BatchCycle] = []
        self.prefill: ForwardRecord | None = None
        self.setup_seconds = clock(m.device) - t0
        graphs = getattr(engine, "graphs", None)
        self._rows = Rows(m, static_shapes=bool(static_shapes) or graphs is not None, graphs=graphs)
        with torch.inference_mode():
            self._rows.prefill(self.sessions)
        self.prefill = self._rows.prefill_record
        self._live = list(range(len(self.sessions)))
        self._retire()

    # ---------------------------------------------------------------- state
    @property
    def live(self) -> list[int]:
        """Request indices still generating, in batch-row order."""
        return list(self._live)

    @property
    def finished(self) -> bool:
        return not self._live

    @property
    def texts(self) -> list[str]:
        return [s.text for s in self.sessions]

    @property
    def traces(self) -> list[Trace]:
        return [s.trace for s in self.sessions]

    def _row(self, s: Session) -> int | None:
        i = next(j for j, x in enumerate(self.sessions) if x is s)
        return self._live.index(i) if i in self._live else None

    # ---------------------------------------------------------------- the driver of its sessions
    def view(self, s: Session) -> list[tuple[Tensor, Tensor]]:
        b = self._row(s)
        return [] if b is None else self._rows.target.view(b)

    def cache_bytes(self, s: Session) -> int:
        b = self._row(s)
        return 0 if b is None else self._rows.row_bytes(b)

    def kv_shapes(self, s: Session) -> list:
        return shapes_of(self.view(s))

    def step_request(self, s: Session):
        raise RuntimeError("a request of a batch is stepped by its BatchSession: call batch.step()")

    def steps(self, s: Session, more, each) -> None:
        self.step_request(s)  # refused likewise

    def release(self, s: Session) -> None:
        """``s`` was closed (``Session.close``, which marks it finished): its row leaves the batch's buffers now,
        so the next cycle neither steps it nor pads for it."""
        self._retire()

    def __repr__(self) -> str:
        return (f"BatchSession({len(self.sessions)} requests, {len(self._live)} live, {len(self.cycles)} cycles, "
                f"{sum(len(s.generated) for s in self.sessions)} new tokens)")

    # ---------------------------------------------------------------- running
    def admit(self, prompts: list, policy=None, max_new_tokens: int | list[int] = 256) -> list[int]:
        """Start ``prompts`` as new requests of this batch: one prefill over them alone, their rows appended
        after the live ones (``Rows.admit``, the scheduler's own refill), so they run from the next ``step()``.
        A driver that keeps B slots full admits the next prompt where a row finished: the continuous batching
        of serving engines. Request i (its index in ``sessions``) draws from generator ``seed + i``; ``policy``
        None: the first request's; ``max_new_tokens``: one limit, or one per prompt. -> the new requests'
        indices. Dynamic shapes only: static shapes (CUDA graphs) fix the rows of every forward."""
        if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts={prompts!r:.60} must be a list of strings (one per request)")
        check_prompt_texts(prompts)
        if self._rows.static_shapes:
            raise ValueError("admit: this batch runs with static shapes (CUDA graphs), which fix the rows of every "
                             "forward; load without cuda_graphs to add requests to a running batch")
        policy = self.sessions[0].policy if policy is None else as_policy(policy)
        limits = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
        if len(limits) != len(prompts):
            raise ValueError(f"{len(limits)} max_new_tokens for {len(prompts)} prompts; give one, or one per prompt")
        first = len(self.sessions)
        new = [Session(self.engine, p, policy, self.sampling, self.seed + first + j, n, self.kernel_backend,
                       self.record_topk, None, driver=self, static_shapes=None)
               for j, (p, n) in enumerate(zip(prompts, limits))]
        if new:
            with torch.inference_mode():
                self._rows.admit(new)
            self.sessions += new
            self._live += list(range(first, first + len(new)))
            self._retire()  # a request its first token ended leaves at once
        return list(range(first, first + len(new)))

    def _retire(self) -> None:
        keep = [row for row, i in enumerate(self._live) if not self.sessions[i].finished]
        if len(keep) == len(self._live):
            return
        self._rows.select(keep)
        self._live = [self._live[r] for r in keep]

    @contextmanager
    def hooks(self, *hooks):
        """``with batch.hooks(("cycle.hook_tree", fn)):`` -- the hooks on every request of the batch inside the
        block (each call sees one request's row: ``hook.request``, ``hook.row``); removed at its end, also
        when it raises. One request's own: ``batch.sessions[i].hooks(...)``."""
        pairs = as_pairs(hooks[0] if len(hooks) == 1 else hooks)
        with ExitStack() as stack:
            for s in self.sessions:
                stack.enter_context(s.hooks(pairs))
            yield self

    @torch.inference_mode()
    def step(self, hooks=None) -> BatchCycle:
        """One cycle for every live request: one drafter forward, one target verify forward. ``hooks``:
        ``[(point, fn), ...]`` on every request for this cycle only (``hooks``)."""
        if self.finished:
            raise SessionFinished(f"every request of the batch has finished after {len(self.cycles)} cycles")
        if hooks is not None:
            with self.hooks(hooks):
                return self.step()
        reqs = [self.sessions[i] for i in self._live]
        cycles, layout, forwards, sw = self._rows.step(reqs)
        bc = BatchCycle(len(self.cycles), tuple(self._live), tuple(cycles), tuple(layout.n),
                        tuple(str(s.policy) for s in reqs), layout.N, forwards, sw.times)
        self.cycles.append(bc)
        self._retire()
        sw.stop()
        return bc

    def run(self, max_new_tokens: int | None = None) -> list[Trace]:
        """Step until every request has finished (end-of-text or ``max_new_tokens``). A new limit applies to
        the live requests: a retired request has left the batch's buffers and does not resume."""
        if max_new_tokens is not None:
            Session.check_max_new(max_new_tokens)
            for i in self._live:
                self.sessions[i].max_new_tokens = max_new_tokens
        while not self.finished:
            self.step()
        return self.traces

    def run_with_hooks(self, max_new_tokens: int | None = None, hooks=()) -> list[Trace]:
        """``run`` with ``hooks`` on every request's cycles, removed at its end, also on error."""
        with self.hooks(hooks):
            return self.run(max_new_tokens)

    # ---------------------------------------------------------------- shapes
    def verify_layout(self, cycle: int = -1) -> dict:
        """The batched TARGET_VERIFY of one cycle in both layouts: ours (padded ``[bs, N]``, the real
        forward's record) and SGLang's (the batch flattened to ``sum(verify_lens)`` token rows, ``qo_indptr``
        from ``sglang...ragged_verify.RaggedVerifyLayout`` when it imports)."""
        if not self.cycles:
            raise ValueError("no batched cycle yet: call step() first")
        bc = self.cycles[cycle]
        rec = bc.forwards[-1]
        lens = list(bc.verify_lens)
        return {
            "cycle": bc.index, "requests": list(bc.requests), "policies": list(bc.policies), "verify_lens": lens,
            "padded": {"forward": rec.to_dict(), "rows": len(lens) * bc.padded_nodes,
                       "padding_rows": len(lens) * bc.padded_nodes - sum(lens),
                       "logits": rec.outputs["logits"]["shape"]},
            "ragged": ragged_layout(lens, rec.outputs["logits"]["shape"][-1]),
            "every_draft_token_has_logits": rec.outputs["logits"]["shape"][:2] == [len(lens), bc.padded_nodes]
            and all(n <= bc.padded_nodes for n in lens),
        }


def ragged_layout(verify_lens: list[int], vocab: int) -> dict:
    """SGLang's flattened TARGET_VERIFY rows for per-request verify lengths (root + drafted nodes each)."""
    qo = [0]
    for n in verify_lens:
        qo.append(qo[-1] + n)
    source = "workbench"
    try:
        from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

        lay = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=verify_lens, device=torch.device("cpu"),
                                                  grid=[qo[-1]])
        qo, source = lay.qo_indptr_device.tolist(), "sglang RaggedVerifyLayout"
    except ImportError:
        pass
    return {"qo_indptr": qo, "rows": qo[-1], "input_ids": [qo[-1]], "positions": [qo[-1]],
            "logits": [qo[-1], vocab], "source": source}


# -------------------------------------------------------------------------------------------- benchmark
def batch_vs_sequential(engine, prompts: list[str], policy, batch_size: int, max_new_tokens: int = 64,
                        repeats: int = 3, warmup: bool = True) -> dict:
    """Aggregate tokens/s of one batch of ``batch_size`` requests against the same requests run one after
    another, interleaved (sequential, batch, sequential, batch, ...) so both see the same machine load.
    Prompts are reused in turn when fewer than ``batch_size`` are given. Greedy; the outputs are compared
    (``lossless``: the batch produced each request's own output)."""
    import time

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    if not prompts:
        raise ValueError("prompts=[] is empty; give at least one prompt")
    reqs = [prompts[i % len(prompts)] for i in range(batch_size)]
    dev = engine.device

    def run_seq():
        out = []
        for p in reqs:
            s = engine.session(p, policy=policy, max_new_tokens=max_new_tokens)
            s.run()
            out.append(s.tokens)
        return out

    def run_batch():
        b = engine.batch_session(reqs, policy=policy, max_new_tokens=max_new_tokens)
        b.run()
        return [s.tokens for s in b.sessions]

    if warmup:
        run_seq(), run_batch()
    rows, lossless = [], True
    for _ in range(repeats):
        t0 = clock(dev)
        seq = run_seq()
        t1 = clock(dev)
        bat = run_batch()
        t2 = clock(dev)
        lossless &= seq == bat
        n_seq, n_bat = sum(map(len, seq)), sum(map(len, bat))
        rows.append({"sequential_tok_s": n_seq / (t1 - t0), "batch_tok_s": n_bat / (t2 - t1),
                     "speedup": (n_bat / (t2 - t1)) / (n_seq / (t1 - t0)), "tokens": n_bat})
    from workbench.records.cycle import percentiles

    def med(key):
        return sorted(r[key] for r in rows)[(len(rows) - 1) // 2]

    return {"batch_size": batch_size, "policy": str(policy), "max_new_tokens": max_new_tokens, "repeats": repeats,
            "sequential_tok_s": med("sequential_tok_s"), "batch_tok_s": med("batch_tok_s"),
            "speedup": percentiles([r["speedup"] for r in rows]), "lossless": lossless, "runs": rows,
            "threads": torch.get_num_threads(), "device": str(dev)}


def batch_table(res: dict) -> str:
    sp = res["speedup"]
    return (f"{res['policy']}, batch of {res['batch_size']} vs the same {res['batch_size']} requests one after "
            f"another ({res['max_new_tokens']} new tokens each, {res['repeats']} interleaved repeat(s), "
            f"{res['device']}, {res['threads']} threads)\n"
            f"  sequential {res['sequential_tok_s']:.1f} tok/s   batch {res['batch_tok_s']:.1f} tok/s   "
            f"speedup p50 {sp['p50']:.2f}x  p90 {sp['p90']:.2f}x  max {sp['max']:.2f}x   "
            f"outputs {'identical' if res['lossless'] else 'DIFFER'}")
