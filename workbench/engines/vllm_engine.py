"""vLLM's speculative decoding in process, stepped one engine step at a time and recorded as Cycles.

    engine = wb.load(engine="vllm")                          # the embedded pair, vLLM's own DFlash method
    s = engine.session("def parse(line):", max_new_tokens=64)
    c = s.step()                                             # one draft/verify cycle -> wb.Cycle
    t = s.run()                                              # -> wb.Trace: the stepper and views read it

One ``LLMEngine.step()`` verifies a request's pending drafts (target forward + rejection sampler) and then
drafts the next block. A cycle here is what the workbench's own engine calls one: the drafts of one
proposal and the verify that judged them. So cycle c pairs the proposal made at the end of step c (step 0
is the prefill) with the verify of step c + 1; its ``stage_seconds`` are that proposal's drafter call
("draft") and the rest of the verifying step ("verify": scheduling, the target forward, the sampler).

Recorded per cycle: the root (the last committed token), the 15 drafts as a chain (vLLM's DFlash drafts
a chain: there is no tree to record), the drafter's top-k log-probs per slot, the target's argmax and
its probability at every drafted slot (from the rejection sampler's logits), the accepted path, the
bonus, positions and times. Not recorded (``trace.meta["not_recorded"]``): per-module shapes, the target's
top-2 logits, K/V contents. Greedy only: vLLM's sampled acceptance is its own rejection rule, not the
workbench's, so temperature > 0 is refused rather than recorded as something it is not.
"""
from __future__ import annotations

import itertools
import time
import warnings
from types import SimpleNamespace

import torch

from workbench.engine.policies import DFlash, as_policy
from workbench.engines import vllm_hooks
from workbench.engines.vllm_hooks import Tap, VllmUnsupported
from workbench.records.cycle import Cycle, Trace
from workbench.records.forward import ForwardMode, ForwardRecord, shape_of

NOT_RECORDED = ("per-module shapes (no shape capture)", "the target's top-2 logits", "K/V contents",
                "a tree: vLLM's DFlash drafts one chain")
_ids = itertools.count()
# wb.Session settings with no vLLM counterpart: accepted at these values only
SESSION_DEFAULTS = {"top_p": 1.0, "top_k": 0, "seed": 0, "kernel_backend": "vllm", "record_topk": 8, "capture": None}


