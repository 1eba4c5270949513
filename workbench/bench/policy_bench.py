"""The policy bench (``python -m workbench bench``): policies side by side in one run, with the field's metrics.

Written against the engine interface (``workbench.interface.base``): any registered engine's sessions run it
(``bench --engine NAME``). The batched bench is ``workbench.bench.batch_bench``, the kernels' micro-bench
``workbench.bench.kernel_bench``.

Importable from a notebook::

    from workbench.bench.policy_bench import compare_policies
    res = compare_policies(engine, ["ar", "dflash", "ddtree:32"], prompts, max_new_tokens=128)
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

import statistics
from dataclasses import dataclass, field

import torch

from workbench.bench.versions import versions
from workbench.engine import validate
from workbench.engine.core import clock
from workbench.engine.policies import AR, DFlash, Policy, parse_policy
from workbench.records.cycle import STAGES, percentiles
from workbench.records.texttable import legend, text_table

# The stages that are the model forwards (with their sampling): the only cost the ceiling keeps.
FORWARD_STAGES = ("draft", "verify")


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
    dtype: str | None = None  # what the engine ran in, as its trace records it
    kernel_backend: str | None = None  # the session's accept-walk kernels


def run_one(engine, policy: Policy, prompt: str, max_new_tokens: int, temperature: float = 0.0,
            seed: int = 0) -> Run:
    """Generate once and time it (wall time = prefill + all cycles, as Spec-Bench's). Only what the engine
    interface declares is read (``BaseEngine.session``, ``BaseSession.run``/``generated``/``text``), so any
    registered engine runs it."""
    t0 = clock(engine.device)
    s = engine.session(prompt, policy=policy, temperature=temperature, seed=seed, max_new_tokens=max_new_tokens,
                       record_topk=1)
    trace = s.run()
    wall = clock(engine.device) - t0
    return Run(
        policy=str(policy), tokens=list(s.generated), text=s.text, wall_time=wall, prefill_seconds=trace.prefill_seconds,
        accept_lengths=trace.accept_lengths, committed=sum(c.committed for c in trace.cycles),
        proposed=sum(int(c.depth.max()) if c.depth.numel() else 0 for c in trace.cycles),
        stage_seconds=trace.stage_seconds(), finish_reason=trace.finish_reason,
        cycle_seconds=[dict(c.stage_seconds) for c in trace.cycles], setup_seconds=trace.setup_seconds,
        dtype=trace.meta.get("dtype"), kernel_backend=s.kernel_backend,
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


def compare_policies(engine, policies, prompts, max_new_tokens: int = 128, repeats: int = 1,
                     check_lossless: bool = False, progress=None, warmup: bool = True, temperature: float = 0.0,
                     seed: int = 0) -> BenchResult:
    """Run every policy on every prompt, interleaved prompt by prompt (A B C A B C ...), after a warm-up.

    policies: Policy objects or strings ('ar', 'ddtree:32'); prompts: [{id, prompt}] (see
    workbench.shipped). With ``check_lossless`` AR is added when missing (it is the reference).
    progress: True / False, or None for a tqdm bar on stderr only when stderr is a terminal.
    ``temperature`` > 0 samples, every run from ``seed`` (repeats draw the same tokens, so their times compare).
    """
    pols = [parse_policy(p) if isinstance(p, str) else p for p in policies]
    if not pols:
        raise ValueError("bench needs at least one policy")
    validate.positive_ints(repeats=repeats, max_new_tokens=max_new_tokens)
    prompts = list(prompts)
    if not prompts:
        raise ValueError("bench needs at least one prompt")
    validate.temperature(temperature), validate.seed(seed)
    if check_lossless and temperature != 0.0:
        raise ValueError("the lossless check compares greedy outputs; use temperature=0")
    check_prompt_lengths(engine, prompts)
    if check_lossless and AR() not in pols:
        pols = [AR(), *pols]
    labels = [str(p) for p in pols]
    runs = timed_runs(engine, pols, prompts, max_new_tokens, repeats, warmup, temperature, seed, progress)
    med = {(i, label): _median_run(runs[i, label]) for i in range(len(prompts)) for label in labels}
    rows = [prompt_row(item, label, med[i, label]) for i, item in enumerate(prompts) for label in labels]
    can_check = temperature == 0.0 and "AR" in labels
    failures = lossless_failures(prompts, labels, runs) if can_check else []
    summary = summarize(med, prompts, labels, failures if can_check else None)
    first = runs[0, labels[0]][0]  # what the engine ran in, as its sessions recorded it
    settings = {"policies": labels, "prompts": len(prompts), "prompt_ids": [p["id"] for p in prompts],
                "max_new_tokens": max_new_tokens, "repeats": repeats, "warmup": warmup,
                "temperature": temperature, "seeds": [seed], "device": str(engine.device),
                "dtype": first.dtype, "threads": torch.get_num_threads(), "kernel_backend": first.kernel_backend,
                "versions": versions()}
    return BenchResult(rows, summary, failures, settings)


def check_prompt_lengths(engine, prompts: list[dict]) -> None:
    """Fail before the run, not in the middle of it. The interface declares no position limit: an engine that
    holds its pair's facts (the workbench's, and engines built on it) is checked here, another refuses a
    prompt too long for it when its session starts."""
    positions = getattr(getattr(engine, "models", None), "max_positions", None)
    for item in prompts:
        n = len(engine.tokenizer(item["prompt"], add_special_tokens=False)["input_ids"])
        if n < 1 or (positions is not None and n >= positions):
            takes = f"1 to {positions - 1}" if positions is not None else "at least 1"
            raise ValueError(f"prompt {item['id']!r} is {n} tokens; the target takes {takes}")


def timed_runs(engine, pols: list[Policy], prompts: list[dict], max_new_tokens: int, repeats: int, warmup: bool,
               temperature: float, seed: int, progress) -> dict[tuple[int, str], list[Run]]:
    """{(prompt index, policy label): its runs} (ids need not be unique), interleaved prompt by prompt after an
    untimed warm-up per policy."""
    from tqdm.auto import tqdm

    # The warm-up is counted in the bar too: on a CPU it can take a while, and silence reads as a hang.
    bar = tqdm(total=(len(pols) if warmup else 0) + len(prompts) * repeats * len(pols), desc="bench", unit="gen",
               leave=False, disable=(None if progress is None else not progress))
    runs: dict[tuple[int, str], list[Run]] = {}
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
    return runs


def prompt_row(item: dict, label: str, m: dict) -> dict:
    """One row per (prompt, policy): Spec-Bench's fields, then ours, from the runs' medians ``m``."""
    f: Run = m["first"]
    decode_s = sum(m["stage_seconds"].values())
    return {
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
    }


def lossless_failures(prompts: list[dict], labels: list[str], runs: dict) -> list[LosslessFailure]:
    """Every run (repeats too) against AR's first on the same prompt: each policy's first differing run."""
    failures: list[LosslessFailure] = []
    for i, item in enumerate(prompts):
        ref = runs[i, "AR"][0].tokens
        for label in labels:
            for r in runs[i, label]:
                pos = first_difference(ref, r.tokens)
                if pos is not None:
                    failures.append(LosslessFailure(item["id"], label, pos, ref[pos] if pos < len(ref) else None,
                                                    r.tokens[pos] if pos < len(r.tokens) else None))
                    break
    return failures


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
        "stage_percentiles": pct, "outside_cycles": outside,  # seconds
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
