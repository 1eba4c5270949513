"""The one cycle implementation: B >= 1 requests stepped together, draft -> tree build -> compile ->
verify -> accept -> commit -> records.

``Rows`` holds the two model states (target and drafter, each one object for every row) and runs the
stages in order over whatever requests it is given; a ``Session`` is one row, a ``BatchSession`` many.
The requests (``workbench.engine.session.Session``) keep their own settings, outputs, traces and hooks; ``Rows``
keeps no reference to them between calls. Each stage's output passes a named hook point
(``workbench.engine.hooks``), where each request's own hooks see its own row.
"""
from __future__ import annotations

from ddtree_kernels import Tree
from workbench.engine import stages
from workbench.engine.hooks import CycleHooks, hooks_for
from workbench.engine.replacements import checked_choices, checked_path, checked_tree, with_choices, with_paths
from workbench.engine.stopwatch import Stopwatch, clock  # noqa: F401  (also re-exported: workbench.engine.core)
from workbench.records.forward import ForwardMode, ForwardRecord
from workbench.models.layout import TreeLayout
from workbench.models.registry import new_draft_state, new_target_state
from workbench.engine.sampling import target_choice
from workbench.records.build import CycleParts


def static_nodes(policy, block_size: int) -> int:
    """Nodes (root included) every verify of ``policy`` is padded to under static shapes: its largest tree."""
    return policy.static_nodes(block_size)


class SessionFinished(RuntimeError):
    """``step()`` was called on a session that has already ended."""