class VllmEngine:
    """A target and a DFlash drafter loaded by vLLM in this process, with hooks on its model runner.

    ``workarounds=True`` applies ``workbench.engines.vllm_workarounds`` before the model loads;
    ``layers=True`` keeps every cycle's drafter inputs, logits and per-layer tensors on its session
    (``s.proposals``, for the conformance report; memory grows with the run)."""

    kind = "vllm"

    def __init__(self, target, draft, *, num_speculative_tokens: int | None = None, dtype: str = "auto",
                 max_model_len: int = 1024, seed: int = 0, workarounds: bool = False, layers: bool = False,
                 speculative: bool = True):
        self.version = vllm_hooks.check_version()
        self.target_dir, self.draft_dir, self.settings = pair_dirs(target, draft)
        self.block_size = self.settings.block_size
        k = self.block_size - 1 if num_speculative_tokens is None else int(num_speculative_tokens)
        if not 1 <= k <= self.block_size - 1:
            raise ValueError(f"num_speculative_tokens={num_speculative_tokens} must be between 1 and the "
                             f"drafter's block size - 1 ({self.block_size - 1})")
        self.num_speculative_tokens = k if speculative else 0
        # "auto" is the checkpoint's own dtype, as for the workbench's engine: vLLM's own "auto" downcasts a
        # float32 checkpoint to bfloat16 on a CPU, which would compare another model silently.
        self.dtype = checkpoint_dtype(self.target_dir) if dtype in (None, "auto") else str(dtype).replace("torch.", "")
        self.workarounds = bool(workarounds)
        vllm_hooks.in_process_env()
        if workarounds:
            from workbench.engines import vllm_workarounds

            self.patches = vllm_workarounds.apply()
        else:
            self.patches = ()
        from vllm import LLM

        spec = {"method": "dflash", "model": str(self.draft_dir), "num_speculative_tokens": k} if speculative else None
        t0 = time.perf_counter()
        try:
            self.llm = LLM(model=str(self.target_dir), tokenizer=str(self.target_dir), dtype=self.dtype,
                           max_model_len=max_model_len, enforce_eager=True, max_num_seqs=1, seed=seed,
                           disable_log_stats=False, async_scheduling=False,
                           **({"speculative_config": spec} if spec else {}))
        except Exception as e:  # vLLM's own refusal of the pair, in one line
            raise VllmUnsupported(f"vLLM {self.version} refused the pair (target {self.target_dir}, drafter "
                                  f"{self.draft_dir}): {str(e).splitlines()[0][:300] if str(e) else type(e).__name__}") from e
        self.load_seconds = time.perf_counter() - t0
        self.runner = vllm_hooks.model_runner(self.llm.llm_engine)
        self.tap = Tap(self.runner, layers=layers) if speculative else None
        if self.tap is not None:
            self.tap.install()
        self.tokenizer = self.llm.get_tokenizer()
        self._live: VllmSession | None = None

    def __repr__(self) -> str:
        spec = f"DFlash x{self.num_speculative_tokens}" if self.num_speculative_tokens else "no speculation"
        fixes = f", workarounds: {', '.join(self.patches)}" if self.patches else ""
        return (f"VllmEngine(vLLM {self.version}, {spec}, {self.dtype}, target={self.target_dir}, "
                f"draft={self.draft_dir}{fixes})")

    def encode(self, prompt: str) -> list[int]:
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def session(self, prompt: str | None = None, policy=DFlash(), temperature: float = 0.0,
                max_new_tokens: int = 128, *, prompt_ids=None, **settings) -> "VllmSession":
        """A new request. Settings of ``wb.Session`` that vLLM's engine has no counterpart for are accepted
        at their defaults only (the stepper passes them back on reset) and refused otherwise."""
        for name, value in settings.items():
            if name not in SESSION_DEFAULTS:
                raise TypeError(f"session() got an unexpected argument {name!r}")
            if value != SESSION_DEFAULTS[name]:
                raise ValueError(f"{name}={value!r}: the vLLM engine runs greedy with vLLM's own kernels and "
                                 f"records top-{SESSION_DEFAULTS['record_topk']} drafts; leave {name} out")
        policy = as_policy(policy)
        if self.num_speculative_tokens and policy != DFlash():
            raise ValueError(f"policy={policy} is not vLLM's: vLLM {self.version} runs its 'dflash' method "
                             "(a chain of drafts; 'ddtree' needs vLLM's TREE_ATTN backend on a GPU): pass "
                             "policy=wb.DFlash()")
        if temperature != 0:
            raise ValueError(f"temperature={temperature}: the vLLM engine records greedy runs only (vLLM's "
                             "sampled acceptance is its own rejection rule); pass temperature=0")
        if self._live is not None and not self._live.finished:  # one request at a time: the older one ends here
            warnings.warn(f"{self._live!r} was still running: aborted for the new session", stacklevel=2)
            self._live.close()
        if (prompt is None) == (prompt_ids is None):
            raise ValueError("give one of prompt= (text) or prompt_ids= (token ids)")
        ids = list(prompt_ids) if prompt_ids is not None else self.encode(prompt)
        self._live = VllmSession(self, ids, prompt if prompt is not None else self.tokenizer.decode(ids),
                                 int(max_new_tokens))
        return self._live

    def generate(self, prompt=None, max_new_tokens: int = 128, *, prompt_ids=None) -> list[int]:
        """Greedy new token ids, stepped to the end."""
        s = self.session(prompt, max_new_tokens=max_new_tokens, prompt_ids=prompt_ids)
        s.run()
        return s.tokens

    def spec_counters(self) -> dict:
        """vLLM's own speculative counters (``LLM.get_metrics()``), summed over requests so far."""
        from workbench.engines.spec_metrics import spec_counters_from_metrics

        return spec_counters_from_metrics(self.llm.get_metrics())

    def close(self) -> None:
        if self.tap is not None:
            self.tap.remove()
        if self.patches:
            from workbench.engines import vllm_workarounds

            vllm_workarounds.undo()
            self.patches = ()


