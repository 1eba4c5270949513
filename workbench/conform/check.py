"""``wb.conform(dump)``: a dumped speculative run replayed against the reference, contract by contract.

    report = wb.conform("run.dump")                 # the pair the dump's header names (default: embedded)
    report = wb.conform("run.dump", target=DIR, draft=DIR)
    print(report); report.to_dict(); report.broken  # contracts in the order they first broke
    python -m workbench conform run.dump [--target DIR --draft DIR] [--json]

For every cycle record (docs/dump-format.md) the checker rebuilds what the step should have been from the
request's committed context (its prompt, its first token and the tokens every earlier step committed), with
the workbench's own independent references: the reference drafter (``workbench.models.drafter_reference``) on that
context, the exact best-N tree (``oracles.build_tree_greedy_exact``) for the engine's own drafter output, the
ancestor closure by a plain walk, the path oracle (``workbench.models.path_oracle``: every node's logits from
its own root-to-node path through transformers' own model and cache) and the accept walk in Python. It then
holds each contract (``workbench.conform.contracts.CONTRACTS``) against the dump's fields. Per contract the
report gives cycles checked, cycles broken, the first broken cycle with its evidence and the acceptance it
cost there (tokens the reference's step commits on that context vs the engine's), and the cycles it could
not check with the fields they lack: a missing field is "not checked", never passed.

Bad input is refused in one line naming the field, before any model loads where the file alone shows it:
a foreign, truncated-header or unknown-version file (``read_dump``), a dump of another pair (vocabulary,
block size, mask token, a hybrid target under a header that says attention-only or the reverse), a field in a
layout the checker cannot read (an unknown visibility form, a drafted slot count the drafter's block cannot
make, a token outside the vocabulary), a dump with nothing to check (no cycle records, no field any contract
reads) and a file that is not as its writer wrote it (a record missing, repeated or out of order, a cycle
without its request's record, two rows' request ids swapped: ``workbench.conform.integrity``). Once the pair
is loaded, its weights' fingerprint is held against the header's (``workbench.conform.fingerprint``): a dump
is never replayed on another pair. A check that judged nothing (every contract not checked) is refused too:
it is no verdict.

Where each part lives: ``workbench.conform.inputs`` (the refusals before any model loads),
``workbench.conform.replay`` (the records in order, each cycle a loop over the contracts),
``workbench.conform.replay_contracts`` (each contract on one cycle), ``workbench.conform.replay_reference`` (the
reference's side of a cycle), ``workbench.conform.report`` (the verdict and its text).
"""
from __future__ import annotations

import os
import time

import torch

from workbench.conform import contracts as C
from workbench.conform import features
from workbench.conform.diagnosis import causes_of, diagnose
from workbench.conform.dump import read_dump
from workbench.conform.fault_cost import fault_cost
from workbench.conform.inputs import ConformInputError, check_pair, header_pair_dirs, prescan
from workbench.conform.replay import Replay, replay_records
from workbench.conform.replay_reference import chain_logits
from workbench.conform.report import ConformReport, ContractResult
from workbench.models.config_facts import is_hybrid

# the checker's names: its entry point, its report and refusal, and the batched path oracle
__all__ = ["ConformInputError", "ConformReport", "ContractResult", "as_models", "chain_logits", "check_arguments",
           "check_fingerprint", "conform"]


