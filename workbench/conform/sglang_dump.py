"""Drop into SGLang's DDTree worker on a GPU host: every tree verify written to a cycle dump. NOT RUN HERE.

SGLang's DDTree pull request (sgl-project/sglang#29907) converts each DDTree tree to EAGLE's layout and verifies
it with EAGLE's sampling (``eagle_sample`` in ``sglang.srt.speculative.eagle_utils``, called from
``eagle_worker_common``). ``install`` wraps that function where the worker calls it; each call then writes
one cycle record per request: the verify input (``draft_token``, ``custom_mask``, ``positions``, the
``retrieve_*`` links), the batch's ``seq_lens``, the target's top-k logits per verified token, and what the
sampling accepted. On the GPU host, in the process that runs the worker (before the server starts)::

    from workbench.conform import sglang_dump
    dump = sglang_dump.install("/tmp/ddtree.dump", pair={"target": "Qwen/Qwen3-8B", "draft": "...",
                                "vocab_size": 151936, "block_size": 16, "dtype": "bfloat16", "device": "cuda",
                                "hybrid": False},   # True for a target with linear-attention layers
                                policy="DDTree(32)")
    ...                       # serve; every verify is appended (the file is readable while it grows)
    dump.close()              # or leave it: a dump without its end line reads as a run stopped early

The drafter's context features are read where its forward consumes them: ``install_features(worker, dump)``
wraps the worker's ``draft_model.project_target_hidden`` (the features its ``fc`` projects) inside
``_append_target_hidden_to_draft_kv_by_loc`` (the positions their K/V are roped at, and each request's rows),
and each request's next cycle record holds them (``draft_context_positions`` and the features, whole or as the
digest: ``features=(layers, hidden)`` of the drafter's target layers). The verify's positions and mask are the
verify input's, read after the forward, not the attention backend's own: the header names them ``intended``
(``workbench.conform.intended``). The drafter's outputs are not read (no drafter output fields), and every
field the converter cannot read is named in the record's ``notes``. The conversion is
``workbench.conform.convert.from_verify_input``, tested on this machine on tensors built by SGLang 0.5.23's own
tree-build and verify kernels (tests/conform/test_convert.py); this module's wrapping is tested on a stand-in
module. It has not run inside SGLang's worker here (no GPU): check one dump by hand before trusting it.
"""
from __future__ import annotations

import importlib
import logging
import types

import torch

from workbench.conform import features as feature_forms
from workbench.conform.convert import from_verify_input
from workbench.conform.dump import DumpWriter, make_header

log = logging.getLogger(__name__)
WORKER_MODULE = "sglang.srt.speculative.eagle_worker_common"  # where the worker calls eagle_sample (0.5.23)
APPEND = "_append_target_hidden_to_draft_kv_by_loc"  # the DFlash worker's draft-context append (0.5.23)
INTENDED = {name: "the EagleVerifyInput's, read after the verify; the attention backend's own is not read"
            for name in ("verify_positions", "visibility")}


class SglangVerifyDump:
    """A dump fed one SGLang verify at a time (``record``); ``install`` calls it from the worker."""

    def __init__(self, path, pair: dict, policy: str, sampling: dict | None = None, topk: int = 8,
                 mask_mode: str = "FULL_MASK", replace: bool = False, features: tuple | None = None):
        from importlib.metadata import PackageNotFoundError, version

        try:
            sglang_version = version("sglang")
        except PackageNotFoundError:
            sglang_version = "not installed"
        self.topk, self.mask_mode = topk, mask_mode
        # (layers, hidden) of the drafter's target layers: the records then hold its context features
        self.features = None if features is None else feature_forms.spec_for(*features)
        extra = {} if self.features is None else {"features": self.features.to_header()}
        self.writer = DumpWriter(path, make_header({"name": "sglang", "version": sglang_version,
                                                    "writer": __name__}, pair, policy, sampling,
                                                   topk={"target": topk}, intended=INTENDED, **extra), replace)
        self.context: dict = {}  # batch index -> (features [c, L * H], positions [c]) taken in since its record
        self.step = 0
        self.cycles: dict[str, int] = {}  # request id -> its cycles so far
        self._said: set[str] = set()

    def record(self, verify_input, seq_lens, logits=None, predict=None, accept_index=None, request_ids=None,
               top: tuple | None = None) -> list[str]:
        """One verify of a batch: ``verify_input`` an ``EagleVerifyInput`` (or the same attribute names), seq_lens
        [bs] committed tokens per request, logits [bs * n, V] the target's (or ``top``: their top-k (values,
        ids) [bs * n, k], taken already), predict / accept_index as ``eagle_sample`` returns them. -> the notes
        (also in each record, and logged once each)."""
        seq = seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else list(seq_lens)
        fields, notes = from_verify_input(verify_input, seq, self.mask_mode, logits=logits, topk=self.topk,
                                          accept_index=accept_index, predict=predict)
        if top is not None:
            vals, ids_ = (t.reshape(len(fields), -1, t.shape[-1]) for t in top)
            for b, f in enumerate(fields):
                f.update(target_topk_ids=ids_[b], target_topk_values=vals[b])  # the choice: sampling may differ
        ids = [str(r) for r in request_ids] if request_ids is not None else [str(b) for b in range(len(fields))]
        for note in notes:
            if note not in self._said:
                self._said.add(note)
                log.warning("cycle dump: %s", note)
        for b, f in enumerate(fields):  # the context each request's drafter took in before this verify's draft
            if b in self.context:
                rows, pos = self.context.pop(b)
                f.update(draft_context_positions=pos, **self.features.fields(rows))
        for rid, f in zip(ids, fields):
            if rid not in self.cycles:
                self.writer.request(rid)
            f["cycle"] = self.cycles.get(rid, 0)
            self.cycles[rid] = f["cycle"] + 1
            self.writer.cycle(rid, self.step, policy=None, notes="\n".join(notes) or None, **f)
        self.step += 1
        return notes

    def take_context(self, rows, positions, counts: list[int]) -> None:
        """The rows the drafter's forward consumed [c, L * H] and their positions [c], ``counts[b]`` rows of
        batch index b after b - 1's: held for each request's next cycle record."""
        at = 0
        for b, k in enumerate(counts):
            got = self.context.get(b)
            new = (rows[at : at + k], positions[at : at + k])
            self.context[b] = new if got is None else tuple(torch.cat([g, x]) for g, x in zip(got, new))
            at += k

    def close(self) -> None:
        self.writer.close()


