"""Acceptance as the ecosystem reports it: per request in AIPerf's record shape, pooled as ``vllm bench serve``
prints it, and in vLLM's and SGLang's own per-request names, so a run here sits beside a served engine's figures
without converting by hand.

    acc = wb.analysis.acceptance(trace)              # a Trace, several (a list, {id: trace}), or read_dump(path)
    acc.records[0].to_dict()                         # AIPerf's SpecDecodeAcceptanceRecord, field for field
    acc.pooled()                                     # the same record over every request (AIPerf's pooled histogram)
    acc.vllm_bench_serve()                           # `vllm bench serve`'s result keys (spec_decode_...)
    acc.records[0].vllm(), acc.records[0].sglang()   # vLLM's metrics.speculative_decoding; SGLang's meta_info names
    wb.analysis.from_vllm_counters(delta)            # the same record from vLLM's own counters

The names and their meaning, from their sources:
- AIPerf's ``SpecDecodeAcceptanceRecord`` (ai-dynamo/aiperf, ``src/aiperf/common/models/spec_decode_models.py``;
  docs "Per-Request Speculative-Decoding Acceptance"), one per request, tree-agnostic: ``engine``,
  ``mean_acceptance_length`` = 1 + num_accepted_draft_tokens / num_spec_steps (the bonus token counted),
  ``draft_acceptance_rate`` = num_accepted_draft_tokens / num_draft_tokens, ``acceptance_histogram`` = {accepted
  draft count j: steps} (sparse, the bonus excluded), ``num_accepted_draft_tokens``, ``num_draft_tokens``,
  ``num_spec_steps`` (= the histogram's sum), ``num_spec_tokens`` (k, the most drafts a step can accept),
  ``completion_tokens``, ``per_step_accepted``, ``per_step_drafted``.
- vLLM 0.32 (``vllm/v1/metrics/stats.py : RequestSpecDecodeMetrics.to_dict``, the response's
  ``metrics.speculative_decoding`` with ``--per-request-spec-decode-metrics``): the same names, the histogram dense
  (index j, length k + 1). Its counters ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
  ``..._num_accepted_tokens``, ``..._num_accepted_tokens_per_pos`` (``vllm/v1/spec_decode/metrics.py``) count the
  same steps; ``vllm bench serve`` prints them as "Acceptance length" = 1 + accepted / drafts, "Acceptance rate
  (%)" and per-position rates, its result JSON as ``spec_decode_acceptance_length`` etc.
  (``vllm/benchmarks/serve.py``).
- SGLang's per-request ``meta_info``: ``spec_verify_ct`` (steps), ``spec_accept_length`` = completion_tokens /
  spec_verify_ct (sgl-project/sglang #3152: the prefill's token counted, so it is mean_acceptance_length + 1 /
  steps when every step commits its path), ``spec_accept_rate``, ``spec_accept_token_num``,
  ``spec_draft_token_num`` (#13754), ``spec_accept_histogram`` (#18332, dense).

What a step is here: a verify of at least one drafted token (vLLM counts a draft when it is verified and only
if it had drafted tokens: a plain-decoding step is none). Its accepted count j is the drafted tokens on the
accepted path, the bonus excluded: for a tree, the depth of its last accepted node, so every figure above reads a
tree and a chain alike. Its drafted count is the drafted nodes the target verified (a chain's length, a tree's
nodes besides the root): a tree's ``draft_acceptance_rate`` is therefore accepted over *nodes*, lower than a
chain's for the same accepted lengths. k is the drafter's drafted slots per block (block size - 1), the deepest a
tree can reach.

The workbench's records keep what the target accepted; vLLM's adapter keeps what the request kept (its last step,
cut by ``max_new_tokens`` inside a block, records the drafts it kept, none at times, while vLLM's counters count
that step and what its sampler accepted past the limit): on vLLM, the two agree on every step but a request's
last, when that one was cut.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

DUMP_FORMAT = "ddtree-workbench-dump"  # a dump's header names its format (docs/dump-format.md)


class AcceptanceError(ValueError):
    """A source acceptance cannot be read from: one line naming it and what to pass."""


@dataclass(frozen=True)
class RequestAcceptance:
    """One request's acceptance, AIPerf's record (``to_dict``) with the request's id beside it."""

    request: str
    engine: str
    per_step_accepted: tuple  # accepted draft tokens per speculative step, in order
    per_step_drafted: tuple  # drafted tokens verified per step
    num_spec_tokens: int | None = None  # k: the most drafts a step can accept (None: not known)
    completion_tokens: int | None = None  # tokens generated, the prefill's first token included
    # the target and drafter that ran it ("target + draft", None: not known): runs of two pairs are not pooled
    pair: str | None = field(default=None, compare=False)
    # the prompt's token ids (None: not known): with the steps, what tells a copy of a run from another run
    prompt: tuple | None = field(default=None, compare=False, repr=False)

    @property
    def num_spec_steps(self) -> int:
        return len(self.per_step_accepted)

    @property
    def num_accepted_draft_tokens(self) -> int:
        return sum(self.per_step_accepted)

    @property
    def num_draft_tokens(self) -> int:
        return sum(self.per_step_drafted)

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted drafts per step: tokens a step commits, the bonus counted (1.0 without a step, as vLLM)."""
        n = self.num_spec_steps
        return 1.0 + self.num_accepted_draft_tokens / n if n else 1.0

    @property
    def draft_acceptance_rate(self) -> float:
        d = self.num_draft_tokens
        return self.num_accepted_draft_tokens / d if d else 0.0

    @property
    def acceptance_histogram(self) -> dict:
        """{accepted draft count j: steps}, zero counts left out (AIPerf's sparse form)."""
        return dict(sorted(Counter(self.per_step_accepted).items()))

    def per_position(self) -> list[float]:
        """Share of steps that accepted at least d drafts, d = 1 .. k: vLLM's per-position acceptance rates
        (``num_accepted_tokens_per_pos`` / ``num_drafts``); for a tree, the share that reached depth d."""
        n, k = self.num_spec_steps, self.num_spec_tokens or max(self.per_step_accepted, default=0)
        return [sum(a >= d for a in self.per_step_accepted) / n if n else 0.0 for d in range(1, k + 1)]

    def to_dict(self) -> dict:
        """AIPerf's ``SpecDecodeAcceptanceRecord``, its field names and order."""
        return {"engine": self.engine, "mean_acceptance_length": self.mean_acceptance_length,
                "draft_acceptance_rate": self.draft_acceptance_rate, "acceptance_histogram": self.acceptance_histogram,
                "num_accepted_draft_tokens": self.num_accepted_draft_tokens, "num_draft_tokens": self.num_draft_tokens,
                "num_spec_steps": self.num_spec_steps, "num_spec_tokens": self.num_spec_tokens,
                "completion_tokens": self.completion_tokens, "per_step_accepted": list(self.per_step_accepted),
                "per_step_drafted": list(self.per_step_drafted)}

    def vllm(self) -> dict:
        """vLLM's per-request ``metrics.speculative_decoding`` (its ``detailed`` level): the histogram dense."""
        k = self.num_spec_tokens if self.num_spec_tokens is not None else max(self.per_step_accepted, default=0)
        hist = [0] * (k + 1)
        for a in self.per_step_accepted:
            hist[a] += 1
        return {"mean_acceptance_length": self.mean_acceptance_length,
                "draft_acceptance_rate": self.draft_acceptance_rate, "acceptance_histogram": hist,
                "num_spec_steps": self.num_spec_steps, "num_accepted_draft_tokens": self.num_accepted_draft_tokens,
                "num_draft_tokens": self.num_draft_tokens, "num_spec_tokens": k,
                "per_step_accepted": list(self.per_step_accepted), "per_step_drafted": list(self.per_step_drafted)}

    def sglang(self) -> dict:
        """SGLang's per-request ``meta_info`` names; ``spec_accept_length`` as SGLang computes it (completion
        tokens over verifies), None without ``completion_tokens``."""
        n = self.num_spec_steps
        hist = self.vllm()["acceptance_histogram"]
        return {"spec_verify_ct": n,
                "spec_accept_length": self.completion_tokens / n if n and self.completion_tokens is not None else None,
                "spec_accept_rate": self.draft_acceptance_rate, "spec_accept_token_num": self.num_accepted_draft_tokens,
                "spec_draft_token_num": self.num_draft_tokens, "spec_accept_histogram": hist,
                "completion_tokens": self.completion_tokens}


@dataclass
class Acceptance:
    """Every request's record, and the run pooled over them."""

    records: list = field(default_factory=list)  # RequestAcceptance, in the order the requests started
    notes: list = field(default_factory=list)  # one line each: what was read short of the whole input

    def remarks(self) -> list[str]:
        """The notes, and a line saying so when no request had a speculative step (plain decoding)."""
        if self.records and not any(r.num_spec_steps for r in self.records):
            return [*self.notes, "no speculative step: every cycle drafted nothing and committed one token, as plain "
                                 "decoding does (acceptance length 1.00, as vLLM reports a request without a draft)"]
        return list(self.notes)

    def pooled(self) -> RequestAcceptance:
        """The run as one record: every step of every request (AIPerf's pooled histogram)."""
        ks = [r.num_spec_tokens for r in self.records if r.num_spec_tokens is not None]
        done = [r.completion_tokens for r in self.records]
        engines = list(dict.fromkeys(r.engine for r in self.records))
        pairs = {r.pair for r in self.records}
        return RequestAcceptance("all", "+".join(engines), tuple(a for r in self.records for a in r.per_step_accepted),
                                 tuple(d for r in self.records for d in r.per_step_drafted), max(ks) if ks else None,
                                 None if None in done else sum(done), pairs.pop() if len(pairs) == 1 else None)

    def vllm_bench_serve(self) -> dict:
        """The run as ``vllm bench serve`` writes it in its result JSON (acceptance rate in percent); the
        acceptance length is the pooled record's, 1.0 without a step as every request's is."""
        p = self.pooled()
        return {"spec_decode_acceptance_rate": 100.0 * p.draft_acceptance_rate,
                "spec_decode_acceptance_length": p.mean_acceptance_length,
                "spec_decode_num_drafts": p.num_spec_steps, "spec_decode_draft_tokens": p.num_draft_tokens,
                "spec_decode_accepted_tokens": p.num_accepted_draft_tokens,
                "spec_decode_per_position_acceptance_rates": p.per_position()}

    def to_dict(self) -> dict:
        return {"records": [{"request": r.request, **r.to_dict()} for r in self.records],
                "pooled": self.pooled().to_dict(), "bench_serve": self.vllm_bench_serve(), "notes": self.remarks()}

    def __str__(self) -> str:
        from workbench.records.texttable import text_table

        rows = [[r.request, r.engine, str(r.num_spec_steps), f"{r.mean_acceptance_length:.2f}",
                 f"{r.draft_acceptance_rate:.3f}",
                 f"{r.sglang()['spec_accept_length']:.2f}" if r.sglang()["spec_accept_length"] is not None else "-",
                 " ".join(f"{j}:{n}" for j, n in r.acceptance_histogram.items())] for r in self.records]
        p, b = self.pooled(), self.vllm_bench_serve()
        pp = ", ".join(f"{x:.3f}" for x in b["spec_decode_per_position_acceptance_rates"][:8])
        return "\n".join([
            text_table(["request", "engine", "steps", "mean acceptance length", "draft acceptance rate",
                        "SGLang spec_accept_length", "histogram (accepted drafts: steps)"], rows),
            f"all {len(self.records)} request(s), as vllm bench serve prints them: Acceptance length "
            f"{b['spec_decode_acceptance_length']:.2f}, Acceptance rate (%) {b['spec_decode_acceptance_rate']:.2f}, "
            f"Drafts {p.num_spec_steps}, Draft tokens {p.num_draft_tokens}, Accepted tokens "
            f"{p.num_accepted_draft_tokens}, per-position acceptance {pp}"
            + (" ..." if len(b["spec_decode_per_position_acceptance_rates"]) > 8 else ""), *self.remarks()])

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(str(self))}</pre>"


