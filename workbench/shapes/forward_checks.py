"""Contract checks over a run's recorded forwards (logits rows, hidden states, positions, the tree mask, K/V
length after commit): PASS/FAIL rows with the numbers, per cycle or summarised. The tree-verify contracts of an
engine's cycle dump are ``workbench.conform.contracts``."""
from __future__ import annotations

import torch

from workbench.models.config_facts import RUN_DTYPES
from workbench.records.forward import ForwardRecord
from workbench.shapes.rows import CheckTable, fmt_shape
from workbench.shapes.tables import trace_of


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """bool [n, n]: out[i, j] is True when node j is node i or one of its ancestors."""
    n = int(parents.shape[0])
    out = torch.zeros(n, n, dtype=torch.bool)
    par = parents.tolist()
    for i in range(n):
        j, steps = i, 0
        while j >= 0 and steps <= n:  # steps bound: a malformed parent cycle cannot loop forever
            out[i, j] = True
            j, steps = par[j], steps + 1
    return out


def target_record(c) -> ForwardRecord | None:
    return next((r for r in c.forwards if r.model == "target"), None)


ADDITIVE_MASK_DTYPES = RUN_DTYPES  # an additive mask is in the dtype the model runs in


# Per cycle, each check reads (cycle, its target record, bs, n) and gives (ok, expected, got), or None where it
# does not apply to that cycle.
def _logits_rows(c, rec, bs, n):
    lg = rec.outputs.get("logits", {}).get("shape")
    got = lg[0] * lg[1] if lg and len(lg) == 3 else None
    return (got == bs * n, f"{bs} x {n} = {bs * n} rows ({rec.mode.value})",
            f"logits {fmt_shape(lg) if lg else 'missing'} = {got} rows")


def _hidden_states(c, rec, bs, n):
    ctx = rec.outputs.get("draft_context", {}).get("shape")
    hs = rec.outputs.get("hidden_states", {}).get("shape")
    ok = ctx is not None and ctx[:2] == [bs, n] and (hs is None or hs[1:3] == [bs, n])
    return (ok, f"[{bs}, {n}, F] context for {n} tokens",
            f"context {fmt_shape(ctx) if ctx else 'not captured'}, hidden {fmt_shape(hs) if hs else '-'}")


def _positions(c, rec, bs, n):
    want = c.start + c.depth
    bad = int((c.position_ids != want).sum())
    sib = sum(1 for p in set(c.parents.tolist()) if p >= 0 and int((c.parents == p).sum()) > 1)
    pos_shape = rec.inputs["positions"]["shape"]
    return (bad == 0 and pos_shape == [bs, n], f"{c.start} + depth for {n} nodes ({sib} sibling groups share a position)",
            f"{bad} of {n} differ; positions {fmt_shape(pos_shape)}")


def _tree_mask(c, rec, bs, n):
    if n <= 1:
        return None
    mask = rec.inputs.get("attention_mask", {}).get("shape")
    exp_shape = [bs, 1, n, c.start + n]
    wrong = int((c.visibility != ancestor_matrix(c.parents)).sum()) if c.visibility.shape == (n, n) else n * n
    return (mask == exp_shape and rec.kv_before == c.start and wrong == 0, f"{fmt_shape(exp_shape)}, ancestor pattern",
            f"{fmt_shape(mask) if mask else 'no mask'}, {wrong} entries off the ancestor pattern")


def _one_device(c, rec, bs, n):
    dev = rec.outputs.get("logits", {}).get("device")
    placed = [(f"{r.model}.{k}", d) for r in c.forwards for k, d in r.devices().items()]
    if dev is None or any(d == "unknown" for _, d in placed):
        return None
    off = [f"{k} on {d}" for k, d in placed if d != dev]
    return (not off, f"all {len(placed)} tensors on {dev} (the target's logits)",
            ", ".join(off[:3]) + (f" (+{len(off) - 3})" if len(off) > 3 else "") if off else f"all on {dev}")


def _index_dtypes(c, rec, bs, n):
    want_dt = {"input_ids": "int64", "positions": "int64", "attention_mask": "bool"}
    got_dt = {k: rec.inputs[k]["dtype"] for k in want_dt if k in rec.inputs}
    got_dt.update({k: str(getattr(c, k).dtype).replace("torch.", "")
                   for k in ("retrieve_next_token", "retrieve_next_sibling")})
    want_dt.update({"retrieve_next_token": "int64", "retrieve_next_sibling": "int64"})
    # This engine passes the mask additive (0 / -inf in the model's dtype, what SDPA adds as is);
    # it carries the same visibility as SGLang's bool mask.
    bad_dt = [f"{k} {v} (want {want_dt[k]})" for k, v in got_dt.items()
              if v != want_dt[k] and not (k == "attention_mask" and v in ADDITIVE_MASK_DTYPES)]
    return (not bad_dt, "ids, positions, retrieve arrays int64; mask bool (or additive float)",
            ", ".join(bad_dt) if bad_dt else ", ".join(f"{k} {v}" for k, v in got_dt.items()))


def _recurrent_state(c, rec, bs, n):
    if c.state_from is None:
        return None
    off = int((c.state_from != c.parents).sum())
    return (off == 0, f"each of {n} nodes continues its parent's conv window and state",
            f"{off} of {n} continue another node's")


