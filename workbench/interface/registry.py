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


class EngineEntryError(ValueError):
    """An engine entry ('module:Class') naming a module or class that is not there, or a module that fails."""


def engine_class(name) -> type[BaseEngine]:
    """The engine class registered under ``name`` (imported now). An entry naming a module its installed
    package lacks, or a class its module lacks, is one line saying which (a package that is not installed
    stays an ImportError: the command line says what to pip install)."""
    path = known()[check_name(name)]
    module, _, cls_name = path.partition(":")
    entry = f"engine {name!r} ({path}{declared_where(name)})"
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        gone = e.name or ""
        if "." not in gone or not (module == gone or module.startswith(gone + ".")):
            raise  # the package itself, or a package the module imports: what to install
        parent, _, leaf = gone.rpartition(".")
        raise EngineEntryError(f"{entry}: module {gone} is not there: {parent} is installed, but has no {leaf!r}; "
                               "the entry names a module its package lacks") from None
    except ImportError:
        raise
    except Exception as e:  # the engine's module raised on import: its error, on one line
        raise EngineEntryError(f"{entry}: importing {module} failed: {type(e).__name__}: "
                               f"{' '.join(str(e).split())}") from None
    cls = getattr(mod, cls_name, None) if cls_name else None
    if cls is None:
        there = sorted(n for n, v in vars(mod).items() if isinstance(v, type) and issubclass(v, BaseEngine)
                       and v.__module__ == mod.__name__)
        raise EngineEntryError(f"{entry}: {module} has no {cls_name!r}"
                               + (f"; its engine classes: {', '.join(there)}" if there else
                                  "; it defines no BaseEngine subclass"))
    if not (isinstance(cls, type) and issubclass(cls, BaseEngine)):
        raise EngineEntryError(f"{entry}: {cls_name} is not a workbench.interface.base.BaseEngine subclass")
    return cls


def declared_where(name: str) -> str:
    """", the workbench.engines entry point of DIST" for an engine an installed package declares (and no
    registration in this process overrides), else ""."""
    if name in ENGINES:
        return ""
    dist = plugins.declared_by(plugins.ENGINE_GROUP, name)
    return f", the {plugins.ENGINE_GROUP} entry point of {dist}" if dist else ""


def load(engine: str = "workbench", target=None, draft=None, **options) -> BaseEngine:
    """The engine ``engine`` over the pair: ``engine_class(engine).load(target, draft, **options)``."""
    return engine_class(engine).load(target, draft, **options)
