"""The record of one draft/verify cycle (``Cycle``) and of a whole run (``Trace``).

Every tensor is detached on the CPU so a record outlives its session. A trace is
saved as versioned JSON lines: a header, one line per cycle, and an end line, so
a truncated or foreign file is recognised; files are written atomically.
"""
from __future__ import annotations

import html
import json
import math
from collections import Counter
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import torch
from torch import Tensor

from workbench.records.files import write_text_atomic
from workbench.records.forward import ForwardRecord

TRACE_FORMAT = "ddtree-workbench-trace"
TRACE_VERSION = 2  # 2: every cycle records top_p and top_k (version 1 files load: taken from the header)
READABLE_VERSIONS = (1, 2)
# Every second of a step() lands in one of these: the pipeline's stages, building the Cycle record,
# and "other" (whatever step() spends outside them), so the stage times add up to the cycle time.
STAGES = ("draft", "tree_build", "tree_compile", "verify", "accept", "commit", "record", "other")


class TraceFileError(ValueError):
    """A trace file that is not ours, of another version, cut short or damaged; the message names file and line."""


def _trace_vocab(meta: dict, prefill) -> int | None:
    """The target's vocabulary size as the trace records it: ``meta['vocab_size']`` or the last dim of the
    prefill's logits (every trace since version 1 keeps that shape); None when neither is there."""
    v = meta.get("vocab_size")
    if isinstance(v, int) and v > 0:
        return v
    shape = ((prefill.outputs.get("logits") or {}).get("shape") if prefill else None) or []
    return shape[-1] if shape and isinstance(shape[-1], int) and shape[-1] > 0 else None


def _in_vocab(t, vocab: int | None) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0 and (vocab is None or t < vocab)


def cycle_problem(c: "Cycle", vocab: int | None = None) -> str | None:
    """The first internal inconsistency of one cycle record, in words, or None.

    Checks what a decoder guarantees: per-node arrays of one length n; the root at 0 (parent -1,
    depth 0) and every parent before its child; depth = parent's depth + 1; token ids (tree, draft
    top-k, target choices, bonus) inside the vocabulary; the accepted path starts at the root,
    walks parent to child, carries the nodes' tokens, follows the target's choice at every step,
    stops where no child matches it, and ends in the bonus = the choice at its last node. A path a hook
    put in place (``"accept" in c.replaced``) need only walk parent to child: following the choices is
    what it was replaced to escape.
    """
    n = int(c.tokens.shape[0]) if c.tokens.dim() == 1 else -1
    if n < 1:
        return f"tokens has shape {list(c.tokens.shape)}; a tree has at least its root"
    for name in ("parents", "depth", "rank", "score", "position_ids", "target_choice", "target_prob",
                 "retrieve_next_token", "retrieve_next_sibling"):
        shape = list(getattr(c, name).shape)
        if shape != [n]:
            return f"{name} has shape {shape} but tokens has {n} nodes"
    if list(c.visibility.shape) != [n, n]:
        return f"visibility has shape {list(c.visibility.shape)}, not [{n}, {n}]"
    if c.draft_topk_tokens.shape != c.draft_topk_logprobs.shape:
        return (f"draft_topk_tokens {list(c.draft_topk_tokens.shape)} and draft_topk_logprobs "
                f"{list(c.draft_topk_logprobs.shape)} differ in shape")
    par, dep, tok, choice = (getattr(c, f).tolist() for f in ("parents", "depth", "tokens", "target_choice"))
    if par[0] != -1 or dep[0] != 0:
        return f"node 0 must be the root (parent -1, depth 0), not parent {par[0]}, depth {dep[0]}"
    for i in range(1, n):
        if not 0 <= par[i] < i:
            return f"node {i} has parent {par[i]}; every parent comes before its child"
        if dep[i] != dep[par[i]] + 1:
            return f"node {i} has depth {dep[i]} but its parent {par[i]} has depth {dep[par[i]]}"
    for name, values in (("tokens", tok), ("target_choice", choice), ("draft_topk_tokens",
                         c.draft_topk_tokens.reshape(-1).tolist()), ("bonus", [c.bonus])):
        bad = next((t for t in values if not _in_vocab(t, vocab)), None)
        if bad is not None:
            where = f"the vocabulary of {vocab} tokens" if vocab else "the token ids (>= 0)"
            return f"{name} holds token {bad}, outside {where}"
    path, path_tok = c.accepted_nodes.tolist(), c.accepted_tokens.tolist()
    if not path or len(path) != len(path_tok):
        return f"accepted_nodes ({len(path)}) and accepted_tokens ({len(path_tok)}) differ in length or are empty"
    if path[0] != 0:
        return f"the accepted path starts at node {path[0]}, not the root"
    forced = "accept" in c.replaced
    for a, b in zip(path, path[1:]):
        if not 0 <= b < n or par[b] != a:
            return f"the accepted path steps from node {a} to node {b}, which is not its child"
        if tok[b] != choice[a] and not forced:
            return (f"the accepted path takes node {b} (token {tok[b]}) where the target chose {choice[a]} "
                    f"at node {a}")
    if [tok[i] for i in path] != path_tok:
        return "accepted_tokens are not the tokens of accepted_nodes"
    last = path[-1]
    if not forced and any(par[i] == last and tok[i] == choice[last] for i in range(1, n)):
        return f"the accepted path stops at node {last} though a child carries the target's choice {choice[last]}"
    if c.bonus != choice[last]:
        return f"bonus {c.bonus} is not the target's choice {choice[last]} at the last accepted node {last}"
    if not 0 <= c.committed <= len(path):
        return f"committed={c.committed} but the accepted path has {len(path)} tokens"
    return None


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f} ms"


