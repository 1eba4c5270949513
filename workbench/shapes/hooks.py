"""Shape capture: forward hooks that record the shape and dtype of what chosen modules see and return.

    with wb.shapes.capture(session):        # session.capture is set for the block, restored after
        session.step()                      # each ForwardRecord of the cycle gets .modules filled

The engine calls ``capture.forward(model_name, mode)`` around each forward and
``capture.take()`` after it (see workbench/records/forward.py). Hooks exist only inside
``forward(...)``; they are removed on exit, also on error. Only shapes and dtypes are
kept, never tensors, so a capture holds no memory of the activations.
"""
from __future__ import annotations

import re
from contextlib import contextmanager

import torch
from torch import nn

from workbench.records.forward import ForwardMode

# Modules hooked by default, as regular expressions over dotted names (full match).
# Target (Qwen3ForCausalLM): embedding output, q/k/v projections and attention output of each
# layer, the final norm, and the LM head (its input is the last hidden state, its output the logits).
TARGET_MODULES = (
    r"model\.embed_tokens",
    r"model\.layers\.\d+\.self_attn(\.[qkv]_proj)?",
    r"model\.norm",
    r"lm_head",
)
# Drafter (DFlashDraftModel): fc + hidden_norm take the target hidden states handed to the drafter.
DRAFT_MODULES = (
    r"fc",
    r"hidden_norm",
    r"layers\.\d+\.self_attn(\.[qkv]_proj)?",
    r"norm",
)
# The drafter borrows the target's embedding and LM head; during a draft forward they are
# recorded under these names.
SHARED_FROM_TARGET = {"target.model.embed_tokens": "model.embed_tokens", "target.lm_head": "lm_head"}


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _shapes(prefix: str, x, out: dict) -> None:
    """Flatten tensors (and tuples/lists of tensors) under dotted keys; everything else is skipped."""
    if isinstance(x, torch.Tensor):
        out[prefix] = {"shape": list(x.shape), "dtype": _dtype(x)}
    elif isinstance(x, (tuple, list)):
        for i, v in enumerate(x):
            _shapes(f"{prefix}.{i}", v, out)


def _modules_of(models) -> dict[str, nn.Module]:
    """{"target": module, "draft": module} from a Session, an Engine, a Models or a dict."""
    if not isinstance(models, dict) and hasattr(models, "models"):  # Session and Engine both carry .models
        models = models.models
    if isinstance(models, dict):
        return dict(models)
    if hasattr(models, "target") and hasattr(models, "draft"):
        return {"target": models.target, "draft": models.draft}
    raise TypeError(f"cannot find target/draft models in {type(models).__name__}; pass a Session, Engine or dict")


class ShapeCapture:
    """Records per-module input/output shapes of the forwards run inside ``forward(...)``.

    ``ShapeCapture(session_or_engine)``; as a context manager over a session it sets
    ``session.capture`` and restores the previous value on exit. Pass it as
    ``engine.session(..., capture=cap)`` to also capture the prefill.
    """

    def __init__(self, models, target_modules=TARGET_MODULES, draft_modules=DRAFT_MODULES):
        self._owner = models if hasattr(models, "capture") else None  # a Session
        self._models = _modules_of(models)
        self._patterns = {"target": [re.compile(p) for p in target_modules],
                          "draft": [re.compile(p) for p in draft_modules]}
        self._records: list[dict] = []
        self._previous = None
        self._active = False

    # ---- the protocol the engine calls
    def _select(self, model_name: str) -> list[tuple[str, nn.Module]]:
        model = self._models[model_name]
        pats = self._patterns.get(model_name, ())
        chosen = [(n, m) for n, m in model.named_modules() if n and any(p.fullmatch(n) for p in pats)]
        if model_name == "draft" and "target" in self._models:
            tgt = dict(self._models["target"].named_modules())
            chosen += [(alias, tgt[n]) for alias, n in SHARED_FROM_TARGET.items() if n in tgt]
        return chosen

    @contextmanager
    def forward(self, model_name: str, mode: ForwardMode):
        """Hook the chosen modules of ``model_name`` for one forward; hooks are gone on exit."""
        if self._active:
            raise RuntimeError("ShapeCapture.forward is not re-entrant: one forward at a time")
        handles = []
        calls: dict[str, int] = {}

        def make_hook(name: str):
            def hook(module, args, kwargs, output):
                # A module called twice in one forward (the drafter's k/v on context, then on the
                # block) gets "#2" so rows stay distinct and aligned.
                calls[name] = calls.get(name, 0) + 1
                key = name if calls[name] == 1 else f"{name}#{calls[name]}"
                ins: dict = {}
                for i, a in enumerate(args):
                    _shapes("input" if len(args) == 1 else f"arg{i}", a, ins)
                for k, v in kwargs.items():
                    _shapes(k, v, ins)
                outs: dict = {}
                _shapes("output", output, outs)
                self._records.append({"name": key, "model": model_name, "mode": str(mode),
                                      "type": type(module).__name__, "inputs": ins, "outputs": outs})
            hook._wb_shape_capture = True  # lets hooks_installed tell ours from transformers' own hooks
            return hook

        self._active = True
        try:
            for name, module in self._select(model_name):
                handles.append(module.register_forward_hook(make_hook(name), with_kwargs=True))
            yield self
        finally:
            for h in handles:
                h.remove()
            self._active = False

    def take(self) -> tuple:
        """The module records since the last take(), in call order; clears them."""
        out, self._records = tuple(self._records), []
        return out

    # ---- as a context manager over a session
    def __enter__(self) -> "ShapeCapture":
        if self._owner is None:
            raise TypeError("use `with wb.shapes.capture(session):` with a Session, or pass capture= to engine.session")
        self._previous = self._owner.capture
        self._owner.capture = self
        return self

    def __exit__(self, *exc) -> bool:
        self._owner.capture = self._previous
        self._previous = None
        return False

    def __repr__(self) -> str:
        return f"ShapeCapture(models={sorted(self._models)}, pending={len(self._records)})"


def capture(session_or_engine, **kw) -> ShapeCapture:
    """``with wb.shapes.capture(session): session.step()`` -- records per-module shapes of that cycle."""
    return ShapeCapture(session_or_engine, **kw)


def hooks_installed(module: nn.Module) -> int:
    """Number of shape-capture hooks on ``module`` and its submodules (0 when no capture is active).

    transformers installs hooks of its own (to collect hidden states); those are not counted.
    """
    return sum(1 for m in module.modules() for h in m._forward_hooks.values() if getattr(h, "_wb_shape_capture", False))
