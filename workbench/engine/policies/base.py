"""The policy interface and the one registry every reader of policies goes through.

A policy decides which drafted prefixes the target verifies. Everything the rest of the workbench asks
of a policy is declared on ``Policy``: its tree build (``build_tree``), its static node count
(``static_nodes``, for CUDA graphs and buffer planning), whether it drafts at all (``drafts``), its label
(``str(policy)``, written back by ``parse_policy``; ``label`` for a menu), its wire name (``kind``), the
integer fields a control edits (``knobs``), the drafter slots it needs (``check_slots``), whether a
small vocabulary can fill it (``capacity``) and whether it can run on a given pair (``for_pair``).

The registry maps each ``kind`` to its class. Parsing (``parse_policy``, ``--policies``), the wire format
(``to_wire`` / ``from_wire``), validation, the stepper and the runner read it; nothing outside this
package tells policies apart by type. A new policy is one class in one file, decorated ``@register``.
"""
from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from torch import Tensor

    from ddtree_kernels import Tree
    from workbench.engine.stages.draft import Draft

MAX_BUDGET = 4096  # a tree larger than this is almost surely a typo (the paper's largest is 1024)


class Policy:
    """What a decoding policy offers the engine, the views and the wire. Subclasses are frozen
    dataclasses whose fields are their settings (``DDTree(budget=32)``)."""

    kind: ClassVar[str]  # the wire name and the short spelling's prefix: 'ddtree' in 'ddtree:32'
    usage: ClassVar[str]  # the short spelling, for error messages: 'ddtree:N'
    drafts: ClassVar[bool] = True  # False: the target decodes alone (no drafter forward, DECODE mode)
    # True: ``parse`` gets the text as written (a value may be a file's path), not lower-cased
    keeps_case: ClassVar[bool] = False
    # True: ``build_rows`` takes several rows at once (drafted.logprobs [n, D, V], roots [n]) and gives each
    # row the tree it would get alone; the tree-build stage then builds a cycle's rows of one policy together
    batched_build: ClassVar[bool] = False
    servable: ClassVar[bool] = True  # False: holds what the wire cannot carry (a Python function)
    knobs: ClassVar[tuple[str, ...]] = ()  # integer fields a control may edit, most important first

    @property
    def label(self) -> str:
        """A short name for a menu ('DDTree'); ``str(policy)`` is the full label ('DDTree(32)')."""
        return type(self).__name__

    def static_nodes(self, block_size: int) -> int:
        """Nodes (root included) of the largest tree this policy builds with a drafter of ``block_size``:
        every verify is padded to it under static shapes."""
        raise NotImplementedError(f"{type(self).__name__} declares no static_nodes(block_size)")

    def build_tree(self, drafted: "Draft", roots: "Tensor", sync_free: bool) -> "Tree":
        """The tree to verify below ``roots`` [1] from the drafter's per-slot log-probs
        (``drafted.logprobs`` [1, D, V], D >= 1; ``drafted.top(k)`` shares one top-k with the record).
        ``sync_free``: never wait for the device (static shapes / CUDA graphs)."""
        raise NotImplementedError(f"{type(self).__name__} declares no build_tree(drafted, roots, sync_free)")

    def build_rows(self, drafted: "Draft", roots: "Tensor", sync_free: bool) -> list["Tree"]:
        """Each row's tree, for ``n`` rows at once (``drafted.logprobs`` [n, D, V], ``roots`` [n]): by default the
        rows of ``build_tree``'s [n, ...] tree (a policy with ``batched_build`` whose build takes n rows)."""
        tree = self.build_tree(drafted, roots, sync_free)
        return [tree[b] for b in range(tree.tokens.shape[0])]

    def capacity(self, slots: int, vocab: int) -> int | None:
        """The most drafted nodes this policy's tree can hold over ``slots`` slots of ``vocab`` tokens when
        that is fewer than it asks for (its tree would be smaller than its label); None otherwise."""
        return None

    def check_slots(self, slots: int) -> None:
        """Refuse (ValueError, one line) a policy that needs more drafted slots than the drafter has."""

    def for_pair(self, pair: dict) -> "Policy":
        """This policy ready to run on ``pair`` (plain data: ``workbench.models.identity.pair_identity``), checked
        before any decode. A policy that holds something made on one pair (a calibration file) refuses another
        pair here (ValueError, one line) and returns a copy bound to what it will use; the rest return
        themselves. Equal to ``self`` either way (binding changes no field)."""
        return self

    @classmethod
    def parse(cls, text: str) -> "Policy | None":
        """This class's policy from ``text`` (stripped, lower case), or None when ``text`` is not one of
        its spellings. Default: 'kind', 'kind:A:B', 'name()', 'name(A, field=B)' with integer (or none)
        arguments, name being the class name."""
        args = spelled_args(text, (cls.kind, cls.__name__.lower()))
        if args is None:
            return None
        pos, kw = args
        try:
            return cls(*pos, **kw)
        except TypeError:
            raise ValueError(f"policy {text!r}: write {cls.usage!r}") from None


