"""The workbench's own engine writes a cycle dump: ``engine.session(..., dump=PATH)`` / ``batch_session``.

``attach(engine, requests, rows, path)`` opens the dump, writes each request's start and hangs the writer on
each request's hook points (``workbench.engine.hooks``); the engine imports nothing of it: this module
registers the session keyword ``dump`` (``workbench.engine.observers``) when it is imported, and
``import workbench`` imports it. What each record is read from:

- ``cycle.hook_begin``: a new engine step (row 0 opens it);
- ``cycle.hook_draft_input``: what the drafter's forward was handed for the row (``models.base.DraftInput``:
  its new context rows' features and positions, its block's tokens and positions), copied from the very
  tensors the forward got; the features are dumped whole for a small pair and as a digest for a large one
  (``workbench.conform.features``; the header's ``features`` says which);
- ``cycle.hook_committed``: the nodes handed to the target state's compaction and the tokens committed;
- the target state's ``observe_verify`` (``models.dense_target.DenseKV``): what the verify forward was handed,
  its input ids, positions and additive mask, read where the forward consumes them (a mask built wrong from a
  right visibility shows as the visibility contract's, not only as wrong logits); the dumped visibility is
  that mask's tree columns [n, n], or [n, context_len + n] (prefix columns first) where it hid any prefix
  column. A target state without it leaves the compiled
  tree's positions and visibility, named ``intended`` in the header (``workbench.conform.intended``);
- ``cycle.hook_record``: the request's ``Cycle`` (the tree the verify ran, the target's top-2 and choice, the
  accepted path) and the target state's own length.

One cycle record per request per engine step; the rows of one batched step share ``step``. Full logits are not
held by a cycle record (the drafter's top-k and the target's top-2 are), so ``draft_logits`` /
``target_logits`` are left out. The file closes (end line) when every request has finished; a finished
session resumed under a larger limit reopens it.
"""
from __future__ import annotations

import torch

