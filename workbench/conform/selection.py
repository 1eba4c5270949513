"""Which cycle records of a dump a check judges: a slice of engine steps, some requests, or both.

    wb.conform("run.dump", cycles=(1000, 2000))      # engine steps 1000 to 1999; (1000, None): to the end
    wb.conform("run.dump", requests=["3", "7"])      # every cycle of requests 3 and 7
    python -m workbench conform run.dump --cycles 1000:2000 --requests 3,7

A slice counts **engine steps** (the dump's ``step``, the report's "(step N)"): one clock for the whole run,
so a slice is a stretch of time whatever the batch was; for a one-request run the steps are its cycles. The
rows of one batched step are checked together.

A slice is a choice of what to *judge*, not of what to *read*: the checker still reads every record before
the slice, cheaply (no model runs), because two contracts need history. Each request's committed context (the
tokens before a cycle) is the prompt, the first token and every earlier cycle's committed tokens; and the
drafter-context contract asks that every committed position reached the drafter, which may have happened in
any earlier step. The record-order check (``workbench.conform.integrity``) reads the whole file. One
judgement is left to the slice's own evidence: the state each request's last step before the slice committed
is judged only through the next root's logits, which the slice checks as its target logits; the report's
note says so.

An argument that is malformed, or a slice that selects no cycle of the dump, is refused in one line naming
it and the fix (``SelectionError``; the checker raises it as ``ConformInputError``), before any model loads.
"""
from __future__ import annotations

from dataclasses import dataclass


class SelectionError(ValueError):
    """A slice or request list that is malformed or selects nothing in the dump: one line, the value and the fix."""


@dataclass(frozen=True)
class Selection:
    """Engine steps ``first`` to ``stop - 1`` (``stop`` None: to the end) of the requests in ``requests``
    (None: every request)."""

    first: int = 0
    stop: int | None = None
    requests: tuple | None = None

    def holds(self, request: str, step: int) -> bool:
        return (self.first <= step and (self.stop is None or step < self.stop)
                and (self.requests is None or request in self.requests))

    @property
    def steps_label(self) -> str:
        """The slice as the command line spells it: '100:200', '100:', ':200'."""
        return f"{self.first or ''}:{'' if self.stop is None else self.stop}" if self.sliced else ":"

    @property
    def sliced(self) -> bool:
        return self.first > 0 or self.stop is not None

    def to_dict(self) -> dict:
        return {"cycles": [self.first, self.stop], "requests": None if self.requests is None else list(self.requests)}


def selection(cycles=None, requests=None) -> Selection | None:
    """``cycles``: (A, B) engine steps A to B - 1 (B None: to the end), or the command line's 'A:B', 'A:', ':B';
    ``requests``: request ids (str, or int as the workbench numbers them), one id alone, or None for all.
    -> None when neither selects anything (the whole dump)."""
    if cycles is None and requests is None:
        return None
    first, stop = _cycles(cycles) if cycles is not None else (0, None)
    return Selection(first, stop, _requests(requests) if requests is not None else None)


def _cycles(cycles) -> tuple[int, int | None]:
    how = ("give engine steps A to B - 1 as (A, B) or 'A:B' (an end left open: None, 'A:' or ':B'), "
           "e.g. --cycles 100:200")
    if isinstance(cycles, str):
        parts = cycles.split(":")
        if len(parts) != 2 or not all(p.strip().isdigit() or not p.strip() for p in parts):
            raise SelectionError(f"cycles={cycles!r:.40}: {how}")
        a, b = (int(p) if p.strip() else None for p in parts)
        a = 0 if a is None else a
    elif isinstance(cycles, (tuple, list)) and len(cycles) == 2:
        a, b = cycles
        if not (a is None or _count(a)) or not (b is None or _count(b)):
            raise SelectionError(f"cycles={cycles!r:.40}: steps are whole numbers from 0; {how}")
        a = 0 if a is None else a
    else:
        raise SelectionError(f"cycles={cycles!r:.40}: {how}")
    if b is not None and b <= a:
        raise SelectionError(f"cycles={cycles!r:.40}: the slice ends at step {b}, not after its start {a}: it "
                             f"selects nothing; give an end past the start (e.g. {a}:{a + 100})")
    return a, b


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _requests(requests) -> tuple:
    ids = [requests] if isinstance(requests, (str, int)) else requests
    if not isinstance(ids, (list, tuple, set, frozenset)) or isinstance(requests, bool):
        raise SelectionError(f"requests={requests!r:.40}: give the request ids as the dump names them, e.g. "
                             "['0', '3'] (--requests 0,3)")
    out = []
    for r in ids:
        if isinstance(r, bool) or not isinstance(r, (str, int)) or not str(r).strip():
            raise SelectionError(f"requests holds {r!r:.40}: a request id is the dump's string (or the workbench's "
                                 "number), e.g. ['0', '3'] (--requests 0,3)")
        out.append(str(r).strip())
    if not out:
        raise SelectionError("requests=[] selects no request: give at least one id, or leave requests out to check "
                             "every request")
    return tuple(dict.fromkeys(out))


