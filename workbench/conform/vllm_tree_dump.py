"""Drop into a vLLM tree proposer on a GPU host: every tree verify written to a cycle dump. NOT RUN HERE.

vLLM has no tree verify in a release: its DDTree pull request (vllm-project/vllm#42910, ``DDTreeProposer``)
holds a host-side tree per request and a per-request additive attention bias (``tree_attn_bias``: 0 where a
verify row sees a column, -inf where not) for the removed ``TREE_ATTN`` backend; independent ports do the
same. Their internals differ, so this module asks for the few values every such integration holds, per
request and step, and writes them::

    from workbench.conform.vllm_tree_dump import VllmTreeDump
    dump = VllmTreeDump("/tmp/vllm-ddtree.dump", pair={...}, policy="DDTree(16)")
    # inside the proposer / model runner, once per request per step, after the verify:
    dump.record(req_id, step, tokens=tree_tokens, positions=tree_positions, attn_bias=bias,
                context_len=num_computed_tokens, parents=tree_parents, logits=target_logits_for_the_tree,
                accepted_nodes=accepted, bonus=bonus_token)
    dump.close()

The tokens, positions and bias are what the integration hands ``record``; unless it reads them where the
attention consumes them, the header names them ``intended`` (``workbench.conform.intended``: the checker says
so beside each verdict on them); pass ``intended={}`` when it does.

``wrap(obj, method, extract)`` puts the call after a method of the proposer (``extract(args, kwargs, result)``
returns the ``record`` keyword arguments per request). The conversion is
``workbench.conform.convert.bias_fields``, tested here; this module's wrapping is tested on a stand-in object.
It has not run inside vLLM here (vLLM's tree attention needs a GPU build): check one dump by hand first.
For vLLM's released DFlash (a chain), the in-process adapter writes dumps itself:
``wb.load(engine="vllm").session(..., dump=PATH)``.
"""
from __future__ import annotations

import functools
import logging

from workbench.conform.convert import bias_fields
from workbench.conform.dump import DumpWriter, make_header

log = logging.getLogger(__name__)
INTENDED = {name: "given to VllmTreeDump.record by the integration, not read where the attention consumed them"
            for name in ("verify_positions", "visibility")}


class VllmTreeDump:
    """A dump fed one request's tree verify at a time."""

    def __init__(self, path, pair: dict, policy: str, sampling: dict | None = None, topk: int = 8,
                 replace: bool = False, intended: dict | None = None):
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("vllm")
        except PackageNotFoundError:
            v = "not installed"
        self.topk = topk
        self.writer = DumpWriter(path, make_header({"name": "vllm", "version": v, "writer": __name__}, pair, policy,
                                                   sampling, topk={"target": topk},
                                                   intended=INTENDED if intended is None else dict(intended)), replace)
        self.cycles: dict[str, int] = {}
        self._said: set[str] = set()

    def record(self, request_id, step: int, *, tokens, positions, attn_bias, context_len: int, parents=None,
               logits=None, accepted_nodes=None, bonus=None, **more) -> list[str]:
        """One request's verify. ``more``: any other dump fields the integration holds (``draft_topk_ids``,
        ``committed_tokens``, ``next_context_len``, ...; docs/dump-format.md). -> the notes."""
        f, notes = bias_fields(tokens, positions, attn_bias, context_len, parents, logits=logits, topk=self.topk,
                               accepted_nodes=accepted_nodes, bonus=bonus)
        rid = str(request_id)
        for note in notes:
            if note not in self._said:
                self._said.add(note)
                log.warning("cycle dump: %s", note)
        if rid not in self.cycles:
            self.writer.request(rid)
        f["cycle"] = self.cycles.get(rid, 0)
        self.cycles[rid] = f["cycle"] + 1
        self.writer.cycle(rid, step, notes="\n".join(notes) or None, **f, **more)
        return notes

    def wrap(self, obj, method: str, extract) -> None:
        """After every ``obj.method(...)``, record what ``extract(args, kwargs, result)`` returns: a list of
        dicts of ``record``'s keyword arguments (``request_id`` and ``step`` included). NOT RUN HERE."""
        original = getattr(obj, method)

        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            result = original(*args, **kwargs)
            for item in extract(args, kwargs, result) or ():
                self.record(**item)
            return result

        setattr(obj, method, wrapped)

    def close(self) -> None:
        self.writer.close()
