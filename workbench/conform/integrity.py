"""Is a dump whole and in order? The checker asks before it replays anything, so a file that lost, repeated,
moved or mislabelled a record is refused as the file's fault instead of being blamed on the engine.

Evidence, strongest first (the first problem found in that order is the one named):

1. ``seq``, every record's number in the file (written by ``DumpWriter``): a number missing, repeated or out
   of order names the record.
2. Each request's own record before its first cycle (every writer writes one): without it the committed
   context is unknown, and three contracts could not be held.
3. Each request's context, continued step to step: a cycle's ``context_len`` and ``root_token`` are the
   previous step's context plus its committed tokens and their last token. A record that does not continue its
   own request but exactly continues another one's (length and root token both) is that request's record under
   the wrong id: two rows' ids swapped (``seq`` cannot see it: the lines are in place, their ids are not). A
   record that continues no request is left to the contracts (an engine that miscounts its context breaks
   "committed tokens").
4. Each request's ``cycle`` numbers: 0, 1, 2, ... (covers dumps written before ``seq`` existed).

``RecordOrder.add(rec)`` takes the records in file order; ``problem()`` is then None or one line.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Context:
    """What a request's next cycle must start from: tokens in the cache before its root, and the root."""

    length: int
    last: int


class RecordOrder:
    def __init__(self, path):
        self.path = str(path)
        self.seqs: list[tuple[int, str]] = []  # (seq, where) in file order
        self.unnumbered: list[str] = []  # where: records without seq
        self.requests: dict[str, str] = {}  # request id -> where its request record is
        self.cycles: dict[str, int] = {}  # request id -> the cycle number due next
        self.context: dict[str, Context | None] = {}
        self.found: dict[int, str] = {}  # evidence rank -> the first problem of that rank

    def _found(self, rank: int, text: str) -> None:
        self.found.setdefault(rank, text)

    def add(self, rec) -> None:
        if "seq" in rec.raw:
            self.seqs.append((rec.get("seq"), rec.where))
        else:
            self.unnumbered.append(rec.where)
        rid = rec.request
        if rec.kind == "request":
            if rid in self.requests:
                self._found(2, f"{rec.where}: a second request record of request {rid!r} (the first at "
                               f"{self.requests[rid]}): two runs written into one file, or a record repeated")
            self.requests[rid] = rec.where
            self.cycles[rid] = 0
            ids, first = rec.get("prompt_ids"), rec.get("first_token")
            self.context[rid] = Context(len(ids), first) if ids is not None and first is not None else None
            return
        if rid not in self.requests:
            self._found(2, f"{rec.where}: a cycle of request {rid!r} with no request record before it: the dump lost "
                           "that request's record (every writer writes it before the request's first cycle), so its "
                           "committed context is unknown; check the whole file as its writer left it")
            self.requests[rid] = rec.where
            self.cycles[rid] = rec.get("cycle") or 0
            self.context[rid] = None
        cycle = rec.get("cycle")
        if cycle is not None:
            if cycle != self.cycles[rid]:
                self._found(4, f"{rec.where}: request {rid!r}'s cycle {cycle} where its cycle {self.cycles[rid]} was "
                               "next: a record of it missing, repeated, out of order or another request's")
            self.cycles[rid] = cycle + 1
        else:
            self.cycles[rid] += 1
        self._continue(rec, rid)

    def _continue(self, rec, rid: str) -> None:
        have_len, have_root = rec.get("context_len"), rec.get("root_token")
        own = self.context.get(rid)
        if have_len is not None and have_root is not None:
            if own is None:  # a request record without its prompt (a hook's): the first cycle says where it is
                own = Context(have_len, have_root)
            elif (have_len, have_root) != (own.length, own.last):
                other = [r for r, c in self.context.items() if r != rid and c is not None
                         and (c.length, c.last) == (have_len, have_root)]
                if other:
                    self._found(3, f"{rec.where}: this record of request {rid!r} (step {rec.get('step')}, row "
                                   f"{rec.get('row')}) continues request {other[0]!r}'s context (context_len "
                                   f"{have_len}, root token {have_root}), not its own (context_len {own.length}, root "
                                   f"token {own.last}): the rows' request ids are swapped or mislabelled")
        self.context[rid] = advance(own, rec)

    def problem(self) -> str | None:
        """The first problem by the strength of its evidence, or None: the records are whole and in order."""
        seq = self.sequence_problem()
        if seq is not None:
            return seq
        for rank in sorted(self.found):
            return self.found[rank]
        return None

    def sequence_problem(self) -> str | None:
        if not self.seqs:
            return None
        if self.unnumbered:
            return (f"{self.unnumbered[0]}: a record without seq among numbered ones: the file mixes two writers' "
                    "records")
        bad = [(s, w) for s, w in self.seqs if not isinstance(s, int) or isinstance(s, bool) or s < 0]
        if bad:
            return f"{bad[0][1]}: seq={str(bad[0][0])[:30]} is not a record number (0, 1, ...)"
        where: dict[int, str] = {}
        for s, w in self.seqs:
            if s in where:
                return (f"{w}: record {s} appears twice (first at {where[s]}): a record repeated; the dump is not "
                        "the file its writer wrote")
            where[s] = w
        m = next((i for i, s in enumerate(sorted(where)) if s != i), None)  # the lowest number not there
        if m is not None:
            after = f" (record {m - 1} is at {where[m - 1]})" if m - 1 in where else ""
            return (f"{self.path}: record {m} is missing{after}: a record was lost after its writer wrote it; the "
                    "dump is not the file its writer wrote")
        for i, (s, w) in enumerate(self.seqs):
            if s != i:
                return (f"{w}: record {s} where record {i} was due (record {i} is at {where[i]}): records out "
                        "of order; the dump is not the file its writer wrote")
        return None

    @property
    def numbered(self) -> bool:
        return bool(self.seqs)


def advance(ctx: Context | None, rec) -> Context | None:
    """A request's context after this cycle: plus the tokens it committed (else its accepted drafts and bonus)."""
    if ctx is None:
        return None
    committed = rec.get("committed_tokens")
    if committed is not None:
        toks = committed.tolist()
        return Context(ctx.length + len(toks), toks[-1]) if toks else ctx
    acc, bonus = rec.get("accepted_nodes"), rec.get("bonus")
    if acc is not None and bonus is not None:
        return Context(ctx.length + len(acc), bonus)
    return None