# ---------------------------------------------------------------------------------------------- sources
def acceptance(source, whole_only: bool = False) -> Acceptance:
    """Per-request acceptance from ``source``: a ``wb.Trace`` (one request), a list or tuple of traces, a dict
    {request id: trace}, or a cycle dump as ``workbench.conform.dump.read_dump(path)`` returns it (the header and
    its records). Refused in one line: anything else, a source without a cycle, a dump record without the accepted
    path, a dump whose last line is cut short unless ``whole_only`` (then its whole cycles are read and the notes
    say so), traces of two pairs, and a trace given twice (a copy is no new sample)."""
    from workbench.records.cycle import Trace

    if isinstance(source, Trace):
        return Acceptance([from_trace(source, "0")])
    if isinstance(source, dict) and source and all(isinstance(t, Trace) for t in source.values()):
        return pool([(f"trace {k!r}", Acceptance([from_trace(t, str(k))])) for k, t in source.items()])
    if isinstance(source, (list, tuple)) and len(source) == 2 and isinstance(source[0], dict) \
            and source[0].get("format") == DUMP_FORMAT:
        return from_dump_records(*source, whole_only=whole_only)
    if isinstance(source, (list, tuple)) and source and all(isinstance(t, Trace) for t in source):
        return pool([(f"trace {i}", Acceptance([from_trace(t, str(i))])) for i, t in enumerate(source)])
    raise AcceptanceError(f"acceptance({type(source).__name__}{'' if source else ' (empty)'}): pass a wb.Trace, a "
                          "list or {id: trace} of them, or a cycle dump as read_dump(path) returns it (the command "
                          "line takes the files: python -m workbench acceptance RUN.dump)")


