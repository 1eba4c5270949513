"""What ships inside the package, on the ground floor: where its assets lie, and the evaluation prompts (the
held-out set, or a user's file, read by one loader) that the bench, pays-off, the comparison report and the
served engine's checks all take."""
from __future__ import annotations

import json
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"  # workbench/assets: the embedded pairs, prompts, calibrations

EVAL_PROMPTS = ASSETS / "eval_prompts.jsonl"
EVAL_PROMPTS_SHORT = ASSETS / "eval_prompts_short.jsonl"
SPLITS = {"long": EVAL_PROMPTS, "short": EVAL_PROMPTS_SHORT}


class PromptFileError(ValueError):
    pass


def _is_json_lines(path: Path, lines: list[str]) -> bool:
    """JSON lines: a .jsonl/.json name, or (any other name) a first non-empty line that is a JSON object.
    Plain text otherwise, so a text file with a line of code starting with '{' stays text."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return True
    if suffix == ".txt":
        return False
    first = next((line for line in lines if line.strip()), "")
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False


def looks_like_json_lines(lines: list[str]) -> bool:
    """Every non-empty line a JSON object with a 'prompt': what a .jsonl file holds."""
    found = False
    for line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            return False
        if not isinstance(obj, dict) or "prompt" not in obj:
            return False
        found = True
    return found


def load_prompts(path) -> list[dict]:
    """JSON lines with ``id`` and ``prompt``, or plain text with one prompt per line. -> [{id, prompt}]

    The format: ``.jsonl``/``.json`` files are JSON lines, ``.txt`` files text (one whose every line is a JSON
    object with a 'prompt' is refused: a misnamed .jsonl); any other name is JSON lines when its first
    non-empty line is a JSON object."""
    path = Path(path)
    if path.is_dir():
        raise PromptFileError(f"prompts file '{path}' is a directory; give a .jsonl or .txt file")
    if not path.is_file():
        raise PromptFileError(f"prompts file '{path}' does not exist")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise PromptFileError(f"prompts file '{path}' is not UTF-8 text") from None
    items = []
    is_json = _is_json_lines(path, lines)
    if not is_json and path.suffix.lower() == ".txt" and looks_like_json_lines(lines):
        # Read as text, every line's JSON would become a prompt: a misnamed .jsonl, refused for every reader.
        raise PromptFileError(f"prompts file '{path}' holds JSON lines, but a .txt file is read as one prompt per "
                              f"line (each line's JSON would be a prompt): rename it '{path.with_suffix('.jsonl')}'")
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if is_json:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise PromptFileError(f"{path}:{no}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
                raise PromptFileError(f"{path}:{no}: each JSON line needs a non-empty string 'prompt'")
            items.append({**obj, "id": str(obj.get("id", f"line-{no}")), "prompt": obj["prompt"]})
        else:
            items.append({"id": f"line-{no}", "prompt": line})
    if not items:
        raise PromptFileError(f"prompts file '{path}' has no prompts")
    return items


def eval_prompts(split: str = "long") -> list[dict]:
    """The shipped evaluation prompts, from held-out files never trained on.

    split: 'long' (~10-line excerpts of held-out standard-library files) or 'short' (1-7 lines
    cut the way people start code: a signature and docstring, a class and ``__init__``,
    imports then ``main``, a test's opening, a half-written expression).
    """
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    return load_prompts(SPLITS[split])


def default_prompts(n: int = 8) -> list[str]:
    """The texts of the first ``n`` prompts of the shipped long split: what the comparison runs (in process
    and served) use when given none."""
    return [p["prompt"] for p in eval_prompts()[:n]]