@dataclass(frozen=True, repr=False)
class Cycle:
    """Everything one cycle did. Tree arrays are flattened with the root (previous bonus) at 0."""

    index: int
    policy: str
    start: int  # position of the root
    root_token: int
    # draft: top-k per drafted slot (slot d predicts depth d+1)
    draft_topk_tokens: Tensor  # int64 [D, k]
    draft_topk_logprobs: Tensor  # float32 [D, k]
    # tree
    tokens: Tensor  # int64 [n]
    parents: Tensor  # int64 [n]
    depth: Tensor  # int64 [n]
    rank: Tensor  # int64 [n]
    score: Tensor  # float32 [n]: draft path log-prob
    # verify inputs
    position_ids: Tensor  # int64 [n]
    visibility: Tensor  # bool [n, n]: the tree part of the verify mask (the prefix is fully visible)
    retrieve_next_token: Tensor  # int64 [n]
    retrieve_next_sibling: Tensor  # int64 [n]
    # target
    target_choice: Tensor  # int64 [n]: argmax or sample at every node
    target_prob: Tensor  # float32 [n]: the target's probability of that choice
    # accept
    accepted_nodes: Tensor  # int64 [L + 1], root first
    accepted_tokens: Tensor  # int64 [L + 1], root token first
    bonus: int
    committed: int  # tokens this cycle added to the output (L + 1 unless the run ended inside it)
    stage_seconds: dict
    forwards: tuple  # ForwardRecord, in the order they ran
    temperature: float = 0.0  # the sampling settings this cycle ran with (they may change mid-session)
    top_p: float = 1.0
    top_k: int = 0

    @property
    def setting(self) -> str:
        """Policy and sampling in one label, e.g. 'DDTree(32)' (greedy) or 'DFlash T=0.8 top_p=0.9'."""
        return setting_label(self.policy, self.temperature, self.top_p, self.top_k)
    # the target's two best tokens and their logits at every node (logits as computed, in the model's dtype)
    target_top2_tokens: Tensor | None = None  # int64 [n, 2]
    target_top2_logits: Tensor | None = None  # float32 [n, 2]
    # a hybrid target: the node whose recurrent state (conv window, delta-rule state) node i continued from,
    # -1 = the request's committed state (SGLang's retrieve_parent_token); None for attention-only targets
    state_from: Tensor | None = None  # int64 [n]
    # the stages whose output a hook replaced in this cycle ("tree_build", "verify", "accept"; see
    # workbench.engine.hooks): after a replaced verify or accept the output need not be the target's own
    replaced: tuple = ()

    @property
    def lossless(self) -> bool:
        """False when a hook replaced the target's choices or the accepted path: the tokens this cycle
        committed need not be the ones the target would have committed (a replaced tree keeps them)."""
        return not ({"verify", "accept"} & set(self.replaced))

    @property
    def n_nodes(self) -> int:
        """Drafted nodes in the tree (the root not counted)."""
        return int(self.tokens.shape[0]) - 1

    @property
    def accepted(self) -> int:
        """Accepted drafted tokens (the root not counted)."""
        return int(self.accepted_nodes.shape[0]) - 1

    @property
    def accept_length(self) -> int:
        """Accepted tokens plus the bonus: the cycle's contribution to tau."""
        return self.accepted + 1

    @property
    def seconds(self) -> float:
        return float(sum(self.stage_seconds.values()))

    def draft_prob(self) -> Tensor:
        """Draft probability of each node's own token given its parent path ([n], 1 at the root)."""
        parent_score = torch.where(self.parents >= 0, self.score[self.parents.clamp(min=0)], 0.0)
        return torch.exp(self.score - parent_score)

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                out[f.name] = {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape), "data": v.tolist()}
            elif f.name == "forwards":
                out[f.name] = [r.to_dict() for r in v]
            else:
                out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: dict, defaults: dict | None = None) -> "Cycle":
        """Inverse of ``to_dict``. ``defaults`` fills fields an older file version did not store.
        Raises ValueError (one line) on a missing key, an unknown dtype or a malformed value."""
        if not isinstance(d, dict):
            raise ValueError(f"a cycle record is a JSON object, not {type(d).__name__}")
        defaults = defaults or {}
        kw = {}
        for f in fields(cls):
            if f.name in d:
                v = d[f.name]
            elif f.name in defaults:
                v = defaults[f.name]
            elif f.default is not MISSING:  # a field added later: older files lack it
                continue
            else:
                raise ValueError(f"the cycle record has no {f.name!r}")
            try:
                if isinstance(v, dict) and "data" in v and "dtype" in v:
                    dtype = getattr(torch, str(v["dtype"]), None)
                    if not isinstance(dtype, torch.dtype):
                        raise ValueError(f"unknown dtype {v['dtype']!r}")
                    v = torch.tensor(v["data"], dtype=dtype).reshape(v["shape"])
                elif f.name == "forwards":
                    v = tuple(ForwardRecord.from_dict(r) for r in v)
                elif f.name == "stage_seconds" and not isinstance(v, dict):
                    raise ValueError("not an object")
                elif f.name == "replaced":
                    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
                        raise ValueError("not a list of stage names")
                    v = tuple(v)
            except (KeyError, TypeError, ValueError, RuntimeError) as e:
                why = f"no {e}" if isinstance(e, KeyError) else " ".join(str(e).split())[:200]
                raise ValueError(f"field {f.name!r}: {why}") from None
            kw[f.name] = v
        return cls(**kw)

    # ---- display: a summary line and a small table (the full record is many kilobytes)
    def __repr__(self) -> str:
        return (f"Cycle({self.index}, {self.setting}, start={self.start}, {self.n_nodes} drafted nodes, "
                f"accepted {self.accepted} + bonus {self.bonus}, committed {self.committed}, {_ms(self.seconds)}"
                + (f", replaced by a hook: {', '.join(self.replaced)}" if self.replaced else "") + ")")

    def _repr_html_(self) -> str:
        stages = "".join(f"<td>{1e3 * self.stage_seconds.get(s, 0.0):.2f}</td>" for s in STAGES)
        acc = " ".join(str(int(t)) for t in self.accepted_tokens[:24].tolist())
        more = " ..." if self.accepted_tokens.shape[0] > 24 else ""
        return (f"<p><b>cycle {self.index}</b> · {html.escape(self.setting)} · root {self.root_token} at "
                f"position {self.start} · {self.n_nodes} drafted nodes · accepted {self.accepted} + bonus "
                f"{self.bonus}" + (f" · <b>replaced by a hook: {', '.join(self.replaced)}</b>" if self.replaced
                                   else "") + "</p><table><tr>" + "".join(f"<th>{s} ms</th>" for s in STAGES) +
                f"</tr><tr>{stages}</tr></table><p>accepted token ids (root first): {acc}{more}</p>")


