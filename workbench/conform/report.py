"""The checker's verdict: per contract what was checked, broken and not checked (``ContractResult``), and the run's
report (``ConformReport``: its text, its dict, the broken contracts in the order they first broke)."""
from __future__ import annotations

from dataclasses import dataclass, field

from workbench.conform import contracts as C
from workbench.conform import intended
from workbench.conform.diagnosis import report_lines


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
    # per broken cycle, its evidence as data (workbench.conform.causes reads it)
    facts: list = field(default_factory=list)

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
    causes: dict = field(default_factory=dict)  # broken contract -> the known causes reproduced (or signatures)
    diagnosis: dict = field(default_factory=dict)  # broken contract -> workbench.conform.diagnosis.diagnose's entry
    cost: object = None  # what the run lost beside the reference's own decode (workbench.conform.fault_cost)

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
                "diagnosis": {name: {"named": [f.to_dict() for f in d["named"]],
                                     "tried": [f.to_dict() for f in d["tried"]], "follows": d["follows"]}
                              for name, d in self.diagnosis.items()},
                "selection": self.selection, "cost": None if self.cost is None else self.cost.to_dict(),
                "intended": intended.intended(self.header)}

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
                         f"{f['reference_accept']} / {f['engine_accept']}"
                         if f and f.get("reference_accept") is not None else "-",
                         "; ".join(f"{k} ({v})" for k, v in r.not_checked.items()) or "-"])
        lines.append(text_table(["contract", "status", "cycles checked", "broken", "first broken",
                                 "accept there ref / engine", "not checked (cycles)"], rows))
        lines += intended.lines(self.header, self.results)  # verdicts on what a writer could not see consumed
        if self.broken:
            lines.append("broken, in the order they first broke:")
            for i, name in enumerate(self.broken, 1):
                f = self.results[name].first
                cost = (f"; the reference's step commits {_tokens(f['reference_accept'])} there, the engine's "
                        f"{f['engine_accept']}" if f.get("reference_accept") is not None else "")
                lines.append(f"  {i}. {name}: request {f['request']}, cycle {f['cycle']} (step {f['step']}): "
                             f"{f['evidence']}{cost}.")
            lines += report_lines(self.broken, self.diagnosis, self.results)
        else:
            lines.append("no contract broken" + (" (see the contracts not checked)" if any(
                r.status == "not checked" for r in self.results.values()) else ""))
        if self.cost is not None:  # the per-step replay's counts above are each on the engine's own context
            lines += self.cost.lines()
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

