"""``wb.conform(dump)``: a dumped speculative run replayed against the reference, contract by contract.

    report = wb.conform("run.dump")                 # the pair the dump's header names (default: embedded)
    report = wb.conform("run.dump", target=DIR, draft=DIR)
    print(report); report.to_dict(); report.broken  # contracts in the order they first broke
    python -m workbench conform run.dump [--target DIR --draft DIR] [--json]

For every cycle record (docs/dump-format.md) the checker rebuilds what the step should have been from the
request's committed context (its prompt, its first token and the tokens every earlier step committed), with
the workbench's own independent references: the reference drafter (``workbench.models.drafter_reference``) on that
context, the exact best-N tree (``oracles.build_tree_greedy_exact``) for the engine's own drafter output, the
ancestor closure by a plain walk, the path oracle (``workbench.models.path_oracle``: every node's logits from
its own root-to-node path through transformers' own model and cache) and the accept walk in Python. It then
holds each contract (``workbench.conform.contracts.CONTRACTS``) against the dump's fields. Per contract the
report gives cycles checked, cycles broken, the first broken cycle with its evidence and the acceptance it
cost there (tokens the reference's step commits on that context vs the engine's), and the cycles it could
not check with the fields they lack: a missing field is "not checked", never passed.

Bad input is refused in one line naming the field, before any model loads where the file alone shows it:
a foreign, truncated-header or unknown-version file (``read_dump``), a dump of another pair (vocabulary,
block size, mask token, a hybrid target under a header that says attention-only or the reverse), a field in a
layout the checker cannot read (an unknown visibility form, a drafted slot count the drafter's block cannot
make, a token outside the vocabulary), a dump with nothing to check (no cycle records, no field any contract
reads) and a file that is not as its writer wrote it (a record missing, repeated or out of order, a cycle
without its request's record, two rows' request ids swapped: ``workbench.conform.integrity``). Once the pair
is loaded, its weights' fingerprint is held against the header's (``workbench.conform.fingerprint``): a dump
is never replayed on another pair. A check that judged nothing (every contract not checked) is refused too:
it is no verdict.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from workbench.conform import contracts as C
from workbench.conform import features as F
from workbench.conform.calibrated_trees import calibrated_tree, is_calibrated
from workbench.conform.causes import match_causes, report_lines
from workbench.conform.dump import read_dump
from workbench.conform.feature_contract import features_problem
from workbench.conform.integrity import RecordOrder
from workbench.models.config_facts import is_hybrid

NEEDS = {  # the fields each contract reads (besides the committed context); a cycle without them is not checked
    "drafter context": ("draft_context_tokens", "draft_context_positions"),
    "drafter features": ("draft_context_positions",),  # and the features, whole or their digest (F.has_features)
    "drafter output": ("draft_topk_ids", "draft_topk_values"),
    "tree": ("tree_tokens", "tree_parents"),
    "verify positions": ("verify_positions", "tree_parents"),
    "visibility": ("visibility_form", "tree_parents"),
    "recurrent-state parents": ("state_from", "tree_parents"),
    "target logits": ("target_topk_ids", "target_topk_values", "tree_tokens", "tree_parents"),
    "accept walk": ("tree_tokens", "tree_parents", "accepted_nodes"),
    "committed tokens": ("accepted_nodes", "tree_tokens"),
}
DIAGNOSED_CYCLES = 8  # broken features cycles whose rows are also held against the previous tree's nodes
# these read the committed context too
CONTEXT_CONTRACTS = ("drafter context", "drafter features", "drafter output", "target logits")
TOKEN_FIELDS = ("draft_context_tokens", "draft_block_tokens", "draft_topk_ids", "tree_tokens", "verify_ids",
                "target_topk_ids", "target_choice", "committed_tokens")


class ConformInputError(ValueError):
    """A dump the checker cannot check (another pair, a layout it cannot read); one line naming the field."""


@dataclass
class ContractResult:
    """One contract over the run."""

    name: str
    checked: int = 0  # cycles whose fields this contract had
    broken: int = 0
    near_ties: int = 0  # top-1 differences within the tolerance's near tie (not counted as broken)
    not_checked: dict = field(default_factory=dict)  # why -> cycles
    first: dict | None = None  # the first broken cycle: request, cycle, step, row, evidence, accept lengths
    accept: list = field(default_factory=lambda: [0, 0])  # over the broken cycles: tokens committed, reference / engine
    facts: list = field(default_factory=list)  # per broken cycle, its evidence as data (workbench.conform.causes reads it)

    @property
    def status(self) -> str:
        if self.broken:
            return "BROKEN"
        return "passed" if self.checked else "not checked"

    def to_dict(self) -> dict:
        return {"contract": self.name, "status": self.status, "checked": self.checked, "broken": self.broken,
                "near_ties": self.near_ties, "not_checked": dict(self.not_checked), "first_broken": self.first,
                "broken_cycles_commit": {"reference": self.accept[0], "engine": self.accept[1]}}


@dataclass
class ConformReport:
    dump: str
    header: dict
    results: dict  # contract name -> ContractResult, in CONTRACTS order
    cycles: int
    requests: int
    tolerance: C.Tolerance
    seconds: float
    notes: list = field(default_factory=list)  # one line each: a dump cut short, fields this version does not know
    policies: list = field(default_factory=list)  # every policy label the records name, in the order first used
    pair_used: dict = field(default_factory=dict)  # the pair the replay ran on: target, draft, dtype
    selection: dict | None = None  # the slice checked (workbench.conform.selection), None: the whole dump
    causes: dict = field(default_factory=dict)  # broken contract -> the known causes its evidence matches

    @property
    def title_policy(self) -> str:
        """Every policy the run used (a session's policy changed mid-run names both), else the header's."""
        p = list(self.policies)
        if len(p) > 1:
            return "policies " + ", ".join(p[:-1]) + " and " + p[-1]
        return p[0] if p else (self.header.get("policy") or "per-request policies")

    @property
    def broken(self) -> list[str]:
        """The broken contracts in the order they first broke (engine step, row, then the data flow's order
        within a step: an input's fault explains what follows it)."""
        bad = [r for r in self.results.values() if r.broken]
        order = {n: i for i, n in enumerate(C.CONTRACTS)}
        return [r.name for r in sorted(bad, key=lambda r: (r.first["step"], r.first["row"], order[r.name]))]

    @property
    def ok(self) -> bool:
        return not self.broken

    def to_dict(self) -> dict:
        return {"dump": self.dump, "engine": self.header.get("engine"), "pair": self.header.get("pair"),
                "policy": self.header.get("policy"), "policies": list(self.policies),
                "pair_used": dict(self.pair_used), "cycles": self.cycles, "requests": self.requests,
                "tolerance": str(self.tolerance), "seconds": self.seconds, "notes": list(self.notes),
                "broken": self.broken, "contracts": [r.to_dict() for r in self.results.values()],
                "causes": {name: [c.to_dict() for c in found] for name, found in self.causes.items()},
                "selection": self.selection}

    def __str__(self) -> str:
        from workbench.records.texttable import text_table

        eng = self.header.get("engine") or {}
        used = self.pair_used or self.header.get("pair") or {}
        lines = [f"Conformance of {self.dump}: {eng.get('name')} {eng.get('version', '')}".rstrip()
                 + f", {self.title_policy}, {self.cycles} cycles of "
                 f"{self.requests} request(s), checked in {self.seconds:.1f} s",
                 f"pair: target {used.get('target')}, draft {used.get('draft')} ({used.get('dtype')})"
                 + named_otherwise(self.header.get("pair") or {}, used),
                 f"tolerance {self.tolerance}"]
        lines += [f"note: {n}" for n in self.notes]
        rows = []
        for r in self.results.values():
            f = r.first
            rows.append([r.name, r.status, str(r.checked), str(r.broken),
                         f"request {f['request']} cycle {f['cycle']}" if f else "-",
                         f"{f['reference_accept']} / {f['engine_accept']}" if f and f.get("reference_accept") is not None else "-",
                         "; ".join(f"{k} ({v})" for k, v in r.not_checked.items()) or "-"])
        lines.append(text_table(["contract", "status", "cycles checked", "broken", "first broken",
                                 "accept there ref / engine", "not checked (cycles)"], rows))
        if self.broken:
            lines.append("broken, in the order they first broke:")
            for i, name in enumerate(self.broken, 1):
                f = self.results[name].first
                cost = (f"; the reference's step commits {_tokens(f['reference_accept'])} there, the engine's "
                        f"{f['engine_accept']}" if f.get("reference_accept") is not None else "")
                ref, eng = self.results[name].accept
                over = (f" Over its {self.results[name].broken} broken cycles the reference's steps commit "
                        f"{_tokens(ref)}, the engine's {eng}." if self.results[name].broken > 1 and ref else "")
                lines.append(f"  {i}. {name}: request {f['request']}, cycle {f['cycle']} (step {f['step']}): "
                             f"{f['evidence']}{cost}.{over}")
            lines += report_lines(self.broken, self.causes)
        else:
            lines.append("no contract broken" + (" (see the contracts not checked)" if any(
                r.status == "not checked" for r in self.results.values()) else ""))
        near = [f"{r.name}: {r.near_ties}" for r in self.results.values() if r.near_ties]
        if near:
            lines.append("near ties (a different top-1 within the tolerance, not counted): " + ", ".join(near))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(str(self))}</pre>"


def _tokens(n: int) -> str:
    return f"{n} token{'' if n == 1 else 's'}"


def named_otherwise(pair: dict, used: dict) -> str:
    """Where the header names the models otherwise than the pair the replay ran on (another path to them, or
    target= / draft= given): what it names, beside the pair used."""
    from workbench.engine.loading import canonical_ref

    named = [canonical_ref(pair.get(k)) if pair.get(k) else None for k in ("target", "draft")]
    if named == [used.get("target"), used.get("draft")] or named == [None, None]:
        return ""
    return f"; the dump names target {pair.get('target')}, draft {pair.get('draft')}"


# ------------------------------------------------------------------------------------------ the pair
def _pair_dirs(pair: dict, target, draft) -> tuple[Path, Path]:
    from workbench.engine.loading import pair_dirs, resolve_model_ref

    if target is None and draft is None:
        t, d = (resolve_model_ref(pair.get(k)) for k in ("target", "draft"))
        if pair.get("target") and t is None:
            raise ConformInputError(f"the dump's pair.target {pair.get('target')!r} is not on this machine: pass "
                                    "target= and draft= (--target / --draft)")
        if pair.get("draft") and d is None:
            raise ConformInputError(f"the dump's pair.draft {pair.get('draft')!r} is not on this machine: pass "
                                    "target= and draft= (--target / --draft)")
        target, draft = t, d
    return pair_dirs(target, draft)


def check_pair(pair: dict, tdir: Path, ddir: Path) -> None:
    """The dump's ``pair`` against the models' configs (read, not loaded): one line naming the first field
    that differs."""
    from workbench.engine.loading import draft_settings, read_config

    tcfg, dcfg = read_config(tdir), read_config(ddir)
    text = tcfg.get("text_config") if isinstance(tcfg.get("text_config"), dict) else tcfg
    ds = draft_settings(dcfg, ddir)
    have = {"vocab_size": text.get("vocab_size"), "block_size": ds.block_size, "mask_token_id": ds.mask_token_id,
            "target_layer_ids": ds.target_layer_ids}
    for key, value in have.items():
        if key in pair and pair[key] != value:
            raise ConformInputError(f"the dump's pair.{key} is {pair[key]!r} but the pair here (target {tdir}, draft "
                                    f"{ddir}) has {value!r}: a dump of another pair; pass its target= and draft=")
    hybrid = is_hybrid(tcfg)
    said = pair.get("hybrid")
    if said is not None and not isinstance(said, bool):
        raise ConformInputError(f"the dump's pair.hybrid is {str(said)[:30]!r}: it must be true (the target has "
                                "linear-attention layers) or false")
    if hybrid and said is not True:
        raise ConformInputError(f"the dump's header says the target is attention-only (pair.hybrid "
                                f"{'absent' if said is None else 'false'}) but the target here ({tdir}) has "
                                "linear-attention layers: write \"hybrid\": true in the header's pair if the dump "
                                "is of this hybrid target, or check it on the pair it was written with")
    if said is True and not hybrid:
        raise ConformInputError(f"the dump's header says the target is hybrid (pair.hybrid true) but the target "
                                f"here ({tdir}) is attention-only: check it on the pair it was written with "
                                "(target=, draft=)")


@dataclass
class Scan:
    """What one pass over the records found before any model loads."""

    cycles: int
    requests: int
    notes: list
    policies: list  # policy labels in the order the records first name them


def prescan(path, pair: dict, features: tuple | None = None) -> Scan:
    """One pass over the records before any model loads: every field decodes, the layouts are ones the checker
    reads, token ids and drafted slots fit the pair, the records are whole and in order (``RecordOrder``), and
    there is something to check: at least one cycle, and one that holds some contract's fields. ``features``:
    (the header's FeatureSpec, the drafter's target layers, the target's hidden size): each record's features
    have that form and width (``workbench.conform.features.check_record``)."""
    from workbench.conform.dump import VISIBILITY_FORMS

    vocab, block = pair.get("vocab_size"), pair.get("block_size")
    _, records = read_dump(path)
    cycles = requests = 0
    unknown: set = set()
    order = RecordOrder(path)
    policies: list = []
    with_context: set = set()  # requests whose record gives the committed context (prompt and first token)
    checkable: set = set()  # contracts some cycle holds the fields of
    for rec in records:
        for name in rec.fields:
            value = rec[name]  # DumpFileError names file:line and the field
            if name in TOKEN_FIELDS and isinstance(value, Tensor) and value.numel() and isinstance(vocab, int):
                lo, hi = int(value.min()), int(value.max())
                if name != "target_choice" and (lo < 0 or hi >= vocab):
                    raise ConformInputError(f"{rec.where}: {name} holds token {hi if hi >= vocab else lo}, outside "
                                            f"the pair's vocabulary of {vocab}: a dump of another pair?")
        unknown.update(rec.unknown)
        order.add(rec)
        label = rec.get("policy")
        if label and label not in policies:
            policies.append(label)
        if rec.kind == "request":
            requests += 1
            if "prompt_ids" in rec and "first_token" in rec:
                with_context.add(rec.request)
            continue
        cycles += 1
        if features is not None:
            try:
                F.check_record(rec, *features)
            except F.FeatureInputError as e:
                raise ConformInputError(str(e)) from None
        checkable.update(name for name, need in NEEDS.items() if all(f in rec for f in need)
                         and (name not in CONTEXT_CONTRACTS or rec.request in with_context))
        form = rec.get("visibility_form")
        if form is not None and form not in VISIBILITY_FORMS:
            raise ConformInputError(f"{rec.where}: visibility_form {form!r} is a layout this checker cannot read "
                                    f"({', '.join(VISIBILITY_FORMS)})")
        kind = rec.get("draft_values")
        if kind is not None and kind not in ("logprobs", "logits"):
            raise ConformInputError(f"{rec.where}: draft_values {kind!r}: the checker reads logprobs or logits")
        for name in ("draft_topk_ids", "draft_logits"):
            if name in rec and isinstance(block, int) and rec[name].shape[0] > block - 1:
                raise ConformInputError(f"{rec.where}: {name} has {rec[name].shape[0]} drafted slots; the pair's "
                                        f"block of {block} drafts at most {block - 1}: a dump of another pair?")
        for a, b in (("draft_topk_ids", "draft_topk_values"), ("target_topk_ids", "target_topk_values")):
            if a in rec and b in rec and rec[a].shape != rec[b].shape:
                raise ConformInputError(f"{rec.where}: {a} {list(rec[a].shape)} and {b} {list(rec[b].shape)} "
                                        "differ in shape")
    problem = order.problem()
    if problem is not None:
        raise ConformInputError(problem)
    if cycles == 0:
        raise ConformInputError(f"{path} holds no cycle record ({requests} request record(s)"
                                f"{', the end line' if records.complete else ''}): nothing to check; dump a run that "
                                "steps at least once")
    if not (checkable if pair.get("hybrid") else checkable - {"recurrent-state parents"}):
        raise ConformInputError(f"{path}: none of its {cycles} cycle record(s) holds the fields any contract reads "
                                "(e.g. tree_tokens and tree_parents for the tree, accepted_nodes for the accept walk): "
                                "nothing could be checked; docs/dump-format.md lists each contract's fields")
    notes = []
    if records.truncated:
        notes.append(records.truncated)
    elif not records.complete:
        notes.append("the dump has no end line: the run stopped early; every whole record was checked")
    if not order.numbered:
        notes.append("the records carry no seq (an older writer): a record lost, repeated or moved is found only by "
                     "each request's cycle numbers and context")
    if unknown:
        notes.append(f"fields this version does not know, not checked: {', '.join(sorted(unknown))}")
    return Scan(cycles, requests, notes, policies)


# ------------------------------------------------------------------------------------------ the replay
def greedy_continuation(model, context: list[int], n: int) -> list[int]:
    """The target's next ``n`` greedy tokens after ``context`` (root last), by its own cache."""
    from workbench.models.path_oracle import prefill

    with torch.no_grad():
        logits, cache = prefill(model, torch.tensor(context))
        out = [int(logits.argmax())]
        while len(out) < n:
            step = model(input_ids=torch.tensor([[out[-1]]]), past_key_values=cache, use_cache=True)
            out.append(int(step.logits[0, -1].argmax()))
    return out


def chain_logits(model, context: list[int], tokens: list[int], parents: list[int]) -> Tensor:
    """Every node's target logits [n, V] from its own root-to-node path, as plain chains through transformers'
    own model: the committed ``context`` (the root excluded) prefilled once, then one batch whose row i is
    node i's path (root first), right-padded; causal attention (and a causal recurrence) keeps the padding
    out of every real position, so row i's logits at its depth are the path oracle's
    (``workbench.models.path_oracle.path_logits``, which tests/conform checks it against) in one forward.
    A cache that cannot be repeated over rows (transformers' linear-attention layers) runs each row's whole
    context instead."""
    from workbench.models.path_oracle import prefill

    n, depth = len(tokens), C.depths_from(parents)
    batch = torch.zeros(n, max(depth) + 1, dtype=torch.long)  # [n, D + 1]
    for i in range(n):
        j = i
        batch[i, depth[i] + 1:] = tokens[i]  # padding: never read
        while j >= 0:
            batch[i, depth[j]] = tokens[j]
            j = parents[j]
    ctx = torch.tensor(context)
    rows = (torch.arange(n), torch.tensor(depth))
    # the decoder's hidden states, and the head over each row's one read position only
    split = hasattr(model, "model") and hasattr(model, "lm_head")
    body = model.model if split else model
    with torch.no_grad():
        _, cache = prefill(model, ctx)
        if all(hasattr(layer, "batch_repeat_interleave") for layer in getattr(cache, "layers", [])):
            cache.batch_repeat_interleave(n)
            out = body(input_ids=batch, past_key_values=cache, use_cache=True)  # [n, D + 1, ...]
            skip = 0
        else:
            out = body(input_ids=torch.cat([ctx.expand(n, len(context)), batch], 1), use_cache=False)
            skip = len(context)
        if split:
            return model.lm_head(out.last_hidden_state[:, skip:][rows]).float()  # [n, V]
        return out.logits[:, skip:][rows].float()


@dataclass
class _Request:
    context: list | None  # committed tokens, the root last; None: the request record is missing
    policy: object
    prompt_len: int = 0
    max_new_tokens: int | None = None
    eos: int | None = None
    seen: dict = field(default_factory=dict)  # position -> token the drafter took in as context
    previous: tuple | None = None  # (record, cost) of the request's previous cycle

    def ends_with(self, committed: list | None) -> bool:
        """Whether this step may end the request short of its accepted path: its token limit or end-of-text."""
        if not committed:
            return True
        new = (len(self.context) - self.prompt_len if self.context is not None else 0) + len(committed)
        return (self.max_new_tokens is not None and new >= self.max_new_tokens) or committed[-1] == self.eos


def _list(rec, name: str) -> list | None:
    return rec[name].tolist() if name in rec else None


class _Replay:
    """The reference's side of every cycle, for one loaded pair."""

    def __init__(self, models, tol: C.Tolerance, hybrid: bool, features: "F.FeatureSpec | None" = None):
        from workbench.models.drafter_reference import Reference

        self.models, self.tol, self.hybrid = models, tol, hybrid
        self.features = features  # the header's features form (None: the dump holds none)
        self.feature_tol = F.tolerance(models.dtype)
        self.diagnosed = 0  # broken features cycles whose rejected-node explanation was tried (a forward each)
        self.ref = Reference(models)
        self.results = {name: ContractResult(name) for name in C.CONTRACTS}
        self._commit_broken: set = set()  # (request, step) of the commits counted broken

    # ---- per contract bookkeeping
    def _skip(self, name: str, why: str) -> None:
        r = self.results[name]
        r.not_checked[why] = r.not_checked.get(why, 0) + 1

    def _needs(self, name: str, rec, extra: tuple = ()) -> bool:
        lacking = [f for f in NEEDS[name] + extra if f not in rec]
        if lacking:
            self._skip(name, "no " + ", ".join(lacking))
            return False
        return True

    def _verdict(self, name: str, rec, problem: str | None, cost, facts: dict | None = None) -> None:
        r = self.results[name]
        r.checked += 1
        if problem is None:
            return
        r.broken += 1
        if facts is not None:
            r.facts.append(facts)
        if name == "committed tokens":
            self._commit_broken.add((rec.request, rec["step"]))
        ref_acc, eng_acc = cost()
        if ref_acc is not None and eng_acc is not None:
            r.accept[0] += ref_acc
            r.accept[1] += eng_acc
        if r.first is None:
            r.first = {"request": rec.request, "cycle": rec.get("cycle"), "step": rec["step"],
                       "row": rec.get("row") or 0, "evidence": problem, "reference_accept": ref_acc,
                       "engine_accept": eng_acc}

    # ---- one cycle
    def cycle(self, rec, rq: _Request) -> None:
        m = self.models
        ctx = rq.context
        start = len(ctx) - 1 if ctx is not None else rec.get("context_len")
        tokens = rec["tree_tokens"].tolist() if "tree_tokens" in rec else None
        parents = rec["tree_parents"].tolist() if "tree_parents" in rec else None
        shape = None if tokens is None or parents is None else C.tree_shape_problem(
            tokens, parents, rec["tree_depths"].tolist() if "tree_depths" in rec else None)
        cache: dict = {}

        def states():  # the target's every layer over the committed context: the features contract's reference,
            if "states" not in cache:  # and the reference drafter's input (one target forward serves both)
                cache["states"] = self.ref.states(ctx[:-1])
            return cache["states"]

        def ref_logits(D: int) -> Tensor:  # [D, V]: the reference drafter on the committed context
            if "draft" not in cache:  # the whole block always: its slots attend to each other
                cache["draft"] = self.ref.draft_logits(ctx, m.block_size - 1, states().drafter_features()).float()
            return cache["draft"][:D]

        def ref_logprobs(D: int) -> Tensor:
            return torch.log_softmax(ref_logits(D), -1)

        def cost():
            """(the reference step's committed tokens on this context, the engine's); computed once a cycle."""
            if "cost" not in cache:
                cache["cost"] = step_cost()
            return cache["cost"]

        def step_cost():
            eng = len(rec["accepted_nodes"]) if "accepted_nodes" in rec else None
            if ctx is None or not C.rebuilds(rq.policy):
                return None, eng
            D = rec["draft_topk_ids"].shape[0] if "draft_topk_ids" in rec else m.block_size - 1
            want = C.reference_tree(ref_logprobs(D), ctx[-1], rq.policy)
            greedy = greedy_continuation(m.target, ctx, D + 1)
            return C.accept_length(want["tokens"], want["parents"], greedy), eng

        # drafter context: every committed position reached the drafter, with its own token
        if ctx is None:
            for name in ("drafter context", "drafter output", "target logits"):
                self._skip(name, "no request record (the committed context is unknown)")
        elif self._needs("drafter context", rec):
            pos, tok = rec["draft_context_positions"].tolist(), rec["draft_context_tokens"].tolist()
            rq.seen.update(zip(pos, tok))
            problem = C.drafter_context_problem(rq.seen, ctx, start)
            if problem is None and ("draft_block_tokens" in rec or "draft_block_positions" in rec):
                problem = C.block_problem(_list(rec, "draft_block_tokens"), _list(rec, "draft_block_positions"),
                                          ctx[-1], m.mask_token_id, start)
            self._verdict("drafter context", rec, problem, cost, C.context_facts(
                _list(rec, "draft_block_tokens"), _list(rec, "draft_block_positions"), ctx[-1], m.mask_token_id,
                start) if problem is not None else None)
        # drafter features: every context row against the target's own at its position and the drafter's layers
        if ctx is not None:
            self._features(rec, rq, ctx, states, cost)
        # drafter output: the engine's top-k per slot against the reference drafter on the same context
        kind = rec.get("draft_values", "logprobs")
        if ctx is not None and self._needs("drafter output", rec):
            ids, vals = rec["draft_topk_ids"], rec["draft_topk_values"]
            ref = ref_logprobs(ids.shape[0]) if kind == "logprobs" else ref_logits(ids.shape[0])
            problem, near = C.topk_problem(ids, vals, ref, self.tol, "slot", "log-prob" if kind == "logprobs"
                                           else "logit")
            self.results["drafter output"].near_ties += near
            self._verdict("drafter output", rec, problem, cost,
                          C.top1_facts(ids, ref) if problem is not None else None)
        # tree: the exact best-N tree for the engine's own drafter output
        if shape is not None and not all(f in rec for f in ("draft_topk_ids", "draft_topk_values")):
            self._verdict("tree", rec, shape, lambda: (None, None))  # malformed: no drafter output needed to say so
        elif self._needs("tree", rec, ("draft_topk_ids", "draft_topk_values")):
            self._tree(rec, rq, tokens, parents, shape, kind, cost)
        if shape is not None:  # the other contracts cannot read a malformed tree: the tree contract names it
            for name in C.CONTRACTS[C.CONTRACTS.index("verify positions"):]:
                self._skip(name, "the tree is malformed")
            return
        # verify positions: the root's position plus depth; the tree's tokens as input ids
        if start is None:
            self._skip("verify positions", "no context_len and no request record")
        elif self._needs("verify positions", rec):
            pos = rec["verify_positions"].tolist()
            problem = C.positions_problem(pos, parents, start, rec["verify_ids"].tolist() if "verify_ids" in rec
                                          else None, tokens)
            self._verdict("verify positions", rec, problem, cost,
                          C.positions_facts(pos, parents, start) if problem is not None else None)
        # visibility: the ancestor closure, from whichever form the engine held
        if start is not None and self._needs("visibility", rec):
            self._verdict("visibility", rec, self._visibility(rec, parents, start), cost)
        # recurrent-state parents (hybrid targets)
        if not self.hybrid:
            self._skip("recurrent-state parents", "an attention-only target has none")
        elif self._needs("recurrent-state parents", rec):
            problem = C.state_parents_problem(rec["state_from"].tolist(), parents)
            self._verdict("recurrent-state parents", rec, problem, cost,
                          C.state_parents_facts(rec["state_from"].tolist(), parents) if problem is not None else None)
        # target logits: every node against the path oracle on the committed context
        if ctx is not None and self._needs("target logits", rec):
            oracle = chain_logits(m.target, ctx[:-1], tokens, parents)
            ids, vals = rec["target_topk_ids"], rec["target_topk_values"]
            problem, near = C.topk_problem(ids, vals, oracle, self.tol, "node", "logit")
            self.results["target logits"].near_ties += near
            self._verdict("target logits", rec, problem, cost)
            root, _ = C.topk_problem(ids[:1], vals[:1], oracle[:1], self.tol, "node", "logit")
            root_inputs_ok = start is not None and "verify_positions" in rec and \
                int(rec["verify_positions"][0]) == start
            if root is not None and root_inputs_ok and rq.previous is not None:
                self._committed_state(rq.previous, root)
        # accept walk: along the engine's own choices
        if self._needs("accept walk", rec):
            choice = (rec["target_choice"] if "target_choice" in rec else
                      rec["target_topk_ids"][:, 0] if "target_topk_ids" in rec else None)
            if choice is None:
                self._skip("accept walk", "no target_choice or target_topk_ids")
            else:
                self._verdict("accept walk", rec, C.accept_problem(
                    tokens, parents, choice.tolist(), rec["accepted_nodes"].tolist(), rec.get("bonus"),
                    last=rq.ends_with(_list(rec, "committed_tokens"))), cost)
        # committed tokens: the accepted drafts then the bonus, K/V kept in path order, the engine's count
        if self._needs("committed tokens", rec):
            acc = rec["accepted_nodes"].tolist()
            problem = None
            if start is not None and rec.get("context_len") is not None and rec["context_len"] != start:
                problem = (f"context_len {rec['context_len']} but {start} tokens are committed before the root")
            elif ctx is not None and rec.get("root_token") is not None and rec["root_token"] != ctx[-1]:
                problem = f"root_token {rec['root_token']}, the last committed token is {ctx[-1]}"
            if problem is None and all(0 <= a < len(tokens) for a in acc):
                committed = _list(rec, "committed_tokens")
                problem = C.commit_problem(committed, [tokens[a] for a in acc], rec.get("bonus"),
                                           _list(rec, "kv_kept_nodes"), acc, rec.get("next_context_len"),
                                           start if start is not None else 0, last=rq.ends_with(committed))
            self._verdict("committed tokens", rec, problem, cost, {"state": False, "hybrid": self.hybrid}
                          if problem is not None else None)
        rq.previous = (rec, cost)

    def _committed_state(self, previous, root_problem: str) -> None:
        """The root's logits depend on nothing but the state the previous step committed (its K/V, its recurrent
        state) and the root itself at its own position: wrong there, the previous commit left a wrong state.
        Counted against that step's commit (it already counted as checked)."""
        rec, cost = previous
        key = (rec.request, rec["step"])
        if key in self._commit_broken:  # that step's commit is counted broken already
            return
        self._commit_broken.add(key)
        r = self.results["committed tokens"]
        r.broken += 1
        r.facts.append({"state": True, "hybrid": self.hybrid,  # kept rows named right: the state itself is wrong
                        "kept_as_accepted": _list(rec, "kv_kept_nodes") == _list(rec, "accepted_nodes")})
        ref_acc, eng_acc = cost()
        if ref_acc is not None and eng_acc is not None:
            r.accept[0] += ref_acc
            r.accept[1] += eng_acc
        if r.first is None or (r.first["step"], r.first["row"]) > (rec["step"], rec.get("row") or 0):
            r.first = {"request": rec.request, "cycle": rec.get("cycle"), "step": rec["step"],
                       "row": rec.get("row") or 0, "reference_accept": ref_acc, "engine_accept": eng_acc,
                       "evidence": "the state this step committed (its kept K/V rows or recurrent state) gives the "
                                   f"next step's root the wrong logits, its position being right: {root_problem}"}

    def _features(self, rec, rq, ctx: list, states, cost) -> None:
        """The drafter-features contract (``workbench.conform.feature_contract``): each context row the drafter
        was handed against the target's own features at its position, and what a differing row equals instead
        (the previous step's tree nodes only for the first few broken cycles: a forward of its paths each)."""
        if not F.has_features(rec) or "draft_context_positions" not in rec:
            self._skip("drafter features", "no draft_context_features (nor its digest)" if "draft_context_positions"
                       in rec else "no draft_context_positions")
            return
        if self.features is None:  # prescan refused features without a header form
            return
        previous = None
        if rq.previous is not None and self.diagnosed < DIAGNOSED_CYCLES:
            prev = rq.previous[0]

            def previous():
                need = ("tree_tokens", "tree_parents", "accepted_nodes", "context_len")
                if not all(f in prev for f in need):
                    return None
                self.diagnosed += 1
                nodes = self.ref.node_states(ctx[: prev["context_len"]], prev["tree_tokens"].tolist(),
                                             prev["tree_parents"].tolist())
                return nodes, set(prev["accepted_nodes"].tolist())
        engine = F.EngineRows(rec, self.features, self.feature_tol)
        v = features_problem(engine, rec["draft_context_positions"].tolist(), states(),
                             list(self.models.target_layer_ids), previous)
        if not v.checked:
            self._skip("drafter features", "no context row at a committed position")
            return
        self._verdict("drafter features", rec, v.problem, cost, v.facts if v.problem else None)

    def _tree(self, rec, rq, tokens, parents, shape, kind, cost) -> None:
        policy = rq.policy
        if is_calibrated(policy):  # rebuilt from the pair's calibration, or not checked, saying what it would need
            want, why = calibrated_tree(policy, rec, kind, self.models) if shape is None else (None, "")
            if shape is None and want is None:
                self._skip("tree", why)
            else:  # a malformed tree is broken whatever the policy's rule
                self._verdict("tree", rec, shape or C.tree_problem(tokens, parents, want), cost)
            return
        if not C.rebuilds(policy):
            self._skip("tree", f"policy {policy} (the checker rebuilds DFlash, DDTree, PathTree, PairTree and "
                               "PairChain trees)")
            return
        if shape is not None:
            self._verdict("tree", rec, shape, lambda: (None, None))
            return
        ids, vals = rec["draft_topk_ids"].long(), rec["draft_topk_values"].float()
        if policy.kind == "dflash":  # the argmax chain: the top-1 of each slot (log-probs or logits alike)
            best = vals.max(dim=1, keepdim=True).values
            first = torch.where(vals == best, ids, torch.iinfo(torch.long).max).min(dim=1).values  # lowest id on ties
            n = min(len(tokens) - 1, first.shape[0])  # a chain cut short by the token limit verifies fewer slots
            chain = [int(t) for t in first[:n]] if len(tokens) - 1 <= first.shape[0] else [int(t) for t in first]
            want = {"tokens": [tokens[0]] + chain, "parents": list(range(-1, len(chain)))}
            self._verdict("tree", rec, C.tree_problem(tokens, parents, want), cost)
            return
        if kind != "logprobs":
            self._skip("tree", "draft values are logits' top-k: a DDTree's path scores need log-probs")
            return
        D, k = ids.shape
        lp = torch.full((D, self.models.target.config.get_text_config(decoder=True).vocab_size), float("-inf"))
        lp.scatter_(1, ids, vals)
        want = C.reference_tree(lp, tokens[0], policy)
        need = min(policy.budget, policy.width or policy.budget)
        if k < need and not _exact_from_topk(want, lp, vals):
            self._skip("tree", f"the draft top-{k} is too short to rebuild a {policy} tree exactly")
            return
        self._verdict("tree", rec, C.tree_problem(tokens, parents, want), cost)

    def _visibility(self, rec, parents, start) -> str | None:
        from workbench.conform.convert import dense_visibility

        try:
            dense = dense_visibility(rec)
        except ValueError as e:  # e.g. FlashInfer bytes that do not fit the request: the engine's indptr
            return " ".join(str(e).split())
        return C.visibility_problem(dense, parents, start)


def _exact_from_topk(want: dict, lp: Tensor, vals: Tensor) -> bool:
    """A tree rebuilt from each slot's top-k is the exact one when no token past rank k could have entered it:
    every node's best unseen child (its score plus the slot's k-th value, an upper bound) scores below the
    tree's last node."""
    tokens, parents = want["tokens"], want["parents"]
    depth = C.depths_from(parents)
    score = [0.0] * len(tokens)
    for i in range(1, len(tokens)):
        score[i] = score[parents[i]] + float(lp[depth[i] - 1, tokens[i]])
    floor = min(score[1:], default=0.0)
    kth = vals[:, -1].tolist()
    return all(score[i] + kth[depth[i]] < floor for i in range(len(tokens)) if depth[i] < len(kth))


# ------------------------------------------------------------------------------------------ entry points
def conform(dump, target=None, draft=None, *, models=None, device: str = "cpu", progress=None, cycles=None,
            requests=None) -> ConformReport:
    """Check every cycle of the dump at ``dump`` against the reference on the pair its header names (default;
    the embedded pair for a workbench dump) or ``target`` / ``draft``, or on ``models`` already loaded
    (``engine.models``, or the workbench engine itself: checked against the header as a directory would be).
    ``device``: where the reference runs when the pair is loaded here (cpu, cuda, cuda:N); ``progress``: a
    callable given one line now and then (``workbench.conform.progress``: a check of more than a few cycles);
    ``cycles`` (A, B) / ``requests`` [ids]: judge engine steps A to B - 1 / those requests only, every record
    before them still read (``workbench.conform.selection``). See the module's docstring."""
    from workbench.engine.loading import load_models, model_ref
    from workbench.engine.policies import parse_policy

    from workbench.conform.progress import Progress
    from workbench.conform.selection import SelectionError, check_against, extent, selection

    models = check_arguments(dump, target, draft, models, device, progress)
    try:
        sel = selection(cycles, requests)
    except SelectionError as e:
        raise ConformInputError(str(e)) from None
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    head, _ = read_dump(dump)
    pair = head["pair"]
    if models is None:
        tdir, ddir = _pair_dirs(pair, target, draft)
    else:
        tdir, ddir = models.target_dir, models.draft_dir
    check_pair(pair, tdir, ddir)
    try:  # the features' form against this checker's digest and the pair's width, before any model loads
        layers, hidden = F.pair_shape(tdir, ddir)
        fspec = F.check_header(head, dump, layers, hidden)
    except F.FeatureInputError as e:
        raise ConformInputError(str(e)) from None
    try:  # a slice outside the dump is refused before the whole file is scanned, and before any model loads
        kept = check_against(sel, extent(dump), dump) if sel is not None else None
    except SelectionError as e:
        raise ConformInputError(str(e)) from None
    scan = prescan(dump, pair, features=(fspec, layers, hidden))
    notes = list(scan.notes) + ([kept.note] if kept is not None and kept.note else [])
    total = kept.cycles if kept is not None else scan.cycles  # the cycles this check judges
    dtype = pair.get("dtype") or "float32"
    tol = C.tolerance(dtype)
    if models is None:
        say(f"loading the pair ({tdir}, {ddir}, {dtype})")
        models = load_models(tdir, ddir, device=device, dtype=dtype)
    elif str(models.dtype).replace("torch.", "") != dtype:
        raise ConformInputError(f"the dump's pair.dtype is {dtype!r} but models= holds {models.dtype}: load the "
                                "pair in the dump's dtype")
    note = check_fingerprint(dump, pair, models)
    if note is not None:
        notes.insert(0, note)
    used = {"target": model_ref(models.target_dir), "draft": model_ref(models.draft_dir),
            "dtype": str(models.dtype).replace("torch.", "")}
    replay = _Replay(models, tol, is_hybrid(models.target.config), fspec)
    reqs: dict = {}
    default_policy = head.get("policy")
    _, records = read_dump(dump)
    ticker = Progress(say, total)
    ticker.start(f" of {scan.cycles}" if total != scan.cycles else "")
    with torch.inference_mode():
        for rec in records:
            if rec.kind == "request":
                ctx = (rec["prompt_ids"].tolist() + [rec["first_token"]] if "prompt_ids" in rec and "first_token"
                       in rec else None)
                reqs[rec.request] = _Request(ctx, _policy(rec.get("policy") or default_policy, parse_policy),
                                             len(ctx) - 1 if ctx else 0, rec.get("max_new_tokens"),
                                             models.tokenizer.eos_token_id)
                continue
            rq = reqs[rec.request]  # prescan refused a cycle without its request's record
            if rec.get("policy"):
                rq.policy = _policy(rec["policy"], parse_policy)
            if sel is not None and not sel.holds(rec.request, rec["step"]):
                _carry(rec, rq)
                continue
            replay.cycle(rec, rq)
            _advance(rec, rq)
            ticker.tick()
    if not any(r.checked for r in replay.results.values()):
        why = sorted({w for r in replay.results.values() for w in r.not_checked})
        raise ConformInputError(f"{dump}: no contract could be checked on its {total} cycle(s) "
                                f"({'; '.join(why)[:240]}): a check that judged nothing is no verdict; dump the "
                                "fields the contracts read (docs/dump-format.md)")
    report = ConformReport(str(dump), head, replay.results, total,
                           kept.requests if kept is not None else scan.requests, tol, time.perf_counter() - t0, notes,
                           scan.policies, used, selection=sel.to_dict() if sel is not None else None)
    report.causes = match_causes(report)  # from the evidence to the known bug classes it matches
    return report


def check_arguments(dump, target, draft, models, device, progress):
    """Each argument of ``conform`` as it must be, or ConformInputError (one line naming it and the fix), before
    any file is read. -> the loaded pair to replay on (``models``, or an engine's), or None."""
    from workbench.engine import validate

    if not isinstance(dump, (str, os.PathLike)) or not str(dump):
        raise ConformInputError(f"dump={dump!r:.60} must be the path of a cycle dump (a str or pathlib.Path), e.g. "
                                "wb.conform('run.dump')")
    if progress is not None and not callable(progress):
        raise ConformInputError(f"progress={progress!r:.60} must be a callable taking one line (e.g. print), or None")
    try:
        validate.device(device)
    except ValueError as e:
        raise ConformInputError(str(e)) from None
    if models is None:
        return None
    if target is not None or draft is not None:
        raise ConformInputError("give models= or target= / draft=, not both: models= is the pair the check runs on")
    return as_models(models)


def as_models(models):
    """``models=`` as a loaded pair: ``engine.models``, or the workbench engine itself (its ``.models``). A
    remote or another engine's handle holds no weights here: refused in one line naming what to pass."""
    from workbench.engine.loading import Models
    from workbench.interface.base import BaseEngine

    if isinstance(models, Models):
        return models
    if isinstance(getattr(models, "models", None), Models):  # the workbench engine (wb.load())
        return models.models
    if isinstance(models, BaseEngine) and models.name == "served":  # by the registry's name: serve is above us
        raise ConformInputError("models= is a remote engine (wb.connect(...)): its weights are in the server's "
                                "process, not this one; pass target= and draft= (the directories it serves) or "
                                "models=wb.load(...).models")
    if isinstance(models, BaseEngine):
        raise ConformInputError(f"models= is the {models.name} engine, not the workbench's: the check replays on "
                                "the workbench's own models of the pair; pass target= and draft= (its directories)")
    raise ConformInputError(f"models={models!r:.60} is not a loaded pair: pass engine.models (wb.load(...).models) "
                            "or target= and draft= directories")


def check_fingerprint(dump, pair: dict, models) -> str | None:
    """The header's weights fingerprint against the loaded pair's: ConformInputError naming both pairs when they
    differ; a note (returned) when the dump has none to compare."""
    from workbench.conform.fingerprint import METHOD, pair_fingerprint
    from workbench.engine.loading import model_ref

    fp = pair.get("fingerprint")
    if not isinstance(fp, dict):
        return ("pair not checked: no fingerprint of the weights in the header (a writer without one: an older "
                "workbench, vLLM's adapter or a hook); make sure the pair here is the one the dump was written with")
    if fp.get("method") != METHOD:
        return (f"pair not checked: the header's fingerprint is by {str(fp.get('method'))[:40]!r}, this checker "
                f"computes {METHOD!r}")
    here = pair_fingerprint(models)
    differ = [role for role in ("target", "draft") if fp.get(role) != here[role]]
    if differ:
        what = " and ".join({"target": "the target's", "draft": "the drafter's"}[r] for r in differ)
        raise ConformInputError(
            f"{dump} was written with target {pair.get('target')}, draft {pair.get('draft')}, but the pair here is "
            f"target {model_ref(models.target_dir)}, draft {model_ref(models.draft_dir)}, and {what} weights differ "
            f"(fingerprint {'/'.join(str(fp.get(r)) for r in differ)} in the dump, {'/'.join(here[r] for r in differ)}"
            " here): check it on the pair it was written with (target= and draft=, or models=)")
    return None


def _policy(label, parse_policy):
    if not label:
        return None
    try:
        return parse_policy(str(label))
    except ValueError:
        return str(label)


def _carry(rec, rq: _Request) -> None:
    """A record outside the slice: read for the history the slice's contracts need (the committed context, the
    positions the drafter took in), judged by none. The slice's first cycle of the request has no previous step
    of its own to blame a wrong root on: its root logits are judged as target logits only."""
    if "draft_context_positions" in rec and "draft_context_tokens" in rec:
        rq.seen.update(zip(rec["draft_context_positions"].tolist(), rec["draft_context_tokens"].tolist()))
    _advance(rec, rq)
    rq.previous = None


def _advance(rec, rq: _Request) -> None:
    """The request's committed context after this step: what the engine says it committed (else the accepted
    path's drafts and the bonus); unknown from here on when the record holds neither."""
    if rq.context is None:
        return
    if "committed_tokens" in rec:
        rq.context = rq.context + rec["committed_tokens"].tolist()
    elif "accepted_nodes" in rec and "tree_tokens" in rec and rec.get("bonus") is not None:
        toks = rec["tree_tokens"].tolist()
        rq.context = rq.context + [toks[a] for a in rec["accepted_nodes"].tolist()[1:]] + [rec["bonus"]]
    else:
        rq.context = None
