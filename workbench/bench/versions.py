"""The versions a benchmark's numbers depend on: every bench and ``run --json`` record them beside its figures."""
from __future__ import annotations

import torch


def versions() -> dict:
    """The versions a benchmark's numbers depend on."""
    import platform

    import transformers

    from workbench.version import __version__

    out = {"workbench": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version()}
    try:
        from importlib.metadata import version

        out["sglang"] = version("sglang")
    except Exception:  # noqa: BLE001 - not installed
        out["sglang"] = None
    return out