_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make ``cls`` a policy every reader knows (parsing, the wire, the stepper)."""
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", kind):
        raise ValueError(f"{cls.__name__}.kind={kind!r} must be a lower-case name, e.g. 'ddtree'")
    if _REGISTRY.get(kind, cls) is not cls:
        raise ValueError(f"policy kind {kind!r} is taken by {_REGISTRY[kind].__name__}; give "
                         f"{cls.__name__} another kind")
    if not isinstance(getattr(cls, "usage", None), str):
        raise ValueError(f"{cls.__name__}.usage must say how to spell it, e.g. 'ddtree:N'")
    _REGISTRY[kind] = cls
    return cls


def unregister(kind: str) -> None:
    """Remove a registered policy (a policy tried out and dropped)."""
    _REGISTRY.pop(kind, None)


def registered() -> dict[str, type[Policy]]:
    """kind -> class, in registration order."""
    return dict(_REGISTRY)


def by_kind(kind: str) -> type[Policy]:
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise ValueError(f"unknown policy kind {kind!r}; known: {', '.join(_REGISTRY)}")
    return cls


def usages() -> str:
    """'ar, dflash, ddtree:N, ...': every spelling parse_policy takes, for error messages."""
    return ", ".join(c.usage for c in _REGISTRY.values() if c.usage)


# 'kind' / 'kind:A:B' / 'name(...)': the shared spellings of Policy.parse
_NAME = r"[a-z][a-z0-9_]*"


def integer_value(val: str):
    """A built-in policy's argument: an integer or 'none' (a ValueError names the value otherwise)."""
    try:
        return None if val == "none" else int(val)
    except ValueError:
        raise ValueError(f"{val!r} is not an integer") from None


def spelled_args(text: str, names, value=integer_value) -> tuple[list, dict] | None:
    """'spine:4' or 'spine(siblings=4)' -> ([4], {}) / ([], {"siblings": 4}) when the text's name is one of
    ``names``; None when it names something else. ``value`` reads each argument (default: integers or
    'none'; the calibrated policies also take floats and text)."""
    t = text.replace(" ", "")
    m = re.fullmatch(rf"({_NAME})(?::(.*)|\((.*)\))?", t)
    if m is None or m.group(1) not in names:
        return None
    raw = m.group(2).split(":") if m.group(2) is not None else (m.group(3).split(",") if m.group(3) else [])
    pos, kw = [], {}
    for a in raw:
        key, _, val = a.partition("=") if re.match(r"[a-z_]+=", a) else ("", "", a)
        try:
            v = value(val)
        except ValueError as e:
            raise ValueError(f"policy {text!r}: {e}") from None
        if key:
            kw[key] = v
        elif kw:
            raise ValueError(f"policy {text!r}: a positional argument follows a named one")
        else:
            pos.append(v)
    return pos, kw


