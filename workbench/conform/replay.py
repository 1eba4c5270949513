"""The replay: a dump's records read in order, each request's committed context followed step by step
(``Request``), and every selected cycle held to the contracts in ``CONTRACTS`` order (``Replay.cycle``, a loop
over ``workbench.conform.replay_contracts.CHECKS``), each contract's verdicts counted in its ``ContractResult``."""
from __future__ import annotations

from dataclasses import dataclass, field

from workbench.conform import contracts as C
from workbench.conform import features
from workbench.conform.replay_contracts import (CHECKS, NEEDS, NO_REQUEST, READ_THE_TREE, UNKNOWN_CONTEXT,
                                                 as_list)
from workbench.conform.replay_reference import Cycle
from workbench.conform.report import ContractResult

SAMPLES = 3  # broken cycles kept per contract for the diagnosis to reproduce (the rest are counted)


@dataclass
class Sample:
    """One broken cycle as the diagnosis reads it: its record, the request's committed context (root last; None:
    unknown), the root's position, the request's previous record, every row's (request, root position) at that
    engine step, and for a committed state blamed on this step, the next cycle that showed it (``after``)."""

    rec: object
    ctx: list | None
    start: int | None
    previous: object
    batch: dict
    after: "Sample | None" = None
    # no cycle of its request broke before this one: the engine's committed state is still the reference's, so
    # outputs the suspected input gives here are comparable (set by the diagnosis from ``Replay.first_broken``)
    clean: bool = True


@dataclass
class Request:
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


class Replay:
    """The reference's side of every cycle, for one loaded pair, and each contract's tally."""

    def __init__(self, models, tol: C.Tolerance, hybrid: bool, feature_spec: "features.FeatureSpec | None" = None):
        from workbench.models.drafter_reference import Reference

        self.models, self.tol, self.hybrid = models, tol, hybrid
        self.features = feature_spec  # the header's features form (None: the dump holds none)
        self.feature_tol = features.tolerance(models.dtype)
        self.diagnosed = 0  # broken features cycles whose rejected-node explanation was tried (a forward each)
        self.ref = Reference(models)
        self.results = {name: ContractResult(name) for name in C.CONTRACTS}
        self._commit_broken: set = set()  # (request, step) of the commits counted broken
        # per contract, its first broken cycles as the diagnosis reproduces them (workbench.conform.diagnosis)
        self.samples: dict = {name: [] for name in C.CONTRACTS}
        self.starts: dict = {}  # engine step -> {row: (request, the root's position)}: every row's of that step
        self._now: Sample | None = None  # the cycle being checked
        self.first_broken: dict = {}  # request -> the first engine step at which any contract broke

    # ---- per contract bookkeeping
    def skip(self, name: str, why: str) -> None:
        r = self.results[name]
        r.not_checked[why] = r.not_checked.get(why, 0) + 1

    def needs(self, name: str, rec, extra: tuple = ()) -> bool:
        lacking = [f for f in NEEDS[name] + extra if f not in rec]
        if lacking:
            self.skip(name, "no " + ", ".join(lacking))
            return False
        return True

    def verdict(self, name: str, rec, problem: str | None, cost, facts: dict | None = None) -> None:
        r = self.results[name]
        r.checked += 1
        if problem is None:
            return
        r.broken += 1
        self.first_broken[rec.request] = min(self.first_broken.get(rec.request, rec["step"]), rec["step"])
        if facts is not None:
            r.facts.append(facts)
        if len(self.samples[name]) < SAMPLES and self._now is not None:
            self.samples[name].append(self._now)
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
    def cycle(self, rec, rq: Request) -> None:
        """Every contract on one cycle record, in ``CONTRACTS`` order. A malformed tree is the tree contract's
        verdict, and the request's previous cycle stays the one before it."""
        cy = Cycle(rec, rq, self.models, self.ref)
        self._now = Sample(rec, cy.ctx, cy.start, rq.previous[0] if rq.previous is not None else None,
                           self.starts.setdefault(rec["step"], {}))
        self._now.batch[rec.get("row") or 0] = (rec.request, cy.start)
        if cy.ctx is None:
            for name in UNKNOWN_CONTEXT:
                self.skip(name, NO_REQUEST)
        for name in C.CONTRACTS:
            if cy.shape is not None and name in READ_THE_TREE:
                self.skip(name, "the tree is malformed")
            else:
                CHECKS[name](self, cy)
        if cy.shape is None:
            rq.previous = (rec, cy.cost)

    def committed_state(self, previous, root_problem: str) -> None:
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
        self.first_broken[rec.request] = min(self.first_broken.get(rec.request, rec["step"]), rec["step"])
        now = self._now
        if len(self.samples["committed tokens"]) < SAMPLES and now is not None and now.ctx is not None:
            cut = rec["context_len"] + 1 if rec.get("context_len") is not None else (
                len(now.ctx) - len(rec["accepted_nodes"]) if "accepted_nodes" in rec else None)
            self.samples["committed tokens"].append(Sample(rec, None if cut is None else now.ctx[:cut],
                                                           None if cut is None else cut - 1, None, {}, after=now))
        r.facts.append({"state": True,  # kept rows named right: the state itself is wrong
                        "kept_as_accepted": as_list(rec, "kv_kept_nodes") == as_list(rec, "accepted_nodes")})
        ref_acc, eng_acc = cost()
        if ref_acc is not None and eng_acc is not None:
            r.accept[0] += ref_acc
            r.accept[1] += eng_acc
        if r.first is None or (r.first["step"], r.first["row"]) > (rec["step"], rec.get("row") or 0):
            r.first = {"request": rec.request, "cycle": rec.get("cycle"), "step": rec["step"],
                       "row": rec.get("row") or 0, "reference_accept": ref_acc, "engine_accept": eng_acc,
                       "evidence": "the state this step committed (its kept K/V rows or recurrent state) gives the "
                                   f"next step's root the wrong logits, its position being right: {root_problem}"}


# ------------------------------------------------------------------------------------------ the records
def replay_records(records, replay: Replay, default_policy, eos, sel, ticker) -> None:
    """Every record in order: a request record starts its request's committed context, a cycle record inside
    the selection ``sel`` (None: all) is replayed, one outside it only advances its request's history."""
    from workbench.engine.policies import parse_policy

    reqs: dict = {}
    for rec in records:
        if rec.kind == "request":
            ctx = (rec["prompt_ids"].tolist() + [rec["first_token"]] if "prompt_ids" in rec and "first_token"
                   in rec else None)
            reqs[rec.request] = Request(ctx, _policy(rec.get("policy") or default_policy, parse_policy),
                                        len(ctx) - 1 if ctx else 0, rec.get("max_new_tokens"), eos)
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


def _policy(label, parse_policy):
    if not label:
        return None
    try:
        return parse_policy(str(label))
    except ValueError:
        return str(label)


def _carry(rec, rq: Request) -> None:
    """A record outside the slice: read for the history the slice's contracts need (the committed context, the
    positions the drafter took in), judged by none. The slice's first cycle of the request has no previous step
    of its own to blame a wrong root on: its root logits are judged as target logits only."""
    if "draft_context_positions" in rec and "draft_context_tokens" in rec:
        rq.seen.update(zip(rec["draft_context_positions"].tolist(), rec["draft_context_tokens"].tolist()))
    _advance(rec, rq)
    rq.previous = None


def _advance(rec, rq: Request) -> None:
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
