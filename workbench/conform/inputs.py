"""What the checker refuses before any model loads: a dump of another pair (``check_pair``), and records it cannot
read or that hold nothing to check (``prescan``); each refusal is a ``ConformInputError`` of one line naming the
field."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from workbench.conform import features
from workbench.conform.dump import VISIBILITY_FORMS, read_dump
from workbench.conform.integrity import RecordOrder
from workbench.conform.replay_contracts import CONTEXT_CONTRACTS, NEEDS
from workbench.models.config_facts import is_hybrid

TOKEN_FIELDS = ("draft_context_tokens", "draft_block_tokens", "draft_topk_ids", "tree_tokens", "verify_ids",
                "target_topk_ids", "target_choice", "committed_tokens")


class ConformInputError(ValueError):
    """A dump the checker cannot check (another pair, a layout it cannot read); one line naming the field."""


# ------------------------------------------------------------------------------------------ the pair
def header_pair_dirs(pair: dict, target, draft) -> tuple[Path, Path]:
    """The pair's directories: ``target`` / ``draft`` when given, else the ones the dump's header names."""
    from workbench.engine.loading import pair_dirs, resolve_model_ref

    if target is None and draft is None:
        t, d = (resolve_model_ref(pair.get(k)) for k in ("target", "draft"))
        if pair.get("target") and t is None:
            raise ConformInputError(f"the dump's pair.target {pair.get('target')!r} is not on this machine: pass "
                                    "target= and draft= (--target / --draft)")
        if pair.get("draft") and d is None:
            raise ConformInputError(f"the dump's pair.draft {pair.get('draft')!r} is not on this machine: pass "
                                    "target= and draft= (--target / --draft)")
        target, draft = t, d
    return pair_dirs(target, draft)


def check_pair(pair: dict, tdir: Path, ddir: Path) -> None:
    """The dump's ``pair`` against the models' configs (read, not loaded): one line naming the first field
    that differs."""
    from workbench.engine.loading import draft_settings, read_config

    tcfg, dcfg = read_config(tdir), read_config(ddir)
    text = tcfg.get("text_config") if isinstance(tcfg.get("text_config"), dict) else tcfg
    ds = draft_settings(dcfg, ddir)
    have = {"vocab_size": text.get("vocab_size"), "block_size": ds.block_size, "mask_token_id": ds.mask_token_id,
            "target_layer_ids": ds.target_layer_ids}
    for key, value in have.items():
        if key in pair and pair[key] != value:
            raise ConformInputError(f"the dump's pair.{key} is {pair[key]!r} but the pair here (target {tdir}, draft "
                                    f"{ddir}) has {value!r}: a dump of another pair; pass its target= and draft=")
    hybrid = is_hybrid(tcfg)
    said = pair.get("hybrid")
    if said is not None and not isinstance(said, bool):
        raise ConformInputError(f"the dump's pair.hybrid is {str(said)[:30]!r}: it must be true (the target has "
                                "linear-attention layers) or false")
    if hybrid and said is not True:
        raise ConformInputError(f"the dump's header says the target is attention-only (pair.hybrid "
                                f"{'absent' if said is None else 'false'}) but the target here ({tdir}) has "
                                "linear-attention layers: write \"hybrid\": true in the header's pair if the dump "
                                "is of this hybrid target, or check it on the pair it was written with")
    if said is True and not hybrid:
        raise ConformInputError(f"the dump's header says the target is hybrid (pair.hybrid true) but the target "
                                f"here ({tdir}) is attention-only: check it on the pair it was written with "
                                "(target=, draft=)")


# ------------------------------------------------------------------------------------------ the records
@dataclass
class Scan:
    """What one pass over the records found before any model loads."""

    cycles: int
    requests: int
    notes: list
    policies: list  # policy labels in the order the records first name them


def prescan(path, pair: dict, feature_form: tuple | None = None) -> Scan:
    """One pass over the records before any model loads: every field decodes, the layouts are ones the checker
    reads, token ids and drafted slots fit the pair, the records are whole and in order (``RecordOrder``), and
    there is something to check: at least one cycle, and one that holds some contract's fields. ``feature_form``:
    (the header's FeatureSpec, the drafter's target layers, the target's hidden size): each record's features
    have that form and width (``workbench.conform.features.check_record``)."""
    vocab, block = pair.get("vocab_size"), pair.get("block_size")
    _, records = read_dump(path)
    cycles = requests = 0
    unknown: set = set()
    order = RecordOrder(path)
    policies: list = []
    with_context: set = set()  # requests whose record gives the committed context (prompt and first token)
    checkable: set = set()  # contracts some cycle holds the fields of
    for rec in records:
        _check_token_ids(rec, vocab)
        unknown.update(rec.unknown)
        order.add(rec)
        label = rec.get("policy")
        if label and label not in policies:
            policies.append(label)
        if rec.kind == "request":
            requests += 1
            if "prompt_ids" in rec and "first_token" in rec:
                with_context.add(rec.request)
            continue
        cycles += 1
        if feature_form is not None:
            try:
                features.check_record(rec, *feature_form)
            except features.FeatureInputError as e:
                raise ConformInputError(str(e)) from None
        checkable.update(name for name, need in NEEDS.items() if all(f in rec for f in need)
                         and (name not in CONTEXT_CONTRACTS or rec.request in with_context))
        _check_layouts(rec, block)
    _check_something_to_check(path, pair, order, records, cycles, requests, checkable)
    return Scan(cycles, requests, _notes(records, order, unknown), policies)


def _check_token_ids(rec, vocab) -> None:
    """Every field decodes (DumpFileError names file:line and the field); token ids lie in the pair's vocabulary."""
    for name in rec.fields:
        value = rec[name]
        if name in TOKEN_FIELDS and isinstance(value, Tensor) and value.numel() and isinstance(vocab, int):
            lo, hi = int(value.min()), int(value.max())
            if name != "target_choice" and (lo < 0 or hi >= vocab):
                raise ConformInputError(f"{rec.where}: {name} holds token {hi if hi >= vocab else lo}, outside "
                                        f"the pair's vocabulary of {vocab}: a dump of another pair?")


def _check_layouts(rec, block) -> None:
    """A cycle record's layouts are ones the checker reads: its visibility form, its draft values' kind, its
    drafted slots within the pair's block, each top-k's ids and values of one shape."""
    form = rec.get("visibility_form")
    if form is not None and form not in VISIBILITY_FORMS:
        raise ConformInputError(f"{rec.where}: visibility_form {form!r} is a layout this checker cannot read "
                                f"({', '.join(VISIBILITY_FORMS)})")
    kind = rec.get("draft_values")
    if kind is not None and kind not in ("logprobs", "logits"):
        raise ConformInputError(f"{rec.where}: draft_values {kind!r}: the checker reads logprobs or logits")
    for name in ("draft_topk_ids", "draft_logits"):
        if name in rec and isinstance(block, int) and rec[name].shape[0] > block - 1:
            raise ConformInputError(f"{rec.where}: {name} has {rec[name].shape[0]} drafted slots; the pair's "
                                    f"block of {block} drafts at most {block - 1}: a dump of another pair?")
    for a, b in (("draft_topk_ids", "draft_topk_values"), ("target_topk_ids", "target_topk_values")):
        if a in rec and b in rec and rec[a].shape != rec[b].shape:
            raise ConformInputError(f"{rec.where}: {a} {list(rec[a].shape)} and {b} {list(rec[b].shape)} "
                                    "differ in shape")


def _check_something_to_check(path, pair: dict, order: RecordOrder, records, cycles: int, requests: int,
                              checkable: set) -> None:
    """The records are whole and in order, there is a cycle, and some cycle holds some contract's fields."""
    problem = order.problem()
    if problem is not None:
        raise ConformInputError(problem)
    if cycles == 0:
        raise ConformInputError(f"{path} holds no cycle record ({requests} request record(s)"
                                f"{', the end line' if records.complete else ''}): nothing to check; dump a run that "
                                "steps at least once")
    if not (checkable if pair.get("hybrid") else checkable - {"recurrent-state parents"}):
        raise ConformInputError(f"{path}: none of its {cycles} cycle record(s) holds the fields any contract reads "
                                "(e.g. tree_tokens and tree_parents for the tree, accepted_nodes for the accept walk): "
                                "nothing could be checked; docs/dump-format.md lists each contract's fields")


def _notes(records, order: RecordOrder, unknown: set) -> list:
    """One line each: a dump cut short or without its end line, records without seq, fields this version does not
    know."""
    notes = []
    if records.truncated:
        notes.append(records.truncated)
    elif not records.complete:
        notes.append("the dump has no end line: the run stopped early; every whole record was checked")
    if not order.numbered:
        notes.append("the records carry no seq (an older writer): a record lost, repeated or moved is found only by "
                     "each request's cycle numbers and context")
    if unknown:
        notes.append(f"fields this version does not know, not checked: {', '.join(sorted(unknown))}")
    return notes
