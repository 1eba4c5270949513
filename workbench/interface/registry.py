"""The engines by name: ``wb.load(engine=NAME)`` and the CLI's ``--engine`` pick from here.

An entry names its class as 'module:Class', imported only when that engine loads (vLLM is optional, and
importing it costs seconds). To add an engine: write one module with a ``BaseEngine`` subclass
(``workbench.interface.base``) and declare it as an entry point of your package in the group
``workbench.engines`` (``workbench.interface.plugins``), or call ``register_engine`` from your code.
"""
from __future__ import annotations

import importlib

from workbench.interface import plugins
from workbench.interface.base import BaseEngine

ENGINES: dict[str, str] = {
    "workbench": "workbench.engine.core:Engine",  # the workbench's own engine (the default)
    "vllm": "workbench.adapters.vllm_engine:VllmEngine",  # vLLM's DFlash in this process (pip extra [vllm])
}
# Engines reached over HTTP have no load(): the line that says how to reach them instead.
REACHED_OTHERWISE = {"served": "a served engine is reached with wb.connect(URL, token=...) "
                               "(python -m workbench serve starts one), not wb.load"}


def known() -> dict[str, str]:
    """name -> 'module:Class': those installed packages declare (entry points), then the built-in ones and
    those registered in this process, which win a name both give."""
    return {**plugins.declared(plugins.ENGINE_GROUP), **ENGINES}


def engine_names() -> list[str]:
    return list(known())


def register_engine(name: str, path: str) -> None:
    """Make ``wb.load(engine=name)`` load the ``BaseEngine`` subclass at ``path`` ('module:Class')."""
    if not isinstance(name, str) or not name or ":" not in str(path):
        raise ValueError(f"register_engine({name!r}, {path!r}): give a name and 'module:Class'")
    ENGINES[name] = path


def unregister_engine(name: str) -> None:
    ENGINES.pop(name, None)


class UnknownEngine(ValueError):
    """An engine name no registry entry, entry point or registration gives."""


def check_name(name) -> str:
    """``name`` when it is a registered engine; else one line listing the known ones."""
    if name in REACHED_OTHERWISE:
        raise UnknownEngine(f"engine={name!r}: {REACHED_OTHERWISE[name]}")
    if name not in known():
        raise UnknownEngine(f"engine={name!r} is not known; known engines: {', '.join(known())}")
    return name


def engine_class(name) -> type[BaseEngine]:
    """The engine class registered under ``name`` (imported now)."""
    path = known()[check_name(name)]
    module, _, cls_name = path.partition(":")
    cls = getattr(importlib.import_module(module), cls_name)
    if not (isinstance(cls, type) and issubclass(cls, BaseEngine)):
        raise TypeError(f"engine {name!r} ({path}) is not a workbench.interface.base.BaseEngine")
    return cls


def load(engine: str = "workbench", target=None, draft=None, **options) -> BaseEngine:
    """The engine ``engine`` over the pair: ``engine_class(engine).load(target, draft, **options)``."""
    return engine_class(engine).load(target, draft, **options)
