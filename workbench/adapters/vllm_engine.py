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

import torch

from workbench.engine import validate
from workbench.engine.policies import AR, DFlash, as_policy
from workbench.engine.prompting import encode_prompt
from workbench.engine.request import SessionState
from workbench.engine.sampling import Sampling
from workbench.adapters import vllm_tap
from workbench.interface.base import DEFAULT_MAX_NEW_TOKENS, BaseEngine, BaseSession
from workbench.adapters.vllm_tap import Tap, VllmUnsupported
from workbench.records.cycle import Cycle, Trace
from workbench.records.engine_step import RECORD_TOPK, chain_cycle, chain_forwards, decode_cycle

NOT_RECORDED = ("per-module shapes (no shape capture)", "the target's top-2 logits", "K/V contents",
                "a tree: vLLM's DFlash drafts one chain")
_ids = itertools.count()
# wb.Session settings with no vLLM counterpart: accepted at these values only
SESSION_DEFAULTS = {"top_p": 1.0, "top_k": 0, "seed": 0, "kernel_backend": "vllm", "record_topk": RECORD_TOPK,
                    "capture": None}
# wb.load() arguments of the workbench's own engine, at the values that mean "vLLM's own choice"
LOAD_DEFAULTS = {"kernel_backend": "torch", "threads": None, "device_map": None, "trust_remote_code": False,
                 "cuda_graphs": False}


