"""The measured per-step cost: the target's verify forward over nodes x rows and the drafter's block
forward over rows, on the device in use, beside the cost model's prediction of each point.

    from workbench.bench import sweep as sw
    from workbench.bench.random_models import random_models
    models = random_models("qwen3-8b", "qwen3-8b-dflash-b16", device="cuda", dtype="bfloat16")
    s = sw.sweep(models, nodes=(1, 2, 4, 8, 16, 32, 64), rows=(1, 4, 8, 16), context=512, graphs=True)
    s.table()                       # median and spread per point
    wb.shapes.sweep_error(s)        # the cost model's prediction per point and its error
    sw.save(s, "s.json"); sw.load("s.json")

What is timed is the engine's own forward, through its own model states (``workbench.bench.forward_timing``):
``DenseKV.verify`` of a ``TreeLayout`` compiled by ``stages.tree_compile`` (the real visibility mask, the K/V
cache holding ``context`` committed tokens per row) and ``DraftKV.draft`` of one block after ``block_size`` new
context rows (a cycle that accepted its whole block). Each point has its own state, verifying one node count as
the engine's static buckets do. States that support static shapes run them (K/V and mask buffers of
``context + max(nodes)`` columns, as the engine's graphed path runs): ``eager`` is that path without
graphs, ``graphs`` replays it from a CUDA graph. A state without static shapes (the hybrid's)
is prefilled with random tokens and runs eager with dynamic shapes.

Cost does not depend on weight values, so ``workbench.bench.random_models`` builds a shipped config's layout
with random weights (no checkpoint); a sweep whose K/V + activations exceed the device's free memory is
refused before any state is built (``workbench.shapes.memory_fit``). The device's roofline probes
(``workbench.bench.device_probes``) join every round. Each point: ``warmup`` untimed calls, then ``repeats``
timed ones interleaved over every point (machine load hits all points alike); median with the quartiles and
the extremes beside it. The command line: ``workbench.bench.sweep_command``.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from workbench.bench.device_probes import Device, Probes
from workbench.bench.forward_timing import DraftForward, TargetForward, sync, time_call
from workbench.bench.opcount import call_ops
from workbench.shapes.families import load_config
from workbench.shapes.memory_fit import check_fits_loaded

NODES = (1, 2, 4, 8, 16, 32, 64)
ROWS = (1, 4, 8, 16)
CPU_NODES = (1, 2, 4, 8, 16, 32)  # what a few minutes on two shared cores allow at a full-size width
CPU_ROWS = (1, 4)


class SweepInputError(ValueError):
    """A config, saved sweep or option a sweep cannot use: one line naming it and the fix."""


# ------------------------------------------------------------------------------------------ records
@dataclass
class Point:
    """One measured forward shape."""

    kind: str  # "verify" (target, TARGET_VERIFY over nodes) or "draft" (the drafter's block)
    mode: str  # "eager" or "graphs"
    rows: int  # requests in the batch
    nodes: int  # tokens per row: tree nodes (root included) for verify, block size for draft
    keys: int  # key columns attention sees per row (committed + scratch, static: the buffer's width)
    context_rows: int  # draft: new target-feature rows per row (0 for verify)
    samples: list  # seconds per timed call
    ops: int = 0  # aten ops one eager call dispatches (0 where not counted)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def quartiles(self) -> tuple[float, float]:
        q = statistics.quantiles(self.samples, n=4, method="inclusive") if len(self.samples) > 1 else [self.samples[0]] * 3
        return q[0], q[2]

    def as_dict(self) -> dict:
        lo, hi = self.quartiles
        return {**asdict(self), "median_s": self.median, "p25_s": lo, "p75_s": hi,
                "min_s": min(self.samples), "max_s": max(self.samples)}


@dataclass
class Sweep:
    points: list
    settings: dict  # model name, layers, dtype, device, context, repeats, warmup, threads, note
    target_config: dict  # the config the timed model was built from (cut layers included): the cost model reads it
    draft_config: dict | None
    device: Device | None = None
    notes: list = field(default_factory=list)

    def select(self, kind: str | None = None, mode: str | None = None) -> list:
        return [p for p in self.points if (kind is None or p.kind == kind) and (mode is None or p.mode == mode)]

    def as_dict(self) -> dict:
        return {"settings": self.settings, "device": self.device.as_dict() if self.device else None,
                "points": [p.as_dict() for p in self.points], "notes": self.notes,
                "target_config": self.target_config, "draft_config": self.draft_config}

    def to_json(self) -> str:
        return json.dumps(self.as_dict())

    @classmethod
    def from_dict(cls, d: dict, source: str = "the saved sweep") -> "Sweep":
        check_saved(d, source)
        keep = {f for f in Point.__dataclass_fields__}
        pts = [Point(**{k: v for k, v in p.items() if k in keep}) for p in d["points"]]
        dev = Device(**d["device"]) if d.get("device") else None
        return cls(pts, d["settings"], d["target_config"], d.get("draft_config"), dev, d.get("notes", []))

    def table(self) -> str:
        s = self.settings
        lines = [f"sweep: {s['model']} ({s['layers']} target layers, {s['draft_layers']} draft layers), {s['dtype']} "
                 f"on {s['device']}, context {s['context']}, {s['repeats']} repeats after {s['warmup']} warm-up, "
                 f"{s['threads']} threads",
                 f"  {'kind':<7}{'mode':<8}{'rows':>5}{'nodes':>6}{'keys':>6}{'median ms':>11}{'p25-p75 ms':>22}{'ops':>6}"]
        for p in self.points:
            lo, hi = p.quartiles
            lines.append(f"  {p.kind:<7}{p.mode:<8}{p.rows:>5}{p.nodes:>6}{p.keys:>6}{p.median * 1e3:>11.3f}"
                         f" {f'{lo * 1e3:.3f}-{hi * 1e3:.3f}':>21}{p.ops:>6}")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    __repr__ = table


# ------------------------------------------------------------------------------------------ the sweep
def _check_grid(nodes, rows, context, repeats, warmup) -> tuple[list, list]:
    def ints(xs, what, least):
        xs = list(xs)
        if not xs or any(isinstance(x, bool) or not isinstance(x, int) or x < least for x in xs):
            raise ValueError(f"{what}={xs!r} must be a non-empty list of integers >= {least}")
        return sorted(set(xs))

    nodes, rows = ints(nodes, "nodes", 1), ints(rows, "rows", 1)
    for v, what, least in ((context, "context", 1), (repeats, "repeats", 1), (warmup, "warmup", 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ValueError(f"{what}={v!r} must be an integer >= {least}")
    return nodes, rows


def _configs_of(models) -> tuple[dict, dict]:
    """The dicts a Models was built from (random_models) or its checkpoints' config.json."""
    out = []
    for model, path in ((models.target, models.target_dir), (models.draft, models.draft_dir)):
        p = Path(path)
        if (p / "config.json").is_file():
            cfg = load_config(p)
            cfg["_name"] = p.name if p.name not in ("target", "draft") else f"{p.parent.name}/{p.name}"
        else:
            cfg = model.config.to_dict()
            cfg["_name"] = str(path)
        out.append(cfg)
    return out[0], out[1]


