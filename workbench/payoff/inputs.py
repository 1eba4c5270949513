"""Everything ``pays-off`` is given, checked before any model loads or any decode runs.

``check_inputs`` takes what a user types (prompts, batch sizes, policies, token counts, sampling) and
returns it normalised, or raises ``PaysOffInputError`` (a ValueError) with one line naming the value and
the fix. It needs no model: the CLI calls it before loading one, ``wb.pays_off`` before anything else.
``fit_to_engine`` then checks what needs the loaded pair (the drafter's block, the target's positions, the
device's memory) and returns the shapes to decode; it runs no decode either.

A paired test counts units as independent samples, so nothing here lets a copy pass as a new one: repeated
prompts are left out with a note, and a batch larger than the prompts (a window that would hold one
prompt twice) is refused.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

from workbench.analysis.paired import MIN_PAIRS

# The prefill commits the first token and a cycle drafts max_new_tokens - generated - 1 slots
# (workbench.engine.runner), so below 3 new tokens no cycle drafts anything: no shape differs from AR and
# the branching pass has no drafted cycle to read.
MIN_NEW_TOKENS = 3
# New tokens per prompt a pays-off decode measures unless told otherwise: its measurement window, shorter than
# the engine's DEFAULT_MAX_NEW_TOKENS because every shape decodes every prompt at every batch size.
MEASURED_NEW_TOKENS = 64


class PaysOffInputError(ValueError):
    """Input ``pays-off`` cannot measure honestly: one line naming the value and the fix."""


@dataclass
class Inputs:
    """The checked input: distinct prompts, batch sizes (ascending), policies (None: the default set)."""

    texts: list
    ids: list
    batches: tuple
    policies: list | None
    max_new_tokens: int
    temperature: float
    seed: int
    repeats: int
    notes: list = field(default_factory=list)  # one line each: what was changed about the input, and why


def prompt_items(prompts) -> list[dict]:
    """A split name ('long', 'short'; None: 'long'), or a list of texts or {id, prompt} -> [{id, prompt}]."""
    from workbench.shipped import SPLITS, eval_prompts

    if prompts is None or (isinstance(prompts, str) and prompts in SPLITS):
        return eval_prompts(prompts or "long")
    if isinstance(prompts, (str, bytes)):
        raise PaysOffInputError(f"prompts={prompts!r:.60} is one text; give a list of at least {MIN_PAIRS} prompts "
                                f"or a split name ({', '.join(SPLITS)})")
    try:
        items = [p if isinstance(p, dict) else {"id": f"prompt-{i}", "prompt": p} for i, p in enumerate(prompts)]
    except TypeError:
        raise PaysOffInputError(f"prompts={prompts!r:.60} is not a list of prompts; give a list of texts or "
                                f"a split name ({', '.join(SPLITS)})") from None
    for i, p in enumerate(items):
        if not isinstance(p.get("prompt"), str) or not p["prompt"]:
            raise PaysOffInputError(f"prompts[{i}] is not a non-empty prompt text; give a str or "
                                    "{'id': ..., 'prompt': str}")
    return [{**p, "id": str(p.get("id", i))} for i, p in enumerate(items)]


def distinct_prompts(items: list[dict]) -> tuple[list[dict], list[str]]:
    """The first of each prompt text, in order, and the note saying which copies were left out (none: []).
    Fewer than ``MIN_PAIRS`` distinct texts are refused: copies decode alike, so a paired test on them
    would count one prompt as several samples."""
    seen, kept, copies = set(), [], []
    for p in items:
        if p["prompt"] in seen:
            copies.append(p["id"])
        else:
            seen.add(p["prompt"])
            kept.append(p)
    n = len(kept)
    if n < MIN_PAIRS:
        if copies:
            raise PaysOffInputError(f"{len(items)} prompts hold {n} distinct text{'s' if n != 1 else ''} (a copy "
                                    f"is not a new sample); a paired test needs at least {MIN_PAIRS} distinct "
                                    f"prompts: give {MIN_PAIRS - n} more")
        raise PaysOffInputError(f"{n} prompts give {n} paired values; a paired test needs at least {MIN_PAIRS}: "
                                f"give {MIN_PAIRS - n} more")
    if not copies:
        return kept, []
    shown = ", ".join(copies[:5]) + (f" and {len(copies) - 5} more" if len(copies) > 5 else "")
    return kept, [f"{len(copies)} repeated prompt(s) left out ({shown}: the same text as an earlier prompt, "
                  f"so not a new paired unit); {n} distinct prompts measured"]


def parse_batches(batch) -> tuple[int, ...]:
    """'1,8', 8, (1, 8) or ['1', '8'] -> (1, 8), ascending (the order given changes nothing); one line on
    anything that is not a positive whole number, and on a size given twice."""
    items = [x.strip() for x in batch.split(",")] if isinstance(batch, str) else batch
    if not isinstance(items, (list, tuple)):
        items = [items]  # one batch size: batch=8
    out = []
    for x in items:
        try:
            v = int(x) if isinstance(x, str) else (None if isinstance(x, bool) else operator.index(x))
        except (TypeError, ValueError):
            v = None
        if v is None or v < 1:
            raise PaysOffInputError(f"batch={batch!r}: {x!r} is not a batch size; each batch size must be a "
                                    "positive integer, e.g. 1,8")
        if v in out:
            raise PaysOffInputError(f"batch={batch!r}: batch size {v} is given twice")
        out.append(v)
    if not out:
        raise PaysOffInputError(f"batch={batch!r} names no batch size; e.g. 1,8")
    return tuple(sorted(out))


def check_windows(batches: tuple, n: int) -> None:
    """A unit at batch B is a window of B consecutive prompts (``measure.windows``): past ``n`` prompts a
    window wraps and holds a prompt twice."""
    for b in batches:
        if b > n:
            raise PaysOffInputError(f"batch {b} with {n} distinct prompts: each window of {b} would hold "
                                    f"{b - n} prompt(s) twice (a copy is not a new sample); use a batch <= {n} "
                                    f"or give {b - n} more prompts")


def parse_policy_list(policies) -> list | None:
    """``workbench.engine.validate.policy_list`` (the one parser of policy lists, the bench's too), its refusals
    as this module's error."""
    from workbench.engine.policies.calibration import check_named
    from workbench.engine.validate import policy_list

    try:
        pols = policy_list(policies)
        check_named(pols or [])  # the calibration files they name, read before any model loads
        return pols
    except ValueError as e:
        raise PaysOffInputError(str(e)) from None


def check_inputs(prompts=None, batch=(1, 8), policies=None, max_new_tokens: int = MEASURED_NEW_TOKENS,
                 temperature: float = 0.0, seed: int = 0, repeats: int = 1) -> Inputs:
    """Every input that needs no model, checked and normalised (see the module docstring)."""
    from workbench.engine import validate

    items, notes = distinct_prompts(prompt_items(prompts))
    batches = parse_batches(batch)
    check_windows(batches, len(items))
    pols = parse_policy_list(policies)
    for name, v in (("max_new_tokens", max_new_tokens), ("repeats", repeats)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PaysOffInputError(f"{name}={v!r} must be a positive integer")
    if max_new_tokens < MIN_NEW_TOKENS:
        raise PaysOffInputError(f"max_new_tokens={max_new_tokens} leaves no drafted cycle (the prefill commits the "
                                "first token, and a cycle drafts only while 2 or more remain): use "
                                f"max_new_tokens >= {MIN_NEW_TOKENS}")
    try:
        validate.temperature(temperature), validate.seed(seed)
    except ValueError as e:
        raise PaysOffInputError(str(e)) from None
    return Inputs([p["prompt"] for p in items], [p["id"] for p in items], batches, pols, max_new_tokens,
                  float(temperature), seed, repeats, notes)


def bind_to_pair(shapes: list, pair: dict, asked: bool) -> tuple[list, list[str]]:
    """Each shape's policy ready for ``pair`` (``Policy.for_pair``: a calibrated policy loads its calibration
    and refuses one made on another pair; a learned-head one loads its head and refuses a pair no head was
    trained on, or a missing head file), before any decode. -> (the shapes, bound; notes).

    ``asked``: the user named the policies, so a refusal is theirs to fix: PaysOffInputError with its line.
    Otherwise (the default set) a policy that cannot run here is left out, and a note says which and why:
    the default set must run on any pair, and a pair nobody calibrated has no calibrated policy to measure."""
    from dataclasses import replace

    kept, left = [], {}
    for s in shapes:
        try:
            kept.append(replace(s, policy=s.policy.for_pair(pair)))  # the bound copy equals the policy
        except ValueError as e:
            if asked:
                raise PaysOffInputError(str(e)) from None
            # one note per reason: the calibrated policies of a pair nobody calibrated share one, and the two
            # learned-head ones of a pair without a head another
            left.setdefault(str(e).removeprefix(f"{s.label}: "), []).append(s.label)
    notes = [f"{', '.join(labels)} left out of the default set: {why}" for why, labels in left.items()]
    return kept, notes


def fit_to_engine(inp: Inputs, engine) -> list:
    """The shapes to decode on ``engine``'s pair (``workbench.payoff.tree_shapes``), after every check that
    needs the loaded models: a shape the drafter's block cannot fill or needs more slots than it drafts,
    a calibrated policy whose calibration was made on another pair, a learned-head policy without a head for
    the pair (``bind_to_pair``; from the default set it is left out, with a note in ``inp.notes``), a prompt
    that runs past the target's positions, a batch the device's memory cannot hold."""
    from workbench.engine.runner import static_nodes
    from workbench.models.identity import pair_identity
    from workbench.payoff.tree_shapes import check_batch_fits, default_shapes, shapes_of

    m = engine.models
    slots, vocab = m.block_size - 1, int(m.target.config.get_text_config().vocab_size)
    try:
        shapes = default_shapes(slots, vocab) if inp.policies is None else shapes_of(inp.policies, slots, vocab)
        for s in shapes:
            s.policy.check_slots(slots)
        shapes, notes = bind_to_pair(shapes, pair_identity(m), asked=inp.policies is not None)
        inp.notes += [n for n in notes if n not in inp.notes]
        longest = max(len(engine.encode(t).ids) for t in inp.texts)
        if longest + inp.max_new_tokens >= m.max_positions:
            raise PaysOffInputError(f"the longest prompt is {longest} tokens; with max_new_tokens="
                                    f"{inp.max_new_tokens} it passes the target's {m.max_positions} positions: "
                                    "fewer new tokens or shorter prompts")
        widest = max(static_nodes(s.policy, m.block_size) for s in shapes)
        for b in inp.batches:
            check_batch_fits(engine, b, longest + inp.max_new_tokens, widest)
    except PaysOffInputError:
        raise
    except ValueError as e:  # the shapes' and the memory estimate's own lines, as this module's error
        raise PaysOffInputError(str(e)) from None
    return shapes


def refill_refusal(inp: Inputs, engine, shapes: list, batch: int) -> str:
    """Why the refilled batch cannot run at ``batch`` ('' when it can): it adds requests to running rows,
    which static shapes (CUDA graphs) fix, and it serves every shape's queue side by side, so the device
    holds ``batch`` rows per shape at once."""
    from workbench.engine.runner import static_nodes
    from workbench.payoff.tree_shapes import check_batch_fits

    if getattr(engine, "graphs", None) is not None:
        return ("this engine captures CUDA graphs, whose static shapes fix the rows of every forward; load it "
                "without cuda_graphs to measure a refilled batch")
    m = engine.models
    longest = max(len(engine.encode(t).ids) for t in inp.texts)
    widest = max(static_nodes(s.policy, m.block_size) for s in shapes)
    try:
        check_batch_fits(engine, batch * len(shapes), longest + inp.max_new_tokens, widest)
    except ValueError as e:
        return f"{len(shapes)} shapes x {batch} rows held side by side: {e}"
    return ""
