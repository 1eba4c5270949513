"""What a state installs on a shared model, removed when the last state that needs it ends.

A model is shared by every session of an engine, and some states need something installed on it for their
forwards: the hybrid state replaces each GatedDeltaNet module's ``forward`` with a router (hybrid.py), the
drafter state adds a per-layer mask pre-hook when its layers need different masks (drafter.py). Each state
*holds* what it installed for as long as it lives: the first holder installs, and when the last holder
ends (its ``release``, or the state's garbage collection with its session) the install is undone and the
modules are as they were, as TransformerLens removes its hooks when their context ends (``reset_hooks_end``).
"""
from __future__ import annotations

import weakref
from typing import Callable


class HeldInstall:
    """One kind of install (``install(model) -> undo()``), held per model by any number of owners."""

    def __init__(self, install: Callable[[object], Callable[[], None]]):
        self._install = install
        self._held: dict[int, list] = {}  # id(model) -> [holders, undo]; the undo keeps the model alive

    def hold(self, owner, model) -> Callable[[], None]:
        """Install on ``model`` unless held already; ``owner`` holds it until ``release()`` is called or the
        owner is collected, whichever comes first. -> release (idempotent)."""
        key = id(model)
        entry = self._held.get(key)
        if entry is None:
            entry = self._held[key] = [0, self._install(model)]
        entry[0] += 1
        released = []

        def release() -> None:
            if released:
                return
            released.append(True)
            entry[0] -= 1
            if entry[0] == 0:
                if self._held.get(key) is entry:
                    del self._held[key]
                entry[1]()

        weakref.finalize(owner, release)
        return release

    def holders(self, model) -> int:
        """How many live owners hold the install on ``model`` (0: not installed)."""
        entry = self._held.get(id(model))
        return entry[0] if entry else 0
