"""What a fault cost the run: the engine's output and acceptance beside the reference's own decode of the same
prompts (``fault_cost``).

The per-step replay (``workbench.conform.replay``) judges every step on the engine's own committed context, so
once the engine's output has left plain greedy decoding each later step is held against the reference's step
on a context the reference would never reach: its commit count there says nothing of what the run lost. Here
the reference decodes each request along its own trajectory, for as many tokens as the engine produced:

- plain greedy decoding from the dump's prompt (the target alone, by its own cache): the engine's output is
  lossless when it equals it, else the first generated token where it leaves it is named;
- the reference's speculative decode with the request's policy on that trajectory: the reference drafter
  (``workbench.models.drafter_reference``) on every committed context, the policy's exact tree
  (``contracts.reference_tree``), the greedy tokens accepted down it. Its tokens per target forward is the
  reference tau; the engine's is its committed tokens over its cycle records (one target forward each).

Tokens lost per 100 target forwards: 100 x (reference tau - engine tau). Greedy dumps only: a sampled run has
no single continuation to call lossless, and one line says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.conform import contracts as C


@dataclass
class RequestCost:
    """One request: the engine's generated tokens against plain greedy decoding and the reference's decode."""

    request: str
    tokens: int  # generated tokens compared (the prefill's first token included)
    left_at: int | None  # the first generated token (0: the prefill's) that differs from greedy; None: lossless
    engine: tuple  # (tokens committed by its cycles, its cycles = target forwards)
    reference: tuple  # the same for the reference's speculative decode of as many tokens
    near_tie: bool = False  # where it left greedy, greedy's top two logits were within the tolerance's near tie

    def to_dict(self) -> dict:
        return {"request": self.request, "tokens": self.tokens, "left_greedy_at": self.left_at,
                "near_tie": self.near_tie,
                "engine": {"committed": self.engine[0], "forwards": self.engine[1]},
                "reference": {"committed": self.reference[0], "forwards": self.reference[1]}}


@dataclass
class FaultCost:
    """The run's cost over the requests judged (``why_not``: the one line saying why none could be)."""

    requests: list = field(default_factory=list)  # RequestCost
    skipped: dict = field(default_factory=dict)  # request -> why its cost was not judged
    why_not: str | None = None

    @property
    def lossless(self) -> bool:
        return all(r.left_at is None for r in self.requests)

    @staticmethod
    def _tau(pairs) -> float | None:
        tokens, forwards = (sum(x) for x in zip(*pairs)) if pairs else (0, 0)
        return tokens / forwards if forwards else None

    @property
    def tau_engine(self) -> float | None:
        return self._tau([r.engine for r in self.requests])

    @property
    def tau_reference(self) -> float | None:
        return self._tau([r.reference for r in self.requests])

    @property
    def lost_per_100(self) -> float | None:
        te, tr = self.tau_engine, self.tau_reference
        return None if te is None or tr is None else 100 * (tr - te)

    def to_dict(self) -> dict:
        return {"judged": self.why_not is None and bool(self.requests), "why_not": self.why_not,
                "lossless": self.lossless if self.requests else None, "tau_engine": self.tau_engine,
                "tau_reference": self.tau_reference, "tokens_lost_per_100_forwards": self.lost_per_100,
                "requests": [r.to_dict() for r in self.requests], "not_judged": dict(self.skipped)}

    def lines(self) -> list[str]:
        """The report's lines: lossless or where the output left greedy decoding, tau engine vs reference."""
        if self.why_not is not None:
            return [f"what it cost: not judged: {self.why_not}"]
        out = []
        if self.requests:
            left = [r for r in self.requests if r.left_at is not None]
            n = sum(r.tokens for r in self.requests)
            if not left:
                out.append(f"what it cost: lossless: the engine's {n} generated tokens of {len(self.requests)} "
                           "request(s) are plain greedy decoding's")
            else:
                where = ", ".join(f"request {r.request} at generated token {r.left_at} of {r.tokens}"
                                  + (" (a near tie of greedy's top two)" if r.near_tie else "") for r in left[:4])
                where += f" and {len(left) - 4} more" if len(left) > 4 else ""
                out.append(f"what it cost: not lossless: the engine's output leaves plain greedy decoding in "
                           f"{len(left)} of {len(self.requests)} request(s) ({where})")
            eng, ref = ([sum(x) for x in zip(*(getattr(r, side) for r in self.requests))]
                        for side in ("engine", "reference"))
            out.append(f"  tau (tokens per target forward): engine {self.tau_engine:.2f} ({eng[0]} tokens in "
                       f"{eng[1]} forwards), reference {self.tau_reference:.2f} ({ref[0]} in {ref[1]}) on its "
                       f"own trajectory: " + (f"{self.lost_per_100:.0f} tokens lost per 100 target forwards"
                                               if self.lost_per_100 >= 0 else f"{-self.lost_per_100:.0f} tokens "
                                               "more per 100 target forwards than the reference's"
                                               + ("" if self.lossless else ", over an output that is not greedy "
                                                  "decoding's")))
        out += [f"  request {rid}: cost not judged: {why}" for rid, why in list(self.skipped.items())[:4]]
        return out