def pair_name(target, draft) -> str | None:
    """"target + draft" as a run names its pair, a path that exists here resolved (one pair written two ways
    is one pair); None when neither is known."""
    import os

    if target is None and draft is None:
        return None
    names = [os.path.realpath(p) if isinstance(p, str) and os.path.exists(p) else os.path.normpath(str(p))
             for p in (target, draft)]
    return " + ".join(names)


def pool(parts, by_source: bool = False) -> Acceptance:
    """Several sources' requests as one run (``parts``: [(source name, Acceptance)], requests kept in order;
    ``by_source``: each request named "source:request", so two files' "0" stay apart).
    Refused in one line: sources of two pairs (one pooled line over both would describe neither), and a request
    that is another source's again (the same steps, token count and prompt, where known: a copy, or the trace
    and the dump of one run, is no new sample)."""
    pairs: dict = {}  # pair -> the first source that ran it
    for name, acc in parts:
        for r in acc.records:
            if r.pair is not None:
                pairs.setdefault(r.pair, name)
    if len(pairs) > 1:
        (p1, a), (p2, b) = list(pairs.items())[:2]
        raise AcceptanceError(f"{a} ran {p1}, {b} ran {p2}: acceptance pools one pair's runs (one line over two "
                              "pairs describes neither); give each pair's runs apart")
    seen: list = []  # (source, request record) of the sources before this one
    for name, acc in parts:
        for r in acc.records:
            other = next(((n, o) for n, o in seen if same_sample(o, r)), None)
            if other is not None:
                raise AcceptanceError(f"{name}'s request {r.request!r} is {other[0]}'s {other[1].request!r} "
                                      f"again (the same {r.num_spec_steps} steps, accepted drafts and tokens"
                                      f"{', and prompt' if r.prompt is not None and other[1].prompt is not None else ''})"
                                      ": a copy is no new sample; give each run once")
        seen += [(name, r) for r in acc.records]
    records = [replace(r, request=f"{name}:{r.request}") if by_source else r for name, acc in parts for r in acc.records]
    return Acceptance(records, [n for _, acc in parts for n in acc.notes])


