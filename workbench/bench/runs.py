"""Benchmarks people can compare: policies side by side in one run, with the field's metrics.

Importable from a notebook::

    from workbench.bench.runs import bench, parse_policies
    res = bench(engine, parse_policies("ar,dflash,ddtree:32"), prompts, max_new_tokens=128)
    res.summary["DDTree(32)"]["speedup_vs_ar"]

Definitions (the conventions of Spec-Bench, vLLM and SGLang):

* ``tau``: mean accepted length per cycle, counting the bonus token (AR = 1); pooled over
  every cycle of every prompt (= committed tokens / verify forwards, SGLang's ``spec_accept_length``).
* ``tokens_per_s``: new tokens / wall time of the whole generation (prefill included, as
  Spec-Bench's ``wall_time``), summed over prompts. With repeats, the median over repeats of
  that pooled figure (so it lies inside ``tokens_per_s_range``). ``speedup_vs_ar``: the ratio to
  AR's, measured in the same run; with repeats, the median of the within-repeat ratios
  (``speedup_vs_ar_per_repeat``), inside ``speedup_vs_ar_range`` and the figure the order verdict
  ranks by. ``wall_time`` sums each prompt's median wall time over repeats.
* ``decode_tokens_per_s``: tokens committed by cycles / time in cycles (prefill excluded);
  ``decode_speedup_vs_ar`` is its ratio to AR's.
* ``accept_rate``: accepted drafted tokens / proposed drafted tokens. A tree proposes many
  branches but at most one root-to-leaf path can be accepted, so a cycle *proposes* the
  tokens of its deepest path (the tree's maximum depth; for DFlash the drafted block).
  ``None`` for AR, which drafts nothing.
* ``ceiling_speedup``: the decode speedup over AR the policy would reach if its cycles cost
  only their model forwards (the ``draft`` and ``verify`` stages: the drafter and target
  forwards with their sampling); everything else (tree build and compile, accept, commit and
  record keeping) free. It is ``(committed / forward time) / AR's decode_tokens_per_s``.
  ``ceiling_ratio`` = ``decode_speedup_vs_ar / ceiling_speedup`` = forward time / cycle time:
  the share of the policy's cycle time spent in the model forwards, <= 1 by construction
  (1.0 = nothing spent outside the forwards). AR's own ceiling is above 1 for the same reason.
* ``tokens_per_s_range``: [min, max] over repeats of the pooled tokens/s (each repeat: all
  prompts' new tokens / their wall times); ``None`` with one repeat, which shows no spread.
  ``tokens_per_s_per_repeat`` lists them; ``speedup_vs_ar_per_repeat`` divides each by AR's in the
  same repeat; ``tokens_per_s_per_prompt`` / ``speedup_vs_ar_per_prompt`` the same per prompt (its median
  wall time over repeats). ``workbench.analysis.order_verdict`` orders policies only where a paired test
  over these (by prompt or by repeat, whichever has more) separates them.
* ``lossless``: every greedy output (every repeat) equals AR's on the same prompt (``None``
  when not checked: no AR run, or sampling).
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

import torch

from workbench.records.cycle import STAGES, percentiles
from workbench.engine.core import clock
from workbench.engine.policies import AR, MAX_BUDGET, DFlash, Policy, parse_policy
from workbench.records.texttable import legend, text_table

# The stages that are the model forwards (with their sampling): the only cost the ceiling keeps.
FORWARD_STAGES = ("draft", "verify")


def parse_policies(text: str) -> list[Policy]:
    """'ar,dflash,ddtree:32' (or the labels the bench prints: 'AR,DDTree(16, width=1)') -> policies, in
    order. Raises ValueError (one line) on bad input."""
    names = [p.strip() for p in re.split(r",(?![^()]*\))", str(text)) if p.strip()]  # no split inside (...)
    if not names:
        raise ValueError(f"--policies {text!r} names no policy; e.g. 'ar,dflash,ddtree:32'")
    out: list[Policy] = []
    for n in names:
        p = parse_policy(n)
        if p in out:
            raise ValueError(f"policy {n!r} is listed twice in {text!r}")
        out.append(p)
    return out


def positive_ints(**values) -> None:
    """Refuse, in one line naming it, any of ``values`` that is not a positive integer."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive integer")


