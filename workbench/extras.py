"""Which optional extra brings which import, and the one line that says how to install it.

A wheel user installs an extra by name (``pip install 'ddtree-workbench[serve]'``); a checkout's
``make install`` installs them all. pyproject.toml's optional-dependencies list the same packages
(tests/packaging/test_wheel.py holds the two together and runs each CLI command without them).
"""
from __future__ import annotations

EXTRA_OF = {  # top-level import name -> the extra that installs it
    "dflash": "dflash", "fastapi": "serve", "uvicorn": "serve", "vllm": "vllm",
    "plotly": "notebook", "ipywidgets": "notebook", "anywidget": "notebook", "jupytext": "notebook",
}
ALSO = {
    # dflash's metadata pins tqdm, requests and datasets exactly; its model code imports only torch and transformers
    "dflash": "; or `pip install --no-deps dflash==0.1.0`, which keeps your own tqdm and requests",
    "vllm": "; on a CPU machine `make install-vllm` installs vLLM's CPU build",
}


def pip_command(module: str) -> str:
    """The pip command that installs ``module`` for a wheel user: its extra, else the package itself."""
    top = module.split(".")[0]
    extra = EXTRA_OF.get(top)
    if extra is None:
        return f"pip install {top}"
    return f"pip install 'ddtree-workbench[{extra}]'" + ALSO.get(top, "")


def missing(what: str, module: str) -> str:
    """One line: ``what`` needs ``module``, which is not installed, and how to install it."""
    return f"{what} needs the {module.split('.')[0]!r} package, which is not installed: {pip_command(module)}"


def missing_package(e: ImportError, what: str) -> str:
    """The line for an ImportError that reached a command: the missing package (``e.name``) with its pip
    command, or else the error's own text on one line."""
    if e.name:
        return missing(what, e.name)
    return " ".join(str(e).split()) or f"{what}: {type(e).__name__}"