def conform(dump, target=None, draft=None, *, models=None, device: str = "cpu", progress=None, cycles=None,
            requests=None) -> ConformReport:
    """Check every cycle of the dump at ``dump`` against the reference on the pair its header names (default;
    the embedded pair for a workbench dump) or ``target`` / ``draft``, or on ``models`` already loaded
    (``engine.models``, or the workbench engine itself: checked against the header as a directory would be).
    ``device``: where the reference runs when the pair is loaded here (cpu, cuda, cuda:N); ``progress``: a
    callable given one line now and then (``workbench.conform.progress``: a check of more than a few cycles);
    ``cycles`` (A, B) / ``requests`` [ids]: judge engine steps A to B - 1 / those requests only, every record
    before them still read (``workbench.conform.selection``). See the module's docstring."""
    from workbench.engine.loading import model_ref

    from workbench.conform.progress import Progress

    models = check_arguments(dump, target, draft, models, device, progress)
    sel = _selection(cycles, requests)
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    head, _ = read_dump(dump)
    pair = head["pair"]
    tdir, ddir = header_pair_dirs(pair, target, draft) if models is None else (models.target_dir, models.draft_dir)
    check_pair(pair, tdir, ddir)
    form = _feature_form(head, dump, tdir, ddir)  # (the header's FeatureSpec, layers, hidden)
    kept = _kept(sel, dump)
    scan = prescan(dump, pair, feature_form=form)
    notes = list(scan.notes) + ([kept.note] if kept is not None and kept.note else [])
    total = kept.cycles if kept is not None else scan.cycles  # the cycles this check judges
    dtype = pair.get("dtype") or "float32"
    tol = C.tolerance(dtype)
    models = _pair_models(models, tdir, ddir, dtype, device, say)
    note = check_fingerprint(dump, pair, models)
    if note is not None:
        notes.insert(0, note)
    used = {"target": model_ref(models.target_dir), "draft": model_ref(models.draft_dir),
            "dtype": str(models.dtype).replace("torch.", "")}
    replay = Replay(models, tol, is_hybrid(models.target.config), form[0])
    _, records = read_dump(dump)
    ticker = Progress(say, total)
    ticker.start(f" of {scan.cycles}" if total != scan.cycles else "")
    with torch.inference_mode():
        replay_records(records, replay, head.get("policy"), models.tokenizer.eos_token_id, sel, ticker)
    if not any(r.checked for r in replay.results.values()):
        why = sorted({w for r in replay.results.values() for w in r.not_checked})
        raise ConformInputError(f"{dump}: no contract could be checked on its {total} cycle(s) "
                                f"({'; '.join(why)[:240]}): a check that judged nothing is no verdict; dump the "
                                "fields the contracts read (docs/dump-format.md)")
    say("decoding the reference along its own trajectory (what the run cost)")
    cost = fault_cost(dump, head, models, sel, models.tokenizer.eos_token_id)
    report = ConformReport(str(dump), head, replay.results, total,
                           kept.requests if kept is not None else scan.requests, tol, time.perf_counter() - t0, notes,
                           scan.policies, used, selection=sel.to_dict() if sel is not None else None, cost=cost)
    report.diagnosis = diagnose(report, replay)  # each candidate cause reproduced against the engine's records
    report.causes = causes_of(report.diagnosis)
    report.seconds = time.perf_counter() - t0  # the diagnosis included
    return report


def _selection(cycles, requests):
    """The slice the check judges (``workbench.conform.selection``), None: the whole dump."""
    from workbench.conform.selection import SelectionError, selection

    try:
        return selection(cycles, requests)
    except SelectionError as e:
        raise ConformInputError(str(e)) from None


def _feature_form(head: dict, dump, tdir, ddir) -> tuple:
    """(the header's FeatureSpec, the drafter's target layers, the target's hidden size): the features' form
    held against this checker's digest and the pair's width, before any model loads."""
    try:
        layers, hidden = features.pair_shape(tdir, ddir)
        return features.check_header(head, dump, layers, hidden), layers, hidden
    except features.FeatureInputError as e:
        raise ConformInputError(str(e)) from None


def _kept(sel, dump):
    """The selection against the dump's extent: a slice outside the dump is refused before the whole file is
    scanned, and before any model loads. None: the whole dump."""
    from workbench.conform.selection import SelectionError, check_against, extent

    try:
        return check_against(sel, extent(dump), dump) if sel is not None else None
    except SelectionError as e:
        raise ConformInputError(str(e)) from None


