"""The engines by name: ``wb.load(engine=NAME)`` and the CLI's ``--engine`` pick from here.

An entry names its class as 'module:Class', imported only when that engine loads (vLLM is optional, and
importing it costs seconds). To add an engine: write one module with a ``BaseEngine`` subclass
(``workbench.interface.base``) and add its line to ``ENGINES`` (or call ``register_engine`` from your code).
"""
from __future__ import annotations

import importlib

from workbench.interface.base import BaseEngine

ENGINES: dict[str, str] = {
    "workbench": "workbench.engine.core:Engine",  # the workbench's own engine (the default)
    "vllm": "workbench.engines.vllm_engine:VllmEngine",  # vLLM's DFlash in this process (pip extra [vllm])
}


def engine_names() -> list[str]:
    return list(ENGINES)


def register_engine(name: str, path: str) -> None:
    """Make ``wb.load(engine=name)`` load the ``BaseEngine`` subclass at ``path`` ('module:Class')."""
    if not isinstance(name, str) or not name or ":" not in str(path):
        raise ValueError(f"register_engine({name!r}, {path!r}): give a name and 'module:Class'")
    ENGINES[name] = path


def unregister_engine(name: str) -> None:
    ENGINES.pop(name, None)


def check_name(name) -> str:
    """``name`` when it is a registered engine; else one line listing the known ones."""
    if name not in ENGINES:
        raise ValueError(f"engine={name!r} is not known; known engines: {', '.join(ENGINES)}")
    return name


def engine_class(name) -> type[BaseEngine]:
    """The engine class registered under ``name`` (imported now)."""
    module, _, cls_name = ENGINES[check_name(name)].partition(":")
    cls = getattr(importlib.import_module(module), cls_name)
    if not (isinstance(cls, type) and issubclass(cls, BaseEngine)):
        raise TypeError(f"engine {name!r} ({ENGINES[name]}) is not a workbench.interface.base.BaseEngine")
    return cls


def load(engine: str = "workbench", target=None, draft=None, **options) -> BaseEngine:
    """The engine ``engine`` over the pair: ``engine_class(engine).load(target, draft, **options)``."""
    return engine_class(engine).load(target, draft, **options)