def sweep(models, nodes=NODES, rows=ROWS, context: int = 512, repeats: int = 7, warmup: int = 2,
          graphs: bool = False, draft: bool = True, seed: int = 0, device_profile: bool = True,
          progress=None) -> Sweep:
    """Time the verify forward at every (rows, nodes) and the draft forward at every rows, ``repeats``
    times each after ``warmup`` untimed calls, interleaved. ``models``: workbench Models (``wb.load().models``
    or ``random_models``) or an engine. ``graphs``: also replay each from a CUDA graph (CUDA only)."""
    models = getattr(models, "models", models)
    nodes, rows = _check_grid(nodes, rows, context, repeats, warmup)
    dev = torch.device(models.device)
    if graphs and dev.type != "cuda":
        raise ValueError(f"graphs=True needs a CUDA device; the models are on {dev}")
    if context + max(nodes) > models.max_positions:
        raise ValueError(f"context {context} + nodes {max(nodes)} exceeds the target's {models.max_positions} positions")
    tcfg, dcfg = _configs_of(models)
    check_fits_loaded(models, tcfg, dcfg, max(rows), max(nodes), context, kv_rows=sum(rows) * len(nodes))
    say = progress or (lambda msg: None)
    modes = ["eager"] + (["graphs"] if graphs else [])
    graph_set = None
    if graphs:
        from workbench.engine.graphs import Graphs

        graph_set = Graphs(dev)
    calls = []  # (Point, fn, state or None)
    with torch.no_grad():
        for r in rows:
            for n in nodes:
                # one state per point: a state verifies one node count, as the engine's static buffers (and
                # graphs) do per bucket; alternating counts on one state would rebuild its mask every call
                tgt = TargetForward(models, r, context, max(nodes), seed + r)
                for mode in modes:
                    if mode == "graphs" and not tgt.static:
                        continue
                    calls.append((Point("verify", mode, r, n, tgt.key_columns(n), 0, []), tgt.call(n), tgt.state))
            if draft:
                d = DraftForward(models, r, context, seed + 100 + r)
                for mode in modes:
                    calls.append((Point("draft", mode, r, d.block, d.keys, d.block, []), d.call(), d.state))
        for p, fn, state in calls:
            state.graphs = graph_set if p.mode == "graphs" else None
            for _ in range(warmup + (1 if p.mode == "graphs" else 0)):  # graphs: the first call captures
                fn()
            if p.mode == "eager":
                p.ops = call_ops(fn)
        sync(dev)
        tc = models.target.config.get_text_config(decoder=True)
        # the device's probes join every round, so they see the load the points see
        probes = Probes(dev, models.dtype, tc.hidden_size, {p.rows * p.nodes for p, _, _ in calls}) \
            if device_profile else None
        if probes:
            probes.run_once()  # warm-up
            probes.samples = {k: [] for k in probes.samples}
        say(f"{len(calls)} points warmed up; timing {repeats} rounds")
        for i in range(repeats):
            for p, fn, state in calls:
                state.graphs = graph_set if p.mode == "graphs" else None
                p.samples.append(time_call(fn, dev))
            if probes:
                probes.run_once()
            say(f"round {i + 1}/{repeats}")
        for _, _, state in calls:
            state.graphs = None
    settings = {"model": tcfg.get("_name"), "draft": dcfg.get("_name"), "layers": tc.num_hidden_layers,
                "draft_layers": models.draft.config.num_hidden_layers, "dtype": str(models.dtype).replace("torch.", ""),
                "device": str(dev), "context": context, "repeats": repeats, "warmup": warmup,
                "threads": torch.get_num_threads(), "seed": seed, "nodes": nodes, "rows": rows, "modes": modes,
                "block_size": models.block_size}
    dprof = probes.device_profile() if probes else None
    del probes
    notes = ["verify: the engine's DenseKV/HybridGDN verify of a DDTree-built TreeLayout (tree_compile's visibility "
             "mask over the K/V cache); draft: DraftKV.draft of one block after block_size new context rows",
             "static-shape states attend over context + max(nodes) columns (the engine's graphed path); 'keys' "
             "says how many columns each point saw"]
    if dev.type == "cpu":
        notes.append("CPU timings on a machine shared with other work: points are interleaved round by round so "
                     "load hits them alike")
    return Sweep([p for p, _, _ in calls], settings, tcfg, dcfg, dprof, notes)


