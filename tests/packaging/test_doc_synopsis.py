"""docs/wire-format.md's synopsis of `serve` names every option the command takes, and no other."""
from __future__ import annotations

import re
from pathlib import Path

from workbench.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_the_serve_synopsis_names_every_option():
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    options = {o for a in sub.choices["serve"]._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
    text = (ROOT / "docs" / "wire-format.md").read_text()
    synopsis = re.search(r"```\n(python -m workbench serve .*?)```", text, re.S).group(1)
    named = set(re.findall(r"--[a-z][a-z-]*", synopsis))
    assert options - named == set(), f"the synopsis lacks {sorted(options - named)}"
    assert named - options == set(), f"the synopsis names options serve does not take: {sorted(named - options)}"
