"""python -m workbench.calibrate refuses, in one line and before any model loads or decodes, what its flags
alone show: an --out that is a folder, cannot be written or exists (unless --replace), too few prompts and
tokens for the cycles the estimate needs, a --draft that does not apply or a path that does not exist."""
from __future__ import annotations

import pytest

from workbench.calibrate.command import build_parser, check_args, main


@pytest.fixture()
def no_decode(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("a model loaded before the flags were checked")
    monkeypatch.setattr("workbench.calibrate.command.load_pair", refuse)


def refused(capsys, argv) -> str:
    assert main([*argv, "--quiet"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("calibrate: "), lines
    return lines[0]


@pytest.mark.parametrize("argv,msg", [
    (["--out", "{tmp}"], "calibrate: --out '{tmp}' is a directory"),
    (["--out", "/proc/x"], "calibrate: --out '/proc/x' cannot be written"),
    (["--out", "{tmp}/c.json", "--prompts", "2", "--max-new-tokens", "8"],
     "--prompts 2 x --max-new-tokens 8 give at most 14 drafted cycles; the estimate needs at least 200"),
    (["--out", "{tmp}/c.json", "--target", "hybrid", "--draft", "/nonexistent"],
     "--draft /nonexistent: --target hybrid is an embedded pair with its own drafter; drop --draft"),
    (["--out", "{tmp}/c.json", "--target", "/nonexistent"],
     "--target /nonexistent: neither dense nor hybrid (an embedded pair) nor a model directory"),
    (["--out", "{tmp}/c.json", "--target", "{tmp}", "--draft", "/nonexistent"],
     "--draft /nonexistent: not a directory"),
    (["--out", "{tmp}/old.json"], "--out {tmp}/old.json exists; give --replace to write over it"),
])
def test_flags_are_refused_before_any_model_loads(tmp_path, capsys, no_decode, argv, msg):
    (tmp_path / "old.json").write_text("{}")
    line = refused(capsys, [a.format(tmp=tmp_path) for a in argv])
    assert msg.format(tmp=tmp_path) in line
    assert (tmp_path / "old.json").read_text() == "{}"


def test_replace_lets_an_existing_out_through(tmp_path):
    (tmp_path / "old.json").write_text("{}")
    args = build_parser().parse_args(["--out", str(tmp_path / "old.json"), "--replace"])
    check_args(args)  # no refusal: the run goes on to the models
    with pytest.raises(ValueError, match="exists; give --replace"):
        check_args(build_parser().parse_args(["--out", str(tmp_path / "old.json")]))
