"""The record of one draft/verify cycle (``Cycle``) and of a whole run (``Trace``).

Every tensor is detached on the CPU so a record outlives its session. A trace is
saved as versioned JSON lines: a header, one line per cycle, and an end line, so
a truncated or foreign file is recognised; files are written atomically.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import torch
from torch import Tensor

from workbench.forward import ForwardRecord

TRACE_FORMAT = "ddtree-workbench-trace"
TRACE_VERSION = 1
STAGES = ("draft", "tree_build", "tree_compile", "verify", "accept", "commit")


class TraceFileError(ValueError):
    """A trace file that is not ours, of another version, or cut short."""


@dataclass(frozen=True)
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
    temperature: float = 0.0
    # the target's two best tokens and their logits at every node (logits as computed, in the model's dtype)
    target_top2_tokens: Tensor | None = None  # int64 [n, 2]
    target_top2_logits: Tensor | None = None  # float32 [n, 2]

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
    def from_dict(cls, d: dict) -> "Cycle":
        kw = {}
        for f in fields(cls):
            if f.name not in d and f.default is not MISSING:  # a field added later: older files lack it
                continue
            v = d[f.name]
            if isinstance(v, dict) and "data" in v and "dtype" in v:
                v = torch.tensor(v["data"], dtype=getattr(torch, v["dtype"])).reshape(v["shape"])
            elif f.name == "forwards":
                v = tuple(ForwardRecord.from_dict(r) for r in v)
            kw[f.name] = v
        return cls(**kw)


@dataclass(frozen=True)
class Summary:
    policy: str
    tau: float
    cycles: int
    new_tokens: int
    accept_histogram: dict  # accept length (incl. bonus) -> cycles
    stage_seconds: dict
    seconds: float
    tokens_per_s: float
    finish_reason: str | None

    def __str__(self) -> str:
        return (f"{self.policy}: tau {self.tau:.2f}, {self.new_tokens} new tokens in {self.cycles} cycles, "
                f"{self.tokens_per_s:.1f} tok/s" + (f", finished: {self.finish_reason}" if self.finish_reason else ""))

    def _repr_html_(self) -> str:
        stages = "".join(f"<td>{1e3 * self.stage_seconds.get(s, 0):.1f}</td>" for s in STAGES)
        hist = ", ".join(f"{k}: {v}" for k, v in sorted(self.accept_histogram.items()))
        return (
            "<table><tr><th>policy</th><th>tau</th><th>cycles</th><th>new tokens</th><th>tok/s</th>"
            + "".join(f"<th>{s} ms</th>" for s in STAGES) + "</tr>"
            f"<tr><td>{self.policy}</td><td>{self.tau:.2f}</td><td>{self.cycles}</td><td>{self.new_tokens}</td>"
            f"<td>{self.tokens_per_s:.1f}</td>{stages}</tr></table><p>accept lengths: {hist}</p>"
        )


@dataclass
class Trace:
    """All cycles of a session so far, with the settings and the prefill that preceded them."""

    meta: dict
    prefill: ForwardRecord | None = None
    cycles: list = field(default_factory=list)
    prefill_seconds: float = 0.0
    finish_reason: str | None = None
    new_tokens: int = 0  # including the first token, which the prefill produced

    def __len__(self) -> int:
        return len(self.cycles)

    def __getitem__(self, i):
        return self.cycles[i]

    def __iter__(self):
        return iter(self.cycles)

    @property
    def policy(self) -> str:
        return self.meta.get("policy", "?")

    @property
    def accept_lengths(self) -> list[int]:
        return [c.accept_length for c in self.cycles]

    @property
    def tau(self) -> float:
        a = self.accept_lengths
        return sum(a) / len(a) if a else 0.0

    def stage_seconds(self) -> dict:
        return {s: sum(c.stage_seconds.get(s, 0.0) for c in self.cycles) for s in STAGES}

    def summary(self) -> Summary:
        secs = sum(c.seconds for c in self.cycles)
        gen = sum(c.committed for c in self.cycles)
        return Summary(
            policy=self.policy, tau=self.tau, cycles=len(self.cycles), new_tokens=self.new_tokens,
            accept_histogram=dict(sorted(Counter(self.accept_lengths).items())),
            stage_seconds=self.stage_seconds(), seconds=secs,
            tokens_per_s=gen / secs if secs > 0 else 0.0, finish_reason=self.finish_reason,
        )

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
        """Write atomically: a temporary file in the same folder, renamed over ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        head = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "meta": self.meta,
                "prefill": self.prefill.to_dict() if self.prefill else None,
                "prefill_seconds": self.prefill_seconds, "finish_reason": self.finish_reason,
                "new_tokens": self.new_tokens}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(head) + "\n")
                for c in self.cycles:
                    fh.write(json.dumps(c.to_dict()) + "\n")
                fh.write(json.dumps({"end": TRACE_FORMAT, "cycles": len(self.cycles)}) + "\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path) -> "Trace":
        path = Path(path)
        lines = path.read_text().splitlines()
        try:
            head = json.loads(lines[0]) if lines else None
        except json.JSONDecodeError:
            head = None
        if not isinstance(head, dict) or head.get("format") != TRACE_FORMAT:
            raise TraceFileError(f"{path} is not a ddtree-workbench trace (no '{TRACE_FORMAT}' header)")
        if head.get("version") != TRACE_VERSION:
            raise TraceFileError(f"{path} is trace version {head.get('version')}; this workbench reads version {TRACE_VERSION}")
        try:
            end = json.loads(lines[-1])
        except json.JSONDecodeError:
            end = None
        if len(lines) < 2 or not isinstance(end, dict) or end.get("end") != TRACE_FORMAT or end.get("cycles") != len(lines) - 2:
            raise TraceFileError(f"{path} is truncated: its end line is missing or does not match its {len(lines) - 1} lines")
        cycles = [Cycle.from_dict(json.loads(line)) for line in lines[1:-1]]
        return cls(meta=head["meta"], prefill=ForwardRecord.from_dict(head["prefill"]) if head["prefill"] else None,
                   cycles=cycles, prefill_seconds=head["prefill_seconds"], finish_reason=head["finish_reason"],
                   new_tokens=head["new_tokens"])
