"""Execute notebook sources into their .ipynb files and store the outputs (the notebooks are committed with them).

Each notebook's cells live in its own source file beside it, ``notebooks/NN_name.py``, in jupytext's percent
format (``# %%`` starts a code cell, ``# %% [markdown]`` a markdown cell): edit the source, then

    .venv/bin/python notebooks/build.py 03         # rebuild the notebooks whose names start with 03
    .venv/bin/python notebooks/build.py            # every notebook (minutes: executes them all)
    .venv/bin/python notebooks/build.py --stamp 03 # only rewrite the run-time note from the stored timings
    .venv/bin/python notebooks/build.py --check    # execute nothing: which notebooks differ from their sources

nbval (``make test``) re-runs every notebook and compares its outputs with the stored ones, and
``tests/notebooks/test_sources.py::test_every_notebook_is_its_source`` fails when a notebook's cells differ from
its source, so a source edited without a rebuild fails the suite. Cells starting with ``# NBVAL_IGNORE_OUTPUT``
hold figures, widgets and timings.
"""
from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).parent
IGNORE = "# NBVAL_IGNORE_OUTPUT\n"
MAX_NOTEBOOK_BYTES = 1_000_000
RUN_TIME_MARK = "<!-- run time -->"  # the note at the top of every notebook: how long its cells took


def sources(folder: Path = HERE) -> dict[str, Path]:
    """Every notebook source, ``NN_name`` -> ``folder / NN_name.py``, in order."""
    return {p.stem: p for p in sorted(Path(folder).glob("[0-9][0-9]_*.py"))}


def source_cells(path: Path) -> list:
    """The cells of one percent-format source, as fresh nbformat cells (no metadata: what the notebook stores)."""
    import jupytext

    make = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell}
    return [make[c.cell_type](c.source) for c in jupytext.read(path, fmt="py:percent").cells]


def stale_cells(nb, cells: list) -> list[str]:
    """Where a stored notebook differs from its source's cells (the run-time note aside): one line per
    difference, none when the notebook is its source's build."""
    stored = [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]
              if RUN_TIME_MARK not in "".join(c["source"])]
    wanted = [(c["cell_type"], c["source"]) for c in cells]
    out = [f"cell {i + 1}: the notebook has {a[0]} {a[1][:60]!r}, the source {b[0]} {b[1][:60]!r}"
           for i, (a, b) in enumerate(zip(stored, wanted)) if a != b]
    if len(stored) != len(wanted):
        out.append(f"{len(stored)} cells in the notebook, {len(wanted)} in the source")
    return out


def drop_widget_state(nb) -> None:
    """Widgets need a live kernel; their saved state is no use in a file and can be huge (each plotly
    FigureWidget stores the plotly.js bundle: 5 MB), so a notebook keeps none."""
    nb.metadata.pop("widgets", None)


def cell_seconds(cell) -> float:
    """Seconds one executed cell took, from the timings nbclient stores in its metadata (0 if none)."""
    ex = (cell.get("metadata") or {}).get("execution") or {}
    start, end = ex.get("iopub.execute_input"), ex.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    parse = lambda t: datetime.fromisoformat(t.replace("Z", "+00:00"))  # noqa: E731
    return max((parse(end) - parse(start)).total_seconds(), 0.0)


def run_time_note(nb, cores: int | None = None) -> str:
    total = sum(cell_seconds(c) for c in nb["cells"] if c.get("cell_type") == "code")
    longest = max((cell_seconds(c) for c in nb["cells"] if c.get("cell_type") == "code"), default=0.0)
    say = lambda t: f"{t:.0f} s" if t < 90 else f"{t / 60:.1f} min"  # noqa: E731
    cores = cores or os.cpu_count() or 1
    return (f"{RUN_TIME_MARK}\n*Run time: about {say(total)} for all cells (the longest {say(longest)}), from the cell "
            f"timings stored at its last build, on a {cores}-core CPU machine. On a machine shared with other work (a "
            "training run, other notebooks) expect several times that; the long cells show a progress bar.*")


def stamp_run_time(nb, cores: int | None = None) -> None:
    """Put (or update) the run-time note right after the title cell, from the stored cell timings."""
    text = run_time_note(nb, cores)
    cells = nb["cells"]
    at = next((i for i, c in enumerate(cells) if c.get("cell_type") == "markdown" and RUN_TIME_MARK in
               "".join(c.get("source", ""))), None)
    if at is not None:
        cells[at]["source"] = text
    else:
        cells.insert(1 if cells and cells[0].get("cell_type") == "markdown" else 0, nbformat.v4.new_markdown_cell(text))


def build(name: str, cells: list, execute: bool = True, out_dir: Path = HERE, static: bool = True) -> Path:
    """Write (and execute) one notebook. ``static``: give every stored figure a PNG and every widget a
    run-the-cell sentence (``workbench.views.static``), so they show on GitHub, nbviewer and in an
    HTML export; a missing browser stops the build with one line rather than storing figures silently
    without them."""
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    path = Path(out_dir) / f"{name}.ipynb"
    if execute:
        # one browser start for all figures (add_static_fallbacks below), not one per figure at display time
        os.environ["WORKBENCH_STATIC_FIGURES"] = "0"
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    drop_widget_state(nb)
    if execute:
        stamp_run_time(nb)
    if execute and static:
        from workbench.views.static import add_static_fallbacks

        try:
            counts = add_static_fallbacks(nb)
        except RuntimeError as e:
            raise SystemExit(f"{path.name}: {e}") from None
        if counts["rendered"] < counts["figures"]:
            raise SystemExit(f"{path.name}: only {counts['rendered']} of {counts['figures']} figures rendered to PNG")
    text = nbformat.writes(nb)
    if len(text.encode()) > MAX_NOTEBOOK_BYTES:
        raise SystemExit(f"{path.name} would be {len(text.encode()) / 1e6:.1f} MB (limit {MAX_NOTEBOOK_BYTES / 1e6:.0f} MB): "
                         "store figures, not big widget states")
    path.write_text(text, encoding="utf-8")
    return path


def main(argv: list[str]) -> None:
    # --stamp: only (re)write the run-time note of the committed notebooks, from their stored cell timings
    # --check: execute nothing; name the notebooks whose cells differ from their sources (exit 1 if any)
    stamp_only, check_only = "--stamp" in argv, "--check" in argv
    wanted = [a for a in argv if a not in ("--stamp", "--check")]
    found = sources()
    unknown = [w for w in wanted if not any(name.startswith(w) for name in found)]
    if unknown:
        raise SystemExit(f"no notebook source starts with {', '.join(map(repr, unknown))}: "
                         f"one of {', '.join(found)} (files notebooks/NN_name.py)")
    stale = False
    for name, path in found.items():
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        if check_only:
            nb_path = HERE / f"{name}.ipynb"
            diff = stale_cells(nbformat.read(nb_path, as_version=4), source_cells(path)) if nb_path.exists() \
                else ["no notebook built yet"]
            stale = stale or bool(diff)
            print(f"{name}: " + ("; ".join(diff[:3]) if diff else "built from its source"))
        elif stamp_only:
            nb_path = HERE / f"{name}.ipynb"
            nb = nbformat.read(nb_path, as_version=4)
            stamp_run_time(nb)
            nbformat.write(nb, nb_path)
            print("stamped", nb_path)
        else:
            print("building", build(name, source_cells(path)))
    if stale:
        raise SystemExit("stale: rebuild those with .venv/bin/python notebooks/build.py NN")


if __name__ == "__main__":
    main(sys.argv[1:])
