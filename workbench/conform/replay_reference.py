"""The reference's side of one replayed cycle: the target's own forwards (``tree_accept_length``, ``chain_logits``)
and ``Cycle``, one cycle record with what its contracts read, the reference's parts computed on first use."""
from __future__ import annotations

import torch
from torch import Tensor

from workbench.conform import contracts as C


def tree_accept_length(model, context: list[int], tokens: list[int], parents: list[int]) -> int:
    """Tokens a step commits (accepted drafts + the bonus) when the target's greedy continuation of ``context``
    (root last) walks the tree ``tokens`` / ``parents`` (root first), found by verifying guesses: one uncached
    forward over the context, the path walked so far and a guess down the tree (each node's first child in
    the tree's order) gives the target's argmax at every position of the guess; the walk follows them while
    they name a child, and a forward is spent again only where the walk leaves the guessed path (a sibling)."""
    kids: dict[int, dict[int, int]] = {}
    for i, p in enumerate(parents):
        if p >= 0:
            kids.setdefault(p, {})[tokens[i]] = i
    node, walked = 0, []
    while True:
        guess, j = [], node
        while j in kids:
            j = next(iter(kids[j].values()))
            guess.append(tokens[j])
        with torch.no_grad():  # [len(guess) + 1, V]: the logits after the walked path and after each guess token
            logits = model(input_ids=torch.tensor([context + walked + guess], device=model.device), use_cache=False,
                           logits_to_keep=len(guess) + 1).logits[0]
        for k, t in enumerate(logits.argmax(-1).tolist()):
            nxt = kids.get(node, {}).get(t)
            if nxt is None:
                return len(walked) + 1  # the bonus
            node = nxt
            walked.append(t)
            if t != guess[k]:  # the walk left the guessed path: later predictions read the guess, not it
                break


def chain_logits(model, context: list[int], tokens: list[int], parents: list[int]) -> Tensor:
    """Every node's target logits [n, V] from its own root-to-node path, as plain chains through transformers'
    own model: the committed ``context`` (the root excluded) prefilled once, then one batch with a row per
    leaf, its root-to-leaf path (root first), right-padded; causal attention (and a causal recurrence) keeps
    what follows a position out of it, so every node's logits are those of a row through it at its depth:
    the path oracle's (``workbench.models.path_oracle.path_logits``, which tests/conform checks it against)
    in one forward.
    A cache that cannot be repeated over rows (transformers' linear-attention layers) runs each row's whole
    context instead."""
    from workbench.models.config_facts import is_hybrid
    from workbench.models.path_oracle import prefill

    n, depth = len(tokens), C.depths_from(parents)
    leaf = list(range(n))  # a leaf below each node (parents come before their children)
    for i in range(n - 1, 0, -1):
        leaf[parents[i]] = leaf[i]
    ends = sorted(set(leaf))
    batch = torch.zeros(len(ends), max(depth) + 1, dtype=torch.long)  # [leaves, D + 1]
    for r, j in enumerate(ends):
        batch[r, depth[j] + 1:] = tokens[j]  # padding: never read
        while j >= 0:
            batch[r, depth[j]] = tokens[j]
            j = parents[j]
    ctx = torch.tensor(context)
    row_of = {j: r for r, j in enumerate(ends)}
    rows = (torch.tensor([row_of[leaf[i]] for i in range(n)]), torch.tensor(depth))  # node i: (its row, depth)
    k = len(ends)
    # the decoder's hidden states, and the head over each row's one read position only
    split = hasattr(model, "model") and hasattr(model, "lm_head")
    body = model.model if split else model
    with torch.no_grad():
        cache = None if is_hybrid(model.config) else prefill(model, ctx)[1]  # a recurrent state does not repeat
        layers = getattr(cache, "layers", None)
        if layers is not None and all(hasattr(layer, "batch_repeat_interleave") for layer in layers):
            cache.batch_repeat_interleave(k)
            out = body(input_ids=batch, past_key_values=cache, use_cache=True)  # [leaves, D + 1, ...]
            skip = 0
        else:
            out = body(input_ids=torch.cat([ctx.expand(k, len(context)), batch], 1), use_cache=False)
            skip = len(context)
        if split:
            return model.lm_head(out.last_hidden_state[:, skip:][rows]).float()  # [n, V]
        return out.logits[:, skip:][rows].float()


class Cycle:
    """One cycle record as its contracts read it: the request's committed context (``ctx``, root last; None when
    unknown), the root's position (``start``), the tree and whether its shape is malformed (``shape``: the tree
    contract's evidence, None when well formed or absent). The reference's parts are computed on first use and
    kept for the cycle: one target forward serves the features' reference and the reference drafter's input."""

    def __init__(self, rec, rq, models, ref):
        self.rec, self.rq, self.models, self.ref = rec, rq, models, ref
        self.ctx = rq.context
        self.start = len(self.ctx) - 1 if self.ctx is not None else rec.get("context_len")
        self.tokens = rec["tree_tokens"].tolist() if "tree_tokens" in rec else None
        self.parents = rec["tree_parents"].tolist() if "tree_parents" in rec else None
        self.shape = None if self.tokens is None or self.parents is None else C.tree_shape_problem(
            self.tokens, self.parents, rec["tree_depths"].tolist() if "tree_depths" in rec else None)
        self.kind = rec.get("draft_values", "logprobs")  # what the drafter's top-k values are: logprobs or logits
        self._cache: dict = {}

    def states(self):
        """The target's every layer over the committed context (``Reference.states``)."""
        if "states" not in self._cache:
            self._cache["states"] = self.ref.states(self.ctx[:-1])
        return self._cache["states"]

    def ref_logits(self, D: int) -> Tensor:
        """[D, V]: the reference drafter on the committed context (the whole block always: its slots attend to
        each other)."""
        if "draft" not in self._cache:
            self._cache["draft"] = self.ref.draft_logits(self.ctx, self.models.block_size - 1,
                                                         self.states().drafter_features()).float()
        return self._cache["draft"][:D]

    def ref_logprobs(self, D: int) -> Tensor:
        return torch.log_softmax(self.ref_logits(D), -1)

    def cost(self) -> tuple:
        """(the reference step's committed tokens on this context, the engine's); computed once a cycle."""
        if "cost" not in self._cache:
            self._cache["cost"] = self._step_cost()
        return self._cache["cost"]

    def _step_cost(self) -> tuple:
        rec, m = self.rec, self.models
        eng = len(rec["accepted_nodes"]) if "accepted_nodes" in rec else None
        if self.ctx is None or not C.rebuilds(self.rq.policy):
            return None, eng
        D = rec["draft_topk_ids"].shape[0] if "draft_topk_ids" in rec else m.block_size - 1
        want = C.reference_tree(self.ref_logprobs(D), self.ctx[-1], self.rq.policy)
        return tree_accept_length(m.target, self.ctx, want["tokens"], want["parents"]), eng
