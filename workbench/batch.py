"""Batched DDTree: several requests drafted in one drafter forward and verified in one target forward.

Layout (padding, not packing): every request keeps its own left-aligned KV rows in shared
``[bs, heads, capacity, head_dim]`` buffers (``RaggedCache``) with its own length; a forward writes each
request's new rows at that request's offset, and an additive mask ``[bs, 1, q, width]`` hides every column
a request does not own (other requests' spare rows, its own stale rows, padding). Positions are per request
(``[bs, q]``), so no request sees another's offsets.

- Prefill: one EXTEND over the prompts right-padded to the longest, causal mask limited to each prompt.
- Draft: one drafter forward; each request's pending context is right-padded to the longest, the padding
  columns hidden; afterwards each drafter cache holds exactly its request's committed positions.
- Tree: built and compiled per request (budgets and depths differ) exactly as a single session does, then
  padded to a common node count N with inert nodes (token -1 for accept, parent -1, position = the root's,
  seeing only themselves), which no accept walk can take.
- Verify: one TARGET_VERIFY forward over ``[bs, N]``; accept: one batched accept over the padded trees;
  commit: one batched KV compaction (``RaggedCache.keep_rows``).
- Retirement: a finished request leaves the buffers (``select``) at the end of its cycle; the others go on.
- Sampling: request i draws from its own generator seeded ``seed + i``, over its own nodes only, so a batch
  consumes each generator as that request's single session would.

SGLang's view of the same verify flattens the batch into one token dimension (``qo_indptr``); see
``BatchSession.verify_layout``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ddtree_kernels import CompiledTree, Tree
from ddtree_kernels import accept as accept_kernel
from workbench import stages
from workbench.cycle import Cycle, Trace
from workbench.engine import Session, SessionFinished, Stopwatch, clock
from workbench.forward import ForwardMode, ForwardRecord, run_draft, run_target
from workbench.kv_cache import RaggedCache
from workbench.policies import AR, as_policy
from workbench.sampling import Sampling, target_choice
from workbench.stages.commit import Committed
from workbench.stages.draft import Draft
from workbench.stages.verify import Verified


class BatchRequest(Session):
    """One request of a batch: a Session (text, tokens, trace, Cycle records as usual) whose cycles the
    BatchSession runs. Its prefill and steps happen in the batch."""

    def _prefill(self) -> None:  # the batch prefills every request in one forward
        pass

    def step(self) -> Cycle:
        raise RuntimeError("a request of a batch is stepped by its BatchSession: call batch.step()")

    def kv_cache(self) -> list[tuple[Tensor, Tensor]]:
        """This request's target cache, [1, kv_heads, start, head_dim] per layer (empty once retired)."""
        b = self._batch._row(self)
        return [] if b is None else self._batch._target.kv(b)


@dataclass(frozen=True)
class BatchCycle:
    """One batched cycle: which requests ran, their Cycle records, and the batched forwards."""

    index: int
    requests: tuple  # request indices (into BatchSession.sessions), batch-row order
    cycles: tuple  # Cycle per request, same order
    verify_lens: tuple  # tree nodes per request (root included): the ragged rows
    budgets: tuple  # the policy budget per request (None for AR / DFlash)
    padded_nodes: int  # N: the common node count of the padded verify
    forwards: tuple  # ForwardRecord of the batched draft (if it ran) and verify forwards
    stage_seconds: dict = field(default_factory=dict)


def _pad_trees(trees: list[Tree], compiled: list[CompiledTree], starts: list[int]):
    """Per-request trees [1, n_b] -> padded Tree and CompiledTree [bs, N] with inert padding nodes."""
    bs, N = len(trees), max(t.n for t in trees)
    dev = trees[0].tokens.device
    tok = torch.full((bs, N), -1, dtype=torch.long, device=dev)  # -1 equals no target choice
    par = torch.full((bs, N), -1, dtype=torch.long, device=dev)
    dep = torch.zeros(bs, N, dtype=torch.long, device=dev)
    rank = torch.zeros(bs, N, dtype=torch.long, device=dev)
    score = torch.zeros(bs, N, device=dev)
    pos = torch.tensor(starts, device=dev)[:, None].repeat(1, N)
    vis = torch.eye(N, dtype=torch.bool, device=dev).repeat(bs, 1, 1)  # padding sees only itself
    nxt = torch.full((bs, N), -1, dtype=torch.long, device=dev)
    sib = torch.full((bs, N), -1, dtype=torch.long, device=dev)
    for b, (t, c) in enumerate(zip(trees, compiled)):
        n = t.n
        tok[b, :n], par[b, :n], dep[b, :n], rank[b, :n], score[b, :n] = (
            t.tokens[0], t.parents[0], t.depth[0], t.rank[0], t.score[0])
        pos[b, :n], vis[b, :n, :n] = c.positions[0], c.visibility[0]
        nxt[b, :n], sib[b, :n] = c.retrieve_next_token[0], c.retrieve_next_sibling[0]
    ridx = torch.arange(N, device=dev)[None] + torch.arange(bs, device=dev)[:, None] * N
    return Tree(tok, par, dep, rank, score), CompiledTree(pos, vis, ridx, nxt, sib)


