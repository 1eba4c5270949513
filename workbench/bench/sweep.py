"""The measured per-step cost: the target's verify forward over nodes x rows and the drafter's block
forward over rows, on the device in use, beside the cost model's prediction of each point.

    from workbench.bench import sweep as sw
    models = sw.random_models("qwen3-8b", "qwen3-8b-dflash-b16", device="cuda", dtype="bfloat16")
    s = sw.sweep(models, nodes=(1, 2, 4, 8, 16, 32, 64), rows=(1, 4, 8, 16), context=512, graphs=True)
    s.table()                       # median and spread per point
    wb.shapes.cost.sweep_error(s)   # the cost model's prediction per point and its error

What is timed is the engine's own forward, through its own model states: ``DenseKV.verify`` of a
``TreeLayout`` compiled by ``stages.tree_compile`` (the real visibility mask, the K/V cache holding
``context`` committed tokens per row) and ``DraftKV.draft`` of one block after ``block_size`` new context
rows (a cycle that accepted its whole block). Each point has its own state, verifying one node count as
the engine's static buckets do. States that support static shapes run them (K/V and mask buffers of
``context + max(nodes)`` columns, as the engine's graphed path runs): ``eager`` is that path without
graphs, ``graphs`` replays it from a CUDA graph. A state without static shapes (the hybrid's)
is prefilled with random tokens and runs eager with dynamic shapes.

Cost does not depend on weight values, so ``random_models`` builds a shipped config's layout with
random weights on the device (no checkpoint), optionally with fewer layers; ``check_configs`` refuses a
config the cost model cannot read or a drafter that does not fit its target, and ``check_fits`` a sweep whose
weights + K/V + activations exceed the device's free memory, both before anything is allocated.
Each point: ``warmup`` untimed calls, then ``repeats`` timed ones interleaved over every point (machine
load hits all points alike); median with the quartiles and the extremes beside it.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from workbench.models.registry import pair_mismatch
from workbench.shapes import families
from workbench.shapes.families import config_name, load_config

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
class Device:
    """The device's measured roofline (independent of the sweep's points): matmul FLOP/s, streaming
    bandwidth (a matrix-vector product over a matrix far larger than any cache) and the seconds one small
    op costs (dispatch on a CPU, launch on a GPU)."""

    name: str
    flops: float
    bandwidth: float
    op_seconds: float
    dtype: str
    threads: int
    flops_at: dict = field(default_factory=dict)  # {tokens (str): FLOP/s of a [tokens, H] x [H, 4H] matmul}

    def as_dict(self) -> dict:
        return asdict(self)


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


# -------------------------------------------------------------------------------- random-weight models
def _label(config, cfg: dict) -> str:
    """How the caller named a config: the path or shipped name given, else its own name."""
    return str(config) if isinstance(config, (str, Path)) else config_name(config, cfg)


def check_configs(target_config, t: dict, draft_config=None, d: dict | None = None) -> None:
    """The configs as given (``t``, ``d``: their dicts, before any cut) describe a target the cost model
    reads and a DFlash drafter that fits it: the same width and vocabulary (it uses the target's embedding
    and LM head) and target layers the target has. A mismatch would otherwise surface only as a shape
    error inside the first forward, after every random weight was built (seconds to minutes at full width)."""
    facts = {}
    for what, config, cfg in (("target", target_config, t), ("draft", draft_config, d)):
        if cfg is None:
            continue
        try:
            facts[what] = families.facts(cfg, what, purpose="cost model")
        except ValueError as e:
            raise SweepInputError(f"{_label(config, cfg)}: {e}") from None
    tname = _label(target_config, t)
    if facts["target"].draft is not None:
        raise SweepInputError(f"target config {tname} is a DFlash drafter; give a target config (target_config=, "
                              "--config) and the drafter as draft_config= (--draft-config)")
    if d is None:
        return
    dname, df, tf = _label(draft_config, d), facts["draft"], facts["target"]
    if df.draft is None:
        raise SweepInputError(f"draft config {dname} is not a DFlash drafter (no dflash_config / target_layer_ids); "
                              "give a DFlash drafter's config (draft_config=, --draft-config)")
    wrong = pair_mismatch((tf.vocab_size, tf.hidden_size, tf.layers),
                          (df.vocab_size, df.hidden_size, tuple(df.draft.target_layer_ids)))
    if wrong is not None:
        raise SweepInputError(f"draft config {dname} does not fit target config {tname}: {wrong[0]}; give a drafter "
                              f"config made for {tname} (draft_config=, --draft-config)")


def _cut(cfg: dict, config, layers: int | None, what: str, param: str) -> dict:
    """``cfg`` with ``layers`` decoder layers (None: as it is) and a ``_name`` that says so."""
    full = int(cfg["num_hidden_layers"])
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= full:
            raise ValueError(f"{param}={layers!r} must be an integer from 1 to the {what}'s {full}")
        cfg["num_hidden_layers"] = layers
        if cfg.get("layer_types"):
            cfg["layer_types"] = list(cfg["layer_types"])[:layers]
    n = cfg["num_hidden_layers"]
    cfg["_name"] = config_name(config, cfg) + (f" ({n} of {full} layers)" if n != full else "")
    return cfg


def cut_configs(target_config, draft_config=None, layers: int | None = None,
                draft_layers: int | None = None) -> tuple[dict, dict | None]:
    """Shipped (or given) configs as dicts, the target cut to ``layers`` decoder layers and the drafter to
    ``draft_layers`` (each None: as shipped). Every width stays; a cut drafter keeps as many target layers
    as it reads (its fc's width), clamped into the cut target. ``_name`` says what was cut. The configs are
    checked first, as given (``check_configs``)."""
    t = load_config(target_config, "target")
    d = load_config(draft_config, "draft") if draft_config is not None else None
    check_configs(target_config, t, draft_config, d)
    t = _cut(t, target_config, layers, "config", "layers")
    if d is None:
        return t, None
    d = _cut(d, draft_config, draft_layers, "drafter", "draft_layers")
    dfc = dict(d.get("dflash_config") or {})
    ids = dfc.get("target_layer_ids") or d.get("target_layer_ids")
    n = t["num_hidden_layers"]
    if ids:
        dfc["target_layer_ids"] = [min(int(i), n - 1) for i in ids]
    dfc.setdefault("mask_token_id", int(t["vocab_size"]) - 1)  # shipped layouts omit it; any id < vocab runs
    dfc.setdefault("block_size", int(d.get("block_size", 16)))
    d["dflash_config"], d["num_target_layers"] = dfc, n
    return t, d


def _hf_config(cfg: dict):
    from transformers import AutoConfig

    fields = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "model_type"}
    return AutoConfig.for_model(cfg["model_type"], **fields)


def _fill(model: torch.nn.Module, seed: int) -> None:
    """Random weights of a trained model's scale: N(0, 0.02) matrices, unit norms (values do not change
    cost, but a zero or huge weight could make a CPU take a denormal or NaN path)."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)


