"""The step-cost table a calibration file carries (``workbench.engine.policies.step_cost.StepCost``), from a
measurement the workbench already makes.

Two sources are read:

- a ``pays-off --json`` result (``workbench.payoff``): per batch size, every shape's median ms per stage.
  A shape's node count is its static node count (DDTree(N): N + 1, DFlash: the block, AR: 1; CostTree and
  CutTree, which choose theirs per cycle, are left out); the verify median is kept per node count, and the
  rest of a drafted step (draft, tree, accept, commit, host) is the median over the drafted shapes of that
  batch (it barely moves with the tree up to 32 nodes);
- a cost table written by hand or by a script, ``{"rows": [...], "nodes": [...], "step_ms": [[...]],
  "source": "..."}``, e.g. the shipped ``workbench/assets/costs/*.json``, each transcribed from a measurement
  in ``docs/`` that its ``source`` names.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from workbench.engine.policies import parse_policy
from workbench.engine.policies.step_cost import StepCost

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "costs"
SHIPPED = {"dense": ASSETS / "dense-cpu.json", "hybrid": ASSETS / "hybrid-cpu.json"}
DRAFTED_FAMILIES = ("chain", "chain-cut", "spine", "tree")  # pays-off's families that draft
# pays-off's families whose node count is chosen per cycle (CostTree, CutTree): their static node count is only a
# cap, so their verify median is not the verify of that many nodes
PER_CYCLE_FAMILIES = ("cost-tree", "cut-tree")
OTHER_STAGES = ("draft", "tree", "accept", "commit", "host")


class CostInputError(ValueError):
    """A cost source that cannot be read; the message is one line."""


def from_pays_off(d: dict, where: str) -> StepCost:
    """A pays-off JSON result -> the table over its batch sizes and its shapes' node counts."""
    block = int((d.get("settings") or {}).get("block_size") or 0)
    batches = d.get("batches") or {}
    if not block or not batches:
        raise CostInputError(f"{where} has no settings.block_size or batches: give a pays-off --json result")
    rows, verify, other = [], [], []
    for b in sorted(batches, key=int):
        by_nodes, rest = {}, []
        for r in batches[b].get("shapes", []):
            ms = r.get("step_ms") or {}
            if "verify" not in ms or r.get("family") in PER_CYCLE_FAMILIES:
                continue
            n = parse_policy(r["label"]).static_nodes(block) if r.get("family") != "ar" else 1
            by_nodes.setdefault(n, []).append(float(ms["verify"]))
            if r.get("family") in DRAFTED_FAMILIES:
                rest.append(sum(float(ms.get(s, 0.0)) for s in OTHER_STAGES))
        if not by_nodes or not rest:
            raise CostInputError(f"{where}: batch {b} has no drafted shape with stage times")
        rows.append(int(b))
        verify.append({n: statistics.median(v) for n, v in by_nodes.items()})
        other.append(statistics.median(rest))
    nodes = sorted(set().union(*verify))
    # a node count one batch lacks is read off that batch's own measured points
    step = []
    for v, o in zip(verify, other):
        pts = sorted(v)
        partial = StepCost((1,), tuple(pts), (tuple(v[n] for n in pts),))
        step.append([o + float(partial.ms(1, n)) for n in nodes])
    src = (f"pays-off result {where} (prompts {d['settings'].get('prompts')}, {d['settings'].get('max_new_tokens')} "
           f"new tokens, {d['settings'].get('device')}): verify median per node count + the median of the drafted "
           "shapes' draft, tree, accept, commit and host")
    return StepCost(tuple(rows), tuple(nodes), tuple(tuple(r) for r in step), src)


def read_costs(source) -> StepCost:
    """A cost source by path (or a shipped one by pair name) -> the table; one line on anything else."""
    p = SHIPPED.get(source, Path(source)) if isinstance(source, str) else Path(source)
    if not p.is_file():
        raise CostInputError(f"cost source {source} is not a file; give a pays-off --json result or a cost table")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CostInputError(f"cost source {p} is not JSON; give a pays-off --json result or a cost table") from None
    if isinstance(d, dict) and "batches" in d:
        return from_pays_off(d, str(p))
    try:
        return StepCost.from_dict(d, f"cost table {p}")
    except ValueError as e:
        raise CostInputError(str(e)) from None