@dataclass
class Run:
    """One generation: what a bench row is made of."""

    policy: str
    tokens: list[int]
    text: str
    wall_time: float
    prefill_seconds: float
    accept_lengths: list[int]
    committed: int  # tokens committed by cycles (new_tokens minus the prefill's token)
    proposed: int  # drafted tokens on the deepest path of each cycle's tree, summed
    stage_seconds: dict
    finish_reason: str | None
    cycle_seconds: list = field(default_factory=list)  # per cycle: stage -> seconds
    setup_seconds: float = 0.0


def run_one(engine, policy: Policy, prompt: str, max_new_tokens: int, temperature: float = 0.0,
            seed: int = 0) -> Run:
    """Generate once and time it (wall time = prefill + all cycles, as Spec-Bench's)."""
    t0 = clock(engine.device)
    s = engine.session(prompt, policy=policy, temperature=temperature, seed=seed, max_new_tokens=max_new_tokens,
                       record_topk=1)
    trace = s.run()
    wall = clock(engine.device) - t0
    return Run(
        policy=str(policy), tokens=s.tokens, text=s.text, wall_time=wall, prefill_seconds=trace.prefill_seconds,
        accept_lengths=trace.accept_lengths, committed=sum(c.committed for c in trace.cycles),
        proposed=sum(int(c.depth.max()) if c.depth.numel() else 0 for c in trace.cycles),
        stage_seconds=trace.stage_seconds(), finish_reason=trace.finish_reason,
        cycle_seconds=[dict(c.stage_seconds) for c in trace.cycles], setup_seconds=trace.setup_seconds,
    )


@dataclass
class LosslessFailure:
    question_id: str
    policy: str
    position: int  # first differing generated-token index
    expected: int | None  # AR's token there (None: AR's output ended)
    got: int | None

    def __str__(self) -> str:
        return (f"lossless check failed: {self.policy} differs from AR on prompt {self.question_id!r} at generated "
                f"token {self.position} (AR: {self.expected}, {self.policy}: {self.got})")


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class BenchResult:
    rows: list[dict]  # one per (prompt, policy): Spec-Bench fields plus ours
    summary: dict  # {policy label: {tau, tokens_per_s, speedup_vs_ar, ...}}
    failures: list[LosslessFailure] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    @property
    def lossless(self) -> bool:
        return not self.failures


def _median_run(runs: list[Run]) -> dict:
    """Median over repeats: wall time and stage times; counts come from the first run (greedy is deterministic)."""
    first = runs[0]
    return {
        "wall_time": statistics.median(r.wall_time for r in runs),
        "wall_times": [r.wall_time for r in runs],
        "prefill_seconds": statistics.median(r.prefill_seconds for r in runs),
        "stage_seconds": {s: statistics.median(r.stage_seconds.get(s, 0.0) for r in runs) for s in STAGES},
        "first": first,
        "runs": runs,
    }