def random_models(target_config="qwen3-8b", draft_config="qwen3-8b-dflash-b16", device="cpu", dtype="bfloat16",
                  layers: int | None = None, draft_layers: int | None = None, seed: int = 0, rows: int = 1,
                  nodes: int = 64, context: int = 512):
    """A target and a DFlash drafter with random weights in a shipped config's layout, built on ``device``
    without loading a checkpoint (``layers`` / ``draft_layers`` cut the depth). Checks first that the
    sweep of ``rows`` x ``nodes`` after ``context`` fits (``check_fits``). -> workbench Models."""
    from workbench.engine.loading import Models, resolve_device, resolve_dtype

    dev, dt = resolve_device(device), resolve_dtype(dtype)
    t, d = cut_configs(target_config, draft_config, layers, draft_layers)
    if d is None:
        raise ValueError("random_models needs a draft_config (the drafter's block forward is swept too)")
    check_fits(t, d, rows, nodes, context, dt, dev)
    from dflash.model import DFlashDraftModel
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    tcfg, dcfg = _hf_config(t), _hf_config(d)
    dcfg.num_target_layers, dcfg.dflash_config = d["num_target_layers"], d["dflash_config"]
    dcfg.block_size = d["dflash_config"]["block_size"]
    for c in (tcfg, dcfg):
        c._attn_implementation = "sdpa"
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dt)
        with torch.device(dev), no_init_weights():  # _fill sets every weight once, below
            target = AutoModelForCausalLM.from_config(tcfg, dtype=dt)
            draft = DFlashDraftModel(dcfg).to(dt)
    finally:
        torch.set_default_dtype(old)
    _fill(target, seed)
    _fill(draft, seed + 1)
    path = Path(t["_name"])
    return Models(target.eval(), draft.eval(), None, path, Path(d["_name"]), dev, dt,
                  (f"random weights in the layout of {t['_name']} + {d['_name']}",))


