"""The docs are checked against the code: docs/API.md's ``>>>`` examples run as a doctest on the embedded pair,
and every docs/ page the README points to exists."""
from __future__ import annotations

import doctest
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_doc(path: Path) -> doctest.TestResults:
    return doctest.testfile(str(path), module_relative=False, optionflags=doctest.ELLIPSIS, verbose=False,
                            raise_on_error=False)


def test_api_doc_examples_run(monkeypatch):
    """A stale signature, default or result in docs/API.md fails here (it once said dtype=None and layers [1, 3, 5])."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    text = (ROOT / "docs" / "API.md").read_text()
    assert text.count(">>> ") >= 20  # the examples are there to be run
    result = run_doc(ROOT / "docs" / "API.md")
    assert result.attempted >= 20 and result.failed == 0, result


def test_a_stale_example_fails(tmp_path):
    """The check can fail: the old claim of the embedded drafter's layers, run as an example."""
    doc = tmp_path / "stale.md"
    doc.write_text(">>> import workbench as wb\n>>> wb.load().models.target_layer_ids\n[1, 3, 5]\n")
    assert run_doc(doc).failed == 1


def test_every_page_the_readme_names_exists():
    readme = (ROOT / "README.md").read_text()
    pages = set(re.findall(r"`(docs/[\w.-]+\.md)`", readme))
    assert {"docs/architecture.md", "docs/API.md", "docs/figures.md", "docs/training.md", "docs/gpu.md",
            "docs/production-engines.md"} <= pages
    assert [p for p in sorted(pages) if not (ROOT / p).exists()] == []
    assert len(readme.splitlines()) <= 200, "README.md is the front door: the rest belongs in docs/"