def bench(engine, policies, prompts, max_new_tokens: int = 128, repeats: int = 1, check_lossless: bool = False,
          progress=None, warmup: bool = True, temperature: float = 0.0, seed: int = 0) -> BenchResult:
    """Run every policy on every prompt, interleaved prompt by prompt (A B C A B C ...), after a warm-up.

    policies: Policy objects or strings ('ar', 'ddtree:32'); prompts: [{id, prompt}] (see
    workbench.shipped). With ``check_lossless`` AR is added when missing (it is the reference).
    progress: True / False, or None for a tqdm bar on stderr only when stderr is a terminal.
    ``temperature`` > 0 samples, every run from ``seed`` (repeats draw the same tokens, so their times compare).
    """
    pols = [parse_policy(p) if isinstance(p, str) else p for p in policies]
    if not pols:
        raise ValueError("bench needs at least one policy")
    positive_ints(repeats=repeats, max_new_tokens=max_new_tokens)
    prompts = list(prompts)
    if not prompts:
        raise ValueError("bench needs at least one prompt")
    from workbench.engine import validate

    validate.temperature(temperature), validate.seed(seed)
    if check_lossless and temperature != 0.0:
        raise ValueError("the lossless check compares greedy outputs; use temperature=0")
    for item in prompts:  # fail before the run, not in the middle of it
        n = len(engine.tokenizer(item["prompt"], add_special_tokens=False)["input_ids"])
        if not 0 < n < engine.models.max_positions:
            raise ValueError(f"prompt {item['id']!r} is {n} tokens; the target takes 1 to "
                             f"{engine.models.max_positions - 1}")
    if check_lossless and AR() not in pols:
        pols = [AR(), *pols]
    labels = [str(p) for p in pols]

    from tqdm.auto import tqdm

    # The warm-up is counted in the bar too: on a CPU it can take a while, and silence reads as a hang.
    bar = tqdm(total=(len(pols) if warmup else 0) + len(prompts) * repeats * len(pols), desc="bench", unit="gen",
               leave=False, disable=(None if progress is None else not progress))
    runs: dict[tuple[int, str], list[Run]] = {}  # (prompt index, policy label): ids need not be unique
    try:
        if warmup:  # first calls pay for allocation and kernel selection; keep them out of the numbers
            for p in pols:
                bar.set_postfix_str(f"warm-up {p}", refresh=True)
                run_one(engine, p, prompts[0]["prompt"], min(max_new_tokens, 16), temperature, seed)
                bar.update(1)
        for i, item in enumerate(prompts):
            for _ in range(repeats):
                for p in pols:
                    bar.set_postfix_str(f"{item['id']} {p}", refresh=False)
                    r = run_one(engine, p, item["prompt"], max_new_tokens, temperature, seed)
                    runs.setdefault((i, str(p)), []).append(r)
                    bar.update(1)
    finally:
        bar.close()

    rows = []
    med: dict[tuple[int, str], dict] = {}
    for i, item in enumerate(prompts):
        for label in labels:
            m = med[i, label] = _median_run(runs[i, label])
            f: Run = m["first"]
            decode_s = sum(m["stage_seconds"].values())
            rows.append({
                # Spec-Bench fields
                "question_id": item["id"], "new_tokens": len(f.tokens), "wall_time": m["wall_time"],
                "accept_lengths": f.accept_lengths, "decoding_steps": len(f.accept_lengths),
                # ours
                "policy": label,
                "tau": sum(f.accept_lengths) / len(f.accept_lengths) if f.accept_lengths else 0.0,
                "tokens_per_s": len(f.tokens) / m["wall_time"] if m["wall_time"] > 0 else 0.0,
                "decode_tokens_per_s": f.committed / decode_s if decode_s > 0 else 0.0,
                "stage_seconds": m["stage_seconds"], "prefill_seconds": m["prefill_seconds"],
                "wall_times": m["wall_times"], "finish_reason": f.finish_reason, "text": f.text,
            })

    failures: list[LosslessFailure] = []
    can_check = temperature == 0.0 and "AR" in labels
    if can_check:  # every run (repeats too) against AR's first
        for i, item in enumerate(prompts):
            ref = runs[i, "AR"][0].tokens
            for label in labels:
                for r in runs[i, label]:
                    pos = first_difference(ref, r.tokens)
                    if pos is not None:
                        failures.append(LosslessFailure(item["id"], label, pos, ref[pos] if pos < len(ref) else None,
                                                        r.tokens[pos] if pos < len(r.tokens) else None))
                        break

    summary = summarize(med, prompts, labels, failures if can_check else None)
    settings = {"policies": labels, "prompts": len(prompts), "prompt_ids": [p["id"] for p in prompts],
                "max_new_tokens": max_new_tokens, "repeats": repeats, "warmup": warmup,
                "temperature": temperature, "seeds": [seed], "device": str(engine.device),
                "dtype": str(engine.models.dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
                "kernel_backend": engine.kernel_backend, "versions": versions()}
    return BenchResult(rows, summary, failures, settings)


def versions() -> dict:
    """The versions a benchmark's numbers depend on."""
    import platform

    import transformers

    from workbench.version import __version__

    out = {"workbench": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version()}
    try:
        from importlib.metadata import version

        out["sglang"] = version("sglang")
    except Exception:  # noqa: BLE001 - not installed
        out["sglang"] = None
    return out


def bench_json(res: "BenchResult") -> dict:
    """What ``bench --json`` prints: the run's settings, then one summary per policy label."""
    return {"settings": res.settings, **res.summary}


def summarize(med: dict, prompts: list[dict], labels: list[str], failures) -> dict:
    """Pool per-prompt medians into one line per policy (see the module docstring for definitions)."""
    out: dict[str, dict] = {}
    for label in labels:
        ms = [med[i, label] for i in range(len(prompts))]
        firsts: list[Run] = [m["first"] for m in ms]
        cycles = sum(len(f.accept_lengths) for f in firsts)
        new_tokens = sum(len(f.tokens) for f in firsts)
        committed = sum(f.committed for f in firsts)
        wall = sum(m["wall_time"] for m in ms)
        stages = {s: sum(m["stage_seconds"][s] for m in ms) for s in STAGES}
        decode_s = sum(stages.values())
        proposed = sum(f.proposed for f in firsts)
        accepted = sum(sum(f.accept_lengths) - len(f.accept_lengths) for f in firsts)
        forward_s = sum(stages[k] for k in FORWARD_STAGES)
        n_rep = min(len(m["runs"]) for m in ms)
        per_repeat = [sum(len(m["runs"][r].tokens) for m in ms) / max(sum(m["runs"][r].wall_time for m in ms), 1e-12)
                      for r in range(n_rep)]
        out[label] = {
            "tau": sum(sum(f.accept_lengths) for f in firsts) / cycles if cycles else 0.0,
            # with repeats, the median over them: a point inside its own range (per-prompt medians summed
            # can fall outside every repeat's figure) and the one the order verdict ranks by
            "tokens_per_s": (statistics.median(per_repeat) if n_rep > 1 else new_tokens / wall if wall > 0 else 0.0),
            "decode_tokens_per_s": committed / decode_s if decode_s > 0 else 0.0,
            "accept_rate": (accepted / proposed if proposed else 0.0) if label != "AR" else None,
            "lossless": None if failures is None else not any(x.policy == label for x in failures),
            "stage_seconds": stages,
            "stage_seconds_per_cycle": {s: v / cycles if cycles else 0.0 for s, v in stages.items()},
            "cycles": cycles, "new_tokens": new_tokens, "wall_time": wall,
            "wall_time_s": wall,
            **cycle_tails([r for m in ms for r in m["runs"]]),
            "forward_tokens_per_s": committed / forward_s if forward_s > 0 else 0.0,
            "tokens_per_s_range": [min(per_repeat), max(per_repeat)] if n_rep > 1 else None,
            "tokens_per_s_per_repeat": per_repeat,
            # per prompt (its median wall time over repeats): the paired units order_verdict prefers
            "tokens_per_s_per_prompt": [len(m["first"].tokens) / m["wall_time"] if m["wall_time"] > 0 else 0.0
                                        for m in ms],
        }
    ar = out.get("AR")
    dflash = out.get(str(DFlash()))
    ar_decode = ar["decode_tokens_per_s"] if ar else None
    for label, s in out.items():
        # within each repeat (interleaved: the same pass over the prompts), so a slow pass cancels
        s["speedup_vs_ar_per_repeat"] = ([a / b for a, b in zip(s["tokens_per_s_per_repeat"],
                                                               ar["tokens_per_s_per_repeat"])] if ar else None)
        s["speedup_vs_ar_per_prompt"] = ([a / b if b else 0.0 for a, b in zip(s["tokens_per_s_per_prompt"],
                                                                          ar["tokens_per_s_per_prompt"])]
                                         if ar else None)
        per = s["speedup_vs_ar_per_repeat"]
        s["speedup_vs_ar"] = (statistics.median(per) if per and len(per) > 1 else
                              s["tokens_per_s"] / ar["tokens_per_s"] if ar and ar["tokens_per_s"] else None)
        s["speedup_vs_ar_range"] = [min(per), max(per)] if per and len(per) > 1 else None
        s["decode_speedup_vs_ar"] = (s["decode_tokens_per_s"] / ar["decode_tokens_per_s"]
                                     if ar and ar["decode_tokens_per_s"] else None)
        s["speedup_vs_dflash"] = (s["tokens_per_s"] / dflash["tokens_per_s"]
                                  if dflash and dflash["tokens_per_s"] else None)
        # decode_speedup / ceiling = forward time / cycle time (the same tokens divided by each): <= 1
        s["ceiling_speedup"] = s["forward_tokens_per_s"] / ar_decode if ar_decode and s["forward_tokens_per_s"] else None
        s["ceiling_ratio"] = (s["decode_speedup_vs_ar"] / s["ceiling_speedup"]
                              if s["ceiling_speedup"] and s["decode_speedup_vs_ar"] is not None else None)
    return out


def cycle_tails(runs: list[Run]) -> dict:
    """Per-stage p50/p90/max over the steady cycles of ``runs`` (each run's first cycle left out), and
    the time outside them, as medians per generation: session start, prefill, the first cycle, and
    the rest of the wall time (the run loop, Python between cycles)."""
    steady = [c for r in runs for c in r.cycle_seconds[1:]]
    cols = {st: [c.get(st, 0.0) for c in steady] for st in STAGES}
    cols["cycle"] = [sum(c.values()) for c in steady]
    firsts = [sum(r.cycle_seconds[0].values()) if r.cycle_seconds else 0.0 for r in runs]
    rest = [r.wall_time - r.setup_seconds - r.prefill_seconds - sum(sum(c.values()) for c in r.cycle_seconds)
            for r in runs]
    pct = {st: percentiles(v) for st, v in cols.items()}
    outside = {"setup": statistics.median(r.setup_seconds for r in runs),
               "prefill": statistics.median(r.prefill_seconds for r in runs),
               "first_cycle": statistics.median(firsts), "between_cycles": statistics.median(rest)}
    return {
        "stage_percentiles": pct, "outside_cycles": outside,  # seconds (older readers use these keys)
        "stage_percentiles_ms": {st: {f"{q}_ms": 1e3 * v for q, v in d.items()} for st, d in pct.items()},
        "outside_cycles_ms": {f"{k}_ms": 1e3 * v for k, v in outside.items()},
    }


def percentile_table(summary: dict) -> str:
    """Per policy: ms per steady cycle for each stage as p50 / p90 / max, then the time outside the cycles
    (medians over generations). Aligned at any width; a legend names every column."""
    cols = ["cycle", *STAGES]
    head = ["policy", *(f"{c} p50/p90/max" for c in cols), "setup", "prefill", "1st cycle", "between"]
    rows = []
    for label, s in summary.items():
        pc = s["stage_percentiles"]
        o = s["outside_cycles"]
        rows.append([label, *("/".join(format(1e3 * pc[c][q], ".2f") for q in ("p50", "p90", "max")) for c in cols),
                     *(f"{1e3 * o[k]:.1f}" for k in ("setup", "prefill", "first_cycle", "between_cycles"))])
    return ("ms per cycle, p50/p90/max over steady cycles (each run's first cycle left out); then ms outside "
            "the cycles, median per generation\n" + text_table(head, rows) + "\n" + legend([
                ("cycle", "a whole steady cycle (the sum of its stages)"),
                ("draft .. other", "one stage of the cycle (the engine's stages; 'accept' is the accept walk)"),
                ("setup", "session start before the prefill"), ("prefill", "the target's prefill forward"),
                ("1st cycle", "the first cycle (cold: allocation, kernel selection), left out above"),
                ("between", "wall time outside prefill and cycles (the run loop)")]))


SUMMARY_KEYS = ("tau", "tokens_per_s", "speedup_vs_ar", "accept_rate", "lossless", "stage_seconds",
                "ceiling_speedup")


def summary_table(summary: dict) -> str:
    """A plain-text table of the summary (one line per policy), aligned, with a legend of every column."""
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    def spread(r):
        return "-" if not r else f"{r[0]:.1f}-{r[1]:.1f}"

    head = ["policy", "tau", "tok/s", "tok/s range", "vs AR", "vs DFlash", "acc/drafted", "decode x", "ceiling",
            "fwd share", "lossless", "draft", "tree", "verify", "accept", "commit"]
    rows = []
    for label, s in summary.items():
        pc = s["stage_seconds_per_cycle"]
        tree = pc["tree_build"] + pc["tree_compile"]
        lossless = "-" if s["lossless"] is None else ("yes" if s["lossless"] else "NO")
        rows.append([label, f"{s['tau']:.2f}", f"{s['tokens_per_s']:.1f}", spread(s.get("tokens_per_s_range")),
                     f(s["speedup_vs_ar"], ".2f"), f(s["speedup_vs_dflash"], ".2f"), f(s["accept_rate"], ".2f"),
                     f(s["decode_speedup_vs_ar"], ".2f"), f(s["ceiling_speedup"], ".2f"), f(s["ceiling_ratio"], ".0%"),
                     lossless, *(f"{1e3 * v:.2f}" for v in (pc["draft"], tree, pc["verify"], pc["accept"],
                                                           pc["commit"]))])
    return text_table(head, rows) + "\n" + legend([
        ("tau", "mean accepted length per cycle, the bonus token counted (AR = 1)"),
        ("tok/s", "new tokens / wall time, prefill included (each prompt: median over repeats)"),
        ("tok/s range", "min-max tok/s over repeats ('-': one repeat shows no spread; use --repeats 3)"),
        ("vs AR, vs DFlash", "tok/s over AR's / DFlash's, measured in this run"),
        ("acc/drafted", "accepted drafted tokens / drafted tokens on each cycle's deepest path"),
        ("decode x", "speedup over AR of the cycles alone (prefill left out)"),
        ("ceiling", "that speedup if only the model forwards (draft, verify) cost time"),
        ("fwd share", "decode x / ceiling = share of cycle time in the forwards (<= 100%)"),
        ("lossless", "every greedy output equals AR's ('-': not checked)"),
        ("draft .. commit", "MEAN ms per cycle in that stage (tree = build + compile; accept = the accept walk)"),
    ])


# ---------------------------------------------------------------------------------------------- batched
def batch_windows(n_prompts: int, batch_size: int) -> list[list[int]]:
    """Prompt indices of each batch: consecutive groups of ``batch_size``, the last filled by wrapping around,
    so every prompt runs at least once."""
    count = max(1, -(-n_prompts // batch_size))
    return [[(w * batch_size + j) % n_prompts for j in range(batch_size)] for w in range(count)]


def batch_policies_bench(engine, policies, prompts, batch_size: int, max_new_tokens: int = 64, repeats: int = 3,
                         warmup: bool = True, progress=None) -> dict:
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
    positive_ints(batch_size=batch_size, repeats=repeats, max_new_tokens=max_new_tokens)
    texts = [p["prompt"] if isinstance(p, dict) else p for p in prompts]
    if not texts:
        raise ValueError("prompts=[] is empty; give at least one prompt")
    groups = [[texts[i] for i in w] for w in batch_windows(len(texts), batch_size)]
    from tqdm.auto import tqdm

    bar = tqdm(total=len(pols) * 2 * len(groups) * (repeats + (1 if warmup else 0)), desc="batch bench", unit="run",
               leave=False, disable=(None if progress is None else not progress))

    def run(policy):
        out = {"seq_tokens": 0, "seq_s": 0.0, "tokens": 0, "wall": 0.0, "cycle_s": 0.0, "steps": [], "acc": 0,
               "row_cycles": 0, "same": True}
        for reqs in groups:
            seq = []
            t0 = clock(engine.device)
            for p in reqs:
                s = engine.session(p, policy=policy, max_new_tokens=max_new_tokens, record_topk=1)
                s.run()
                seq.append(s.tokens)
            t1 = clock(engine.device)
            bar.update(1)
            b = engine.batch_session(reqs, policy=policy, max_new_tokens=max_new_tokens, record_topk=1)
            b.run()
            t2 = clock(engine.device)
            bar.update(1)
            toks = [s.tokens for s in b.sessions]
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

    if warmup:
        for p in pols:
            run(p)
    per = {str(p): [] for p in pols}
    for r in range(repeats):
        k = r % len(pols)
        for p in pols[k:] + pols[:k]:
            per[str(p)].append(run(p))
    bar.close()
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
    return {"batch_size": batch_size, "batches": len(groups), "prompts": len(texts), "max_new_tokens": max_new_tokens,
            "repeats": repeats, "device": str(engine.device), "threads": torch.get_num_threads(), "policies": out}


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


# ---------------------------------------------------------------------------------------------- kernels
KERNEL_BUDGETS = (16, 32, 64, 128, 256, 512, 1024)


def _times(fn, repeats: int, device: torch.device) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn()``, after one warm-up call."""
    fn()
    ts = []
    for _ in range(repeats):
        t0 = clock(device)
        fn()
        ts.append(clock(device) - t0)
    return ts


def _time(fn, repeats: int, device: torch.device) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls, after one warm-up call."""
    return statistics.median(_times(fn, repeats, device))


def _timed(row: dict, key: str, fn, repeats: int, device) -> float:
    """Time ``fn`` into row[key + '_s'] (median) and row[key + '_range_s'] ([min, max] over the calls)."""
    ts = _times(fn, repeats, device)
    row[f"{key}_s"], row[f"{key}_range_s"] = statistics.median(ts), [min(ts), max(ts)]
    return row[f"{key}_s"]


def _path_choice(tree) -> torch.Tensor:
    """A target 'choice' per node that accepts the tree's deepest root-to-leaf path (the longest walk)."""
    n = tree.n
    parents = tree.parents[0].tolist()
    tokens = tree.tokens[0].tolist()
    depth = tree.depth[0].tolist()
    choice = torch.full((1, n), -1, dtype=torch.long)  # no node carries token -1: the walk stops there
    node = depth.index(max(depth))
    while parents[node] >= 0:
        choice[0, parents[node]] = tokens[node]
        node = parents[node]
    return choice


def kernel_bench(budgets=KERNEL_BUDGETS, repeats: int = 10, device="cpu", depth: int = 15, vocab: int = 4096,
                 backends=("torch", "sglang"), seed: int = 0, progress=None) -> dict:
    """Micro-benchmarks of the tree kernels, medians side by side in one run.

    tree_build: vectorized ``build_tree`` vs a host heap over the top-k (``build_tree_host_heap``, the
    plain baseline) on random log-probs [1, depth, vocab], and build + compile together;
    accept: the accept walk through each backend on that tree (torch vs SGLang's Triton kernel,
    under Triton's interpreter on a CPU); kv_compact: ``compact_kv`` vs the per-row loop oracle.
    Unavailable backends are reported with an ``error`` instead of a time.
    """
    from tqdm.auto import tqdm

    from ddtree_kernels import accept, build_tree, check_backend, compact_kv, compile_tree
    from ddtree_kernels.oracles import build_tree_host_heap, compact_kv_loop
    from workbench.engine.loading import resolve_device

    dev = resolve_device(device)
    budgets = [int(b) for b in budgets]
    twice = sorted({b for b in budgets if budgets.count(b) > 1})
    if twice:
        raise ValueError(f"budget {twice[0]} is given twice; give each budget once")
    for b in budgets:
        if b < 1:
            raise ValueError(f"budget {b} must be a positive integer")
        if b > MAX_BUDGET:
            raise ValueError(f"budget {b} is absurdly large; the limit is {MAX_BUDGET} nodes, as for DDTree")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be a positive integer")
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(1, depth, vocab, generator=g) * 3, dim=-1).to(dev)
    root = torch.tensor([1], device=dev)
    heads, head_dim, prefix = 8, 64, 512

    available = {}
    for b in backends:
        try:
            check_backend(b)
            available[b] = None
        except (ValueError, RuntimeError) as e:
            available[b] = str(e)

    out = {"device": str(dev), "threads": torch.get_num_threads(), "logprobs_shape": [1, depth, vocab],
           "repeats": repeats, "seed": seed, "versions": versions(), "tree_build": [], "accept": [], "kv_compact": []}
    # Three steps per budget (tree build, accept walk, KV compaction), so a large budget shows progress.
    bar = tqdm(total=3 * len(budgets), desc="kernels", unit="step", leave=False,
               disable=(None if progress is None else not progress))
    for b in budgets:
        bar.set_postfix_str(f"budget {b}: tree build", refresh=True)
        row = {"budget": b}
        vec = _timed(row, "vectorized", lambda: build_tree(lp, root, b), repeats, dev)
        heap = _timed(row, "heap", lambda: build_tree_host_heap(lp, root, b), repeats, dev)
        both = _timed(row, "build_compile", lambda: compile_tree(build_tree(lp, root, b), prefix, depth), repeats, dev)
        row["heap_over_vectorized"] = heap / vec
        # build + compile runs the build, so it cannot truly be faster: a busy machine measured one of them
        why = []
        if both < vec:
            why.append(f"build+compile ({1e6 * both:.0f} us) < build alone ({1e6 * vec:.0f} us)")
        # On a CPU build_tree *is* a host heap: the two medians cannot truly differ several times over.
        if dev.type == "cpu" and not 0.5 <= heap / vec <= 2:
            why.append(f"heap ({1e6 * heap:.0f} us) and build_tree ({1e6 * vec:.0f} us) run the same host heap on a "
                       f"CPU yet differ {max(heap / vec, vec / heap):.1f}x")
        if why:
            row["contradiction"] = "; ".join(why) + ": the machine was busy during one of them; rerun on an idle machine"
        if dev.type == "cuda":  # the build must not wait on the host: torch raises on a synchronising call
            try:  # steady state: the per-budget candidate table was built (and cached) by the calls above
                torch.cuda.set_sync_debug_mode("error")
                build_tree(lp, root, b)
                row["host_sync_free"] = True
            except RuntimeError:
                row["host_sync_free"] = False
            finally:
                torch.cuda.set_sync_debug_mode("default")
        out["tree_build"].append(row)
        bar.update(1)
        bar.set_postfix_str(f"budget {b}: accept walk", refresh=True)

        tree = build_tree(lp, root, b)
        ct = compile_tree(tree, prefix, depth)
        choice = _path_choice(tree).to(dev)
        arow = {"budget": b, "nodes": tree.n}
        for name, err in available.items():
            if err is not None:
                arow[f"{name}_s"], arow[f"{name}_error"] = None, err
                continue
            _timed(arow, name, lambda name=name: accept(name, tree, ct, choice, depth), repeats, dev)
        if arow.get("torch_s") and arow.get("sglang_s"):
            arow["sglang_over_torch"] = arow["sglang_s"] / arow["torch_s"]
        out["accept"].append(arow)
        bar.update(1)
        bar.set_postfix_str(f"budget {b}: KV compaction", refresh=True)

        acc = accept("torch", tree, ct, choice, depth)
        nodes = acc.index[0, : int(acc.length[0]) + 1]
        kv = torch.randn(1, heads, prefix + tree.n, head_dim, generator=g).to(dev)
        krow = {"budget": b, "accepted": int(nodes.numel()), "kv_shape": list(kv.shape)}
        fast = _timed(krow, "compact_kv", lambda: compact_kv(kv, prefix, nodes), repeats, dev)
        loop = _timed(krow, "loop", lambda: compact_kv_loop(kv, prefix, nodes.tolist()), repeats, dev)
        krow["loop_over_compact"] = loop / fast
        out["kv_compact"].append(krow)
        bar.update(1)
    bar.close()
    return out


def kernel_table(res: dict) -> str:
    """The kernel medians with their min-max over the timed calls; contradictory rows flagged '!'."""
    def us(v):
        return "n/a" if v is None else f"{1e6 * v:.0f}"

    def rng(r, key):
        v = r.get(f"{key}_range_s")
        return "-" if not v else f"{1e6 * v[0]:.0f}-{1e6 * v[1]:.0f}"

    tb = res["tree_build"]
    sync = bool(tb) and "host_sync_free" in tb[0]
    head = ["tree build", "budget", "build_tree", "range", "heap", "range", "heap/ours", "build+compile", "range",
            *(["sync-free"] if sync else []), "flag"]
    rows = [["", str(r["budget"]), us(r["vectorized_s"]), rng(r, "vectorized"), us(r["heap_s"]), rng(r, "heap"),
             f"{r['heap_over_vectorized']:.2g}", us(r["build_compile_s"]), rng(r, "build_compile"),
             *([str(r["host_sync_free"])] if sync else []), "!" if "contradiction" in r else ""] for r in tb]
    lines = [f"device {res['device']}, {res['threads']} threads, log-probs {res['logprobs_shape']}; "
             f"microseconds: median of {res['repeats']} calls, range = min-max over them", "",
             text_table(head, rows)]
    lines += [f"  ! budget {r['budget']}: {r['contradiction']}" for r in tb if "contradiction" in r]
    arows = [["", str(r["budget"]), str(r["nodes"]), us(r.get("torch_s")), rng(r, "torch"), us(r.get("sglang_s")),
              rng(r, "sglang"), f"{r['sglang_over_torch']:.1f}" if "sglang_over_torch" in r else "-"]
             for r in res["accept"]]
    lines += ["", text_table(["accept walk", "budget", "nodes", "torch", "range", "sglang", "range", "sglang/torch"],
                             arows)]
    errs = {k: v for r in res["accept"] for k, v in r.items() if k.endswith("_error")}
    for k, v in errs.items():
        lines.append(f"{'':16}{k[:-6]}: {v}")
    krows = [["", str(r["budget"]), str(r["accepted"]), us(r["compact_kv_s"]), rng(r, "compact_kv"), us(r["loop_s"]),
              rng(r, "loop"), f"{r['loop_over_compact']:.1f}"] for r in res["kv_compact"]]
    lines += ["", text_table(["kv compaction", "budget", "accepted", "compact_kv", "range", "loop", "range",
                              "loop/compact"], krows)]
    lines += ["", legend([
        ("build_tree", "our tree build (host heap on a CPU, vectorized on a GPU)"),
        ("heap", "the plain baseline: top-k, one copy to the host, a Python heap"),
        ("heap/ours", "heap median / build_tree median (> 1: ours faster)"),
        ("build+compile", "build_tree then compile_tree (verify inputs); never truly below build_tree alone"),
        ("flag", "'!': the row's measurements contradict each other (a busy machine); see the note"),
        ("accept walk", "the walk through each backend; sglang = SGLang's kernel (Triton interpreter on a CPU)"),
        ("kv compaction", "compact_kv vs a per-row loop over the accepted rows")])]
    return "\n".join(lines)