# ------------------------------------------------------------------------------------------ the engine's side
@dataclass
class Output:
    """One request's output as the dump records it."""

    prompt: list | None
    first: int | None
    policy: str | None
    temperature: float | None
    generated: list = field(default_factory=list)  # committed tokens after the first
    cycles: int = 0
    slots: int = 0  # the most drafted slots a cycle held (its drafter's block, or a vLLM K; 0: not dumped)
    labels: set = field(default_factory=set)  # the policies its cycles name
    unknown: bool = False  # a cycle recorded no committed tokens: the output is unknown from there
    judged: bool = False  # a cycle inside the check's selection


def outputs(records, head: dict, sel) -> dict:
    """request id -> Output, from one pass over the dump's records."""
    out: dict = {}
    sampling = head.get("sampling") or {}
    for rec in records:
        if rec.kind == "request":
            out[rec.request] = Output(rec["prompt_ids"].tolist() if "prompt_ids" in rec else None,
                                      rec.get("first_token"), rec.get("policy") or head.get("policy"),
                                      rec.get("temperature", sampling.get("temperature")))
            continue
        o = out[rec.request]
        o.cycles += 1
        o.judged = o.judged or sel is None or sel.holds(rec.request, rec["step"])
        if rec.get("policy"):
            o.labels.add(rec["policy"])
        if "draft_topk_ids" in rec:
            o.slots = max(o.slots, int(rec["draft_topk_ids"].shape[0]))
        if "committed_tokens" in rec:
            o.generated += rec["committed_tokens"].tolist()
        elif "accepted_nodes" in rec and "tree_tokens" in rec and rec.get("bonus") is not None:
            toks = rec["tree_tokens"].tolist()
            o.generated += [toks[a] for a in rec["accepted_nodes"].tolist()[1:]] + [rec["bonus"]]
        else:
            o.unknown = True
    return out


def unjudgeable(o: Output, models) -> str | None:
    """Why this request's cost cannot be judged, or None."""
    from workbench.engine.policies import parse_policy

    if o.prompt is None or o.first is None:
        return "the dump holds no prompt_ids / first_token for it (a verify-only writer)"
    if o.unknown:
        return "a cycle recorded neither committed_tokens nor the accepted path and bonus"
    if not o.cycles:
        return "no cycle"
    if len(o.labels) > 1:
        return f"its policy changed mid-run ({', '.join(sorted(o.labels))})"
    label = next(iter(o.labels), None) or o.policy
    try:
        policy = parse_policy(str(label)) if label else None
    except ValueError:
        policy = None
    if policy is None or not C.rebuilds(policy):
        return f"the reference has no tree for policy {label!r} (it rebuilds DFlash and DDTree)"
    return None


# ------------------------------------------------------------------------------------------ the reference's side
class Trajectory:
    """Plain greedy decoding of one prompt, found by verifying guesses: one uncached target forward over the
    prompt, the greedy tokens known so far and a guess for the next ones (the engine's own output first, then
    the reference drafter's top-1 chain) gives the target's argmax at every position, so each forward adds
    the guess's agreeing prefix and one token more; causal, its hidden states at the known positions are the
    drafter features of every prefix of the trajectory. -> ``known`` (greedy tokens), ``features`` [T, L * H]."""

    def __init__(self, ref, models, prompt: list, n: int, eos):
        self.ref, self.models, self.prompt, self.n, self.eos = ref, models, list(prompt), n, eos
        self.known: list = []
        self.features = None
        self.gaps: list = []  # per known token: its logit's lead over the runner-up (a near tie when tiny)
        self.forwards = 0

    @property
    def done(self) -> bool:
        return len(self.known) >= self.n or (self.eos is not None and self.eos in self.known)

    def tokens(self) -> list:
        out = self.known[: self.n]
        return out[: out.index(self.eos) + 1] if self.eos is not None and self.eos in out else out

    def extend(self, guess: list) -> None:
        """One forward over prompt + known + guess: the known tokens grow by the guess's prefix the target's
        argmax agrees with, and the argmax after it."""
        ids = self.prompt + self.known + list(guess)
        st = self.ref.states(ids)
        self.features = st.drafter_features()  # [len(ids), L * H]
        first = len(self.prompt) + len(self.known) - 1  # the position whose logits give the next known token
        logits = self.models.target.lm_head(st.hidden[-1][first:])  # [len(guess) + 1, V]
        top = logits.topk(2, dim=-1).values.float()  # the lead of the top-1 over the runner-up
        self.forwards += 1
        for j, t in enumerate(logits.argmax(-1).tolist()):  # equal maxima: the lowest token id, as greedy takes it
            self.known.append(t)
            self.gaps.append(float(top[j, 0] - top[j, 1]))
            if j >= len(guess) or guess[j] != t:
                break

    def cover(self, upto: int, guess_after) -> None:
        """Extend until ``upto`` greedy tokens are known (or the decode ended); ``guess_after(k)``: a guess for
        the tokens after the first k."""
        while not self.done and len(self.known) < upto:
            self.extend(guess_after(len(self.known)))


