"""One validation for the Python API and the command line.

Each check takes the value as given and returns it normalised, or raises ``ValueError`` with one
line that names the value and, where useful, the fix. The CLI wraps the same functions as
argparse types (``as_arg``), so ``wb.load(threads=0)`` and ``--threads 0`` say the same thing.
Output paths are checked here too, before any work: nothing is created to make a path valid.
"""
from __future__ import annotations

import argparse
import math
import operator

from workbench.models.config_facts import RUN_DTYPES, run_dtype
from workbench.records.files import output_dir, output_path  # noqa: F401  (validation of outputs)

SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes 64 bits
DTYPES = RUN_DTYPES  # what the models run in (aliases: config_facts.DTYPE_ALIASES)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def text(value, name: str = "prompt") -> str:
    """A non-empty str that is valid Unicode text (a lone surrogate, e.g. from non-UTF-8 bytes in argv,
    cannot reach the tokenizer)."""
    if not isinstance(value, str):
        raise ValueError(f"{name}={value!r} is not text; give a str")
    if not value:
        raise ValueError(f"{name}={value!r} is empty; give at least one character of text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = value[e.start]
        raise ValueError(f"{name} has a character that is not valid text at index {e.start} ({bad!r}: a lone "
                         f"surrogate, e.g. from bytes that are not UTF-8); give UTF-8 text") from None
    return value


def prompt_list(prompts, name: str = "prompts") -> list[str] | None:
    """None (the caller's default prompts), or a non-empty list of texts: a bare str is refused (it would be
    taken character by character), as is an empty list (a report of nothing)."""
    if prompts is None:
        return None
    if isinstance(prompts, (str, bytes)):
        raise ValueError(f"{name}={prompts!r:.60} is one text; give a list of texts, e.g. [{prompts!r:.40}]")
    try:
        items = list(prompts)
    except TypeError:
        raise ValueError(f"{name}={prompts!r:.60} is not a list of texts") from None
    if not items:
        raise ValueError(f"{name}=[] holds no prompt; give at least one text, or leave {name} out for the defaults")
    return [text(p, f"{name}[{i}]") for i, p in enumerate(items)]


def token_ids(values, name: str = "prompt_ids") -> list[int]:
    """Token ids as a list of ints, from any iterable of integers that is not text (a list, a numpy array, an
    integer tensor). The engine and the served engine's client both check ids here, so either refuses the same
    value in the same line; the vocabulary's range is the engine's to check (the client does not know it)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{name}={values!r:.80} must be a list of token ids")
    out = []
    for n, i in enumerate(values):
        try:
            if isinstance(i, bool):
                raise TypeError
            out.append(operator.index(i))  # an int, a numpy or 0-d tensor integer; 1.7 must not become 1
        except TypeError:
            raise ValueError(f"{name}[{n}]={i!r:.40} is not a token id; give integers") from None
    return out


def temperature(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"temperature={value!r} must be a finite number >= 0 (0 means greedy)")
    return float(value)


def seed(value) -> int:
    if not _is_int(value) or not 0 <= value <= SEED_MAX:
        raise ValueError(f"seed={value!r} must be an integer from 0 to 2**64-1")
    return value


def positive_int(value, name: str) -> int:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return value


def positive_ints(**values) -> None:
    """Refuse, in one line naming it, any of ``values`` that is not a positive integer."""
    for name, v in values.items():
        positive_int(v, name)


def threads(value):
    """None (the default) or a positive number of CPU threads."""
    return None if value is None else positive_int(value, "threads")


def record_topk(value) -> int:
    if not _is_int(value) or value < 1:
        raise ValueError(f"record_topk={value!r} must be a positive integer (the drafter's top-k kept per slot "
                         "in each Cycle; 8 by default)")
    return value


def port(value) -> int:
    if not _is_int(value) or not 0 <= value <= 65535:
        raise ValueError(f"port={value!r} must be an integer from 0 to 65535 (0 picks a free port)")
    return value


def device(value):
    """cpu, cuda or cuda:N (a str or a torch.device); meta, mps, xpu, ... are refused before any model loads."""
    import torch

    try:
        dev = torch.device(value)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda") or (dev.type == "cpu" and dev.index not in (None, 0)):
        raise ValueError(f"device={str(value)!r} is not a device this workbench runs on: use cpu, cuda or cuda:N")
    return value


def dtype(value):
    """None or "auto" (the checkpoint's own dtype), a name in DTYPES (or an alias) or the matching torch.dtype."""
    import torch

    if value is None or value == "auto":
        return value
    name = str(value).replace("torch.", "") if isinstance(value, torch.dtype) else value
    if isinstance(name, str) and run_dtype(name) is not None:
        return value
    raise ValueError(f"dtype={value!r} is not one the models run in: use auto, {', '.join(DTYPES)}")


def capture(value):
    """None or a shape capture (``wb.shapes.capture(...)``)."""
    if value is None or (callable(getattr(value, "forward", None)) and callable(getattr(value, "take", None))):
        return value
    raise ValueError(f"capture={value!r} is not a shape capture; pass capture=wb.shapes.capture(engine) "
                     "or leave it None")


def policy_fits(policy, slots: int, pair: dict | None = None):
    """A policy that needs more drafted slots than the drafter has is refused now, not at step()
    (``Policy.check_slots``); given the pair's identity (``workbench.models.identity.pair_identity``), so is one
    that cannot run on that pair (a calibration made on another), and the policy comes back ready for it
    (``Policy.for_pair``)."""
    policy.check_slots(slots)
    return policy if pair is None else policy.for_pair(pair)


def split_policies(text: str, name: str = "policies") -> list[str]:
    """'dflash,DDTree(16, width=1)' -> ['dflash', 'DDTree(16, width=1)']: commas inside (...) stay, as a
    policy's label writes them. An empty entry is refused, not skipped (a doubled comma is a typo, and
    skipping it would run a list the user did not write); a text of no entry at all names no policy."""
    import re

    said = f"{name} {text!r}" if name.startswith("--") else f"{name}={text!r}"
    parts = [p.strip() for p in re.split(r",(?![^()]*\))", text)]
    if not any(parts):
        raise ValueError(f"{said} names no policy; give e.g. 'dflash,ddtree:8', or leave it out for the "
                         "default set")
    for i, p in enumerate(parts):
        if not p:
            raise ValueError(f"{said}: entry {i + 1} is empty; remove the extra comma")
    return parts


def policy_list(policies, name: str = "policies") -> list | None:
    """None (the caller's default set), a comma-separated string ('dflash,ddtree:8') or one spelling, a
    policy, or a list of policies and spellings -> [Policy], in order; any spelling ``parse_policy`` takes.
    ValueError (one line) on an empty list or entry, an unknown spelling, or a policy listed twice (its
    runs would be counted twice). ``name``: how the message names the value ('--policies' on the CLI)."""
    from workbench.engine.policies import as_policy

    if policies is None:
        return None
    if isinstance(policies, str):
        items = split_policies(policies, name)
    else:
        try:
            items = list(policies)
        except TypeError:  # one policy (wb.DDTree(8), or a class such as wb.DFlash): as_policy says if it is not
            items = [policies]
        if not items:
            raise ValueError(f"{name}=[] names no policy; give e.g. ['dflash', 'ddtree:8'], or leave it out for "
                             "the default set")
    said = f"{name} {policies!r:.80}" if name.startswith("--") else f"{name}={policies!r:.80}"
    out = []
    for x in items:
        try:
            p = as_policy(x)
        except TypeError as e:
            raise ValueError(str(e)) from None
        if p in out:
            raise ValueError(f"{said}: {p} is listed twice")
        out.append(p)
    return out


def as_arg(check):
    """An argparse ``type`` from a check: parse the text as its kind, and report the check's own line."""
    def parse(s: str):
        try:
            v = int(s) if check in _INT_CHECKS else float(s) if check in _FLOAT_CHECKS else s
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
        try:
            return check(v)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = check.__name__
    return parse


_INT_CHECKS = {seed, threads, record_topk, port}
_FLOAT_CHECKS = {temperature}
