"""The docs are checked against the code: docs/API.md's ``>>>`` examples run as a doctest on the embedded pair,
and every docs/ page the README points to exists."""
from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_doc(path: Path) -> doctest.TestResults:
    return doctest.testfile(str(path), module_relative=False, optionflags=doctest.ELLIPSIS, verbose=False,
                            raise_on_error=False)


def test_api_doc_examples_run(monkeypatch):
    """A stale signature, default or result in docs/API.md fails here (dtype=None or layers [1, 3, 5], say)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    text = (ROOT / "docs" / "API.md").read_text()
    assert text.count(">>> ") >= 20  # the examples are there to be run
    result = run_doc(ROOT / "docs" / "API.md")
    assert result.attempted >= 20 and result.failed == 0, result


def test_a_stale_example_fails(tmp_path):
    """The check can fail: a wrong claim of the embedded drafter's layers, run as an example."""
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


def cli_commands(monkeypatch) -> tuple[set[str], str]:
    """The subcommands workbench/cli.py's parser really has (the choices of the subparsers ``build_parser`` adds,
    caught as argparse hands them back) and the parser's usage line."""
    import argparse

    from workbench.cli import build_parser

    made = []
    add = argparse.ArgumentParser.add_subparsers

    def keep(self, **kwargs):
        made.append(add(self, **kwargs))
        return made[-1]

    monkeypatch.setattr(argparse.ArgumentParser, "add_subparsers", keep)
    parser = build_parser()
    return set(made[0].choices), parser.format_usage()


def command_list_problems(commands: set[str], readme: str, cli_md: str, pages: dict[str, str]) -> list[str]:
    """What the README's command list, docs/cli.md's command table and every ``python -m workbench NAME`` in
    ``pages`` say that the parser does not: a command left out, or a name that is no command."""
    found = re.search(r"`python -m workbench ((?:[\w-]+ \| )*[\w-]+)`", readme)
    listed = {"README.md's command list": set(found.group(1).split(" | ")) if found else set(),
              "docs/cli.md's command table": set(re.findall(r"^\| `([\w-]+)` \|", cli_md, re.M))}
    out = []
    for where, names in listed.items():
        out += [f"{where} omits {c}" for c in sorted(commands - names)]
        out += [f"{where} names {c}, which is no command" for c in sorted(names - commands)]
    for page, text in pages.items():
        out += [f"{page} runs `python -m workbench {c}`, which is no command"
                for c in sorted(set(re.findall(r"-m workbench ([a-z][\w-]*)", text)) - commands)]
    return out


def test_every_command_is_listed_and_every_listed_command_exists(monkeypatch):
    """The README's one-line command list and docs/cli.md's table name exactly the parser's subcommands (none
    left out), every page's ``python -m workbench NAME`` runs a command, and
    the usage line (a hand-written metavar) lists them all."""
    commands, usage = cli_commands(monkeypatch)
    assert {"run", "bench", "pays-off", "sweep", "conform"} <= commands
    pages = {str(p.relative_to(ROOT)): p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    assert command_list_problems(commands, pages["README.md"], pages["docs/cli.md"], pages) == []
    shown = re.search(r"\{([\w,-]+)\}", usage).group(1).split(",")
    assert sorted(shown) == sorted(commands) and len(shown) == len(commands)


def test_a_stale_command_list_fails():
    """The check can fail: a README list missing three commands, and a page naming a command that is not there."""
    old = "- **A command line**: `python -m workbench run | bench | report | serve | bench-serve | kernels` (x)."
    table = "".join(f"| `{c}` | ... |\n" for c in ("run", "bench", "report", "kernels", "serve", "bench-serve", "sweep",
                                                   "conform", "pays-off", "replay"))
    commands = {"run", "bench", "report", "kernels", "serve", "bench-serve", "pays-off", "sweep", "conform"}
    assert command_list_problems(commands, old, table, {"docs/x.md": "python -m workbench profile --x"}) == [
        "README.md's command list omits conform", "README.md's command list omits pays-off",
        "README.md's command list omits sweep", "docs/cli.md's command table names replay, which is no command",
        "docs/x.md runs `python -m workbench profile`, which is no command"]


def test_the_policy_how_to_runs_as_written(tiny_engines, tmp_path, monkeypatch):
    """docs/architecture.md, "Add a tree policy": its class, taken from the page as it stands, registers, parses
    back, crosses the wire, and decodes greedily token for token as plain decoding does."""
    import sys
    import textwrap

    import workbench as wb
    from workbench.engine.policies import from_wire, registered, to_wire, unregister

    doc = (ROOT / "docs" / "architecture.md").read_text()
    how_to = doc[doc.index("## Add a tree policy"):]
    code = textwrap.dedent(re.search(r"```python\n(.*?)```", how_to, re.S).group(1))
    (tmp_path / "my_policy.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "prefix" not in registered()
    try:
        from my_policy import Prefix

        p = wb.parse_policy("prefix:3")
        assert p == Prefix(3) and wb.parse_policy(str(p)) == p and from_wire(to_wire(p)) == p
        eng = tiny_engines["l4-h32"]
        s = eng.session("t1 t2 t3", policy=p, max_new_tokens=20)
        ar = eng.session("t1 t2 t3", policy=wb.AR(), max_new_tokens=20)
        s.run(), ar.run()
        assert s.tokens == ar.tokens and max(c.n_nodes for c in s.cycles) <= 3
        # the how-to is where people copy validation from: its class refuses a bad depth where it is made
        # (unchecked, Prefix(-2) would verify a 13-slot chain and Prefix("3") fail inside build_tree)
        for bad in (-2, 0, "3", 2.5, True, None):
            with pytest.raises(ValueError) as e:
                Prefix(bad)
            assert str(e.value) == (f"Prefix depth={bad!r} must be a positive integer (drafted slots kept, "
                                    "e.g. Prefix(4))")
        with pytest.raises(ValueError, match=r"^Prefix depth=-2 must be a positive integer"):
            wb.parse_policy("prefix:-2")
    finally:
        unregister("prefix")
        sys.modules.pop("my_policy", None)


def test_loading_the_served_engine_says_to_connect_as_the_page_says():
    """docs/architecture.md says wb.load(engine="served") explains itself in one line (not a bare "not known")."""
    import workbench as wb

    text = " ".join((ROOT / "docs" / "architecture.md").read_text().split())
    assert '`wb.load(engine="served")` says so in one line' in text
    with pytest.raises(ValueError) as e:
        wb.load(engine="served")
    msg = str(e.value)
    assert "\n" not in msg and "not known" not in msg and "wb.connect(URL" in msg and "python -m workbench serve" in msg


def test_every_file_docs_architecture_names_exists():
    """The route and the rooms name files; a file moved or renamed without the page fails here."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = {p for p in re.findall(r"`([\w/]+\.py)", text) if not p.split("/")[-1].startswith("my_")}  # how-tos' own
    assert len(named) >= 40
    def found(p: str) -> bool:  # a path from the root or from workbench/; a bare name (a room's table) anywhere in it
        if "/" not in p:
            return any(ROOT.glob(f"workbench/**/{p}")) or (ROOT / "kernels" / p).exists()
        return any((base / p).exists() for base in (ROOT, ROOT / "workbench"))

    missing = [p for p in named if not found(p)]
    assert sorted(missing) == []