# ------------------------------------------------------------------------------------------ memory check
def free_bytes(device) -> int:
    """Memory a sweep may use: the GPU's free memory, or the host's available memory."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: line.split()[1] for line in f}
    return int(info["MemAvailable"]) * 1024


def needed_bytes(target_config: dict, draft_config: dict | None, rows: int, nodes: int, context: int,
                 dtype) -> dict:
    """Bytes a sweep of ``rows`` x ``nodes`` after ``context`` holds at its largest point: weights, K/V
    (target: context + nodes columns; drafter: context + its block) and the largest forward's activations
    (every node's logits, in the model dtype and float32 for the choice; the MLP's widest intermediate; the
    attention scores of a math-path SDPA), from the cost model's per-family facts."""
    from workbench.models.registry import dtype_bytes
    from workbench.shapes.cost import arch

    e = dtype_bytes(dtype)
    a = arch(target_config, "target")
    d = arch(draft_config, "draft") if draft_config is not None else None
    f = a.facts
    weights = (a.params + (d.params if d else 0)) * e
    kv = rows * a.kv_per_token * (context + nodes) * e
    block = d.draft["block_size"] if d else 0
    if d:
        kv += rows * d.kv_per_token * (context + 2 * block) * e
    n = max(nodes, 2 * block)
    H = f.hidden_size
    # the MLP's intermediate width per token (dense, or the routed experts' together): gate, up, product
    inter = max(max((L.mlp + L.topk * L.expert) // (3 * H) for L in f.layer_params), 4 * H)
    heads = f.attention.heads if f.attention else 1
    act = rows * n * (a.vocab * (e + 4) + 4 * inter * e) + rows * heads * n * (context + n) * 4
    return {"weights": int(weights), "kv": int(kv), "activations": int(act), "total": int(weights + kv + act)}


def check_fits(target_config: dict, draft_config: dict | None, rows: int, nodes: int, context: int, dtype,
               device, headroom: float = 0.9) -> dict:
    """Raise a one-line ValueError naming the config, the bytes needed and the fix when the sweep's
    model + K/V + activations would not fit in ``headroom`` of the device's free memory; else the bytes."""
    need = needed_bytes(target_config, draft_config, rows, nodes, context, dtype)
    free = free_bytes(device)
    if need["total"] > headroom * free:
        name = target_config.get("_name") or target_config.get("model_type")
        g = 2 ** 30
        raise ValueError(
            f"{name} in {str(dtype).replace('torch.', '')} at rows={rows}, nodes={nodes}, context={context} needs "
            f"{need['total'] / g:.1f} GiB (weights {need['weights'] / g:.1f}, K/V {need['kv'] / g:.2f}, activations "
            f"{need['activations'] / g:.2f}) but {torch.device(device)} has {free / g:.1f} GiB free: cut layers "
            f"(layers=, --layers), rows or nodes")
    return need


# ------------------------------------------------------------------------------------------ the forwards
def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _layout(models, rows: int, nodes: int, start: int, seed: int):
    """The engine's TreeLayout of ``rows`` random DDTree-built trees of exactly ``nodes`` nodes, rooted at
    ``start`` (tokens from a small slice of the vocabulary: cost does not depend on which)."""
    from ddtree_kernels import build_tree

    from workbench.engine.policies import AR
    from workbench.engine.stages.tree_build import tree_build
    from workbench.engine.stages.tree_compile import tree_compile

    g = torch.Generator().manual_seed(seed)
    depth = models.block_size - 1
    trees = []
    for _ in range(rows):
        lp = torch.log_softmax(torch.randn(1, depth, 64, generator=g) * 2, dim=-1)
        root = torch.randint(0, 64, (1,), generator=g)
        if nodes == 1:  # the root alone, as the engine's tree build gives AR
            trees.append(tree_build(AR(), None, int(root), models.device))
            continue
        t = build_tree(lp.to(models.device), root.to(models.device), nodes - 1)
        if t.n != nodes:
            raise ValueError(f"a tree of {nodes} nodes cannot be built below a block of {models.block_size}")
        trees.append(t)
    return tree_compile(trees, [start] * rows, [depth] * rows)


class _Target:
    """One target state of ``rows`` rows holding ``context`` committed tokens each."""

    def __init__(self, models, rows: int, context: int, max_nodes: int, seed: int):
        from workbench.models.registry import new_target_state

        self.models, self.rows = models, rows
        self.state = new_target_state(models)
        if self.state.supports_static_shapes:
            self.keys = context + max_nodes
            self.state.preallocate(rows, self.keys)
            self.state.cache.set_lengths([context] * rows)  # committed K/V of zeros: its values do not change cost
            self.state.static.set_lengths([context] * rows)
            self.static = True
        else:  # a real prefill of random tokens (dynamic shapes: attention sees context + nodes columns)
            g = torch.Generator().manual_seed(seed)
            vocab = models.target.config.get_text_config(decoder=True).vocab_size
            prompts = torch.randint(0, vocab, (rows, context), generator=g).tolist()
            with torch.no_grad():
                self.state.prefill(prompts)
            self.keys = None
            self.static = False
        self.layouts: dict = {}
        self.context = context

    def layout(self, nodes: int):
        if nodes not in self.layouts:
            self.layouts[nodes] = _layout(self.models, self.rows, nodes, self.context, 1000 * self.rows + nodes)
        return self.layouts[nodes]

    def call(self, nodes: int):
        return lambda: self.state.verify(self.layout(nodes))

    def key_columns(self, nodes: int) -> int:
        return self.keys if self.static else self.context + nodes


class _Draft:
    """One drafter state of ``rows`` rows: ``context - block`` tokens in its cache and ``block`` pending
    context rows (the features of a fully accepted block), drafting the block after ``context``."""

    def __init__(self, models, rows: int, context: int, seed: int):
        from workbench.models.registry import new_draft_state

        m = models
        self.models, self.rows, self.block = m, rows, m.block_size
        if context < self.block:
            raise ValueError(f"context={context} must be at least the drafter's block of {self.block}")
        self.state = new_draft_state(m)
        self.keys = context + self.block
        self.state.preallocate(rows, self.keys)
        F = m.draft.fc.in_features
        g = torch.Generator().manual_seed(seed)
        self.features = (torch.randn(rows, self.block, F, generator=g) * 0.5).to(m.device, m.dtype)
        self.context = context
        self.state.start([self.features[b : b + 1] for b in range(rows)])

    def reset(self) -> None:
        self.state.crop([self.context - self.block] * self.rows)
        self.state.cache.set_lengths([self.context - self.block] * self.rows)
        self.state.context = [self.features[b : b + 1] for b in range(self.rows)]

    def call(self):
        def run():
            self.reset()
            return self.state.draft([1] * self.rows, [self.context] * self.rows)
        return run


def count_ops(fn) -> int:
    """aten ops one call of ``fn`` dispatches (each a kernel launch on a GPU, a dispatch on a CPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Count():
        fn()
    return Count.n


def _time(fn, device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


class Probes:
    """The device's roofline as timed calls that can join a sweep's rounds (so they see the load the points
    see): a [M, H] x [H, N] matmul per token count M (FLOP/s; N = max(4H, 2^22 / H), the peak at M = 2048 on
    a GPU, 256 on a CPU), a matrix-vector product over 2^27 (CPU) or 2^29 (GPU) elements (bytes/s: weights
    read once, as a memory-bound forward reads them) and a chain of 200 one-element adds (seconds per op)."""

    def __init__(self, device, dtype, hidden: int = 4096, tokens=()):
        dev = torch.device(device)
        dt = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype))
        self.device, self.dtype, gpu = dev, dt, dev.type == "cuda"
        self.peak_m = 2048 if gpu else 256
        N = max(4 * hidden, 2 ** 22 // hidden)
        w = torch.randn(N, hidden, device=dev, dtype=dt)
        n = 2 ** (29 if gpu else 27)
        big = torch.empty(n // 8192, 8192, device=dev, dtype=dt).normal_()
        v = torch.randn(1, 8192, device=dev, dtype=dt)
        one = torch.zeros(1, device=dev, dtype=dt)

        def chain():
            for _ in range(200):
                one.add_(1)

        self.calls = []  # (name, fn, work: FLOPs, bytes or ops per call)
        for m in sorted({self.peak_m, *tokens}):
            x = torch.randn(m, hidden, device=dev, dtype=dt)
            self.calls.append((f"matmul {m}", (lambda x=x: x @ w.T), 2 * m * hidden * N))
        self.calls.append(("stream", lambda: v @ big.T, big.numel() * big.element_size()))
        self.calls.append(("op", chain, 200))
        self.samples = {name: [] for name, _, _ in self.calls}

    def run_once(self) -> None:
        for name, fn, _ in self.calls:
            self.samples[name].append(_time(fn, self.device))

    def device_profile(self) -> Device:
        med = {name: statistics.median(self.samples[name]) for name, _, _ in self.calls}
        work = {name: w for name, _, w in self.calls}
        at = {name.split()[1]: work[name] / med[name] for name in med if name.startswith("matmul")}
        gpu = self.device.type == "cuda"
        name = torch.cuda.get_device_name(self.device) if gpu else f"CPU ({os.cpu_count()} cores)"
        return Device(name, at[str(self.peak_m)], work["stream"] / med["stream"], med["op"] / work["op"],
                      str(self.dtype).replace("torch.", ""), torch.get_num_threads(), at)


def measure_device(device, dtype, hidden: int = 4096, tokens=(), repeats: int = 5) -> Device:
    """``Probes`` timed on their own: one warm-up, then the median of ``repeats``."""
    p = Probes(device, dtype, hidden, tokens)
    with torch.no_grad():
        p.run_once()
        p.samples = {k: [] for k in p.samples}
        for _ in range(repeats):
            p.run_once()
    return p.device_profile()


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
                tgt = _Target(models, r, context, max(nodes), seed + r)
                for mode in modes:
                    if mode == "graphs" and not tgt.static:
                        continue
                    calls.append((Point("verify", mode, r, n, tgt.key_columns(n), 0, []), tgt.call(n), tgt.state))
            if draft:
                d = _Draft(models, r, context, seed + 100 + r)
                for mode in modes:
                    calls.append((Point("draft", mode, r, d.block, d.keys, d.block, []), d.call(), d.state))
        for p, fn, state in calls:
            state.graphs = graph_set if p.mode == "graphs" else None
            for _ in range(warmup + (1 if p.mode == "graphs" else 0)):  # graphs: the first call captures
                fn()
            if p.mode == "eager":
                p.ops = count_ops(fn)
        _sync(dev)
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
                p.samples.append(_time(fn, dev))
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


def check_fits_loaded(models, tcfg: dict, dcfg: dict, rows: int, nodes: int, context: int,
                      kv_rows: int | None = None) -> dict:
    """``check_fits`` for models already in memory: their weights are already held, so only K/V and
    activations must fit in what is free. ``kv_rows``: rows of K/V held at once (default ``rows``; a sweep
    holds one state per point)."""
    need = needed_bytes(tcfg, dcfg, rows, nodes, context, models.dtype)
    if kv_rows is not None:
        need["kv"] = needed_bytes(tcfg, dcfg, kv_rows, nodes, context, models.dtype)["kv"]
    free = free_bytes(models.device)
    extra = need["kv"] + need["activations"]
    if extra > 0.9 * free:
        g = 2 ** 30
        raise ValueError(f"{tcfg.get('_name')} at rows={rows}, nodes={nodes}, context={context} needs "
                         f"{extra / g:.2f} GiB of K/V and activations but {models.device} has {free / g:.1f} GiB "
                         f"free: fewer rows, nodes or a shorter context")
    return need


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


# ------------------------------------------------------------------------------------------ the CLI
def _ints(text: str, what: str) -> list[int]:
    try:
        xs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--{what} {text!r} must be comma-separated whole numbers, e.g. 1,4,16") from None
    if not xs or any(x < 1 for x in xs):
        raise ValueError(f"--{what} {text!r}: each must be 1 or more")
    return xs


# the options that choose or shape a measurement: --from (reads one) and --tp-table (measures nothing) use none
MEASURING = ("pair", "config", "draft_config", "layers", "draft_layers", "device", "dtype", "nodes", "rows", "context",
             "repeats", "warmup", "graphs", "no_draft", "threads", "seed", "save")


def add_parser(sub):
    """``python -m workbench sweep`` and its options (registered by workbench.cli). -> the parser."""
    from workbench.engine.validate import as_arg, threads

    p = sub.add_parser("sweep", help="the measured verify/draft forward sweep beside the cost model; --tp-table")
    p.add_argument("--pair", default=None, help="an embedded pair: 'embedded' (the default dense pair) or 'hybrid'")
    p.add_argument("--config", default=None, help="a shipped target config (e.g. qwen3-8b) built with random weights")
    p.add_argument("--draft-config", default="qwen3-8b-dflash-b16", help="the drafter's config with --config")
    p.add_argument("--layers", type=int, default=None, help="cut the target to this many layers (--config)")
    p.add_argument("--draft-layers", type=int, default=None, help="cut the drafter to this many layers (--config)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--dtype", default=None, help="default: float32 on a CPU (its bf16 GEMV is slow), bfloat16 on CUDA")
    p.add_argument("--nodes", default=None, help=f"tree nodes per row (default {','.join(map(str, NODES))}; "
                   f"CPU with --config: {','.join(map(str, CPU_NODES))})")
    p.add_argument("--rows", default=None, help=f"rows (default {','.join(map(str, ROWS))}; CPU with --config: "
                   f"{','.join(map(str, CPU_ROWS))})")
    p.add_argument("--context", type=int, default=512, help="committed tokens per row (default 512)")
    p.add_argument("--repeats", type=int, default=7, help="timed calls per point, interleaved (default 7)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per point first (default 2)")
    p.add_argument("--graphs", action="store_true", help="also replay each point from a CUDA graph (CUDA only)")
    p.add_argument("--no-draft", action="store_true", help="time the verify forward only")
    p.add_argument("--threads", type=as_arg(threads), default=None, help="CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs (default 0)")
    p.add_argument("--save", metavar="FILE", help="write the sweep as JSON to FILE (read it back with --from)")
    p.add_argument("--from", dest="from_file", metavar="FILE", help="a saved sweep: print it and the model's error, "
                   "measure nothing")
    p.add_argument("--tp-table", action="store_true", help="print the TP1/4/8 verify table for the shipped "
                   "configs (cost model only) and exit")
    p.add_argument("--batch", type=int, default=1, help="batch of the --tp-table (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def unused_options(args) -> list[str]:
    """The options given (set away from their defaults) that this invocation would not use, as spelt on the
    command line: measuring options beside --from or --tp-table, --from beside --tp-table, --batch without it."""
    import argparse

    defaults = add_parser(argparse.ArgumentParser().add_subparsers())
    given = [d for d in (*MEASURING, "from_file", "batch") if getattr(args, d) != defaults.get_default(d)]
    if args.tp_table:
        used = {"batch"}
    elif args.from_file:
        used = {"from_file"}
    else:
        used = {*MEASURING}
    spell = {"from_file": "--from"}
    return [spell.get(d, "--" + d.replace("_", "-")) for d in given if d not in used]


def _models_for(args):
    if args.config and args.pair:
        raise ValueError("--config (random weights) and --pair (an embedded checkpoint) exclude each other")
    nodes = _ints(args.nodes, "nodes") if args.nodes else None
    rows = _ints(args.rows, "rows") if args.rows else None
    dev = torch.device(args.device)
    if args.config:
        dtype = args.dtype or ("bfloat16" if dev.type == "cuda" else "float32")
        nodes = nodes or list(NODES if dev.type == "cuda" else CPU_NODES)
        rows = rows or list(ROWS if dev.type == "cuda" else CPU_ROWS)
        m = random_models(args.config, args.draft_config, args.device, dtype, args.layers, args.draft_layers,
                          args.seed, max(rows), max(nodes), args.context)
        return m, nodes, rows
    from workbench.engine.core import load as load_engine

    if args.layers or args.draft_layers:
        raise ValueError("--layers / --draft-layers cut a random-weight --config; an embedded pair runs whole")
    target = "hybrid" if args.pair == "hybrid" else None
    if args.pair not in (None, "embedded", "hybrid"):
        raise ValueError(f"--pair {args.pair!r} must be 'embedded' or 'hybrid'")
    eng = load_engine(target=target, device=args.device, dtype=args.dtype or "auto")
    return eng.models, nodes or list(NODES), rows or list(ROWS)


def run_command(args, out, err) -> int:
    """``python -m workbench sweep``: the measured sweep beside the cost model's prediction, or the TP table."""
    from workbench.shapes.measured import sweep_error

    unused = unused_options(args)
    if unused:  # said now: silently ignored, an option reads as applied to what is printed
        mode = "--tp-table (the cost model's table)" if args.tp_table else (
            "--from (a saved sweep)" if args.from_file else "a measured sweep")
        hint = " (--batch sizes the --tp-table; a measured sweep's batches are --rows)" \
            if "--batch" in unused and not args.tp_table else ""
        raise SweepInputError(f"{', '.join(unused)} would be ignored by {mode}: drop "
                              f"{'it' if len(unused) == 1 else 'them'}{hint}")
    if args.tp_table:
        from workbench.shapes.parallel_table import parallelism_table

        t = parallelism_table(batch=args.batch)
        print(json.dumps(t.as_dict()) if args.json else repr(t), file=out)
        return 0
    if args.from_file:
        s = load(args.from_file)
    else:
        for v, what, least in ((args.context, "context", 1), (args.repeats, "repeats", 1), (args.warmup, "warmup", 0)):
            if v < least:
                raise ValueError(f"--{what} {v} must be at least {least}")
        if args.save:
            from workbench.engine.validate import output_path

            output_path(args.save, "--save")
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        m, nodes, rows = _models_for(args)
        s = sweep(m, nodes, rows, args.context, args.repeats, args.warmup, args.graphs, not args.no_draft, args.seed,
                  progress=lambda msg: print(f"sweep: {msg}", file=err, flush=True))
        if args.save:
            save(s, args.save)
    e = sweep_error(s)
    if args.json:
        print(json.dumps({"sweep": s.as_dict(), "model_error": e.as_dict()}), file=out)
    else:
        print(s.table(), file=out)
        print(repr(e), file=out)
    return 0