def parse_request_list(text: str | None) -> list[str] | None:
    """The command line's ``--requests 0,3,7`` as ids (a blank entry is refused by ``selection``)."""
    return None if text is None else [p.strip() for p in text.split(",")]


# ----------------------------------------------------------------------------------------- against the dump
@dataclass
class Extent:
    """The engine step of every cycle record in the dump, per request (in file order)."""

    steps: dict  # request -> [step, ...]

    @property
    def cycles(self) -> int:
        return sum(len(v) for v in self.steps.values())


def extent(path) -> Extent:
    """One pass over the dump's records, reading only their kind, request and step (no tensor is unpacked)."""
    from workbench.conform.dump import read_dump

    _, records = read_dump(path)
    steps: dict = {}
    for rec in records:
        if rec.kind == "cycle":
            steps.setdefault(rec.request, []).append(rec["step"])
    return Extent(steps)


@dataclass
class Selected:
    """What a selection keeps of a dump: cycle records and requests judged, and one line for the report."""

    cycles: int
    requests: int
    note: str


def check_against(sel: Selection, ext: Extent, path) -> Selected:
    """The selection against the dump: SelectionError (one line) when it selects no cycle record of it;
    otherwise what it keeps and the report's note (what was read but not judged; an end past the dump's)."""
    if not ext.steps:  # a dump without cycle records is the checker's own refusal (prescan), in its own words
        return Selected(0, 0, "")
    if sel.requests is not None:
        absent = [r for r in sel.requests if r not in ext.steps]
        if absent:
            known = list(ext.steps)
            raise SelectionError(
                f"requests {', '.join(repr(r) for r in absent[:5])} {'is' if len(absent) == 1 else 'are'} not in "
                f"{path} (its {len(known)} request(s) with cycles: {', '.join(repr(r) for r in known[:8])}"
                f"{', ...' if len(known) > 8 else ''}): give ids as the dump's records name them")
    mine = {r: v for r, v in ext.steps.items() if sel.requests is None or r in sel.requests}
    first, last = min(min(v) for v in mine.values()), max(max(v) for v in mine.values())
    kept = {r: sum(sel.holds(r, step) for step in v) for r, v in mine.items()}
    cycles = sum(kept.values())
    if not cycles:
        whose = (f"request(s) {', '.join(repr(r) for r in mine)}" if sel.requests is not None else "its cycle records")
        raise SelectionError(f"cycles {sel.steps_label} select no cycle of {path}: {whose} run from step {first} to "
                             f"step {last}; give a slice that meets them (e.g. --cycles {first}:{last + 1})")
    parts = []
    if sel.sliced:
        end = last if sel.stop is None or sel.stop > last else sel.stop - 1
        parts.append(f"steps {sel.first} to {end}" + (f" (the dump's records end at step {last})"
                                                      if sel.stop is not None and sel.stop > last + 1 else ""))
    if sel.requests is not None:
        parts.append(f"request(s) {', '.join(repr(r) for r in sel.requests)}")
    note = (f"a slice was checked: {', '.join(parts)}, {cycles} of the dump's {ext.cycles} cycle records; the "
            "committed context and the drafter's context rows before the slice were read from the dump, not judged"
            + ("; each request's last commit before the slice is judged only through the next root's logits (target "
               "logits, in the slice)" if sel.first > 0 else ""))
    return Selected(cycles, sum(1 for n in kept.values() if n), note)