def reference_decode(ref, models, prompt: list, engine_out: list, policy, slots: int, eos) -> tuple:
    """Plain greedy decoding of ``len(engine_out)`` tokens after ``prompt`` (cut after end-of-text) and the
    reference's speculative decode of them with ``policy`` (``slots`` drafted slots a step). -> (the
    Trajectory, tokens its steps committed after the first, its steps = target forwards)."""
    tr = Trajectory(ref, models, prompt, len(engine_out), eos)
    tr.extend(engine_out)  # a lossless engine's output is the whole trajectory at once
    m, forwards, chain = 1, 0, []  # m: generated tokens committed (the prefill's first one)
    while True:
        greedy = tr.tokens()
        if m >= len(greedy) and tr.done:
            break
        root = len(prompt) + m - 1  # the root's position
        # the whole block always (its slots attend to each other), the engine's slots of it
        logits = ref.draft_logits(prompt + greedy[:m], models.block_size - 1, tr.features[:root])[:slots]
        chain = logits.argmax(-1).tolist()  # the drafter's top-1 per slot: the guess past the known tokens
        tr.cover(m + slots + 1, lambda k: chain[k - m:])
        greedy = tr.tokens()
        tree = C.reference_tree(torch.log_softmax(logits, -1), greedy[m - 1], policy)
        accepted = C.accept_length(tree["tokens"], tree["parents"], greedy[m : m + slots + 1])
        m, forwards = m + max(1, min(accepted, len(greedy) - m)), forwards + 1
    return tr, len(tr.tokens()) - 1, forwards


def fault_cost(dump, head: dict, models, sel=None, eos=None) -> FaultCost:
    """The run's cost (module docstring): greedy dumps only, on the requests the selection ``sel`` judges (whole;
    a slice of engine steps is not judged)."""
    from workbench.conform.dump import read_dump
    from workbench.engine.policies import parse_policy
    from workbench.models.drafter_reference import Reference

    sampling = head.get("sampling") or {}
    if sel is not None and (sel.first or sel.stop is not None):
        return FaultCost(why_not=f"this check judged engine steps {sel.first} to "
                                 f"{'the end' if sel.stop is None else sel.stop - 1} only, and the cost is a whole "
                                 "run's: check without cycles= for it")
    _, records = read_dump(dump)
    outs = outputs(records, head, sel)
    sampled = sorted({float(o.temperature) for o in outs.values() if o.temperature})
    if sampled or sampling.get("temperature"):
        t = sampled[0] if sampled else sampling.get("temperature")
        return FaultCost(why_not=f"the run samples (temperature {t:g}): a sampled output has no single continuation "
                                 "to call lossless, and its acceptance is a draw; check a greedy run for the cost")
    cost, ref = FaultCost(), Reference(models)
    near_tie = C.tolerance((head.get("pair") or {}).get("dtype") or "float32").near_tie
    with torch.inference_mode():
        for rid, o in outs.items():
            if not o.judged:
                continue
            why = unjudgeable(o, models)
            if why is not None:
                cost.skipped[rid] = why
                continue
            policy = parse_policy(str(next(iter(o.labels), None) or o.policy))
            mine = [o.first] + o.generated
            slots = o.slots or models.block_size - 1
            tr, committed, forwards = reference_decode(ref, models, o.prompt, mine, policy, slots, eos)
            greedy = tr.tokens()
            left = next((i for i, (a, b) in enumerate(zip(mine, greedy)) if a != b),
                        None if len(mine) == len(greedy) else min(len(mine), len(greedy)))
            tie = left is not None and left < len(tr.gaps) and tr.gaps[left] <= near_tie
            cost.requests.append(RequestCost(rid, len(mine), left, (len(o.generated), o.cycles),
                                             (committed, forwards), tie))
    if not cost.requests and cost.skipped:
        cost.why_not = next(iter(cost.skipped.values()))
    return cost