def _verify_visible(starts: list[int], visibility: Tensor) -> Tensor:
    """bool [bs, N, max(starts) + N]: request b's N tree rows (written at its rows [starts[b], starts[b] + N))
    see its committed prefix and, within the tree block, ``visibility[b]``; nothing else."""
    bs, N, _ = visibility.shape
    dev = visibility.device
    st = torch.tensor(starts, device=dev)[:, None, None]
    col = torch.arange(max(starts) + N, device=dev)[None, None]
    visible = (col < st).expand(bs, N, col.shape[-1]).clone()
    rows = st[:, :, 0] + torch.arange(N, device=dev)[None]  # [bs, N] the tree's rows
    visible[torch.arange(bs, device=dev)[:, None, None], torch.arange(N, device=dev)[None, :, None],
            rows[:, None, :]] = visibility
    return visible


def _additive(visible: Tensor, dtype) -> Tensor:
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))


class BatchSession:
    """Several generations stepped together. ``step()`` -> BatchCycle; ``run()`` -> the per-request traces."""

    def __init__(self, engine, prompts, policy=None, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                 seed: int = 0, max_new_tokens: int | list[int] = 256, kernel_backend: str | None = None,
                 record_topk: int = 8):
        from workbench.policies import DDTree

        if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts={prompts!r:.60} must be a list of strings (one per request)")
        if not prompts:
            raise ValueError("prompts=[] is empty; give at least one prompt")
        from workbench.prompting import Prompt

        for i, p in enumerate(prompts):
            if not isinstance(p, (str, Prompt)):
                raise ValueError(f"prompts[{i}]={p!r:.60} is not a string")
        policy = DDTree(32) if policy is None else policy
        policies = list(policy) if isinstance(policy, (list, tuple)) else [policy] * len(prompts)
        if len(policies) != len(prompts):
            raise ValueError(f"{len(policies)} policies for {len(prompts)} prompts; give one policy, or one per prompt")
        limits = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
        if len(limits) != len(prompts):
            raise ValueError(f"{len(limits)} max_new_tokens for {len(prompts)} prompts; give one, or one per prompt")
        m = engine.models
        self._check_drafter(m)
        t0 = clock(m.device)
        self.engine, self.models = engine, m
        self.sampling = Sampling(temperature, top_p, top_k)
        backend = kernel_backend or engine.kernel_backend
        self.kernel_backend = backend
        self.sessions: list[BatchRequest] = [
            BatchRequest(engine, p, as_policy(pol), self.sampling, seed + i, n, backend, record_topk, None)
            for i, (p, pol, n) in enumerate(zip(prompts, policies, limits))
        ]
        for s in self.sessions:
            s._batch = self
        self.cycles: list[BatchCycle] = []
        self.prefill: ForwardRecord | None = None
        self.setup_seconds = clock(m.device) - t0
        self._prefill()

    @staticmethod
    def _check_drafter(m) -> None:
        for layer in m.draft.layers:
            a = layer.self_attn
            if a.is_causal or a.sliding_window is not None:
                raise NotImplementedError("batched drafting supports only a non-causal, full-attention drafter "
                                          f"(layer {a.layer_idx} is causal or sliding)")

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

    def _row(self, s: BatchRequest) -> int | None:
        i = self.sessions.index(s)
        return self._live.index(i) if i in self._live else None

    def __repr__(self) -> str:
        return (f"BatchSession({len(self.sessions)} requests, {len(self._live)} live, {len(self.cycles)} cycles, "
                f"{sum(len(s.generated) for s in self.sessions)} new tokens)")

    # ---------------------------------------------------------------- running
    @torch.inference_mode()
    def _prefill(self) -> None:
        m = self.models
        t0 = clock(m.device)
        ids_list = [s.prompt_ids for s in self.sessions]
        bs, P = len(ids_list), max(len(x) for x in ids_list)
        lens = torch.tensor([len(x) for x in ids_list], device=m.device)
        ids = torch.zeros(bs, P, dtype=torch.long, device=m.device)
        for b, x in enumerate(ids_list):
            ids[b, : len(x)] = torch.tensor(x, device=m.device)
        pos = torch.arange(P, device=m.device).expand(bs, P)
        col = torch.arange(P, device=m.device)
        # Causal within each prompt; padding queries see their prompt (never an empty row, which gives NaN).
        visible = (col[None, None] <= col[None, :, None]) & (col[None, None] < lens[:, None, None])  # [bs, P, P]
        self._target = RaggedCache(m.target.config, [0] * bs)
        self._draft = RaggedCache(m.draft.config, [0] * bs)
        out = run_target(m.target, ids, pos, self._target, ForwardMode.EXTEND, m.target_layer_ids,
                         _additive(visible[:, None], m.dtype))
        self._target.set_lengths([len(x) for x in ids_list])
        self.prefill = out.record
        self._context = [out.features[b : b + 1, : len(x)] for b, x in enumerate(ids_list)]  # [1, m_b, F] each
        last = out.logits[torch.arange(bs, device=m.device), lens - 1][:, None]  # [bs, 1, V]
        seconds = clock(m.device) - t0
        for b, s in enumerate(self.sessions):
            choice, _ = target_choice(last[b : b + 1], s.sampling, s.generator)
            s.trace.prefill, s.trace.prefill_seconds = out.record, seconds
            s._append([int(choice[0, 0])])
        self._live = list(range(bs))
        self._retire()

    def _retire(self) -> None:
        keep = [row for row, i in enumerate(self._live) if not self.sessions[i].finished]
        if len(keep) == len(self._live):
            return
        self._target.select(keep)
        self._draft.select(keep)
        self._context = [self._context[r] for r in keep]
        self._live = [self._live[r] for r in keep]

    @torch.inference_mode()
    def _draft_all(self, reqs: list[BatchRequest], starts: list[int]) -> tuple[Tensor, ForwardRecord]:
        """One drafter forward for every live request -> (log-probs [bs, B-1, V], record)."""
        m = self.models
        dev, B = m.device, m.block_size
        bs = len(reqs)
        ctx_lens = [c.shape[1] for c in self._context]
        M = max(ctx_lens)
        F = self._context[0].shape[-1]
        ctx = self._context[0].new_zeros(bs, M, F)
        pos = torch.zeros(bs, M + B, dtype=torch.long, device=dev)
        for b, (c, s) in enumerate(zip(self._context, starts)):
            ctx[b, : c.shape[1]] = c[0]
            pos[b, : c.shape[1]] = torch.arange(s - c.shape[1], s, device=dev)
            pos[b, M:] = torch.arange(s, s + B, device=dev)
        block = torch.full((bs, B), m.mask_token_id, dtype=torch.long, device=dev)
        block[:, 0] = torch.tensor([s.bonus for s in reqs], device=dev)
        # Keys: request b's cache rows [0, L_b), then its M context rows (m_b real), then its B block rows.
        L = torch.tensor(self._draft.lengths, device=dev)[:, None]
        col = torch.arange(max(self._draft.lengths) + M + B, device=dev)[None]
        mlen = torch.tensor(ctx_lens, device=dev)[:, None]
        visible = (col < L + mlen) | ((col >= L + M) & (col < L + M + B))  # [bs, width]
        mask = _additive(visible[:, None, None].expand(bs, 1, B, col.shape[1]), m.dtype)
        logits, rec = run_draft(m.draft, m.target, block, pos, ctx, self._draft, None, mask)
        self._draft.set_lengths(starts)  # the block's rows and the padding do not stay
        self._context = [c[:, :0] for c in self._context]
        return torch.log_softmax(logits.float(), dim=-1), rec

    @torch.inference_mode()
    def step(self) -> BatchCycle:
        """One cycle for every live request: one drafter forward, one target verify forward."""
        if self.finished:
            raise SessionFinished(f"every request of the batch has finished after {len(self.cycles)} cycles")
        m = self.models
        sw = Stopwatch(m.device)
        sw.start("other")
        reqs = [self.sessions[i] for i in self._live]
        starts, roots = [s.start for s in reqs], [s.bonus for s in reqs]
        policies = [s.policy for s in reqs]
        depths = [min(m.block_size - 1, s.max_new_tokens - len(s.generated) - 1, m.max_positions - 1 - s.start)
                  for s in reqs]
        uses = [not isinstance(p, AR) and d > 0 for p, d in zip(policies, depths)]

        sw.start("draft")
        logprobs, draft_rec = self._draft_all(reqs, starts) if any(uses) else (None, None)
        sw.start("tree_build")
        drafted = [Draft(logprobs[b : b + 1, : depths[b]], draft_rec) if uses[b] else None for b in range(len(reqs))]
        trees = [stages.tree_build(p, d, r, m.device) for p, d, r in zip(policies, drafted, roots)]
        sw.start("tree_compile")
        max_depths = [d if u else 0 for d, u in zip(depths, uses)]
        compiled = [stages.tree_compile(t, st, md) for t, st, md in zip(trees, starts, max_depths)]
        tree, comp = _pad_trees(trees, compiled, starts)
        N = tree.n
        sw.start("verify")
        mode = ForwardMode.TARGET_VERIFY if any(not isinstance(p, AR) for p in policies) else ForwardMode.DECODE
        out = run_target(m.target, tree.tokens.clamp(min=0), comp.positions, self._target, mode,
                         m.target_layer_ids, _additive(_verify_visible(starts, comp.visibility)[:, None], m.dtype))
        if self.sampling.greedy:
            choice, prob = target_choice(out.logits, self.sampling, None)
        else:  # each request samples its own nodes from its own generator, as its single session would
            choice = torch.zeros(tree.tokens.shape, dtype=torch.long, device=m.device)
            prob = torch.zeros(tree.tokens.shape, device=m.device)
            for b, (s, t) in enumerate(zip(reqs, trees)):
                c, p = target_choice(out.logits[b : b + 1, : t.n], s.sampling, s.generator)
                choice[b, : t.n], prob[b, : t.n] = c[0], p[0]
        sw.start("accept")
        accepted = accept_kernel(self.kernel_backend, tree, comp, choice, max(max_depths))
        sw.start("commit")
        lengths = accepted.length.tolist()  # one host read per cycle for the whole batch
        nodes = [accepted.index[b, : lengths[b] + 1] for b in range(len(reqs))]
        self._target.keep_rows(starts, nodes)
        committed, kept = [], []
        for b, s in enumerate(reqs):
            toks = tree.tokens[b, nodes[b]].tolist()
            bonus = int(accepted.bonus[b])
            c = Committed(nodes[b], toks[1:] + [bonus], bonus, out.features[b : b + 1, nodes[b]])
            self._context[b] = torch.cat([self._context[b], c.context], dim=1)
            committed.append(c)
            kept.append(s._append(c.tokens))
        sw.start("record")
        times = sw.times
        cycles = []
        top2 = out.logits.topk(2, dim=-1)  # [bs, N, 2]: what wb.first_divergence reads, as in a single session
        for b, s in enumerate(reqs):
            n = trees[b].n
            v = Verified(choice[b : b + 1, :n], prob[b : b + 1, :n], None, None, out.record,
                         top2.indices[b : b + 1, :n], top2.values[b : b + 1, :n])
            cyc = s._record(policies[b], starts[b], roots[b], drafted[b], trees[b], compiled[b],
                            v, committed[b], kept[b], times)
            s.trace.append(cyc)
            cycles.append(cyc)
        forwards = tuple(r for r in (draft_rec, out.record) if r is not None)
        bc = BatchCycle(len(self.cycles), tuple(self._live), tuple(cycles), tuple(t.n for t in trees),
                        tuple(getattr(p, "budget", None) for p in policies), N, forwards, times)
        self.cycles.append(bc)
        self._retire()
        sw.stop()
        return bc

    def run(self, max_new_tokens: int | None = None) -> list[Trace]:
        """Step until every request has finished (end-of-text or ``max_new_tokens``). A new limit applies to
        the live requests: a retired request has left the batch's buffers and does not resume."""
        if max_new_tokens is not None:
            Session._check_max_new(max_new_tokens)
            for i in self._live:
                self.sessions[i].max_new_tokens = max_new_tokens
        while not self.finished:
            self.step()
        return self.traces

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
            "cycle": bc.index, "requests": list(bc.requests), "budgets": list(bc.budgets), "verify_lens": lens,
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
def batch_bench(engine, prompts: list[str], policy, batch_size: int, max_new_tokens: int = 64, repeats: int = 3,
                warmup: bool = True) -> dict:
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
    from workbench.cycle import percentiles

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