def same_sample(a: RequestAcceptance, b: RequestAcceptance) -> bool:
    """Whether ``b`` is ``a`` again: the same steps (accepted and drafted, in order) and completion tokens, and
    the same prompt where both know it. Without a step and without both prompts, two plain-decoding requests
    cannot be told apart: not called copies."""
    both = a.prompt is not None and b.prompt is not None
    return (a.per_step_accepted, a.per_step_drafted, a.completion_tokens) == \
        (b.per_step_accepted, b.per_step_drafted, b.completion_tokens) \
        and (a.prompt == b.prompt if both else a.num_spec_steps > 0)


def from_trace(trace, request: str) -> RequestAcceptance:
    """One request from its trace: every cycle that verified a drafted node is a step. A trace without a cycle
    (a session that has not stepped) is refused in one line."""
    if not trace.cycles:
        raise AcceptanceError(f"the trace holds no cycle ({trace.new_tokens} token(s), the prefill's): no step to "
                              "judge; run the session first (s.run() or s.step())")
    steps = [c for c in trace.cycles if c.n_nodes > 0]
    ks = [int(c.draft_topk_tokens.shape[0]) for c in steps]
    engine = str(trace.meta.get("engine") or "workbench").split()[0].lower()
    ids = trace.meta.get("prompt_ids")
    return RequestAcceptance(request, engine, tuple(c.accepted for c in steps), tuple(c.n_nodes for c in steps),
                             max(ks) if ks else None, trace.new_tokens,
                             pair_name(trace.meta.get("target"), trace.meta.get("draft")),
                             tuple(ids) if ids is not None else None)


