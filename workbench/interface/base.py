"""What an engine and its sessions offer the views, traces, stepper, bench and comparison report.

Every engine (the workbench's own, ``workbench.engine.core.Engine``; vLLM in process,
``workbench.adapters.vllm_engine.VllmEngine``; a served one over HTTP, ``workbench.serve.client.RemoteEngine``)
derives from ``BaseEngine`` and its sessions implement ``BaseSession``, as SGLang's attention backends derive
from one ``AttentionBackend`` and vLLM's proposers from one proposer base. ``workbench.interface.registry`` finds
an engine by its ``name``.

An engine that lacks an operation says so in one line naming what to use instead (``BaseEngine.lacks``,
from the class's ``instead``), rather than failing somewhere inside.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from workbench.records.cycle import Cycle, Trace


DEFAULT_MAX_NEW_TOKENS = 128  # the one default of every engine's session and generate, and of the CLI


class EngineLacks(NotImplementedError):
    """An operation this engine does not offer; the message names what to use instead."""


class BaseEngine(ABC):
    """Loaded models that start sessions. ``name`` is the registry's key (``wb.load(engine=name)``)."""

    name: ClassVar[str]
    # operation -> what to use instead, for the operations this engine lacks (batch_session, replay)
    instead: ClassVar[dict[str, str]] = {}
    # the policy a command runs when none is named, and the policy kinds its sessions take (None: every one)
    default_policy: ClassVar[str] = "ddtree:32"
    policy_kinds: ClassVar[tuple[str, ...] | None] = None
    tokenizer: Any  # the target's tokenizer: the views decode token ids with it

    @classmethod
    @abstractmethod
    def load(cls, target=None, draft=None, **options) -> "BaseEngine":
        """The engine over a target and its drafter (None, None: the embedded pair). ``options`` are the
        engine's own (``wb.load``'s keywords); one it cannot honour is refused in one line, before loading."""

    @property
    @abstractmethod
    def device(self) -> "torch.device":
        """What the engine runs on (traces record it)."""

    @abstractmethod
    def session(self, prompt: str | None = None, policy=None, temperature: float = 0.0,
                max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, *, prompt_ids=None, **settings) -> "BaseSession":
        """Start one generation (its prefill runs now)."""

    def batch_session(self, prompts=None, policy=None, **kw):
        """Several generations stepped together (``workbench.engine.batch``)."""
        raise self.lacks("batch_session")

    def replay(self, trace: "Trace", **kw) -> "BaseSession":
        """A new session that re-runs ``trace`` cycle by cycle."""
        raise self.lacks("replay")

    def close(self) -> None:
        """Release what the engine holds outside Python's reach (hooks, patches)."""

    def lacks(self, operation: str) -> EngineLacks:
        """The one-line error of an operation this engine does not offer."""
        hint = self.instead.get(operation, "use the workbench's engine (wb.load())")
        return EngineLacks(f"the {self.name} engine has no {operation}(): {hint}")


class BaseSession(ABC):
    """One generation stepped a cycle at a time: what the stepper, the views, the bench and the comparison
    report read and set. Settings an engine cannot change refuse a new value in one line."""

    engine: BaseEngine
    prompt: str
    prompt_ids: list[int]
    generated: list[int]  # new token ids, the pending bonus included
    finish_reason: str | None
    trace: "Trace"

    @abstractmethod
    def step(self) -> "Cycle":
        """One draft/verify cycle, recorded (``SessionFinished`` once the session has ended)."""

    @abstractmethod
    def run(self, max_new_tokens: int | None = None) -> "Trace":
        """Step until the session ends."""

    def close(self) -> None:
        """End the request early (a no-op where nothing is held)."""

    @property
    @abstractmethod
    def text(self) -> str:
        """The generated text so far."""

    # the settings the stepper shows and passes back on reset
    policy: Any
    temperature: float
    top_p: float
    top_k: int
    seed: int
    max_new_tokens: int
    kernel_backend: str
    record_topk: int
    capture: Any