def setting_label(policy: str, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0) -> str:
    """'DDTree(32)' when greedy; 'DDTree(32) T=0.8 top_p=0.9 top_k=20' when sampling (defaults left out)."""
    if not temperature:
        return str(policy)
    parts = [str(policy), f"T={temperature:g}"]
    if top_p != 1.0:
        parts.append(f"top_p={top_p:g}")
    if top_k:
        parts.append(f"top_k={top_k}")
    return " ".join(parts)


@dataclass(frozen=True)
class PolicyFigures:
    """The figures of the cycles that ran with one setting (policy and sampling) in a trace."""

    setting: str
    cycles: int
    tau: float
    committed: int  # tokens those cycles added
    seconds: float  # time in those cycles
    tokens_per_s: float  # committed / seconds
    accept_histogram: dict

    def __str__(self) -> str:
        return (f"{self.setting}: tau {self.tau:.2f}, {self.committed} tokens in {self.cycles} cycles, "
                f"{self.tokens_per_s:.1f} tok/s")


def _figures(setting: str, cycles: list) -> PolicyFigures:
    al = [c.accept_length for c in cycles]
    secs = sum(c.seconds for c in cycles)
    committed = sum(c.committed for c in cycles)
    return PolicyFigures(setting, len(cycles), sum(al) / len(al) if al else 0.0, committed, secs,
                         committed / secs if secs > 0 else 0.0, dict(sorted(Counter(al).items())))