class VllmEngine(BaseEngine):
    """A target and a DFlash drafter loaded by vLLM in this process, with hooks on its model runner.

    ``workarounds=True`` applies ``workbench.adapters.vllm_workarounds`` before the model loads;
    ``layers=True`` keeps every cycle's drafter inputs, logits and per-layer tensors on its session
    (``s.proposals``, for the comparison report; memory grows with the run)."""

    name = "vllm"
    default_policy = "dflash"
    policy_kinds = ("dflash",)  # vLLM's 'dflash' method: a chain ('ddtree' needs its TREE_ATTN backend on a GPU)
    instead = {
        "batch_session": "this engine steps one vLLM request at a time; run sessions one after another, or "
                         "use wb.load() (the workbench's engine) for batched sessions",
        "replay": "replay the trace on the workbench's engine: wb.load().replay(trace)",
    }

    @classmethod
    def load(cls, target=None, draft=None, device: str = "cpu", dtype="auto", **options) -> "VllmEngine":
        """``wb.load(target, draft, engine="vllm", ...)``: the pair in vLLM (defaults: the embedded pair).
        The workbench engine's own arguments are refused unless left at their defaults."""
        if device != "cpu" and device != "cuda":
            raise ValueError(f"device={device!r}: vLLM picks its own device (its CPU build or CUDA); leave device out")
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but CUDA is not available on this machine: vLLM's CPU build runs on the "
                             "CPU; leave device out")
        for name, default in LOAD_DEFAULTS.items():
            if name in options and options.pop(name) != default:
                raise ValueError(f"{name}= is an option of the workbench's engine; vLLM runs its own kernels "
                                 f"and settings: leave {name} out with engine='vllm'")
        return cls(target, draft, dtype=str(dtype).replace("torch.", ""), **options)

    def __init__(self, target, draft, *, num_speculative_tokens: int | None = None, dtype: str = "auto",
                 max_model_len: int = 1024, seed: int = 0, workarounds: bool = False, layers: bool = False,
                 speculative: bool = True):
        self.version = vllm_tap.check_version()
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
        vllm_tap.in_process_env()
        if workarounds:
            from workbench.adapters import vllm_workarounds

            self.patches = vllm_workarounds.apply()
        else:
            self.patches = ()
        from vllm import LLM

        spec = {"method": "dflash", "model": str(self.draft_dir), "num_speculative_tokens": k} if speculative else None
        t0 = time.perf_counter()
        # vLLM's CPU worker replaces torch.set_num_threads process-wide with a no-op once it binds its threads;
        # a workbench engine loaded later in the same process (wb.compare, notebook 10) would then silently
        # keep vLLM's count. Its binding is done at start-up, so putting the function back changes nothing there.
        set_num_threads = torch.set_num_threads
        try:
            self.llm = LLM(model=str(self.target_dir), tokenizer=str(self.target_dir), dtype=self.dtype,
                           max_model_len=max_model_len, enforce_eager=True, max_num_seqs=1, seed=seed,
                           disable_log_stats=False, async_scheduling=False,
                           **({"speculative_config": spec} if spec else {}))
        except Exception as e:  # vLLM's own refusal of the pair, in one line (its log on stderr has the rest)
            raise VllmUnsupported(f"vLLM {self.version} refused the pair (target {self.target_dir}, drafter "
                                  f"{self.draft_dir}): {refusal_reason(e)[:300]}") from e
        finally:
            torch.set_num_threads = set_num_threads
        self.load_seconds = time.perf_counter() - t0
        self.max_model_len = int(max_model_len)  # prompt, new tokens and a block's drafts must fit in it
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        self.runner = vllm_tap.model_runner(self.llm.llm_engine)
        self.tap = Tap(self.runner, layers=layers) if speculative else None
        if self.tap is not None:
            self.tap.install()
        self.tokenizer = self.llm.get_tokenizer()
        self._live: VllmSession | None = None

    @property
    def device(self) -> torch.device:
        """What vLLM's model runner runs on (its CPU build: cpu)."""
        return torch.device(self.runner.device)

    def __repr__(self) -> str:
        spec = f"DFlash x{self.num_speculative_tokens}" if self.num_speculative_tokens else "no speculation"
        fixes = f", workarounds: {', '.join(self.patches)}" if self.patches else ""
        return (f"VllmEngine(vLLM {self.version}, {spec}, {self.dtype}, target={self.target_dir}, "
                f"draft={self.draft_dir}{fixes})")

    def encode(self, prompt: str) -> list[int]:
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def session(self, prompt: str | None = None, policy=DFlash(), temperature: float = 0.0,
                max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, *, prompt_ids=None, messages=None, dump=None,
                dump_replace: bool = False,
                **settings) -> "VllmSession":
        """A new request. Settings of ``wb.Session`` that vLLM's engine has no counterpart for are accepted
        at their defaults only (the stepper passes them back on reset) and refused otherwise. ``dump``: a
        path; every step is also written there as a cycle dump (``workbench.conform.vllm_dump``); an existing
        file is refused unless ``dump_replace=True``. ``messages``: a chat, through the target tokenizer's chat
        template as ``wb.Session`` applies it (``workbench.engine.prompting``)."""
        if dump is None and dump_replace is not False:
            raise ValueError(f"dump_replace={dump_replace!r} without dump=: give dump=PATH, or leave dump_replace out")
        if dump is not None:
            from workbench.conform.dump import check_dump_path

            check_dump_path(dump, dump_replace)
        for name, value in settings.items():
            if name not in SESSION_DEFAULTS:
                raise TypeError(f"session() got an unexpected argument {name!r}")
            if value != SESSION_DEFAULTS[name]:
                raise ValueError(f"{name}={value!r}: the vLLM engine runs greedy with vLLM's own kernels and "
                                 f"records top-{SESSION_DEFAULTS['record_topk']} drafts; leave {name} out")
        validate.positive_int(max_new_tokens, "max_new_tokens")  # 2.7 must not run as 2
        policy = as_policy(policy)
        if self.num_speculative_tokens and policy != DFlash():
            raise ValueError(f"policy={policy} is not vLLM's: vLLM {self.version} runs its 'dflash' method "
                             "(a chain of drafts; 'ddtree' needs vLLM's TREE_ATTN backend on a GPU): pass "
                             "policy=wb.DFlash()")
        if temperature != 0:
            raise ValueError(f"temperature={temperature}: the vLLM engine records greedy runs only (vLLM's "
                             "sampled acceptance is its own rejection rule); pass temperature=0")
        if sum(x is not None for x in (prompt, prompt_ids, messages)) != 1:
            raise ValueError("give one of prompt= (text), messages= (a chat) or prompt_ids= (token ids)")
        if prompt_ids is not None:  # ids the target's vocabulary holds (-1 would reach the tokenizer)
            ids = list(encode_prompt(self.tokenizer, prompt_ids=prompt_ids, vocab_size=self.vocab_size).ids)
        elif messages is not None:
            chat = encode_prompt(self.tokenizer, messages=messages, vocab_size=self.vocab_size)
            ids, prompt = list(chat.ids), chat.text
        else:
            ids = self.encode(validate.text(prompt))
        room = self.max_model_len - len(ids) - self.num_speculative_tokens
        if max_new_tokens > room:
            raise ValueError(f"max_new_tokens={max_new_tokens}: the prompt's {len(ids)} tokens, the new ones and the "
                             f"{self.num_speculative_tokens} drafts of a block must fit this engine's max_model_len="
                             f"{self.max_model_len}; give at most {max(room, 0)}, or wb.load(engine='vllm', "
                             "max_model_len=N) with a larger N")
        if self._live is not None and not self._live.finished:  # one request at a time: the older one ends here
            warnings.warn(f"{self._live!r} was still running: aborted for the new session", stacklevel=2)
            self._live.close()
        self._live = VllmSession(self, ids, prompt if prompt is not None else self.tokenizer.decode(ids),
                                 max_new_tokens)
        if dump is not None:
            from workbench.conform.vllm_dump import attach

            attach(self, self._live, dump, dump_replace)
        return self._live

    def generate(self, prompt=None, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, *, prompt_ids=None) -> list[int]:
        """Greedy new token ids, stepped to the end."""
        s = self.session(prompt, max_new_tokens=max_new_tokens, prompt_ids=prompt_ids)
        s.run()
        return s.tokens

    def spec_counters(self) -> dict:
        """vLLM's own speculative counters (``LLM.get_metrics()``), summed over requests so far."""
        from workbench.adapters.spec_metrics import spec_counters_from_metrics

        return spec_counters_from_metrics(self.llm.get_metrics())

    def close(self) -> None:
        if self.tap is not None:
            self.tap.remove()
        if self.patches:
            from workbench.adapters import vllm_workarounds

            vllm_workarounds.undo()
            self.patches = ()