def from_dump_records(header: dict, records, whole_only: bool = False) -> Acceptance:
    """Every request of a cycle dump (``read_dump``'s header and records): a cycle record's accepted path
    (``accepted_nodes``) and tree (``tree_tokens`` or ``tree_parents``) make a step; its drafted slots
    (``draft_topk_ids`` / ``draft_logits``, else the header's block size - 1) k; the request's first token and
    every ``committed_tokens`` its completion tokens. A dump without a cycle record is refused; one whose last
    line is cut short too, unless ``whole_only`` (its whole cycles are read, and a note says so)."""
    engine = str((header.get("engine") or {}).get("name") or "?")
    pair = header.get("pair") or {}
    block = pair.get("block_size")
    steps: dict = {}  # request -> [accepted], [drafted], k, completion tokens (None when not known), prompt
    cycles = 0
    for rec in records:
        # completion tokens: the prefill's first token, then every step's; None once a record does not say
        s = steps.setdefault(rec.request, [[], [], block - 1 if isinstance(block, int) else None, None, None])
        if rec.kind == "request":
            s[3] = 1 if "first_token" in rec else None
            s[4] = tuple(int(t) for t in rec["prompt_ids"].tolist()) if "prompt_ids" in rec else None
            continue
        cycles += 1
        step_of(rec, s)
    return Acceptance([RequestAcceptance(r, engine, tuple(a), tuple(d), k, n, pair_name(pair.get("target"),
                                                                                       pair.get("draft")), prompt)
                       for r, (a, d, k, n, prompt) in steps.items()],
                      dump_notes(records, cycles, len(steps), whole_only))


def step_of(rec, s: list) -> None:
    """One cycle record into its request's [accepted], [drafted], k and completion tokens (``s``, in place)."""
    tree = "tree_tokens" if "tree_tokens" in rec else "tree_parents"
    lacking = [f for f in ("accepted_nodes", tree) if f not in rec]
    if lacking:
        raise AcceptanceError(f"{rec.where}: a cycle record without {' or '.join(lacking)}"
                              f"{' (or tree_tokens)' if tree in lacking else ''}: its acceptance is not in the "
                              "dump (docs/dump-format.md lists the fields)")
    drafted = int(rec[tree].shape[0]) - 1
    for name in ("draft_topk_ids", "draft_logits"):
        if name in rec:
            s[2] = max(s[2] or 0, int(rec[name].shape[0]))
            break
    if s[3] is not None:
        s[3] = s[3] + int(rec["committed_tokens"].shape[0]) if "committed_tokens" in rec else None
    if drafted > 0:
        s[0].append(int(rec["accepted_nodes"].shape[0]) - 1)
        s[1].append(drafted)


