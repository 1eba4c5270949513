"""vLLM's DFlash (in process, ``wb.load(engine="vllm")``) writes a cycle dump: ``session(..., dump=PATH)``.

A DFlash step verifies a chain, and a chain is a tree (each draft's parent is the one before it). Per step,
from what ``workbench.adapters.vllm_tap.Tap`` captured on vLLM's proposer and rejection sampler:

- drafter context: the positions the drafter's context K/V were roped at (``precompute_and_store_context_kv``:
  every row of the verify before, of which the rows before this step's root are the committed ones the drafter
  keeps; the rejected rows after them are left out), the tokens ``DFlashProposer.propose`` got for those rows
  (``target_token_ids``: the drafter's forward reads no context token, so the header names them ``intended``,
  ``workbench.conform.intended``), the block's ids and positions its drafter model ran;
- drafter features: what the drafter's ``fc`` consumed for those rows (the target's layers side by side, as
  ``propose`` combined them from its ``target_hidden_states``: a fault between the two shows here), whole or as
  the digest (``workbench.conform.features``: the header's ``features`` says which);
- drafter output: the top-k of the drafter's logits for every proposed slot (``draft_values = "logits"``);
- tree: the root and the verified drafts as a chain; target logits: the top-k of the rejection sampler's
  target logits at every verified slot; accept: what it sampled; commit: the tokens the request received.

Not captured, so left out and named in each record's ``notes``: the verify forward's positions and attention
mask (vLLM verifies a chain as a causal prefill; the tap reads neither) and the engine's count of computed
tokens after the step. The request runs alone (the adapter loads vLLM with ``max_num_seqs=1``).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from workbench.conform import features
from workbench.conform.dump import DumpWriter, make_header
from workbench.conform.engine_dump import cycle_fields
from workbench.models.config_facts import is_hybrid

TOPK = 8
INTENDED = {"draft_context_tokens": "vLLM's drafter forward reads no context token, only their features: these are "
                                    "the target_token_ids propose() was handed for those rows"}
NOT_CAPTURED = ("verify_positions, visibility: vLLM's chain verify (a causal prefill) is not read by vllm_tap.Tap",
                "next_context_len: vLLM's count of computed tokens is not read by vllm_tap.Tap")


def _config(target_dir) -> dict:
    try:
        return json.loads((Path(target_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _vocab(config: dict) -> int | None:
    try:
        return int(config["vocab_size"])
    except (KeyError, ValueError, TypeError):
        return None


class VllmDump:
    """The dump of one vLLM session (one request)."""

    def __init__(self, engine, session, path, replace: bool = False):
        config = _config(engine.target_dir)
        pair = {"target": str(engine.target_dir), "draft": str(engine.draft_dir), "vocab_size": _vocab(config),
                "block_size": engine.block_size, "dtype": engine.dtype, "device": str(engine.device),
                "hybrid": is_hybrid(config)}  # a hybrid target's dump says so, or a checker refuses it
        self.features = features.spec_for(*features.pair_shape(engine.target_dir, engine.draft_dir))
        head = make_header({"name": "vllm", "version": engine.version, "workarounds": list(engine.patches),
                            "num_speculative_tokens": engine.num_speculative_tokens},
                           pair, str(session.policy), {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0},
                           topk={"draft": TOPK, "target": TOPK}, batch=1, features=self.features.to_header(),
                           intended=INTENDED)
        self.writer = DumpWriter(path, head, replace)
        self.request = session.request_id
        self.writer.request(self.request, prompt_ids=torch.tensor(session.prompt_ids), first_token=session.generated[0],
                            policy=str(session.policy), temperature=0.0, top_p=1.0, top_k=0, seed=0,
                            max_new_tokens=session.max_new_tokens)

    @property
    def path(self):
        return self.writer.path

    def cycle(self, session, c, pending, verify, committed_tokens: list[int]) -> None:
        """One engine step: ``c`` the session's Cycle; ``pending`` (Proposal, row) the drafts it verified;
        ``verify`` (Verify, row) the rejection sampler's call (both None for a step without speculation)."""
        f = {k: v for k, v in cycle_fields(c).items() if k not in ("verify_positions", "visibility_form", "visibility")}
        f.update(row=0, rows=1, committed_tokens=torch.tensor(committed_tokens, dtype=torch.long))
        notes = list(NOT_CAPTURED)
        n = int(c.tokens.shape[0])  # the tree's nodes, root first
        if pending is not None:
            p, row = pending
            k = int(p.drafts.shape[1])
            if len(p.req_ids) == 1:
                # vLLM hands the proposer every row of the last verify and a count of the rejected ones; the
                # drafter keeps the rows before this step's root (the committed ones)
                keep = p.context_positions < c.start
                f.update(draft_context_tokens=p.context_tokens[keep], draft_context_positions=p.context_positions[keep])
                if "context_positions" not in p.observed:
                    notes.append("draft_context_positions: propose()'s target_positions (the drafter's context K/V "
                                 "were not seen roped)")
                if "context_features" not in p.observed:  # not what the forward consumed: left unjudged
                    notes.append("draft_context_features: the drafter's fc was not seen consuming them")
                elif p.context_features is not None and p.context_features.shape[-1] == self.features.width:
                    f.update(self.features.fields(p.context_features[keep]))
                else:  # a proposer handed something else than the target layers side by side: said, not guessed
                    notes.append("draft_context_features: vLLM's target_hidden_states are "
                                 f"{None if p.context_features is None else list(p.context_features.shape)}, not "
                                 f"[rows, {self.features.width}]")
            else:
                notes.append(f"draft_context_tokens: a proposal over {len(p.req_ids)} requests; the tap keeps no "
                             "split of its context rows")
            q = slice(row * (k + 1), (row + 1) * (k + 1))
            if p.query_tokens is not None:
                f["draft_block_tokens"] = p.query_tokens[q]
            if p.query_positions is not None:
                f["draft_block_positions"] = p.query_positions[q]
            if p.draft_logits is not None:
                # a step cut by max_new_tokens is recorded with the root and the drafts it kept (its Cycle's tree)
                v, i = p.draft_logits[row, : n - 1].float().topk(TOPK, dim=-1)
                f.update(draft_topk_ids=i, draft_topk_values=v, draft_values="logits")
        if verify is not None:
            v, vrow = verify
            v_, i_ = v.target_logits[vrow][:n].float().topk(TOPK, dim=-1)
            f.update(target_topk_ids=i_, target_topk_values=v_)
        if session.finished and len(session.generated) >= session.max_new_tokens:
            notes.append(f"accepted_nodes: this step reached max_new_tokens={session.max_new_tokens}; vLLM cuts its "
                         f"accepted path to the {len(committed_tokens)} tokens that were left, and the record keeps "
                         "the root and the drafts it kept (as the workbench drafts no further than the limit)")
        self.writer.cycle(self.request, c.index, notes="\n".join(notes), **f)
        if session.finished:
            self.writer.close()

    def close(self) -> None:
        self.writer.close()


def attach(engine, session, path, replace: bool = False) -> VllmDump:
    dump = VllmDump(engine, session, path, replace)
    session.dump = dump
    return dump