def percentiles(values) -> dict:
    """{"p50", "p90", "max"} of a list of numbers (nearest-rank; zeros for an empty list)."""
    v = sorted(values)
    if not v:
        return {"p50": 0.0, "p90": 0.0, "max": 0.0}

    return {"p50": v[max(0, math.ceil(0.5 * len(v)) - 1)], "p90": v[max(0, math.ceil(0.9 * len(v)) - 1)],
            "max": v[-1]}


@dataclass(frozen=True)
class Summary:
    """A run in figures. ``tokens_per_s`` = new_tokens / seconds, where ``seconds`` is the whole
    generation (prefill + cycles), so the line's numbers divide; ``decode_tokens_per_s`` counts only
    the cycles (tokens they committed / their time). ``by_policy``: the same per setting (policy and
    sampling), in order of first use; more than one entry when settings changed mid-session.
    ``replaced``: {stage: cycles} whose output a hook replaced (``Cycle.replaced``); empty for a plain run."""

    policy: str
    tau: float
    cycles: int
    new_tokens: int  # including the first token, which the prefill produced
    accept_histogram: dict  # accept length (incl. bonus) -> cycles
    stage_seconds: dict
    seconds: float  # prefill + cycles
    tokens_per_s: float  # new_tokens / seconds
    finish_reason: str | None
    prefill_seconds: float = 0.0
    decode_tokens_per_s: float = 0.0  # tokens committed by cycles / time in cycles
    by_policy: dict = field(default_factory=dict)  # setting label -> PolicyFigures
    replaced: dict = field(default_factory=dict)  # stage -> cycles whose output for it a hook replaced

    @property
    def mixed(self) -> bool:
        return len(self.by_policy) > 1

    @property
    def lossless(self) -> bool:
        """False when a hook replaced the target's choices or an accepted path in any cycle."""
        return not ({"verify", "accept"} & set(self.replaced))

    def replaced_note(self) -> str:
        """'' for a plain run; else which stages hooks replaced, in how many cycles, and what that means."""
        if not self.replaced:
            return ""
        what = ", ".join(f"{k} in {v} cycle{'s' if v != 1 else ''}" for k, v in self.replaced.items())
        return f"replaced by hooks: {what}" + ("" if self.lossless else " (the output is not the target's own)")

    def __str__(self) -> str:
        line = (f"{self.policy}: tau {self.tau:.2f}, {self.new_tokens} new tokens in {self.cycles} cycles "
                f"+ prefill, {_ms(self.seconds)}, {self.tokens_per_s:.1f} tok/s "
                f"(cycles alone {self.decode_tokens_per_s:.1f} tok/s)"
                + (f", finished: {self.finish_reason}" if self.finish_reason else "")
                + (f"; {self.replaced_note()}" if self.replaced else ""))
        if self.mixed:
            line += "".join(f"\n  {f}" for f in self.by_policy.values())
        return line

    def _repr_html_(self) -> str:
        def row(label, tau, cycles, tokens, tps, stage_s):
            stages = "".join(f"<td>{1e3 * stage_s.get(s, 0):.1f}</td>" for s in STAGES) if stage_s else \
                "<td></td>" * len(STAGES)
            return (f"<tr><td>{html.escape(label)}</td><td>{tau:.2f}</td><td>{cycles}</td><td>{tokens}</td>"
                    f"<td>{tps:.1f}</td>{stages}</tr>")

        hist = ", ".join(f"{k}: {v}" for k, v in sorted(self.accept_histogram.items()))
        rows = row(self.policy, self.tau, self.cycles, self.new_tokens, self.tokens_per_s, self.stage_seconds)
        if self.mixed:
            rows += "".join(row(f"· {f.setting}", f.tau, f.cycles, f.committed, f.tokens_per_s, None)
                            for f in self.by_policy.values())
        return (
            "<table><tr><th>policy</th><th>tau</th><th>cycles</th><th>tokens</th><th>tok/s</th>"
            + "".join(f"<th>{s} ms</th>" for s in STAGES) + f"</tr>{rows}</table>"
            f"<p>tok/s = new tokens / (prefill + cycles) = {self.new_tokens} / {_ms(self.seconds)}; "
            f"accept lengths: {hist}</p>"
            + (f"<p><b>{html.escape(self.replaced_note())}</b></p>" if self.replaced else "")
        )


