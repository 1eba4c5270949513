"""Session observers: what ``engine.session(..., NAME=VALUE)`` / ``batch_session`` attach to the requests
they start, looked up by name.

Why a registry: an observer (the cycle dump's writer) lives on a floor above the engine and hangs on the
requests' hook points (``workbench.engine.hooks``), so the engine must not import it. The observer's module
registers itself when it is imported (``workbench.conform.engine_dump`` registers ``dump``; ``import workbench``
imports ``workbench.conform``, so it is there whenever the package is), and the engine finds it here by the
keyword's name. A keyword whose observer nobody registered is refused in one line, before the prefill.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Observer:
    """One session keyword. ``check(value, **options)`` runs before the prefill and raises a one-line
    ValueError naming a bad value; ``attach(engine, requests, rows, value, **options)`` runs after it and
    returns the handle each request keeps as ``request.observers[name]``."""

    name: str
    check: Callable[..., None]
    attach: Callable[..., object]


OBSERVERS: dict[str, Observer] = {}
# Who registers the observers the engine's own keywords name: said when one is missing.
PROVIDERS = {"dump": "workbench.conform.engine_dump"}


def register_observer(name: str, check: Callable[..., None], attach: Callable[..., object]) -> None:
    """Make ``engine.session(..., name=VALUE)`` attach an observer (a later registration replaces one)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_observer({name!r}, ...): the name is a session keyword, e.g. 'dump'")
    if not callable(check) or not callable(attach):
        raise ValueError(f"register_observer({name!r}, ...): check and attach must be functions")
    OBSERVERS[name] = Observer(name, check, attach)


def observer(name: str) -> Observer:
    """The observer registered as ``name``; a one-line ValueError naming who registers it otherwise."""
    found = OBSERVERS.get(name)
    if found is None:
        who = PROVIDERS.get(name, "its module")
        raise ValueError(f"{name}= has no observer registered in this process: {who} registers it when imported "
                         f"(import workbench does); import it first, or leave {name}= out")
    return found


def attach(name: str, engine, requests: list, rows, value, **options) -> object:
    """Attach the observer ``name`` to ``requests`` (already prefilled, stepped over ``rows``); each request
    keeps its handle as ``request.observers[name]``. -> the handle."""
    handle = observer(name).attach(engine, requests, rows, value, **options)
    for r in requests:
        r.observers[name] = handle
    return handle
