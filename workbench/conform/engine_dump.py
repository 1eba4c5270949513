"""The workbench's own engine writes a cycle dump: ``engine.session(..., dump=PATH)`` / ``batch_session``.

``attach(engine, requests, rows, path)`` opens the dump, writes each request's start and puts two taps on the
running engine, which do nothing unless a dump is attached (``Request.dump`` and ``DraftKV.tap`` are None):

- the drafter state's tap (``DraftKV.tap``), run as each draft forward starts: each row's pending context
  (how many committed rows it takes in, from which cache length) and its block, as that forward reads them;
- the request's record (``Request.record`` -> ``EngineDump.cycle``): the rest from what the stages handed the
  request (``CycleParts``: the tree the verify ran, the compiled positions and visibility it got, the target's
  top-2 and choice, the accepted nodes handed to the state's compaction) and the target state's own length.

One cycle record per request per engine step; the rows of one batched step share ``step``. Full logits are not
held by a cycle record (the drafter's top-k and the target's top-2 are), so ``draft_logits`` /
``target_logits`` are left out. The file closes (end line) when every request has finished; a finished
session resumed under a larger limit reopens it.
"""
from __future__ import annotations

import torch

from workbench.conform.dump import DumpWriter, make_header
from workbench.conform.fingerprint import pair_fingerprint
from workbench.engine.loading import model_ref
from workbench.records.build import CycleParts
from workbench.records.cycle import Cycle


def pair_identity(models) -> dict:
    """The header's ``pair``: what a checker needs to load the same models and refuse another pair (down to
    the weights: ``fingerprint``). A target with linear-attention layers (recurrent state per request) makes a
    hybrid pair."""
    t = models.target.config
    return {"target": model_ref(models.target_dir), "draft": model_ref(models.draft_dir),
            "vocab_size": int(t.vocab_size), "block_size": int(models.block_size),
            "dtype": str(models.dtype).replace("torch.", ""), "device": str(models.device),
            "target_layer_ids": list(models.target_layer_ids), "mask_token_id": int(models.mask_token_id),
            "hybrid": "linear_attention" in (getattr(t, "layer_types", None) or ()),
            "fingerprint": pair_fingerprint(models)}


def cycle_fields(c: Cycle) -> dict:
    """The dump fields a ``Cycle`` record holds: the tree, its verify inputs (positions, dense visibility),
    the drafter's top-k log-probs, the target's top-2 and choice, the accepted path (what any engine that
    records Cycles can write; the drafter's context and the commit come from the engine itself)."""
    f = {"cycle": c.index, "policy": c.policy, "context_len": c.start, "root_token": c.root_token,
         "tree_tokens": c.tokens, "tree_parents": c.parents, "tree_depths": c.depth, "verify_ids": c.tokens,
         "verify_positions": c.position_ids, "visibility_form": "dense", "visibility": c.visibility,
         "target_choice": c.target_choice, "accepted_nodes": c.accepted_nodes, "bonus": c.bonus,
         "state_from": c.state_from}
    if c.draft_topk_tokens.numel():  # none where no draft ran (a request at its last token)
        f.update(draft_topk_ids=c.draft_topk_tokens, draft_topk_values=c.draft_topk_logprobs, draft_values="logprobs")
    if c.target_top2_tokens is not None:
        f.update(target_topk_ids=c.target_top2_tokens, target_topk_values=c.target_top2_logits)
    return f