class VllmSession:
    """One request in vLLM, stepped one engine step (= one cycle) at a time. Mirrors ``wb.Session``:
    ``step()`` -> Cycle, ``run()`` -> Trace, ``tokens``, ``text``, ``finished``, ``trace``."""

    def __init__(self, engine: VllmEngine, prompt_ids: list[int], prompt: str, max_new_tokens: int):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be 1 or more")
        self.engine, self.prompt_ids, self.prompt = engine, prompt_ids, prompt
        self.request_id = f"wb-{next(_ids)}"
        self.generated: list[int] = []
        self.finish_reason: str | None = None
        self.trace = Trace(meta={
            "engine": f"vllm {engine.version}", "prompt": prompt, "prompt_ids": list(prompt_ids),
            "prompt_format": "ids", "policy": str(DFlash()) if engine.num_speculative_tokens else "AR",
            "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "max_new_tokens": max_new_tokens,
            "target": str(engine.target_dir), "draft": str(engine.draft_dir), "device": "cpu", "dtype": engine.dtype,
            "num_speculative_tokens": engine.num_speculative_tokens, "block_size": engine.block_size,
            "workarounds": list(engine.patches), "not_recorded": list(NOT_RECORDED),
        })
        self._pending = None  # the proposal the next step verifies
        # per cycle, the (Proposal, row) it verified: kept with layers=True (the conformance report reads them)
        self.proposals: list = []
        if engine.tap is not None:
            engine.tap.take()  # nothing of an earlier request
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
        engine.llm.llm_engine.add_request(self.request_id, TokensPrompt(prompt_token_ids=list(prompt_ids)), params)
        t0 = time.perf_counter()
        while not self.generated and not self.finished:  # the prefill: the first token and the first drafts
            self._engine_step()
        self.trace.prefill_seconds = time.perf_counter() - t0
        self.trace.new_tokens = len(self.generated)
        if engine.tap is not None:
            proposals, _ = engine.tap.take()
            self._pending = self._mine(proposals)

    def __repr__(self) -> str:
        return (f"VllmSession({self.request_id}, {len(self.generated)}/{self.trace.meta['max_new_tokens']} "
                f"tokens, {len(self.trace.cycles)} cycles{', ' + self.finish_reason if self.finished else ''})")

    # what the stepper and views read of a session; fixed for a vLLM request
    policy = DFlash()
    temperature = 0.0
    sampling = SimpleNamespace(temperature=0.0, top_p=1.0, top_k=0)
    capture = None

    def __getattr__(self, name):
        if name in SESSION_DEFAULTS:
            return SESSION_DEFAULTS[name]
        raise AttributeError(f"'VllmSession' object has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name in ("policy", "temperature", "top_p", "top_k", "seed", "max_new_tokens") and \
                getattr(self, name, None) != value:
            raise ValueError(f"{name}={value!r}: a vLLM request keeps its settings (greedy DFlash, the limit it "
                             "started with); start a new session instead")
        object.__setattr__(self, name, value)

    @property
    def max_new_tokens(self) -> int:
        return self.trace.meta["max_new_tokens"]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def tokens(self) -> list[int]:
        return list(self.generated)

    @property
    def text(self) -> str:
        return self.engine.tokenizer.decode(self.generated)

    @property
    def cycles(self) -> list[Cycle]:
        return self.trace.cycles

    def _engine_step(self) -> float:
        t0 = time.perf_counter()
        outs = self.engine.llm.llm_engine.step()
        seconds = time.perf_counter() - t0
        for out in outs:
            if out.request_id != self.request_id:
                continue
            self.generated = list(out.outputs[0].token_ids)
            if out.finished:
                self.finish_reason = str(out.outputs[0].finish_reason or "stop")
        return seconds

    def _mine(self, items):
        """This request's row of the last proposal / verify: (item, row) or None."""
        for item in reversed(items):
            for row, rid in enumerate(item.req_ids):  # vLLM suffixes its internal ids: "wb-0" -> "wb-0-a55f..."
                if rid == self.request_id or str(rid).startswith(self.request_id + "-"):
                    return item, row
        return None

    @torch.inference_mode()
    def step(self) -> Cycle:
        from workbench.engine.runner import SessionFinished

        if self.finished:
            raise SessionFinished(f"session finished ({self.finish_reason}) after {len(self.generated)} new "
                                  f"tokens in {len(self.cycles)} cycles; start a new session")
        before = len(self.generated)
        start = len(self.prompt_ids) + before - 1  # position of the root (the last committed token)
        root = self.generated[-1]
        seconds = self._engine_step()
        committed = len(self.generated) - before
        tap = self.engine.tap
        if tap is None:  # no speculation: one target decode per step
            c = _ar_cycle(len(self.cycles), start, root, self.generated[before:], seconds)
        else:
            proposals, verifies = tap.take()
            verify = self._mine(verifies)
            nxt = self._mine(proposals)
            draft_s = self._pending[0].seconds if self._pending else 0.0
            if tap.layers:
                self.proposals.append(self._pending)
            c = _dflash_cycle(len(self.cycles), start, root, self._pending, verify, committed,
                              {"draft": draft_s, "verify": seconds - (nxt[0].seconds if nxt else 0.0)})
            self._pending = nxt
        self.trace.cycles.append(c)
        self.trace.new_tokens = len(self.generated)
        if self.finished:
            self.trace.finish_reason = self.finish_reason
        return c

    def run(self, max_new_tokens: int | None = None) -> Trace:
        if max_new_tokens is not None and max_new_tokens != self.trace.meta["max_new_tokens"]:
            raise ValueError(f"max_new_tokens={max_new_tokens}: a vLLM request's limit is set when it starts "
                             f"({self.trace.meta['max_new_tokens']}); start a session with the limit you want")
        while not self.finished:
            self.step()
        return self.trace

    def close(self) -> None:
        if not self.finished:
            self.engine.llm.llm_engine.abort_request([self.request_id])
            self.finish_reason = "aborted"
            self.trace.finish_reason = "aborted"


def _chain(n: int, start: int) -> dict:
    """A chain of n nodes (the root and n - 1 drafts) in the Cycle's tree arrays."""
    ar = torch.arange(n)
    nxt = torch.where(ar + 1 < n, ar + 1, torch.full_like(ar, -1))
    return dict(parents=ar - 1, depth=ar.clone(), rank=torch.zeros(n, dtype=torch.long), position_ids=start + ar,
                visibility=torch.ones(n, n, dtype=torch.bool).tril(), retrieve_next_token=nxt,
                retrieve_next_sibling=torch.full((n,), -1))


def _dflash_cycle(index, start, root, pending, verify, committed, stage_seconds,
                  topk: int = 8) -> Cycle:
    if pending is None or verify is None:
        raise VllmUnsupported(
            f"vLLM step {index + 1} verified no drafts of this request (a step without speculation: the "
            "prompt and its continuation may be longer than max_model_len, or the scheduler split the "
            "request); the workbench cannot record it as a cycle")
    proposal, row = pending
    v, vrow = verify
    drafts = proposal.drafts[row]  # [K]
    d = int(v.num_drafts[vrow])
    logits = v.target_logits[vrow]  # [d + 1, V]
    probs = torch.softmax(logits, dim=-1)
    choice = logits.argmax(dim=-1)  # [d + 1]
    tokens = torch.cat([torch.tensor([root]), drafts[:d]])  # [n]
    n = d + 1
    if proposal.draft_logits is not None:
        lp = torch.log_softmax(proposal.draft_logits[row, :d], dim=-1)  # [d, V]
        # a stable sort lists tied tokens by id, the one argmax (and so vLLM's greedy draft) picks first
        vals, idx = torch.sort(lp, dim=-1, descending=True, stable=True)
        chain_lp = lp.gather(-1, drafts[:d, None])[:, 0]
        score = torch.cat([torch.zeros(1), chain_lp.cumsum(0)])
        top_tokens, top_lp = idx[:, :topk], vals[:, :topk].float()
    else:
        score, top_tokens, top_lp = torch.zeros(n), torch.zeros(0, topk, dtype=torch.long), torch.zeros(0, topk)
    accepted = v.sampled[vrow]
    accepted = accepted[accepted >= 0]  # accepted drafts then the bonus
    L = int(accepted.numel()) - 1
    nodes = torch.arange(L + 1)
    forwards = (
        ForwardRecord("draft", ForwardMode.TARGET_VERIFY,
                      {"input_ids": {"shape": [1 + d], "dtype": "int64", "device": "cpu"},
                       "target_hidden": shape_of(proposal.context_features)},
                      {"logits": {"shape": [d, int(logits.shape[-1])], "dtype": "float32", "device": "cpu"}}),
        ForwardRecord("target", ForwardMode.TARGET_VERIFY,
                      {"input_ids": {"shape": [n], "dtype": "int64", "device": "cpu"}},
                      {"logits": shape_of(logits)}),
    )
    return Cycle(
        index=index, policy=str(DFlash()), start=start, root_token=int(root),
        draft_topk_tokens=top_tokens, draft_topk_logprobs=top_lp, tokens=tokens, score=score.float(),
        target_choice=choice, target_prob=probs.gather(-1, choice[:, None])[:, 0],
        accepted_nodes=nodes, accepted_tokens=tokens[nodes], bonus=int(accepted[-1]),
        committed=int(committed), stage_seconds=stage_seconds, forwards=forwards, **_chain(n, start))


def _ar_cycle(index, start, root, new_tokens, seconds) -> Cycle:
    tok = torch.tensor([root])
    nxt = int(new_tokens[0]) if new_tokens else int(root)
    return Cycle(index=index, policy="AR", start=start, root_token=int(root),
                 draft_topk_tokens=torch.zeros(0, 8, dtype=torch.long), draft_topk_logprobs=torch.zeros(0, 8),
                 tokens=tok, score=torch.zeros(1), target_choice=torch.tensor([nxt]), target_prob=torch.ones(1),
                 accepted_nodes=torch.zeros(1, dtype=torch.long), accepted_tokens=tok, bonus=nxt,
                 committed=len(new_tokens), stage_seconds={"verify": seconds}, forwards=(), **_chain(1, start))


def checkpoint_dtype(target_dir) -> str:
    """The dtype a checkpoint's config.json names (``dtype`` or ``torch_dtype``), float32 when it names none."""
    import json

    cfg = json.loads((target_dir / "config.json").read_text())
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or text.get("dtype") or "float32")


def pair_dirs(target, draft):
    """(target dir, drafter dir, DraftSettings): the workbench loader's own rule for the directories, and
    the drafter's config read as it reads it."""
    from workbench.engine.loading import draft_settings, pair_dirs as dirs, read_config

    tdir, ddir = dirs(target, draft)
    return tdir, ddir, draft_settings(read_config(ddir), ddir)


def load(target=None, draft=None, **kw) -> VllmEngine:
    """``wb.load(target, draft, engine="vllm", ...)``: the pair in vLLM (defaults: the embedded pair)."""
    return VllmEngine(target, draft, **kw)
