"""wb.connect's own arguments, refused in one line before any connection is tried."""
from __future__ import annotations

import time

import pytest

import workbench as wb

TOKEN = "a-test-token-of-forty-characters-0123456"


@pytest.mark.parametrize("value", ["no", 1, 0, None, "True"])
def test_insecure_http_takes_booleans_only(value):
    t = time.perf_counter()
    with pytest.raises(ValueError, match=rf"insecure_http={value!r} must be True or False"):
        wb.connect("http://192.0.2.1:8765", token=TOKEN, insecure_http=value)
    assert time.perf_counter() - t < 0.5  # refused before any connection is tried


def test_token_and_token_file_together_are_refused(tmp_path):
    f = tmp_path / "token"
    f.write_text("another-token-of-forty-characters-000000")
    f.chmod(0o600)
    with pytest.raises(ValueError, match="give one of token= or token_file=, not both"):
        wb.connect("http://127.0.0.1:9", token=TOKEN, token_file=f)


def test_the_serve_start_line_says_how_to_attach():
    from pathlib import Path

    from workbench.serve.main import attach_line

    url = "http://127.0.0.1:8765"
    assert attach_line(url, "~/tok") == f"attach with wb.connect({url!r}, token_file={str(Path.home() / 'tok')!r})"
    assert attach_line(url, None) == f"attach with wb.connect({url!r}, token=...)"


@pytest.mark.parametrize("mode", [0o640, 0o604])
def test_a_token_file_others_can_read_is_refused_as_the_server_refuses_it(tmp_path, mode):
    import re

    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(mode)
    why = f"token_file={f} has mode {mode:04o}: group or others can read or write it; the server refuses such a " \
          f"file too; run `chmod 600 {f}`"
    with pytest.raises(ValueError, match=re.escape(why)):
        wb.connect("http://127.0.0.1:9", token_file=f)
    with pytest.raises(ValueError, match=re.escape(f"token_file={tmp_path / 'none'}: no such file")):
        wb.connect("http://127.0.0.1:9", token_file=tmp_path / "none")
