"""The interface between the cycle and a model: one state object per model, holding every request's rows.

The cycle (``workbench.engine.runner``) never touches a cache, a mask or a model forward; it hands a state the
per-cycle ``TreeLayout`` (architecture-free: tokens, positions, parents, visibility, per-row starts) and
tells it which tree nodes each row accepted. How the state lays out its memory (per-token K/V, a latent, a
recurrent state per request) and which mask or fork it needs is the state's business, as an SGLang
attention backend owns its buffers and ``init_forward_metadata``.

A new architecture plugs in by writing a class that satisfies ``TargetState`` and either naming it for its
family in ``workbench.models.registry`` (``STATES``) or registering a detector with
``registry.register_target_state`` (tried first; the last registered first).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor

from workbench.records.forward import ForwardRecord
from workbench.models.layout import TreeLayout
from workbench.models.registry import StateSpec


@dataclass
class StepOut:
    """What one forward of a state returns to the cycle."""

    logits: Tensor  # [B, n, V]: prefill: each row's last prompt token (n = 1); verify/decode: every node
    features: Tensor | None  # [B, n, F]: the drafter's context (target hidden states); prefill: [B, P, F] padded
    record: ForwardRecord


@runtime_checkable
class TargetState(Protocol):
    """The target model's state over B >= 1 rows (requests), row b of every buffer belonging to request b.

    Row lengths are host ints: ``lengths[b]`` tokens of request b are committed (= the position of its
    pending root). Every method keeps the rows' order; only ``select`` changes which rows exist.

    Capabilities and settings every state declares (the cycle reads and sets them, never probes for them):
    ``supports_static_shapes`` (``preallocate`` works: fixed shapes and storage from then on, no host reads
    between forwards), ``kernel_backend`` (set before each verify from the session's setting; used by
    states that run kernels inside their forward), ``graphs`` (None, or the engine's
    ``workbench.engine.graphs.Graphs``, set after ``preallocate``: static forwards captured and replayed),
    ``capture`` (None, or a ``workbench.shapes.ShapeCapture`` set between cycles: forwards record module
    shapes) and ``state_from`` (None, or int64 [B, N] after a verify: the node whose recurrent state each node
    continued, -1 = the committed state; recorded as ``Cycle.state_from``).
    """

    lengths: list[int]
    supports_static_shapes: bool
    kernel_backend: str
    graphs: object | None
    capture: object | None
    state_from: Tensor | None

    def preallocate(self, rows: int, capacity: int) -> None:
        """Static shapes from now on: buffers for ``rows`` rows of ``capacity`` tokens, allocated once.
        Only where ``supports_static_shapes``; refuses (ValueError) elsewhere."""

    def prefill(self, prompts: list[list[int]]) -> StepOut:
        """EXTEND over each row's prompt (rows start empty). Commits the prompts; logits [B, 1, V] at each
        row's last prompt token, features [B, max P, F] (row b's first len(prompts[b]) are real)."""

    def verify(self, layout: TreeLayout) -> StepOut:
        """TARGET_VERIFY over the layout's [B, N] nodes (row b's tree rooted at ``layout.starts[b]`` ==
        ``lengths[b]``): every node sees its row's committed prefix and its own ancestors. Leaves the
        committed state as it was (the tree is scratch until ``commit``)."""

    def decode(self, layout: TreeLayout) -> StepOut:
        """DECODE: ``verify`` of a root-only layout (N == 1), labelled and planned as plain decoding."""

    def commit(self, layout: TreeLayout, nodes: list[Tensor]) -> None:
        """Keep the accepted nodes of the last verify: ``nodes[b]`` int64 [L_b + 1], root first, in path
        order (indices into row b's tree). Afterwards ``lengths[b] == layout.starts[b] + len(nodes[b])``."""

    def crop(self, lengths: list[int]) -> None:
        """Roll every row back to ``lengths[b]`` committed tokens (<= now). Refuses where ``can_crop`` is False."""

    def can_crop(self, lengths: list[int]) -> bool:
        ...

    def select(self, rows: list[int]) -> None:
        """Keep only these rows, in this order (retiring finished requests)."""

    @property
    def rows(self) -> int:
        """How many rows (requests) this state holds."""

    def admit(self, other: "TargetState") -> None:
        """Append ``other``'s rows (requests prefilled apart, by a state of the same class) after these:
        requests joining running rows. Dynamic shapes only; a static-shape state refuses (ValueError)."""

    def take(self, rows: list[int]) -> "TargetState":
        """A new state of the same class holding copies of ``rows``, in that order; this one is unchanged
        (a driver steps a subset, then ``admit``s the copy back)."""

    def view(self, row: int) -> list[tuple[Tensor, ...]]:
        """Read-only per-layer views of one row's committed state (dense: (keys, values) [1, H, len, D])."""

    def describe(self, batch: int | None = None, length: int | None = None, nodes: int = 0) -> list[StateSpec]:
        """The buffers a forward of ``batch`` rows at ``length`` committed tokens with ``nodes`` scratch
        nodes holds (defaults: now). From the config alone; no tensors are made."""

    def nbytes(self) -> int:
        """Bytes of committed state held for all rows now."""


@dataclass(frozen=True)
class DraftInput:
    """What one row's draft forward was handed, read from the very tensors the forward got (copies): its new
    context rows (the target features of committed positions not yet in the drafter's cache) and its block.
    Given to ``DraftState.draft``'s ``observe`` (the ``cycle.hook_draft_input`` hook point), never built
    otherwise. A context that went in several forwards (static shapes: block-sized chunks) is joined."""

    context_features: Tensor  # [c, F]: F = len(target_layer_ids) * hidden, the target's layers side by side
    context_positions: Tensor  # int64 [c]: the positions the forward gave those rows
    block_tokens: Tensor  # int64 [Bk]: the root, then the mask token in every slot
    block_positions: Tensor  # int64 [Bk]


@runtime_checkable
class DraftState(Protocol):
    """The drafter's state over B >= 1 rows, beside the target's (``TargetState``): its own K/V of the
    committed positions it has seen, and each row's pending target context (features of committed positions
    not yet in its cache). One per session or batch; the cycle drafts, then hands it the newly committed
    features.

    Declares ``supports_static_shapes``, ``graphs``, ``capture`` and ``kernel_backend`` as ``TargetState``
    does (the drafter's forward runs no kernel of its own: "torch").
    """

    lengths: list[int]
    supports_static_shapes: bool
    kernel_backend: str
    graphs: object | None
    capture: object | None

    def preallocate(self, rows: int, capacity: int) -> None:
        """Static shapes from now on (as ``TargetState.preallocate``)."""

    def start(self, features: list[Tensor]) -> None:
        """Rows begin empty with the prefill's features as pending context ([1, P_b, F] each)."""

    def add_context(self, features: list[Tensor | None]) -> None:
        """Append each row's newly committed features [1, k_b, F] (None: none) to its pending context."""

    def draft(self, roots: list[int], starts: list[int], observe=None) -> tuple[Tensor, ForwardRecord]:
        """One block forward for every row: [root, MASK x (block - 1)] at positions [start, start + block).
        -> (logits [B, block - 1, V], record). Afterwards row b's cache holds exactly [0, starts[b]).
        ``observe``: None, or a callable given one ``DraftInput`` per row after the forward (copies of what it
        read); only the ``cycle.hook_draft_input`` hook point passes one."""

    def crop(self, lengths: list[int]) -> None:
        """Roll every row back to at most ``lengths[b]`` cached tokens."""

    def select(self, rows: list[int]) -> None:
        """Keep only these rows, in this order."""

    @property
    def rows(self) -> int:
        """How many rows this state holds."""

    def admit(self, other: "DraftState") -> None:
        """Append ``other``'s rows (K/V and pending context) after these."""

    def take(self, rows: list[int]) -> "DraftState":
        """A new state holding copies of ``rows``; this one is unchanged."""

    def view(self, row: int) -> list[tuple[Tensor, ...]]:
        """Read-only per-layer (keys, values) of one row's cache."""

    def describe(self, batch: int | None = None, length: int | None = None, nodes: int = 0) -> list[StateSpec]:
        """The drafter's buffers at ``batch`` rows of ``length`` (+ ``nodes``) tokens (defaults: now)."""

    def nbytes(self) -> int:
        """Bytes of K/V held for all rows now."""
