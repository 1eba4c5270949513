"""Differential diagnosis: for each broken contract, the catalogue's candidate causes that fit its evidence
(``workbench.conform.causes``), each reproduced in the reference on the contract's first broken cycles
(``workbench.conform.suspects``: the suspected mask, positions, kept K/V rows and recurrent state, bonus, drafter
block) and held against what the engine recorded. The cause named is the one whose reproduction matches on every
cycle tried; where none does, the report says "no candidate reproduces it" and lists what was tried. A cause is
never chosen by the target's kind: the kind only rules out what the target cannot have.

Cost: only candidates that fit are reproduced, each on at most ``replay.SAMPLES`` broken cycles (a forward or two
of the tiny tree each); the rest of the broken cycles are counted, not reproduced.
"""
from __future__ import annotations

from dataclasses import dataclass

from workbench.conform import contracts as C
from workbench.conform.causes import CAUSES, Cause


@dataclass
class Finding:
    cause: Cause
    matched: int = 0  # broken cycles whose records the reproduction equals
    tried: int = 0  # broken cycles it could be tried on
    what: str = ""  # the suspected input, in words
    diff: float | None = None  # the largest |difference| of the engine's values from the reproduction's
    signature: bool = False  # no reproduction: its signature alone matches

    @property
    def reproduced(self) -> bool:
        return self.signature or (self.tried > 0 and self.matched == self.tried)

    def to_dict(self) -> dict:
        return {**self.cause.to_dict(), "reproduced": self.reproduced, "matched": self.matched, "tried": self.tried,
                "what": self.what, "max_diff": self.diff, "signature_only": self.signature}


@dataclass
class Env:
    """What a reproduction runs on: the loaded pair, the checker's tolerance, whether the target is hybrid, the
    reference drafter and target (``drafter_reference.Reference``), and a per-cycle memo of shared forwards."""

    models: object
    tol: object
    hybrid: bool
    ref: object
    memo: dict


def clean_before(report, name: str, upstream: tuple) -> list[str]:
    """The contracts of ``upstream`` that broke before ``name`` first did: at an earlier step (row), or at the same
    one and earlier in the data flow (``CONTRACTS`` order)."""
    order = {n: i for i, n in enumerate(C.CONTRACTS)}
    first = report.results[name].first
    at = (first["step"], first["row"], order[name]) if first else (float("inf"), 0, 0)
    out = []
    for u in upstream:
        f = report.results[u].first if u in report.results else None
        if f is not None and (f["step"], f["row"], order[u]) < at:
            out.append(u)
    return out


def diagnose(report, replay) -> dict:
    """Broken contract -> {"named": [Finding], "tried": [Finding], "follows": [upstream contracts broken first]}."""
    env = Env(replay.models, replay.tol, replay.hybrid, replay.ref, {})
    for kept in replay.samples.values():
        for sample in kept:  # a later cycle's output also carries the earlier steps' fault: not comparable
            sample.clean = replay.first_broken.get(sample.rec.request, sample.rec["step"]) >= sample.rec["step"]
    out = {}
    for name in report.broken:
        result = report.results[name]
        fit = [c for c in CAUSES if c.contract == name and c.fits(result, replay.hybrid)]
        follows = sorted({u for c in CAUSES if c.contract == name for u in clean_before(report, name, c.upstream)})
        tried = [attempt(c, result, replay.samples[name], env) for c in fit if not clean_before(report, name,
                                                                                               c.upstream)]
        named = sorted([f for f in tried if f.reproduced], key=lambda f: (f.signature, -f.matched))
        if any(not f.signature for f in named):  # a reproduction explains it: a bare signature adds nothing
            named = [f for f in named if not f.signature]
        out[name] = {"named": named, "tried": tried, "follows": follows}
    return out


def attempt(cause: Cause, result, samples: list, env: Env) -> Finding:
    """One candidate reproduced on the contract's kept broken cycles (or, for one the contract reproduced itself,
    on every broken cycle's evidence)."""
    if cause.reproduce is None:
        return Finding(cause, signature=True, what="its signature in the evidence")
    if cause.over_facts:
        matched, tried, what = cause.reproduce(result)
        return Finding(cause, matched, tried, what)
    found = Finding(cause)
    for sample in samples:
        try:
            got = cause.reproduce(sample, env)
        except (RuntimeError, ValueError, IndexError, KeyError, AttributeError, TypeError) as e:
            # a reproduction this pair or record cannot run is not tried; it never stops the check
            found.what = found.what or f"could not run: {type(e).__name__}: {' '.join(str(e).split())[:80]}"
            continue
        if got is None:
            continue
        found.tried += 1
        found.matched += got.match
        if got.diff is not None:
            found.diff = max(found.diff or 0.0, got.diff)
        if not found.what or (got.match and found.matched == 1):
            found.what = got.what
    return found


def causes_of(diagnosis: dict) -> dict:
    """Broken contract -> the causes named (reproduced first, then those matching a signature only)."""
    return {name: [f.cause for f in d["named"]] for name, d in diagnosis.items()}


def report_lines(broken: list[str], diagnosis: dict, results: dict) -> list[str]:
    """The report's lines: per broken contract the cause reproduced and how, or that no candidate reproduces it."""
    out = ["diagnosis (candidate causes reproduced in the reference; workbench.conform.diagnosis):"]
    for name in broken:
        d = diagnosis.get(name, {"named": [], "tried": [], "follows": []})
        for f in d["named"]:
            out.append(f"  {name}: {f.cause.name} -- {describe(f, results[name].broken)}; source: {f.cause.source}")
        if sum(not f.signature for f in d["named"]) > 1:
            out.append(f"  {name}: these reproduce it alike on the cycles tried (a longer dump may tell them apart)")
        if d["named"]:
            continue
        held = [f for f in d["tried"] if f.tried]
        idle = [f.cause.name + (f" ({f.what})" if f.what.startswith("could not run") else "")
                for f in d["tried"] if not f.tried]  # no kept cycle could tell (fields, history), or it cannot run
        if d["tried"]:
            out.append(f"  {name}: no candidate reproduces it (" + "; ".join(
                [f"{f.cause.name}: {f.matched} of {f.tried}" for f in held] + ([
                    "no cycle kept could tell: " + ", ".join(idle)] if idle else [])) + ")")
        elif d["follows"]:
            out.append(f"  {name}: no candidate tried: {', '.join(d['follows'])} broke first (its input)")
        else:
            out.append(f"  {name}: no candidate reproduces it (no catalogued cause fits its evidence)")
    return out


def describe(f: Finding, broken: int) -> str:
    if f.signature:
        return "matches its signature (not reproducible from the dump)"
    within = f"; recorded values within {f.diff:.1g} of the reproduction's" if f.diff is not None else ""
    return (f"reproduced: {f.what}, equal to the engine's records on {f.matched} of {f.tried} broken cycles tried "
            f"({broken} broken){within}")