@dataclass
class Trace:
    """All cycles of a session so far, with the settings and the prefill that preceded them."""

    meta: dict
    prefill: ForwardRecord | None = None
    cycles: list = field(default_factory=list)
    prefill_seconds: float = 0.0
    finish_reason: str | None = None
    setup_seconds: float = 0.0  # session start before the prefill (tokenize, checks)
    new_tokens: int = 0  # including the first token, which the prefill produced

    def __len__(self) -> int:
        return len(self.cycles)

    def __getitem__(self, i):
        return self.cycles[i]

    def __iter__(self):
        return iter(self.cycles)

    @property
    def settings(self) -> list[str]:
        """The distinct settings (policy and sampling) the cycles ran with, in order of first use."""
        return list(dict.fromkeys(c.setting for c in self.cycles))

    @property
    def policy(self) -> str:
        """The policy label; 'A + B' when the policy or the sampling changed mid-session."""
        names = self.settings
        if not names:
            p = self.meta.get("policy", "?")
            return " + ".join(p) if isinstance(p, list) else str(p)
        return names[0] if len(names) == 1 else " + ".join(names)

    def append(self, cycle: Cycle) -> None:
        """Add a cycle; a setting that differs from the header's turns that header entry into the list of
        values used, in order (so ``meta`` never claims one policy or temperature for a mixed run)."""
        self.cycles.append(cycle)
        for key in ("policy", "temperature", "top_p", "top_k"):
            v = getattr(cycle, key)
            if key not in self.meta:
                continue
            cur = self.meta[key]
            seen = cur if isinstance(cur, list) else [cur]
            if v not in seen:
                self.meta[key] = [*seen, v]

    def note_change(self, cycle: int, name: str, value) -> None:
        """A setting changed between cycles: ``meta["changes"]`` gets ``{"cycle", "name", "value"}`` (it
        applies from that cycle on), so the trace replays itself (``engine.replay(trace)``). A seed's
        header entry becomes the list of seeds used, as policy and sampling entries do."""
        self.meta.setdefault("changes", []).append({"cycle": int(cycle), "name": name, "value": value})
        if name == "seed" and "seed" in self.meta:
            cur = self.meta["seed"]
            seen = cur if isinstance(cur, list) else [cur]
            if value not in seen:
                self.meta["seed"] = [*seen, value]

    def changes(self) -> list[dict]:
        """The settings changed between cycles, in order: ``[{"cycle", "name", "value"}, ...]``."""
        return list(self.meta.get("changes", []))

    @property
    def accept_lengths(self) -> list[int]:
        return [c.accept_length for c in self.cycles]

    @property
    def tau(self) -> float:
        a = self.accept_lengths
        return sum(a) / len(a) if a else 0.0

    def stage_seconds(self) -> dict:
        return {s: sum(c.stage_seconds.get(s, 0.0) for c in self.cycles) for s in STAGES}

    def stage_percentiles(self, skip_first: bool = False) -> dict:
        """{stage or "cycle": {"p50", "p90", "max"} seconds} over the cycles: a median hides the slow
        cycles that decide throughput. ``skip_first`` leaves out cycle 0 (one-time costs)."""
        cycles = self.cycles[1:] if skip_first else self.cycles
        cols = {s: [c.stage_seconds.get(s, 0.0) for c in cycles] for s in STAGES}
        cols["cycle"] = [c.seconds for c in cycles]
        return {s: percentiles(v) for s, v in cols.items()}

    def outside_cycles(self) -> dict:
        """Seconds spent outside the steady cycles: session start, prefill, and the first cycle."""
        return {"setup": self.setup_seconds, "prefill": self.prefill_seconds,
                "first_cycle": self.cycles[0].seconds if self.cycles else 0.0}

    def summary(self) -> Summary:
        cycle_s = sum(c.seconds for c in self.cycles)
        gen = sum(c.committed for c in self.cycles)
        secs = cycle_s + self.prefill_seconds
        groups: dict[str, list] = {}
        for c in self.cycles:
            groups.setdefault(c.setting, []).append(c)
        return Summary(
            policy=self.policy, tau=self.tau, cycles=len(self.cycles), new_tokens=self.new_tokens,
            accept_histogram=dict(sorted(Counter(self.accept_lengths).items())),
            stage_seconds=self.stage_seconds(), seconds=secs,
            tokens_per_s=self.new_tokens / secs if secs > 0 else 0.0, finish_reason=self.finish_reason,
            prefill_seconds=self.prefill_seconds, decode_tokens_per_s=gen / cycle_s if cycle_s > 0 else 0.0,
            by_policy={k: _figures(k, v) for k, v in groups.items()},
            replaced={k: n for k, n in sorted(Counter(x for c in self.cycles for x in c.replaced).items(),
                                              key=lambda kv: STAGES.index(kv[0]) if kv[0] in STAGES else len(STAGES))},
        )

    # ---- display: a summary line and a small table (the full record is megabytes)
    def __repr__(self) -> str:
        state = f"finished: {self.finish_reason}" if self.finish_reason else "running"
        return (f"Trace({self.policy}, {len(self.cycles)} cycles, {self.new_tokens} new tokens, "
                f"tau {self.tau:.2f}, {state})")

    def _repr_html_(self, rows: int = 8) -> str:
        cs = self.cycles
        shown = cs if len(cs) <= rows else cs[: rows // 2] + [None] + cs[-rows // 2:]
        body = "".join(
            "<tr><td colspan='6'>...</td></tr>" if c is None else
            f"<tr><td>{c.index}</td><td>{html.escape(c.setting)}</td><td>{c.n_nodes}</td><td>{c.accepted}</td>"
            f"<td>{c.committed}</td><td>{1e3 * c.seconds:.1f}</td></tr>" for c in shown)
        prompt = str(self.meta.get("prompt", ""))
        prompt = prompt if len(prompt) <= 60 else prompt[:57] + "..."
        return (f"<p><b>{html.escape(repr(self))}</b><br>prompt: <code>{html.escape(prompt)}</code></p>"
                "<table><tr><th>cycle</th><th>setting</th><th>nodes</th><th>accepted</th><th>committed</th>"
                f"<th>ms</th></tr>{body}</table>")

    def metrics(self) -> list[dict]:
        """One row per cycle: accepted length, tree size, committed tokens, time per stage."""
        return [
            {"cycle": c.index, "start": c.start, "nodes": c.n_nodes, "accepted": c.accepted,
             "accept_length": c.accept_length, "committed": c.committed, "seconds": c.seconds,
             **{f"{s}_s": c.stage_seconds.get(s, 0.0) for s in STAGES}}
            for c in self.cycles
        ]

    # ---- files
    def save(self, path) -> Path:
        """Write atomically (a temporary file beside ``path``, renamed over it), with the mode of every
        other output. The folder must exist: a missing one is refused, naming the path."""
        head = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "meta": self.meta,
                "prefill": self.prefill.to_dict() if self.prefill else None,
                "prefill_seconds": self.prefill_seconds, "setup_seconds": self.setup_seconds,
                "finish_reason": self.finish_reason,
                "new_tokens": self.new_tokens}
        lines = [json.dumps(head), *(json.dumps(c.to_dict()) for c in self.cycles),
                 json.dumps({"end": TRACE_FORMAT, "cycles": len(self.cycles)})]
        return write_text_atomic(path, "\n".join(lines) + "\n")

    @classmethod
    def load(cls, path) -> "Trace":
        """Read a saved trace. Every damaged-file case raises TraceFileError naming the file and line."""
        path = Path(path)
        if path.is_dir():
            raise TraceFileError(f"{path} is a directory, not a trace file")
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw[: e.start].count(b"\n") + 1
            raise TraceFileError(f"{path}:{line}: not UTF-8 text; not a ddtree-workbench trace") from None
        lines = text.splitlines()

        def parse(no: int):
            try:
                return json.loads(lines[no - 1])
            except json.JSONDecodeError as e:
                raise TraceFileError(f"{path}:{no}: not valid JSON ({e.msg} at column {e.colno}); "
                                     "the file is damaged or cut short") from None

        try:
            head = json.loads(lines[0]) if lines else None
        except json.JSONDecodeError:
            head = None
        if not isinstance(head, dict) or head.get("format") != TRACE_FORMAT:
            raise TraceFileError(f"{path}:1: not a ddtree-workbench trace (no '{TRACE_FORMAT}' header)")
        version = head.get("version")
        if version not in READABLE_VERSIONS:
            raise TraceFileError(f"{path}:1: trace version {version!r}; this workbench reads versions "
                                 f"{', '.join(map(str, READABLE_VERSIONS))}")
        end = parse(len(lines)) if len(lines) >= 2 else None
        if not isinstance(end, dict) or end.get("end") != TRACE_FORMAT or end.get("cycles") != len(lines) - 2:
            raise TraceFileError(f"{path}:{len(lines)}: truncated: the end line is missing or does not match "
                                 f"the file's {max(len(lines) - 2, 0)} cycle lines")
        try:
            meta = head["meta"]
            if not isinstance(meta, dict):
                raise ValueError("'meta' is not an object")
            prefill = ForwardRecord.from_dict(head["prefill"]) if head["prefill"] else None
            extra = dict(prefill_seconds=float(head["prefill_seconds"]), finish_reason=head["finish_reason"],
                         new_tokens=int(head["new_tokens"]),
                         setup_seconds=float(head.get("setup_seconds", 0.0)))
        except (KeyError, TypeError, ValueError) as e:
            why = f"no {e}" if isinstance(e, KeyError) else " ".join(str(e).split())
            raise TraceFileError(f"{path}:1: damaged header ({why})") from None
        # Version 1 stored sampling once, in the header; every cycle of such a file ran with it.
        defaults = {k: meta[k] for k in ("top_p", "top_k") if k in meta} if version == 1 else {}
        vocab = _trace_vocab(meta, prefill)
        ids = meta.get("prompt_ids")
        if ids is not None and (not isinstance(ids, list) or not all(_in_vocab(t, vocab) for t in ids)):
            raise TraceFileError(f"{path}:1: damaged header (prompt_ids hold a token outside the vocabulary of "
                                 f"{vocab} tokens)" if vocab else f"{path}:1: damaged header (prompt_ids are not "
                                 "token ids)")
        cycles = []
        for no in range(2, len(lines)):
            try:
                cycles.append(Cycle.from_dict(parse(no), defaults))
            except ValueError as e:
                if isinstance(e, TraceFileError):
                    raise
                raise TraceFileError(f"{path}:{no}: damaged cycle record ({e})") from None
            problem = cycle_problem(cycles[-1], vocab)
            if problem:
                raise TraceFileError(f"{path}:{no}: inconsistent cycle {cycles[-1].index}: {problem}")
        return cls(meta=meta, prefill=prefill, cycles=cycles, **extra)