def save(s: Sweep, path) -> None:
    Path(path).write_text(json.dumps(s.as_dict(), indent=1) + "\n")


# what Sweep.table and sweep_error read from a saved sweep (a file missing one fails there, after the load)
SAVED_KEYS = {"points": list, "settings": dict, "target_config": dict}
SAVED_SETTINGS = ("model", "layers", "draft_layers", "dtype", "device", "context", "repeats", "warmup", "threads")
SAVED_POINT = ("kind", "mode", "rows", "nodes", "keys", "context_rows", "samples", "ops", "median_s")


def check_saved(d, source: str = "the saved sweep") -> None:
    """``d`` has what a saved sweep (``Sweep.as_dict``) holds and its readers use; else one line naming
    ``source`` and what is missing."""
    fix = "give a file written by sweep --save (workbench.bench.sweep.save)"
    if not isinstance(d, dict):
        raise SweepInputError(f"{source} holds a JSON {type(d).__name__}, not a saved sweep's object; {fix}")
    for key, kind in SAVED_KEYS.items():
        if not isinstance(d.get(key), kind):
            raise SweepInputError(f"{source} has no {key!r} ({kind.__name__}) as a saved sweep does; {fix}")
    missing = [k for k in SAVED_SETTINGS if k not in d["settings"]]
    if missing:
        raise SweepInputError(f"{source}: its settings lack {', '.join(missing)}; {fix}")
    for i, p in enumerate(d["points"]):
        lacks = [k for k in SAVED_POINT if not isinstance(p, dict) or k not in p]
        if lacks:
            raise SweepInputError(f"{source}: point {i} lacks {', '.join(lacks)}; {fix}")


def load(path) -> Sweep:
    """A sweep written by ``save``; a path that is not one is refused in one line naming it."""
    p = Path(path)
    fix = "give a file written by sweep --save (workbench.bench.sweep.save)"
    if not p.is_file():
        raise SweepInputError(f"saved sweep {p} {'is a directory' if p.is_dir() else 'does not exist'}; {fix}")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise SweepInputError(f"saved sweep {p} is not UTF-8 text; {fix}") from None
    except json.JSONDecodeError as e:
        raise SweepInputError(f"saved sweep {p} is not JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                              f"{fix}") from None
    return Sweep.from_dict(d, f"saved sweep {p}")
