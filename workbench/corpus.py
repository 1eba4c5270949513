"""The training corpus: Python standard library source, present on every machine.

Files are split into train and held-out by a hash of their relative path, so the
split is the same on every machine and never depends on file order.
"""
from __future__ import annotations

import hashlib
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Tests, vendored data and the IDLE GUI are excluded: they are noisy, huge, or both.
_EXCLUDED_PARTS = {"test", "tests", "idle_test", "site-packages", "lib2to3", "__pycache__", "ensurepip"}
HELD_OUT_MODULUS = 25  # 1 file in 25 is held out for evaluation


@dataclass(frozen=True)
class SourceFile:
    relpath: str
    text: str

    @property
    def held_out(self) -> bool:
        return is_held_out(self.relpath)


def is_held_out(relpath: str) -> bool:
    digest = hashlib.sha1(relpath.encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELD_OUT_MODULUS == 0


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def list_sources(root: Path | None = None, max_bytes: int = 200_000) -> list[SourceFile]:
    """All usable ``.py`` files under ``root`` (default: this interpreter's stdlib), sorted by path."""
    root = root or stdlib_root()
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if _EXCLUDED_PARTS.intersection(rel.split("/")):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if 200 <= len(text) <= max_bytes:
            out.append(SourceFile(rel, text))
    return out


_OPENING = re.compile(r"^([ \t]*)(def|class|async def) [^\n]*:[ \t]*$", re.M)


def opening_prompts(text: str, rng: random.Random, n: int, context_chars: int = 240) -> list[str]:
    """Prompts ending right after a ``def``/``class`` signature line, as a user would type them.

    A little preceding context is kept so the model knows where it is; the prompt
    ends with the newline and indentation of the body, so the next token is the body.
    """
    matches = list(_OPENING.finditer(text))
    rng.shuffle(matches)
    prompts = []
    for m in matches[:n]:
        indent = m.group(1) + "    "
        start = max(0, m.start() - context_chars)
        start = text.rfind("\n", 0, start) + 1 if start > 0 else 0
        prompts.append(text[start : m.end()] + "\n" + indent)
    return prompts


def midfile_prompts(text: str, rng: random.Random, n: int, chars: int = 320) -> list[str]:
    """Prompts that stop in the middle of a file, at the end of a line."""
    prompts = []
    if len(text) < chars + 200:
        return prompts
    for _ in range(n):
        end = rng.randrange(chars, len(text) - 100)
        end = text.find("\n", end)
        if end < 0:
            continue
        start = text.rfind("\n", 0, end - chars) + 1
        prompt = text[start : end + 1]
        # Keep the indentation of the next line: that is where a user's cursor sits.
        nxt = text[end + 1 : end + 200]
        prompt += nxt[: len(nxt) - len(nxt.lstrip(" "))]
        if prompt.strip():
            prompts.append(prompt)
    return prompts