class Fixed:
    """A session setting a vLLM request cannot change: reads as its value, refuses another in one line."""

    def __init__(self, value):
        self.value = value

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, objtype=None):
        return self.value

    def __set__(self, obj, value) -> None:
        if value != self.value:
            raise ValueError(f"{self.name}={value!r}: a vLLM request keeps its settings (greedy DFlash, the limit it "
                             "started with); start a new session instead")


class VllmSession(SessionState, BaseSession):
    """One request in vLLM, stepped one engine step (= one cycle) at a time. Implements the session
    interface (``workbench.interface.base.BaseSession``): ``step()`` -> Cycle, ``run()`` -> Trace, ``tokens``,
    ``text``, ``finished``, ``trace``, and the settings, fixed for a vLLM request (greedy, vLLM's kernels)."""

    temperature = Fixed(0.0)
    sampling = Fixed(Sampling(0.0, 1.0, 0))
    top_p = Fixed(SESSION_DEFAULTS["top_p"])
    top_k = Fixed(SESSION_DEFAULTS["top_k"])
    seed = Fixed(SESSION_DEFAULTS["seed"])
    kernel_backend = Fixed(SESSION_DEFAULTS["kernel_backend"])
    record_topk = Fixed(SESSION_DEFAULTS["record_topk"])
    capture = Fixed(SESSION_DEFAULTS["capture"])

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
            "prompt_format": "ids", "policy": str(DFlash() if engine.num_speculative_tokens else AR()),
            "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "max_new_tokens": max_new_tokens,
            "target": str(engine.target_dir), "draft": str(engine.draft_dir), "device": str(engine.device),
            "dtype": engine.dtype,
            "num_speculative_tokens": engine.num_speculative_tokens, "block_size": engine.block_size,
            "workarounds": list(engine.patches), "not_recorded": list(NOT_RECORDED),
        })
        self._pending = None  # the proposal the next step verifies
        self.dump = None  # a workbench.conform.vllm_dump.VllmDump writing each step, or None
        # per cycle, the (Proposal, row) it verified: kept with layers=True (the comparison report reads them)
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

    @property
    def policy(self):
        """vLLM's DFlash method (AR for an engine loaded with speculative=False)."""
        return DFlash() if self.engine.num_speculative_tokens else AR()

    @policy.setter
    def policy(self, p) -> None:
        if as_policy(p) != self.policy:
            raise ValueError(f"policy={p}: a vLLM request keeps its settings (greedy DFlash, the limit it started "
                             "with); start a new session instead")

    @property
    def max_new_tokens(self) -> int:
        return self.trace.meta["max_new_tokens"]

    @max_new_tokens.setter
    def max_new_tokens(self, n: int) -> None:
        if n != self.max_new_tokens:
            raise ValueError(f"max_new_tokens={n!r}: a vLLM request keeps its settings (greedy DFlash, the limit it "
                             "started with); start a new session instead")

    @property
    def text(self) -> str:
        return self.engine.tokenizer.decode(self.generated)

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
        pending = verify = None  # what a dump of this step reads
        if tap is None:  # no speculation: one target decode per step
            c = decode_cycle(len(self.cycles), start, root, self.generated[before:], seconds)
        else:
            proposals, verifies = tap.take()
            verify = self._mine(verifies)
            nxt = self._mine(proposals)
            draft_s = self._pending[0].seconds if self._pending else 0.0
            if tap.layers:
                self.proposals.append(self._pending)
            c = self._chain_cycle(start, root, self._pending, verify, committed,
                                  {"draft": draft_s, "verify": seconds - (nxt[0].seconds if nxt else 0.0)})
            pending, self._pending = self._pending, nxt
        self.trace.cycles.append(c)
        self.trace.new_tokens = len(self.generated)
        if self.finished:
            self.trace.finish_reason = self.finish_reason
        if self.dump is not None:
            self.dump.cycle(self, c, pending, verify, self.generated[before:])
        return c

    def _chain_cycle(self, start, root, pending, verify, committed, stage_seconds) -> Cycle:
        """The Cycle of a step that verified ``pending`` (the proposal made at the end of the step before)."""
        index = len(self.cycles)
        if pending is None or verify is None:
            raise VllmUnsupported(
                f"vLLM step {index + 1} verified no drafts of this request (a step without speculation: the "
                "prompt and its continuation may be longer than max_model_len, or the scheduler split the "
                "request); the workbench cannot record it as a cycle")
        (proposal, row), (v, vrow) = pending, verify
        d = int(v.num_drafts[vrow])
        logits = v.target_logits[vrow]  # [d + 1, V]
        forwards = chain_forwards(d + 1, logits.shape[-1], proposal.context_features, logits, self.engine.device)
        return chain_cycle(index, start, root, proposal.drafts[row],
                           None if proposal.draft_logits is None else proposal.draft_logits[row], logits,
                           v.sampled[vrow], committed, stage_seconds, forwards, policy=str(DFlash()))

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


def refusal_reason(e: Exception) -> str:
    """The reason in a vLLM refusal: a config validation error's messages (its first line only counts them),
    else the error's first line."""
    errors = getattr(e, "errors", None)
    if callable(errors):  # pydantic's ValidationError: "1 validation error for ModelConfig" then the reasons
        try:
            msgs = [" ".join(str(x.get("msg", "")).split()) for x in errors()]
        except Exception:  # noqa: BLE001 - not pydantic's after all
            msgs = []
        if any(msgs):
            return "; ".join(m for m in msgs if m)
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


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
