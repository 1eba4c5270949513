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


_TEST_DIRS = {"test", "tests"}


def list_sources(root: Path | None = None, max_bytes: int = 200_000, tests: bool = False) -> list[SourceFile]:
    """All usable ``.py`` files under ``root`` (default: this interpreter's stdlib), sorted by path.

    ``tests=True`` lists the ``test_*.py`` files of the test packages instead: the target never
    trains on them; they are a source of test-shaped prompts (held-out ones for evaluation only).
    """
    root = root or stdlib_root()
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = set(rel.split("/"))
        if tests:
            if not (_TEST_DIRS & parts and path.name.startswith("test_")) or (_EXCLUDED_PARTS - _TEST_DIRS) & parts:
                continue
        elif _EXCLUDED_PARTS.intersection(parts):
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


# ---------------------------------------------------------------- boilerplate

def is_generated_table(f: SourceFile) -> bool:
    """The charmap codecs (``encodings/cp1252.py`` ...): 65 near-identical generated tables."""
    return f.relpath.startswith("encodings/") and "generated from" in f.text[:400]


def thin_generated_tables(files: list[SourceFile], keep_one_in: int) -> list[SourceFile]:
    """Keep 1 generated table in ``keep_one_in`` (by path hash): they teach the target to loop."""
    if keep_one_in <= 1:
        return list(files)

    def keep(f: SourceFile) -> bool:
        return int.from_bytes(hashlib.sha1(f.relpath.encode()).digest()[4:8], "big") % keep_one_in == 0

    return [f for f in files if not is_generated_table(f) or keep(f)]


# ---------------------------------------------------------------- short prompts (what people type)

SHORT_SHAPES = ("def_doc", "class_init", "imports_main", "test_opening", "expression")
MAX_SHORT_LINES = 7
_SIG = re.compile(r"^([ \t]*)(async def|def|class) (\w+)[^\n]*:[ \t]*$", re.M)
_DOC_START = re.compile(r"^[rbu]?(\"\"\"|''')")


def _dedent(lines: list[str], indent: int) -> list[str]:
    return [ln[indent:] if ln[:indent].strip() == "" else ln.lstrip() for ln in lines]


def _docstring(lines: list[str], i: int) -> int | None:
    """Index one past the docstring starting at line ``i`` (None: no docstring there or too long)."""
    if i >= len(lines):
        return None
    first = lines[i].strip()
    m = _DOC_START.match(first)
    if not m:
        return None
    q = m.group(1)
    if first.count(q) >= 2:
        return i + 1
    for j in range(i + 1, min(len(lines), i + MAX_SHORT_LINES)):
        if q in lines[j]:
            return j + 1
    return None


def _def_doc(text: str, rng: random.Random) -> list[str]:
    lines, out = text.split("\n"), []
    for no, ln in enumerate(lines):
        m = _SIG.match(ln)
        if not m or m.group(2) == "class":
            continue
        end = _docstring(lines, no + 1)
        if end is None or end - no > MAX_SHORT_LINES - 1:
            continue
        out.append("\n".join(_dedent(lines[no:end], len(m.group(1)))) + "\n    ")
    return out


def _class_init(text: str, rng: random.Random) -> list[str]:
    lines, out = text.split("\n"), []
    for no, ln in enumerate(lines):
        m = _SIG.match(ln)
        if not m or m.group(2) != "class":
            continue
        k = _docstring(lines, no + 1) or no + 1
        while k < len(lines) and not lines[k].strip():
            k += 1
        if k >= len(lines) or not lines[k].lstrip().startswith("def __init__(") or not _SIG.match(lines[k]):
            continue
        if k - no + 1 <= MAX_SHORT_LINES:
            out.append("\n".join(_dedent(lines[no : k + 1], len(m.group(1)))) + "\n        ")
    return out


def _imports_main(text: str, rng: random.Random) -> list[str]:
    imports = [ln for ln in text.split("\n") if re.match(r"^(import|from) [\w.]+( import [\w, ]+)?$", ln)]
    out = []
    for k in range(1, min(4, len(imports)) + 1):
        head = "\n".join(imports[:k])
        out.append(head + "\n\n\ndef main():\n    ")
        out.append(head + '\n\n\nif __name__ == "__main__":\n    ')
    return out


def _test_opening(text: str, rng: random.Random) -> list[str]:
    lines, out = text.split("\n"), []
    cls = None
    for no, ln in enumerate(lines):
        if re.match(r"^class \w+\(.*\):\s*$", ln):
            cls = ln.rstrip()
        if cls is None or not re.match(r"^    def test_\w+\(self[^\n]*\):\s*$", ln):
            continue
        pieces = [cls, ln.rstrip()]
        body = lines[no + 1] if no + 1 < len(lines) else ""
        if body.startswith("        ") and body.strip() and not body.rstrip().endswith(("(", ",", "\\", "[", "{", ":")):
            pieces.append(body.rstrip())
        out.append("\n".join(pieces) + "\n        ")
    return out


def _expression(text: str, rng: random.Random) -> list[str]:
    """A line cut in the middle of its expression, after its function's signature and up to 3 lines."""
    lines, out = text.split("\n"), []
    func = None  # (line index, indent) of the enclosing def
    in_string = False  # inside a triple-quoted string (docstrings): not code
    for no, ln in enumerate(lines):
        if ln.count('"""') % 2 or ln.count("'''") % 2:
            in_string = not in_string
            continue
        if in_string:
            continue
        m = _SIG.match(ln)
        if m:
            func = (no, len(m.group(1))) if m.group(2) != "class" else None
            continue
        if func is None or not ln.strip():
            continue
        ind = len(ln) - len(ln.lstrip())
        if ind <= func[1]:
            func = None
            continue
        code = ln.strip()
        if len(code) < 24 or code.startswith(("#", '"', "'", "return", "raise")) or code.endswith(("(", ",", "\\", "[", "{")):
            continue
        if no - func[0] > 4:  # the function so far must fit: signature + up to 3 lines + this one
            continue
        # '=' only as an assignment or keyword argument, not inside '==', '<=', '!=', '>='
        cuts = [i + 1 for i, ch in enumerate(ln) if ind + 6 <= i < len(ln) - 6 and
                (ch in "(,[" or (ch == "=" and ln[i - 1] not in "=<>!" and ln[i + 1] != "="))]
        if not cuts:
            continue
        cut = rng.choice(cuts)
        body = [b for b in lines[func[0] + 1 : no] if b.strip()]
        pieces = [lines[func[0]], *body, ln[:cut] + (" " if ln[cut - 1] in "=," else "")]
        if len(pieces) <= MAX_SHORT_LINES:
            out.append("\n".join(_dedent(pieces, func[1])))
    return out


_SHAPERS = {"def_doc": _def_doc, "class_init": _class_init, "imports_main": _imports_main,
            "test_opening": _test_opening, "expression": _expression}


def short_prompts(text: str, rng: random.Random, n: int, shape: str) -> list[str]:
    """Up to ``n`` prompts of 1-7 lines cut from ``text`` in one of ``SHORT_SHAPES``.

    def_doc: a function's signature and docstring; class_init: a class line, its docstring and
    ``__init__``'s signature; imports_main: an import block then ``main``; test_opening: a
    TestCase line and a test method's opening; expression: a line cut mid-expression.
    """
    if shape not in _SHAPERS:
        raise ValueError(f"shape {shape!r} is not one of {', '.join(SHORT_SHAPES)}")
    got = [p for p in _SHAPERS[shape](text, rng) if 0 < p.count("\n") + 1 <= MAX_SHORT_LINES]
    rng.shuffle(got)
    return got[:n]