from workbench.conform import features
from workbench.conform.dump import DumpWriter, check_dump_path, make_header
from workbench.conform.fingerprint import pair_fingerprint
from workbench.engine.loading import model_ref
from workbench.engine.observers import register_observer
from workbench.models.config_facts import is_hybrid
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
            "hybrid": is_hybrid(t),
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
    """One dump written by one ``Session`` or ``BatchSession`` (its requests share the file), from hooks on each
    request's hook points: nothing of it runs in a cycle without a dump."""

    def __init__(self, engine, requests: list, rows, path, replace: bool = False):
        from workbench.version import __version__

        m = engine.models
        self.models, self.requests = m, list(requests)
        self.ids = {id(r): str(i) for i, r in enumerate(self.requests)}
        labels = {str(r.policy) for r in self.requests}
        first = self.requests[0]
        # whole rows for a small pair, a digest for a large one (workbench.conform.features)
        self.features = features.spec_for(len(m.target_layer_ids),
                                          int(m.target.config.get_text_config(decoder=True).hidden_size))
        # the verify's inputs as its forward consumes them, where the target state shows them
        self.observes = hasattr(rows.target, "observe_verify")
        intended = {} if self.observes else {name: "the compiled tree's, not read at the verify forward (the "
                                             "target state has no observe_verify)" for name in VERIFY_INPUTS}
        header = make_header(
            {"name": "workbench", "version": __version__, "static_shapes": bool(rows.static_shapes),
             "kernel_backend": first.kernel_backend},
            pair_identity(m), labels.pop() if len(labels) == 1 else None,
            {"temperature": first.sampling.temperature, "top_p": first.sampling.top_p,
             "top_k": first.sampling.top_k, "seed": first.seed},
            topk={"draft": first.record_topk, "target": 2}, batch=len(self.requests),
            features=self.features.to_header(), intended=intended)
        self.writer = DumpWriter(path, header, replace)
        self.step = -1
        self._new_step = False  # a cycle began: its first record opens a new step (a cycle that raised writes none)
        self._inputs: list = []  # per row of the running cycle: its DraftInput (None: no draft forward)
        self._committed: list = []  # per row of the running cycle: its stages.Committed
        self._verify = None  # the running cycle's verify inputs: (ids, positions [B, N], visible [B, N, W] or None)
        self._target = None  # the target state whose observe_verify this dump set
        self._off: list = []  # removers of the hooks this dump put on its requests
        for r in self.requests:
            s = r.sampling
            self.writer.request(self.ids[id(r)], prompt_ids=torch.tensor(r.prompt_ids), first_token=r.generated[0],
                                policy=str(r.policy), temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                seed=r.seed, max_new_tokens=r.max_new_tokens)
            for point, fn in (("cycle.hook_begin", self.on_begin), ("cycle.hook_draft_input", self.on_draft_input),
                              ("cycle.hook_committed", self.on_committed), ("cycle.hook_record", self.on_record)):
                self._off.append(r.hook_points.add(point, fn))

    @property
    def path(self):
        return self.writer.path

    # ---- the hooks (each row of a cycle calls each in turn; row 0 first)
    def on_begin(self, depth, hook) -> None:
        if hook.row == 0:
            self._new_step = True
            self._inputs, self._committed, self._verify = [None] * hook.batch, [None] * hook.batch, None
            if self.observes and self._target is not hook.rows.target:
                self._target = hook.rows.target
                self._target.observe_verify = self.on_verify_input

    def on_verify_input(self, ids, positions, mask) -> None:
        """What the verify forward is handed (ids, positions [B, N]; mask additive [B, 1, N, W], None: every
        column visible), copied: a static verify reuses its buffers."""
        self._verify = (ids.clone(), positions.clone(), None if mask is None else mask[:, 0] == 0)

    def on_draft_input(self, seen, hook) -> None:
        """What the drafter's forward was handed for this row (its context rows and block), or None."""
        self._inputs[hook.row] = seen

    def on_committed(self, committed, hook) -> None:
        self._committed[hook.row] = committed

    def on_record(self, cyc: Cycle, hook) -> None:
        """The request's record of the step just committed."""
        if self._new_step:  # every row of one step shares its number
            self.step, self._new_step = self.step + 1, False
        if self.writer.closed:
            try:
                self.writer.reopen()
            except ValueError as e:  # the file is another run's now: raising here would cut the step short
                self.detach(str(e))
                return
        f = self._fields(hook.request, cyc, hook)
        self.writer.cycle(self.ids[id(hook.request)], self.step, **f)
        if all(r.finished for r in self.requests):
            self.writer.close()
            self.release()

    def release(self) -> None:
        """Take this dump's observer off the target state (set again by the next step of a resumed session)."""
        if self._target is not None and self._target.observe_verify == self.on_verify_input:
            self._target.observe_verify = None
        self._target = None

    def _fields(self, request, c: Cycle, hook) -> dict:
        row = hook.row
        f = {"row": row, "rows": hook.batch, **cycle_fields(c)}
        seen = self._inputs[row]
        if seen is not None:  # the forward ran for every row (one that keeps no slot this step too)
            ctx = int(seen.context_positions.shape[0])
            seq = request.prompt_ids + request.generated
            f.update(draft_context_tokens=torch.tensor(seq[c.start - ctx : c.start], dtype=torch.long),
                     draft_context_positions=seen.context_positions, draft_block_tokens=seen.block_tokens,
                     draft_block_positions=seen.block_positions, **self.features.fields(seen.context_features))
        if self._verify is not None:  # what the verify forward consumed, in place of the compiled tree's
            ids, pos, vis = self._verify
            n, start = int(c.tokens.shape[0]), c.start
            seen = vis[row, :n, : start + n] if vis is not None else torch.ones(n, start + n, dtype=torch.bool)
            # the tree's columns alone where the forward saw the whole prefix (the dump format's m = n)
            f.update(verify_ids=ids[row, :n], verify_positions=pos[row, :n], visibility_form="dense",
                     visibility=seen[:, start:] if bool(seen[:, :start].all()) else seen)
        elif self.observes:  # the forward ran unseen (another observer held the state): said, not passed off
            f["notes"] = "verify_ids, verify_positions, visibility: the compiled tree's, not seen at the verify forward"
        committed = self._committed[row]
        f.update(committed_tokens=torch.tensor(committed.tokens[: c.committed], dtype=torch.long),
                 kv_kept_nodes=committed.nodes)
        lengths = getattr(hook.rows.target, "lengths", None)
        if lengths is not None and row < len(lengths):
            f["next_context_len"] = int(lengths[row])
        return f

    def close(self) -> None:
        """Write the end line now (a session stopped before it finished)."""
        self.writer.close()
        self.release()

    def detach(self, why: str) -> None:
        """Stop dumping these requests, and say so (a warning naming why): the run goes on undumped."""
        import warnings

        for off in self._off:
            off()
        self._off = []
        self.release()
        for r in self.requests:
            if r.observers.get(OBSERVER) is self:
                del r.observers[OBSERVER]
        warnings.warn(f"{why}; this session's further cycles are not dumped", stacklevel=3)

    def __repr__(self) -> str:
        return f"EngineDump({str(self.path)!r}, {self.step + 1} steps, {self.writer.records} records)"


def check(path, replace: bool = False) -> None:
    """``session(..., dump=PATH)`` before the prefill: a path a dump can be written to (one-line ValueError)."""
    check_dump_path(path, replace)


def attach(engine, requests: list, rows, path, replace: bool = False) -> EngineDump:
    """Dump ``requests`` (a session's one, or a batch's, already prefilled) stepped over ``rows`` to ``path``
    (``replace``: overwrite an existing file; docs/dump-format.md)."""
    if any(OBSERVER in r.observers for r in requests):
        raise ValueError("these requests already write a dump; one dump per session or batch")
    return EngineDump(engine, requests, rows, path, replace)


VERIFY_INPUTS = ("verify_ids", "verify_positions", "visibility")  # read at the forward, where the state shows them
OBSERVER = "dump"  # the session keyword: engine.session(..., dump=PATH); registered on import
register_observer(OBSERVER, check, attach)