def install(path, pair: dict, policy: str, module: "str | types.ModuleType" = WORKER_MODULE,
            **kw) -> SglangVerifyDump:
    """Wrap ``module.eagle_sample`` so every verify the worker runs is also dumped. -> the dump (``close()``
    it, or ``uninstall(module)``). NOT RUN HERE: the wrapping is tested on a stand-in module only."""
    mod = importlib.import_module(module) if isinstance(module, str) else module
    original = getattr(mod, "eagle_sample", None)
    if original is None:
        raise ValueError(f"{getattr(mod, '__name__', mod)} has no eagle_sample: this SGLang calls its verify "
                         "elsewhere; pass module= the worker module that imports eagle_sample")
    if getattr(original, "_wb_dump", None) is not None:
        raise ValueError("a cycle dump is already installed there; uninstall(module) first")
    dump = SglangVerifyDump(path, pair, policy, **kw)

    def eagle_sample(verify_input, batch, logits_output, *args, **kwargs):
        logits = logits_output.next_token_logits
        # the target's logits as the forward gave them (eagle_sample may apply penalties in place)
        top = logits.float().topk(min(dump.topk, logits.shape[-1]), dim=-1) if logits is not None else None
        out = original(verify_input, batch, logits_output, *args, **kwargs)
        predict, _, accept_index = out
        dump.record(verify_input, batch.seq_lens, predict=predict, accept_index=accept_index, top=top,
                    request_ids=[getattr(r, "rid", i) for i, r in enumerate(getattr(batch, "reqs", []) or [])] or None)
        return out

    eagle_sample._wb_dump = dump
    eagle_sample._wb_original = original
    mod.eagle_sample = eagle_sample
    return dump


def uninstall(module: "str | types.ModuleType" = WORKER_MODULE) -> None:
    """Put the original ``eagle_sample`` back and close the dump."""
    mod = importlib.import_module(module) if isinstance(module, str) else module
    fn = getattr(mod, "eagle_sample", None)
    if getattr(fn, "_wb_dump", None) is not None:
        fn._wb_dump.close()
        mod.eagle_sample = fn._wb_original


def install_features(worker, dump: SglangVerifyDump) -> None:
    """Record the drafter's context where its forward consumes it (the module's docstring): the features
    ``worker.draft_model.project_target_hidden`` projects, per request by the append's ``extend_lens`` or
    ``commit_lens`` (rows in batch order; one request when it has neither). NOT RUN HERE: tested on a stand-in
    worker only."""
    model, append = getattr(worker, "draft_model", None), getattr(worker, APPEND, None)
    if append is None or not callable(getattr(model, "project_target_hidden", None)):
        raise ValueError(f"{type(worker).__name__} has no draft_model.project_target_hidden or {APPEND}: not "
                         "SGLang 0.5.23's DFlash worker; the drafter's features cannot be read at its forward")
    if dump.features is None:
        raise ValueError("the dump holds no features form: make it with features=(layers, hidden) of the drafter's "
                         "target layers")
    project, seen = model.project_target_hidden, []

    def project_target_hidden(target_hidden):
        seen.append(target_hidden.detach().float().cpu())  # [rows, L * H]: what the drafter's fc consumes
        return project(target_hidden)

    def append_context(*args, **kwargs):
        seen.clear()
        out = append(*args, **kwargs)
        pos, lens = kwargs.get("positions"), kwargs.get("extend_lens")
        lens = kwargs.get("commit_lens") if lens is None else lens
        if seen and pos is not None:
            rows = seen[0]
            counts = [int(x) for x in lens.tolist()] if lens is not None else [rows.shape[0]]
            dump.take_context(rows, pos.detach().cpu().long().reshape(-1), counts)
        return out

    model.project_target_hidden = project_target_hidden
    setattr(worker, APPEND, append_context)
