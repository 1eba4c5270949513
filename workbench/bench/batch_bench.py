"""The batched bench (``bench --batch-size N``): every policy's batches of N requests against the same requests
run one after another, interleaved policy by policy (``compare_policies_batched``), and its table."""
from __future__ import annotations

import statistics

import torch

from workbench.engine import validate
from workbench.engine.core import clock
from workbench.engine.policies import DFlash, parse_policy
from workbench.records.texttable import legend, text_table


def batch_windows(n_prompts: int, batch_size: int) -> list[list[int]]:
    """Prompt indices of each batch: consecutive groups of ``batch_size``, the last filled by wrapping around,
    so every prompt runs at least once."""
    count = max(1, -(-n_prompts // batch_size))
    return [[(w * batch_size + j) % n_prompts for j in range(batch_size)] for w in range(count)]


def compare_policies_batched(engine, policies, prompts, batch_size: int, max_new_tokens: int = 64,
                             repeats: int = 3, warmup: bool = True, progress=None) -> dict:
    """``bench --batch-size N``: every policy's batches of N requests (``engine.batch_session``) against the
    same requests run one after another, the policies interleaved within each repeat (policy order rotated
    per repeat; each policy's sequential run right before its batch), so machine load hits all alike.

    Per policy and repeat: batch tok/s (wall, prefill included) and decode tok/s (tokens / cycle time),
    tau (accepted + bonus per row and cycle), the median batch cycle time, sequential tok/s and the batch's
    speedup over it, and the decode tok/s over DFlash's in the same repeat. Every repeat's figure is kept:
    none is hidden behind a percentile. Greedy; ``lossless``: every batch produced each request's own output."""
    pols = [parse_policy(p) if isinstance(p, str) else p for p in policies]
    if not pols:
        raise ValueError("batch bench needs at least one policy")
    validate.positive_ints(batch_size=batch_size, repeats=repeats, max_new_tokens=max_new_tokens)
    texts = [p["prompt"] if isinstance(p, dict) else p for p in prompts]
    if not texts:
        raise ValueError("prompts=[] is empty; give at least one prompt")
    groups = [[texts[i] for i in w] for w in batch_windows(len(texts), batch_size)]
    from tqdm.auto import tqdm

    bar = tqdm(total=len(pols) * 2 * len(groups) * (repeats + (1 if warmup else 0)), desc="batch bench", unit="run",
               leave=False, disable=(None if progress is None else not progress))
    if warmup:
        for p in pols:
            batched_pass(engine, p, groups, max_new_tokens, bar)
    per = {str(p): [] for p in pols}
    for r in range(repeats):
        k = r % len(pols)
        for p in pols[k:] + pols[:k]:
            per[str(p)].append(batched_pass(engine, p, groups, max_new_tokens, bar))
    bar.close()
    return {"batch_size": batch_size, "batches": len(groups), "prompts": len(texts), "max_new_tokens": max_new_tokens,
            "repeats": repeats, "device": str(engine.device), "threads": torch.get_num_threads(),
            "policies": policy_rows(per)}


def batched_pass(engine, policy, groups: list[list[str]], max_new_tokens: int, bar) -> dict:
    """One pass of ``policy`` over the batches: each batch's requests one after another, then as one batch.
    -> the pass's totals (tokens, seconds, cycle times, accepted lengths, whether the outputs agree)."""
    out = {"seq_tokens": 0, "seq_s": 0.0, "tokens": 0, "wall": 0.0, "cycle_s": 0.0, "steps": [], "acc": 0,
           "row_cycles": 0, "same": True}
    for reqs in groups:
        seq = []
        t0 = clock(engine.device)
        for p in reqs:
            s = engine.session(p, policy=policy, max_new_tokens=max_new_tokens, record_topk=1)
            s.run()
            seq.append(list(s.generated))
        t1 = clock(engine.device)
        bar.update(1)
        b = engine.batch_session(reqs, policy=policy, max_new_tokens=max_new_tokens, record_topk=1)
        b.run()
        t2 = clock(engine.device)
        bar.update(1)
        toks = [list(s.generated) for s in b.sessions]
        cycles = [c for t in b.traces for c in t.cycles]
        steps = [sum(bc.stage_seconds.values()) for bc in b.cycles]
        out["seq_tokens"] += sum(map(len, seq))
        out["seq_s"] += t1 - t0
        out["tokens"] += sum(map(len, toks))
        out["wall"] += t2 - t1
        out["cycle_s"] += sum(steps)
        out["steps"] += steps[1:]
        out["acc"] += sum(c.accept_length for c in cycles)
        out["row_cycles"] += len(cycles)
        out["committed"] = out.get("committed", 0) + sum(c.committed for c in cycles)
        out["same"] &= seq == toks
    return out


def policy_rows(per: dict[str, list[dict]]) -> dict[str, dict]:
    """{policy label: its figures per repeat and their medians} from each repeat's pass totals."""
    dflash = str(DFlash())
    out = {}
    for label, rs in per.items():
        dec = [x["committed"] / x["cycle_s"] if x["cycle_s"] > 0 else 0.0 for x in rs]
        row = {"tau": rs[0]["acc"] / rs[0]["row_cycles"] if rs[0]["row_cycles"] else 0.0,
               "batch_tok_s_per_repeat": [x["tokens"] / x["wall"] for x in rs],
               "decode_tok_s_per_repeat": dec,
               "cycle_ms_p50_per_repeat": [1e3 * statistics.median(x["steps"]) if x["steps"] else 0.0 for x in rs],
               "sequential_tok_s_per_repeat": [x["seq_tokens"] / x["seq_s"] for x in rs],
               "lossless": all(x["same"] for x in rs)}
        row["speedup_per_repeat"] = [b / s for b, s in zip(row["batch_tok_s_per_repeat"],
                                                           row["sequential_tok_s_per_repeat"])]
        out[label] = row
    for label, row in out.items():
        row["decode_vs_dflash_per_repeat"] = ([a / b for a, b in zip(row["decode_tok_s_per_repeat"],
                                                                    out[dflash]["decode_tok_s_per_repeat"])]
                                              if dflash in out else None)
        for key in ("batch_tok_s", "decode_tok_s", "cycle_ms_p50", "sequential_tok_s", "speedup", "decode_vs_dflash"):
            v = row[f"{key}_per_repeat"]
            row[key] = statistics.median(v) if v else None
    return out


def batch_policies_table(res: dict) -> str:
    """One line per policy; every repeat's speedup shown, so a slow repeat cannot hide behind a percentile."""
    def each(v, fmt=".2f"):
        return " ".join(format(x, fmt) for x in v) if v else "-"

    head = ["policy", "tau", "cycle ms p50", "batch tok/s", "decode tok/s", "seq tok/s", "batch/seq per repeat",
            "decode x DFlash per repeat", "lossless"]
    rows = [[label, f"{r['tau']:.2f}", f"{r['cycle_ms_p50']:.1f}", f"{r['batch_tok_s']:.1f}", f"{r['decode_tok_s']:.1f}",
             f"{r['sequential_tok_s']:.1f}", each(r["speedup_per_repeat"]), each(r["decode_vs_dflash_per_repeat"]),
             "yes" if r["lossless"] else "NO"] for label, r in res["policies"].items()]
    return (f"batches of {res['batch_size']} ({res['batches']} batch(es) over {res['prompts']} prompts, "
            f"{res['max_new_tokens']} new tokens each, {res['repeats']} repeat(s), policies interleaved; "
            f"{res['device']}, {res['threads']} threads); figures are medians over repeats unless 'per repeat'\n"
            + text_table(head, rows) + "\n" + legend([
                ("tau", "accepted + bonus per row and cycle, at this batch size"),
                ("cycle ms p50", "median time of one batched cycle (every row's draft, verify, accept, commit)"),
                ("batch tok/s", "new tokens of every row / wall time of the batch runs (prefill included)"),
                ("decode tok/s", "tokens the cycles committed / time in the cycles"),
                ("seq tok/s", "the same requests one after another, each its own session"),
                ("batch/seq per repeat", "batch tok/s over seq tok/s, each repeat"),
                ("decode x DFlash per repeat", "decode tok/s over DFlash's in the same repeat")]))
