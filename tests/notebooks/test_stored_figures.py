"""Figures stored in the notebooks' outputs say what they mean: a point reported with its range over
repeats or prompts lies inside that range (a point outside its own range is a summary taken another way)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
POINT_IN_RANGE = re.compile(r"(\d+\.\d+)x \[(\d+\.\d+)-(\d+\.\d+) over (?:repeats|prompts)\]")


def stored_text(nb: Path) -> str:
    out = []
    for cell in json.loads(nb.read_text())["cells"]:
        for o in cell.get("outputs", []):
            out.append("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def test_the_pattern_finds_stored_figures():
    found = sum(len(POINT_IN_RANGE.findall(stored_text(nb))) for nb in NOTEBOOKS)
    assert found >= 10  # notebooks 05 and 08 print speed-ups with their ranges


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_stored_point_lies_in_its_own_range(nb):
    bad = [m.group(0) for m in POINT_IN_RANGE.finditer(stored_text(nb))
           if not float(m.group(2)) <= float(m.group(1)) <= float(m.group(3))]
    assert not bad, f"{nb.name}: {bad}"