def dump_notes(records, cycles: int, requests: int, whole_only: bool) -> list:
    """What the dump's reading left short, after its records were read: no cycle and a cut last line (without
    ``whole_only``) refused in one line; a cut line read whole-only and a missing end line as notes."""
    path = getattr(records, "path", "the dump")
    cut = getattr(records, "truncated", None)
    # the header is line 1 and every whole record one line: the cut line is the one after them
    cut_at = f"{path}:{getattr(records, 'count', 0) + 2}"
    if cycles == 0:
        raise AcceptanceError(f"{path} holds no cycle record ({requests} request(s)"
                              f"{', then a line cut short at ' + cut_at if cut else ''}): no step to judge (the run "
                              "stopped before its first cycle); dump a run that steps at least once")
    if cut and not whole_only:
        raise AcceptanceError(f"{cut_at}: the last line is cut short (the run stopped mid-record): its figures would "
                              f"leave that cycle out; pass --whole-only (acceptance(..., whole_only=True)) to report "
                              f"its {cycles} whole cycles as such")
    if cut:
        return [f"read {cycles} whole cycles of {path}, cut short at line {cut_at.rsplit(':', 1)[1]}: the run stopped "
                "mid-record"]
    if not getattr(records, "complete", True):
        return [f"{path} has no end line: the run stopped early or is still writing; its {cycles} whole cycles read"]
    return []


def from_vllm_counters(counters: dict, request: str = "all", engine: str = "vllm", num_spec_tokens: int | None = None,
                       completion_tokens: int | None = None) -> RequestAcceptance:
    """The record from vLLM's own counters over a span (``workbench.adapters.spec_metrics``'s dict, or its
    ``delta`` over one request): ``drafts`` (steps), ``draft_tokens``, ``accepted`` and ``per_pos`` (steps that
    accepted at position i, i.e. at least i + 1 drafts). A step's drafts are accepted as a prefix, so the steps
    that accepted exactly j are per_pos[j - 1] - per_pos[j]: the histogram, and with it every figure above, comes
    from the counters alone. The per-step order is not in them: ``per_step_*`` hold the steps sorted by j, and
    drafted tokens spread evenly (vLLM drafts a fixed count per step). Counters that contradict each other are
    refused in one line."""
    try:
        drafts, tokens, accepted = (int(round(float(counters[k]))) for k in ("drafts", "draft_tokens", "accepted"))
        per_pos = [int(round(float(x))) for x in counters.get("per_pos", [])]
    except (KeyError, TypeError, ValueError) as e:
        raise AcceptanceError(f"counters {str(counters)[:80]}: need drafts, draft_tokens, accepted and per_pos as "
                              f"workbench.adapters.spec_metrics reads them ({type(e).__name__}: {e})") from None
    if accepted and not per_pos:
        raise AcceptanceError("the counters hold no per-position counts (vllm:spec_decode_num_accepted_tokens_per_pos):"
                              " the histogram of accepted drafts cannot be derived")
    k = num_spec_tokens if num_spec_tokens is not None else len(per_pos)
    bounds = [drafts] + per_pos + [0]
    hist = {j: bounds[j] - bounds[j + 1] for j in range(len(per_pos) + 1)}
    if any(n < 0 for n in hist.values()) or sum(j * n for j, n in hist.items()) != accepted:
        raise AcceptanceError(f"the counters contradict each other: {drafts} drafts, {accepted} accepted, per position "
                              f"{per_pos}: steps that accept a position must also accept the ones before it, and the "
                              "positions must sum to the accepted count")
    per_step = tuple(j for j, n in sorted(hist.items()) for _ in range(n))
    even, extra = divmod(tokens, drafts) if drafts else (0, 0)
    drafted = tuple(even + (1 if i < extra else 0) for i in range(drafts))
    return RequestAcceptance(request, engine, per_step, drafted, k, completion_tokens)
