"""Extensions from other installed packages, found through entry points (as pytest and Jupyter find theirs).

A package that ships a policy or an engine declares it in its own metadata, and no file of this project is
edited to reach it:

    [project.entry-points."workbench.policies"]
    mine = "my_pkg.my_policy"              # a module whose import registers the policy (@register)

    [project.entry-points."workbench.engines"]
    slowref = "my_pkg.my_engine:SlowRef"   # a BaseEngine subclass, imported only when that engine loads

Policies load when ``workbench.engine.policies`` is imported (every reader of a spelling goes through it), so
the CLI, the stepper, the served engine and ``pays-off`` know them; engines are listed by name and imported on
``wb.load(engine=NAME)``. A plugin that fails to import is named in one warning line (a ``PluginWarning``,
located in the plugin's module, not in ours), never silently dropped, and never stops the workbench from
starting: where warnings are errors (``-W error``) the line is printed instead of raised. Filter it as any
warning: ``-W "ignore:workbench.policies plugin"``, or ``warnings.simplefilter("ignore", PluginWarning)``.
"""
from __future__ import annotations

import sys
import warnings
from importlib.metadata import entry_points

POLICY_GROUP = "workbench.policies"
ENGINE_GROUP = "workbench.engines"

_loaded: set[str] = set()  # entry-point values already imported in this process (import once)


class PluginWarning(UserWarning):
    """An installed package's entry point (a plugin) that failed to import."""


def declared(group: str) -> dict[str, str]:
    """name -> 'module' or 'module:attr', for every installed package's entry point in ``group``."""
    return {ep.name: ep.value for ep in entry_points(group=group)}


def declared_by(group: str, name: str) -> str | None:
    """The installed distribution whose entry point declares ``name`` in ``group`` (None: none does)."""
    for ep in entry_points(group=group):
        if ep.name == name:
            return getattr(ep.dist, "name", None)
    return None


def import_declared(group: str) -> list[str]:
    """Import every module declared in ``group`` (once per process); the names that loaded. A plugin that
    raises is reported in one warning naming its entry point and the error."""
    import importlib

    done = []
    for name, value in declared(group).items():
        module = value.partition(":")[0]
        if value in _loaded:
            done.append(name)
            continue
        try:
            importlib.import_module(module)
        except Exception as e:  # a broken third-party plugin must not stop the workbench from starting
            warn_broken(f"{group} plugin {name!r} ({value}) failed to import: {type(e).__name__}: "
                        f"{' '.join(str(e).split())}", module, e)
            continue
        _loaded.add(value)
        done.append(name)
    return done


def warn_broken(message: str, module: str, error: BaseException) -> None:
    """One ``PluginWarning`` line, located at the plugin's own module (and its line that raised, where the
    traceback passes through it), so no source line of ours is shown under it. Where a filter turns it into an
    error, the same line goes to stderr: a broken plugin never stops the import of the workbench."""
    lineno, tb = 0, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") == module:
            lineno = tb.tb_lineno
        tb = tb.tb_next
    try:
        warnings.warn_explicit(message, PluginWarning, module, lineno, module=module)
    except PluginWarning:
        sys.stderr.write(warnings.formatwarning(message, PluginWarning, module, lineno, line=""))