KV_AFTER_COMMIT = "kv after commit = prefix + accepted + 1"
RECURRENT_STATE = "recurrent state from the parent"
# The rows in their order (the recurrent state's last, for a hybrid target); the KV check reads the next cycle
# (``_kv_after_commit``), after the others.
ROWS = ("logits rows = bs x tokens/request", "hidden states for all tokens", "positions = start + depth",
        "tree mask = ancestors", KV_AFTER_COMMIT, "verify inputs on the target's device", "index dtypes as SGLang's")
CYCLE_CHECKS = {"logits rows = bs x tokens/request": _logits_rows, "hidden states for all tokens": _hidden_states,
                "positions = start + depth": _positions, "tree mask = ancestors": _tree_mask,
                "verify inputs on the target's device": _one_device, "index dtypes as SGLang's": _index_dtypes,
                RECURRENT_STATE: _recurrent_state}


def _kv_after_commit(c, rec, kv_after):
    if kv_after is None:
        return None
    exp = c.start + c.accepted + 1
    return (kv_after == exp, f"{c.start} + {c.accepted} + 1 = {exp}",
            f"{kv_after} (verify grew it {rec.kv_before} -> {rec.kv_after})")


def _live_kv(obj, trace) -> int | None:
    """A session's live cache length (for its last cycle's KV check); None for a trace."""
    if trace is obj or not hasattr(obj, "kv_cache"):
        return None
    # The first attention layer's keys [1, kv_heads, len, head_dim] (a hybrid's linear layers come as a 3-D conv
    # window and its state).
    return next((int(k.shape[-2]) for k, _ in obj.kv_cache() if k.dim() == 4), None)


def _results(cycles: list, live_kv) -> dict[str, list]:
    """{check: [(cycle index, ok, expected, got)]} over the cycles where each check applies."""
    results: dict[str, list] = {k: [] for k in ROWS}
    if any(c.state_from is not None for c in cycles):  # a hybrid target: its linear layers' recurrent state
        results[RECURRENT_STATE] = []
    for i, c in enumerate(cycles):
        rec = target_record(c)
        n = int(c.tokens.shape[0])
        if rec is None:
            for k in results:
                results[k].append((c.index, False, "a target forward", "none recorded"))
            continue
        bs = rec.inputs["input_ids"]["shape"][0]
        for name, check in CYCLE_CHECKS.items():
            res = check(c, rec, bs, n)
            if res is not None:
                results[name].append((c.index, *res))
        nxt = target_record(cycles[i + 1]) if i + 1 < len(cycles) else None
        res = _kv_after_commit(c, rec, nxt.kv_before if nxt is not None else live_kv)
        if res is not None:
            results[KV_AFTER_COMMIT].append((c.index, *res))
    return results


def _rows(results: dict[str, list], per_cycle: bool) -> CheckTable:
    """One row per check (its first failure, else its first cycle), or with ``per_cycle`` one per check and cycle."""
    rows = CheckTable()
    for name, res in results.items():
        if per_cycle:
            rows += [{"check": name, "ok": ok, "result": "PASS" if ok else "FAIL", "cycles": str(ci),
                      "expected": e, "got": g} for ci, ok, e, g in res]
            continue
        if not res:
            rows.append({"check": name, "ok": True, "result": "n/a", "cycles": "0 applicable",
                         "expected": "", "got": ""})
            continue
        fails = [r for r in res if not r[1]]
        ci, ok, e, g = (fails or res)[0]
        where = f"{len(res) - len(fails)}/{len(res)} pass" + (f"; first failure: cycle {ci}" if fails else "")
        rows.append({"check": name, "ok": not fails, "result": "FAIL" if fails else "PASS", "cycles": where,
                     "expected": e, "got": g})
    return rows


def check_contracts(trace_or_session, per_cycle: bool = False) -> CheckTable:
    """Contract checks over every cycle, as PASS/FAIL rows with the numbers (first failure, else first cycle).

    - logits rows: bs x tokens-per-request (not bs) in TARGET_VERIFY;
    - hidden states (the drafter's context) for every verified token;
    - positions = start + depth, so siblings share a position;
    - tree mask [bs, 1, n, prefix + n] with exactly the ancestor-or-self pattern;
    - KV length after commit = prefix + accepted + 1 (the root), read from the next cycle's
      verify ``kv_before`` (or the live cache, for a session's last cycle);
    - every tensor of the cycle's forwards (drafter and verify, inputs and outputs) on the
      target's device, as SGLang's DFlash verify requires (dflash_utils.py: "candidates and
      next_token_logits must be on the same device"); records whose devices are unknown are not
      applicable;
    - index dtypes SGLang uses: input_ids and positions int64 (compute_position_torch's
      ``.to(torch.int64)``, DFlash's ``draft_token`` long), the tree mask bool (this engine's additive
      float mask carries the same visibility), the EAGLE retrieve
      arrays int64 (spec_tree's verify kernel). SGLang's int32 tensors (qo/kv indptr, accept
      index) have no counterpart in this engine's forward: see ``table(..., view="sglang")``.
    """
    obj = trace_or_session
    trace = trace_of(obj)
    cycles = list(trace.cycles)
    if not cycles:
        raise ValueError("the trace has no cycles to check; step() the session first")
    rows = _rows(_results(cycles, _live_kv(obj, trace)), per_cycle)
    rows.title = f"contracts of {trace.policy} over {len(cycles)} cycles"
    return rows