class EngineDump:
    """One dump written by one ``Session`` or ``BatchSession`` (its requests share the file)."""

    def __init__(self, engine, requests: list, rows, path, replace: bool = False):
        from workbench.version import __version__

        m = engine.models
        self.models, self.rows, self.requests = m, rows, list(requests)
        self.ids = {id(r): str(i) for i, r in enumerate(self.requests)}
        labels = {str(r.policy) for r in self.requests}
        first = self.requests[0]
        header = make_header(
            {"name": "workbench", "version": __version__, "static_shapes": bool(rows.static_shapes),
             "kernel_backend": first.kernel_backend},
            pair_identity(m), labels.pop() if len(labels) == 1 else None,
            {"temperature": first.sampling.temperature, "top_p": first.sampling.top_p,
             "top_k": first.sampling.top_k, "seed": first.seed},
            topk={"draft": first.record_topk, "target": 2}, batch=len(self.requests))
        self.writer = DumpWriter(path, header, replace)
        self.step = -1
        self._times = None  # the stage-time dict of the step being recorded: every row of one step shares it
        self._row = 0
        self._drafts: list | None = None  # per row of the next step: (root, start, context rows, cache rows, static)
        self._step_drafts: list | None = None  # the same, of the step being recorded
        for r in self.requests:
            s = r.sampling
            self.writer.request(self.ids[id(r)], prompt_ids=torch.tensor(r.prompt_ids), first_token=r.generated[0],
                                policy=str(r.policy), temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                seed=r.seed, max_new_tokens=r.max_new_tokens)
            r.dump = self
        rows.draft.tap = self.draft_tap

    @property
    def path(self):
        return self.writer.path

    def draft_tap(self, state, roots: list[int], starts: list[int]) -> None:
        """As a draft forward starts: each row's pending context length and its cache length (the static path
        places context row j at cache length + j, the dynamic ones at start - context + j)."""
        self._drafts = [(r, s, int(c.shape[1]), int(L), state.static is not None)
                        for r, s, c, L in zip(roots, starts, state.context, state.cache.lengths)]

    def cycle(self, request, parts: CycleParts, cyc: Cycle) -> None:
        """The request's record of the step just committed."""
        if parts.times is not self._times:  # a new step (its rows are recorded one after another)
            self._times, self.step, self._row = parts.times, self.step + 1, 0
            self._step_drafts, self._drafts = self._drafts, None
        row, self._row = self._row, self._row + 1
        if self.writer.closed:
            try:
                self.writer.reopen()
            except ValueError as e:  # the file is another run's now: raising here would cut the step short
                self.detach(str(e))
                return
        f = self._fields(request, parts, cyc, row)
        self.writer.cycle(self.ids[id(request)], self.step, **f)
        if all(r.finished for r in self.requests):
            self.writer.close()

    def _fields(self, request, parts: CycleParts, c: Cycle, row: int) -> dict:
        m = self.models
        drafts = self._step_drafts
        f = {"row": row, "rows": self.rows.rows, **cycle_fields(c)}  # rows: retired only after the records
        if drafts is not None:  # the forward ran for every row (one that keeps no slot this step too)
            root, start, ctx, cache_len, static = drafts[row]
            first = cache_len if static else start - ctx
            seq = request.prompt_ids + request.generated
            f.update(draft_context_tokens=torch.tensor(seq[c.start - ctx : c.start], dtype=torch.long),
                     draft_context_positions=torch.arange(first, first + ctx),
                     draft_block_tokens=torch.tensor([root] + [m.mask_token_id] * (m.block_size - 1)),
                     draft_block_positions=torch.arange(start, start + m.block_size))
        f.update(committed_tokens=torch.tensor(parts.committed.tokens[: parts.kept], dtype=torch.long),
                 kv_kept_nodes=parts.committed.nodes)
        lengths = getattr(self.rows.target, "lengths", None)
        if lengths is not None and row < len(lengths):
            f["next_context_len"] = int(lengths[row])
        return f

    def close(self) -> None:
        """Write the end line now (a session stopped before it finished)."""
        self.writer.close()

    def detach(self, why: str) -> None:
        """Stop dumping these requests, and say so (a warning naming why): the run goes on undumped."""
        import warnings

        for r in self.requests:
            if r.dump is self:
                r.dump = None
        if self.rows.draft.tap == self.draft_tap:
            self.rows.draft.tap = None
        warnings.warn(f"{why}; this session's further cycles are not dumped", stacklevel=3)

    def __repr__(self) -> str:
        return f"EngineDump({str(self.path)!r}, {self.step + 1} steps, {self.writer.records} records)"


def attach(engine, requests: list, rows, path, replace: bool = False) -> EngineDump:
    """Dump ``requests`` (a session's one, or a batch's, already prefilled) stepped over ``rows`` to ``path``
    (``replace``: overwrite an existing file; docs/dump-format.md)."""
    if rows.draft.tap is not None:
        raise ValueError("these rows already write a dump; one dump per session or batch")
    return EngineDump(engine, requests, rows, path, replace)