class Rows:
    """The model states of B >= 1 requests and the cycle over them.

    ``prefill(reqs)`` starts every request; ``step(reqs)`` runs one cycle for the requests given (the
    live ones, in row order) and returns (their Cycle records, the cycle's TreeLayout, the batched
    forwards' records, the stopwatch still running in "record" so the caller's bookkeeping is timed);
    ``select(rows)`` retires rows, ``admit(reqs)`` adds requests to running rows (prefilled apart, their
    rows appended), ``take(rows)`` copies rows out into a new ``Rows`` (for stepping a subset) and
    ``merge(other)`` appends another's rows. Row order is the caller's to track: the requests handed to
    ``step`` must be this object's rows, in order.

    What the cycle reads of a request and hands it (``workbench.engine.request.Request``): its settings
    (``policy``, ``sampling``, ``generator``, ``max_new_tokens``, ``kernel_backend``), its hooks
    (``hook_points``, ``workbench.engine.hooks``: a shape capture is one), its position (``start``, ``bonus``,
    ``generated``, ``prompt_ids``, ``trace``), and ``begin`` (after the prefill), ``extend`` (the committed
    tokens) and ``record`` (its share of the cycle) -- nothing else.
    """

    def __init__(self, models, static_shapes: bool = False, graphs=None):
        """``static_shapes``: every draft and verify forward of a fixed policy has the same shapes and
        storage (trees padded to the policy's node count, buffers preallocated to the requests' limit, no
        host read between the draft and the verify forward); ``graphs``: a ``workbench.engine.graphs.Graphs``
        that captures and replays those forwards (CUDA; implies static shapes)."""
        self.models = models
        self.target = new_target_state(models)
        self.draft = new_draft_state(models)
        self.prefill_record: ForwardRecord | None = None
        self.static_shapes = static_shapes or graphs is not None
        self.graphs = graphs
        self.capacity = 0
        if self.static_shapes:
            for st in (self.target, self.draft):
                if not st.supports_static_shapes:
                    raise ValueError(f"static_shapes=True: {type(st).__name__} runs with dynamic shapes only "
                                     "(it declares no static-shape path); drop static_shapes for this model")

    def _preallocate(self, reqs: list, nodes: int) -> None:
        """Buffers for the requests' whole limit (prompt + max_new_tokens + a tree or two draft blocks),
        rounded up to a length bucket of 256; a larger limit later moves to the next bucket."""
        m = self.models
        need = max(len(s.prompt_ids) + s.max_new_tokens for s in reqs) + max(nodes, 2 * m.block_size)
        if need <= self.capacity:
            return
        self.capacity = max(-(-need // 256) * 256, self.capacity)
        for st in (self.target, self.draft):
            st.preallocate(len(reqs), self.capacity)
            st.graphs = self.graphs

    def prefill(self, reqs: list) -> None:
        """Start ``reqs``: one EXTEND forward over their prompts, each one's first token chosen. Their
        hooks see ``prefill.hook_begin`` and ``prefill.hook_end`` (the latter even when it raises)."""
        hooks = hooks_for(reqs, self, prefill=True)
        if hooks is None:
            return self._prefill(reqs)
        try:
            hooks.observe("prefill.hook_begin", [s.prompt_ids for s in reqs])
            self._prefill(reqs)
        except BaseException as e:
            hooks.end("prefill.hook_end", e)
            raise
        hooks.end("prefill.hook_end", None)

    def _prefill(self, reqs: list) -> None:
        m = self.models
        t0 = clock(m.device)
        if self.static_shapes:
            self._preallocate(reqs, max(static_nodes(s.policy, m.block_size) for s in reqs))
        out = self.target.prefill([s.prompt_ids for s in reqs])
        self.draft.start([out.features[b : b + 1, : len(s.prompt_ids)] for b, s in enumerate(reqs)])
        self.prefill_record = out.record
        top2 = out.logits[:, -1].topk(2)  # each first token's runner-up, for wb.first_divergence
        chosen = []
        for b, s in enumerate(reqs):
            choice, _ = target_choice(out.logits[b : b + 1], s.sampling, s.generator)
            chosen.append(int(choice[0, 0]))
        seconds = clock(m.device) - t0
        for b, (s, t) in enumerate(zip(reqs, chosen)):
            s.begin(t, out.record, seconds, {"tokens": top2.indices[b].tolist(),
                                             "logits": top2.values[b].float().tolist()})

    @property
    def rows(self) -> int:
        return self.target.rows

    def admit(self, reqs: list) -> None:
        """Start ``reqs`` and append their rows after the running ones: one prefill (EXTEND) over the new
        prompts alone, then their state joins these rows (dynamic shapes only)."""
        if not self.rows:  # every earlier row retired (or none yet): fresh states, as a new Rows has
            self.target, self.draft = new_target_state(self.models), new_draft_state(self.models)
            self.capacity = 0
            return self.prefill(reqs)
        if self.static_shapes:
            raise ValueError("admit: static shapes fix the rows of a forward; requests join running rows with "
                             "dynamic shapes only (drop static_shapes / cuda_graphs for a batching driver)")
        new = Rows(self.models)
        new.prefill(reqs)
        self.merge(new)
        self.prefill_record = new.prefill_record

    def row_bytes(self, row: int) -> int:
        """Bytes of committed model state (target and drafter) held for one row."""
        return sum(t.nelement() * t.element_size() for st in (self.target, self.draft)
                   for kv in st.view(row) for t in kv)

    def take(self, rows: list[int]) -> "Rows":
        """A new ``Rows`` holding copies of ``rows`` (in that order); these are unchanged."""
        out = Rows(self.models)
        out.target, out.draft = self.target.take(rows), self.draft.take(rows)
        return out

    def merge(self, other: "Rows") -> None:
        """Append ``other``'s rows after these (``other`` is consumed)."""
        self.target.admit(other.target)
        self.draft.admit(other.draft)

    def select(self, rows: list[int]) -> None:
        self.target.select(rows)
        self.draft.select(rows)

    def step(self, reqs: list) -> tuple[list, TreeLayout, tuple, Stopwatch]:
        """One cycle over ``reqs`` (this object's rows, in order). Each request's hooks see its own row at
        every point (``workbench.engine.hooks.POINTS``), ``cycle.hook_end`` even when the cycle raises."""
        sw = Stopwatch(self.models.device)
        sw.start("other")  # checks and bookkeeping between the named stages
        hooks = hooks_for(reqs, self, sw)
        if hooks is None:  # no request has a hook: the cycle exactly as without hook points
            return self._cycle(reqs, sw, None)
        try:
            out = self._cycle(reqs, sw, hooks)
        except BaseException as e:
            hooks.end("cycle.hook_end", e)
            raise
        hooks.end("cycle.hook_end", None)
        return out

    def _cycle(self, reqs: list, sw: Stopwatch, hooks: CycleHooks | None) -> tuple[list, TreeLayout, tuple, Stopwatch]:
        m = self.models
        starts, roots, policies = [s.start for s in reqs], [s.bonus for s in reqs], [s.policy for s in reqs]
        # Never draft past a request's token limit or the model's positions.
        depths = [min(m.block_size - 1, s.max_new_tokens - len(s.generated) - 1, m.max_positions - 1 - s.start)
                  for s in reqs]
        uses = [p.drafts and d > 0 for p, d in zip(policies, depths)]
        max_depths = [d if u else 0 for d, u in zip(depths, uses)]  # a root-only tree needs no ancestry work

        nodes = None
        if self.static_shapes:  # one node count per policy mix: the forwards' shapes do not change
            nodes = max(static_nodes(p, m.block_size) for p in policies)
            self._preallocate(reqs, nodes)

        if hooks is not None:
            hooks.observe("cycle.hook_begin", max_depths)
        sw.start("draft")
        drafted = [None] * len(reqs)
        if hooks is not None:
            drafted = self._draft_hooked(hooks, roots, starts, depths, uses)
            hooks.observe("cycle.hook_draft", drafted)
        elif any(uses):
            drafted = stages.draft(self.draft, roots, starts, [d if u else None for d, u in zip(depths, uses)])
        sw.start("tree_build")
        trees, check = stages.tree_build_checked(policies, drafted, roots, m.device, self.static_shapes, nodes)
        if hooks is not None and hooks.has("cycle.hook_tree"):
            vocab = m.target.get_output_embeddings().weight.shape[0]
            # Copies: a hook that changes its value in place without returning it changes nothing, silently or not.
            copies = [Tree(*(x.clone() for x in (t.tokens, t.parents, t.depth, t.rank, t.score))) for t in trees]
            for b, t in hooks.replace("cycle.hook_tree", copies, lambda v, b: checked_tree(
                    v, roots[b], vocab, max_depths[b], nodes, trees[b], row=b)).items():
                trees[b] = t
        sw.start("tree_compile")
        layout = stages.tree_compile(trees, starts, max_depths, nodes)
        if hooks is not None:
            hooks.observe("cycle.hook_compiled", layout.compileds)
        sw.start("verify")
        # A state that runs kernels inside its forward (a hybrid's GatedDeltaNet layers) takes the backend here.
        self.target.kernel_backend = reqs[0].kernel_backend
        mode = ForwardMode.DECODE if not any(p.drafts for p in policies) else ForwardMode.TARGET_VERIFY
        verified = stages.verify(self.target, layout, mode, [s.sampling for s in reqs],
                                 [s.generator for s in reqs], sync_free=self.static_shapes)
        if hooks is not None and hooks.has("cycle.hook_choices"):
            verified = self._hook_choices(hooks, layout, verified)
        sw.start("accept")
        accepted = stages.accept(reqs[0].kernel_backend, layout, verified)
        if hooks is not None and hooks.has("cycle.hook_accepted"):
            accepted = self._hook_accepted(hooks, layout, verified, accepted)
        sw.start("commit")
        committed = stages.commit(self.target, layout, accepted, verified.features, check)
        self.draft.add_context([c.context for c in committed])
        kept = [s.extend(c.tokens) for s, c in zip(reqs, committed)]
        if hooks is not None:
            hooks.observe("cycle.hook_committed", committed)
        sw.start("record")
        times = sw.times  # every Cycle holds this dict: "record" and the rest of "other" land in it later
        cycles = []
        state_from = self.target.state_from  # [B, N]: recurrent targets only (None: no recurrent state)
        for b, s in enumerate(reqs):
            cycles.append(s.record(CycleParts(
                policies[b], starts[b], roots[b], drafted[b], layout.trees[b], layout.compileds[b],
                verified.row(b, layout.n[b]), committed[b], kept[b], times,
                None if state_from is None else state_from[b, : layout.n[b]],
                () if hooks is None else tuple(hooks.replaced[b]))))
        if hooks is not None:
            hooks.observe("cycle.hook_record", cycles)
        draft_rec = next((d.record for d in drafted if d is not None), None)
        forwards = tuple(r for r in (draft_rec, verified.record) if r is not None)
        return cycles, layout, forwards, sw

    def _draft_hooked(self, hooks: CycleHooks, roots: list[int], starts: list[int], depths: list[int],
                      uses: list[bool]) -> list:
        """The draft of a cycle with hooks: the drafter's state copies what its forward is handed only when a
        ``cycle.hook_draft_input`` hook will read it, and those hooks see each row's copy (None: no forward)."""
        inputs = [None] * len(roots)
        drafted = [None] * len(roots)
        if any(uses):
            def observe(seen: list) -> None:
                inputs[:] = seen

            drafted = stages.draft(self.draft, roots, starts, [d if u else None for d, u in zip(depths, uses)],
                                   observe if hooks.has("cycle.hook_draft_input") else None)
        hooks.observe("cycle.hook_draft_input", inputs)
        return drafted

    def _hook_choices(self, hooks: CycleHooks, layout: TreeLayout, verified):
        """Each row's choices [1, n] through its cycle.hook_choices hooks; a replacement is checked and put in."""
        vocab = self.models.target.get_output_embeddings().weight.shape[0]
        rows = [verified.choice[b : b + 1, : n].clone() for b, n in enumerate(layout.n)]  # [1, n_b] copies
        got = hooks.replace("cycle.hook_choices", rows,
                            lambda v, b: checked_choices(v, layout.n[b], vocab, verified.choice))
        return with_choices(verified, got) if got else verified

    def _hook_accepted(self, hooks: CycleHooks, layout: TreeLayout, verified, accepted):
        """Each row's accepted path [L + 1] through its cycle.hook_accepted hooks (a host read of the
        lengths: only when such a hook is registered); a replacement must be a root-to-node path of the tree."""
        lengths = accepted.length.tolist()
        paths = [accepted.index[b, : L + 1].clone() for b, L in enumerate(lengths)]  # [L_b + 1] copies
        got = hooks.replace("cycle.hook_accepted", paths, lambda v, b: checked_path(
            v, layout.trees[b].parents[0].tolist(), accepted.index))
        return with_paths(accepted, got, verified.choice) if got else accepted