def parse_policy(text: str) -> Policy:
    """Any registered policy's spelling: 'ar', 'dflash', 'ddtree:32' (or 'ddtree:32:1' for a width),
    'eagle:TOPK:STEPS:N', 'spine:K', or any ``str(policy)`` / ``repr(policy)`` ('DDTree(16, width=1)')."""
    if not isinstance(text, str):
        raise TypeError(f"policy {text!r} is not text; use one of {usages()}")
    t = text.strip()
    for cls in _REGISTRY.values():
        p = cls.parse(t if cls.keeps_case else t.lower())
        if p is not None:
            return p
    raise ValueError(f"unknown policy {text!r}; use {usages()}")


def as_policy(p) -> Policy:
    """A policy, its text, or a policy class whose settings all have defaults (``wb.DFlash``)."""
    if isinstance(p, Policy):
        return p
    if isinstance(p, str):
        return parse_policy(p)
    if isinstance(p, type) and issubclass(p, Policy) and p.kind in _REGISTRY:
        try:
            return p()
        except TypeError:
            pass
    raise TypeError(f"policy={p!r} is not a policy; use wb.AR(), wb.DFlash() or wb.DDTree(budget=N)")


# ------------------------------------------------------------------------------------------- the wire
def servable_kinds() -> list[str]:
    return [k for k, c in _REGISTRY.items() if c.servable]


def to_wire(p: Policy) -> dict:
    """DDTree(32) -> {"name": "ddtree", "budget": 32, "width": None}. ValueError: not servable."""
    if not isinstance(p, Policy) or _REGISTRY.get(p.kind) is not type(p) or not p.servable:
        raise ValueError(f"policy {p!r:.80} cannot be served: the wire carries {', '.join(servable_kinds())} "
                         "(a TreePolicy's function runs only in-process; use a local engine)")
    return {"name": p.kind, **{f.name: getattr(p, f.name) for f in dataclasses.fields(p)}}


def from_wire(w: dict) -> Policy:
    """The inverse of ``to_wire`` (``w["name"]`` a kind; the other keys its fields)."""
    cls = _REGISTRY.get(str(w["name"]).lower())
    if cls is None or not cls.servable:
        raise ValueError(f"unknown policy name {str(w['name'])[:60]!r}; use one of {', '.join(servable_kinds())}")
    known = {f.name for f in dataclasses.fields(cls)}
    extra = set(w) - known - {"name"}
    if extra:
        raise ValueError(f"policy {w['name']!r} has no field(s) {', '.join(sorted(map(str, extra)))[:60]}")
    return cls(**{k: v for k, v in w.items() if k != "name"})


# ------------------------------------------------------------------------------------------- controls
def choices(current: Policy | None = None) -> list[tuple[str, str]]:
    """(label, kind) of every policy a menu can make from its defaults, and ``current``'s when it is
    not one of them (a TreePolicy): what the stepper's dropdown lists."""
    out = []
    for kind, cls in _REGISTRY.items():
        try:
            out.append((cls().label, kind))
        except TypeError:  # no defaults for every field (a TreePolicy needs its function)
            continue
    if current is not None and current.kind not in {k for _, k in out}:
        out.append((current.label, current.kind))
    return out


def knob_values(p: Policy) -> list[int | None]:
    """The values of ``p``'s knobs, in order."""
    return [getattr(p, k) for k in p.knobs]


def with_knobs(p: Policy, values: list) -> Policy:
    """``p`` with its knobs set to ``values`` (in order; 0 for a knob whose default is None means None)."""
    defaults = {f.name: f.default for f in dataclasses.fields(p)}
    new = {}
    for k, v in zip(p.knobs, values):
        new[k] = None if v == 0 and defaults.get(k) is None else int(v)
    return dataclasses.replace(p, **new) if new else p