def _pair_models(models, tdir, ddir, dtype: str, device: str, say):
    """The pair to replay on: ``models`` as given (in the dump's dtype), else loaded here."""
    from workbench.engine.loading import load_models

    if models is None:
        say(f"loading the pair ({tdir}, {ddir}, {dtype})")
        return load_models(tdir, ddir, device=device, dtype=dtype)
    if str(models.dtype).replace("torch.", "") != dtype:
        raise ConformInputError(f"the dump's pair.dtype is {dtype!r} but models= holds {models.dtype}: load the "
                                "pair in the dump's dtype")
    return models


def check_arguments(dump, target, draft, models, device, progress):
    """Each argument of ``conform`` as it must be, or ConformInputError (one line naming it and the fix), before
    any file is read. -> the loaded pair to replay on (``models``, or an engine's), or None."""
    from workbench.engine import validate

    if not isinstance(dump, (str, os.PathLike)) or not str(dump):
        raise ConformInputError(f"dump={dump!r:.60} must be the path of a cycle dump (a str or pathlib.Path), e.g. "
                                "wb.conform('run.dump')")
    if progress is not None and not callable(progress):
        raise ConformInputError(f"progress={progress!r:.60} must be a callable taking one line (e.g. print), or None")
    try:
        validate.device(device)
    except ValueError as e:
        raise ConformInputError(str(e)) from None
    if models is None:
        return None
    if target is not None or draft is not None:
        raise ConformInputError("give models= or target= / draft=, not both: models= is the pair the check runs on")
    return as_models(models)


def as_models(models):
    """``models=`` as a loaded pair: ``engine.models``, or the workbench engine itself (its ``.models``). A
    remote or another engine's handle holds no weights here: refused in one line naming what to pass."""
    from workbench.engine.loading import Models
    from workbench.interface.base import BaseEngine

    if isinstance(models, Models):
        return models
    if isinstance(getattr(models, "models", None), Models):  # the workbench engine (wb.load())
        return models.models
    if isinstance(models, BaseEngine) and models.name == "served":  # by the registry's name: serve is above us
        raise ConformInputError("models= is a remote engine (wb.connect(...)): its weights are in the server's "
                                "process, not this one; pass target= and draft= (the directories it serves) or "
                                "models=wb.load(...).models")
    if isinstance(models, BaseEngine):
        raise ConformInputError(f"models= is the {models.name} engine, not the workbench's: the check replays on "
                                "the workbench's own models of the pair; pass target= and draft= (its directories)")
    raise ConformInputError(f"models={models!r:.60} is not a loaded pair: pass engine.models (wb.load(...).models) "
                            "or target= and draft= directories")


def check_fingerprint(dump, pair: dict, models) -> str | None:
    """The header's weights fingerprint against the loaded pair's: ConformInputError naming both pairs when they
    differ; a note (returned) when the dump has none to compare."""
    from workbench.conform.fingerprint import METHOD, pair_fingerprint
    from workbench.engine.loading import model_ref

    fp = pair.get("fingerprint")
    if not isinstance(fp, dict):
        return ("pair not checked: no fingerprint of the weights in the header (a writer without one: an older "
                "workbench, vLLM's adapter or a hook); make sure the pair here is the one the dump was written with")
    if fp.get("method") != METHOD:
        return (f"pair not checked: the header's fingerprint is by {str(fp.get('method'))[:40]!r}, this checker "
                f"computes {METHOD!r}")
    here = pair_fingerprint(models)
    differ = [role for role in ("target", "draft") if fp.get(role) != here[role]]
    if differ:
        what = " and ".join({"target": "the target's", "draft": "the drafter's"}[r] for r in differ)
        raise ConformInputError(
            f"{dump} was written with target {pair.get('target')}, draft {pair.get('draft')}, but the pair here is "
            f"target {model_ref(models.target_dir)}, draft {model_ref(models.draft_dir)}, and {what} weights differ "
            f"(fingerprint {'/'.join(str(fp.get(r)) for r in differ)} in the dump, {'/'.join(here[r] for r in differ)}"
            " here): check it on the pair it was written with (target= and draft=, or models=)")
    return None
