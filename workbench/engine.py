"""The engine (loaded models) and its sessions (one generation each, stepped a cycle at a time)."""
from __future__ import annotations

import os
import time

import torch

from ddtree_kernels import check_backend
from workbench import stages, validate
from workbench.cycle import Cycle, Trace, setting_label
from workbench.forward import ForwardMode, run_target
from workbench.kv_cache import BufferedCache
from workbench.loading import Models, load_models, model_ref
from workbench.policies import AR, DDTree, Policy, as_policy
from workbench.sampling import Sampling, target_choice
from workbench.stages.verify import MaskBuffer

DEFAULT_MAX_NEW_TOKENS = 128  # the one default of engine.session, engine.generate and the CLI


def clock(device: torch.device) -> float:
    """Seconds, after the device's queued work is done (a CUDA kernel launch returns before it runs)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


class Stopwatch:
    """Times the consecutive stages of one cycle: ``start("draft")`` ... ``start("verify")`` ... ``stop()``.

    Each start closes the previous stage. While a torch profiler records, every stage is also a
    named range in its trace (``bench --profile``), so a slow cycle can be read stage by stage.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.times: dict[str, float] = {}
        self._name: str | None = None
        self._t = 0.0
        self._range = None
        self._profiling = torch.autograd._profiler_enabled()

    def start(self, name: str) -> None:
        now = self.stop()
        self._name, self._t = name, now
        if self._profiling:
            self._range = torch.profiler.record_function(name)
            self._range.__enter__()

    def stop(self) -> float:
        now = clock(self.device)
        if self._name is not None:
            self.times[self._name] = self.times.get(self._name, 0.0) + now - self._t
            if self._range is not None:
                self._range.__exit__(None, None, None)
                self._range = None
            self._name = None
        return now


def to_host(**tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    """CPU copies of a cycle's record tensors. From a GPU: every copy queued without waiting, then one
    wait for them all (one host synchronisation per record instead of one per tensor)."""
    cuda = any(t.device.type == "cuda" for t in tensors.values())
    out = {k: t.to("cpu", non_blocking=cuda) for k, t in tensors.items()}
    if cuda:
        torch.cuda.current_stream().synchronize()
    return out


class SessionFinished(RuntimeError):
    """``step()`` was called on a session that has already ended."""


def load(target=None, draft=None, device: str = "cpu", dtype=None, kernel_backend: str = "torch",
         threads: int | None = None) -> "Engine":
    """Load a target and a DFlash drafter (default: the embedded pair) into an Engine.

    ``wb.load(target=DIR, draft=DIR, device="cuda", dtype="bfloat16")`` for real checkpoints.
    """
    validate.device(device), validate.dtype(dtype), validate.threads(threads)  # one line each, before loading
    check_backend(kernel_backend)
    if torch.device(device).type == "cpu":
        # An explicit OMP_NUM_THREADS wins over the default (busy or shared machines).
        env = os.environ.get("OMP_NUM_THREADS", "")
        torch.set_num_threads(threads or (int(env) if env.isdigit() and int(env) > 0 else min(os.cpu_count() or 1, 8)))
    return Engine(load_models(target, draft, device, dtype), kernel_backend)


class Engine:
    """Loaded models; holds no generation state, so its sessions are independent."""

    def __init__(self, models: Models, kernel_backend: str = "torch"):
        check_backend(kernel_backend, models.device)  # on CUDA, 'sglang' builds its JIT kernel now
        self.models = models
        self.kernel_backend = kernel_backend

    @property
    def tokenizer(self):
        return self.models.tokenizer

    @property
    def device(self) -> torch.device:
        return self.models.device

    def __repr__(self) -> str:
        t = self.models.target.config
        return (f"Engine(target={self.models.target_dir.name}: {t.num_hidden_layers} layers, vocab {t.vocab_size}; "
                f"draft block {self.models.block_size}, layers {self.models.target_layer_ids}; "
                f"device={self.device}, dtype={str(self.models.dtype).replace('torch.', '')}, "
                f"kernel_backend={self.kernel_backend!r})")

    def session(self, prompt: str, policy: Policy = DDTree(32), temperature: float = 0.0, top_p: float = 1.0,
                top_k: int = 0, seed: int = 0, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                kernel_backend: str | None = None, record_topk: int = 8, capture=None) -> "Session":
        """Start a generation from ``prompt`` (runs the prefill now)."""
        return Session(self, prompt, as_policy(policy), Sampling(temperature, top_p, top_k), seed,
                       max_new_tokens, kernel_backend or self.kernel_backend, record_topk, capture)

    def batch_session(self, prompts: list[str], policy=DDTree(32), **kw) -> "BatchSession":  # noqa: F821
        """Several generations in one batch (``policy``: one, or one per prompt); see ``workbench.batch``."""
        from workbench.batch import BatchSession

        return BatchSession(self, prompts, policy, **kw)

    def generate(self, prompt: str, policy: Policy = DDTree(32), max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                 **kw) -> Trace:
        """Run a whole session and return its trace."""
        s = self.session(prompt, policy, max_new_tokens=max_new_tokens, **kw)
        return s.run()


class SessionState:
    """What a session's state means, shared by a local ``Session`` and a ``RemoteSession``: both hold
    ``prompt_ids``, ``generated``, ``finish_reason`` and ``trace``."""

    @property
    def start(self) -> int:
        """Position of the pending bonus token (= tokens in the target cache)."""
        return len(self.prompt_ids) + len(self.generated) - 1

    @property
    def bonus(self) -> int:
        return self.generated[-1]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def cycles(self) -> list[Cycle]:
        return self.trace.cycles

    @property
    def tokens(self) -> list[int]:
        """Generated token ids (the pending bonus included)."""
        return list(self.generated)


class Session(SessionState):
    """One generation, stepped a cycle at a time. ``step()`` -> Cycle; ``run()`` -> Trace."""

    def __init__(self, engine: Engine, prompt: str, policy: Policy, sampling: Sampling, seed: int,
                 max_new_tokens: int, kernel_backend: str, record_topk: int, capture):
        t_start = clock(engine.models.device)
        m = engine.models
        validate.text(prompt), validate.record_topk(record_topk), validate.capture(capture)
        validate.policy_fits(policy, m.block_size - 1)
        check_backend(kernel_backend, m.device)
        self._check_max_new(max_new_tokens)
        self.engine, self.models = engine, m
        self._policy, self.sampling = policy, sampling
        self.kernel_backend, self.record_topk, self.capture = kernel_backend, record_topk, capture
        self._max_new_tokens = max_new_tokens
        self.prompt = prompt
        ids = m.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"prompt={prompt!r} encodes to no tokens")
        if len(ids) >= m.max_positions:
            raise ValueError(
                f"prompt is {len(ids)} tokens but the target has {m.max_positions} positions; shorten the prompt"
            )
        self.prompt_ids: list[int] = ids
        self.generator = torch.Generator(device=m.device)
        self.seed = seed  # validated and applied to the generator by the setter
        self.generated: list[int] = []
        self.finish_reason: str | None = None
        self.trace = Trace(meta={
            "prompt": prompt, "prompt_ids": ids, "policy": str(policy), "temperature": sampling.temperature,
            "top_p": sampling.top_p, "top_k": sampling.top_k, "seed": seed, "kernel_backend": kernel_backend,
            "target": model_ref(m.target_dir), "draft": model_ref(m.draft_dir), "device": str(m.device),
            "dtype": str(m.dtype).replace("torch.", ""), "block_size": m.block_size,
        })
        self.trace.setup_seconds = self._clock() - t_start
        self._prefill()

    # ---------------------------------------------------------------- settings for the next cycle
    @property
    def policy(self) -> Policy:
        return self._policy

    @policy.setter
    def policy(self, p) -> None:
        self._policy = validate.policy_fits(as_policy(p), self.models.block_size - 1)

    @property
    def seed(self) -> int:
        return self._seed

    @seed.setter
    def seed(self, s: int) -> None:
        """Re-seed the sampler: the next cycle's draws come from ``s`` (greedy decoding ignores it)."""
        self._seed = validate.seed(s)
        self.generator.manual_seed(s)

    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    @temperature.setter
    def temperature(self, t: float) -> None:
        self.sampling = Sampling(t, self.sampling.top_p, self.sampling.top_k)

    @property
    def top_p(self) -> float:
        return self.sampling.top_p

    @top_p.setter
    def top_p(self, p: float) -> None:
        self.sampling = Sampling(self.sampling.temperature, p, self.sampling.top_k)

    @property
    def top_k(self) -> int:
        return self.sampling.top_k

    @top_k.setter
    def top_k(self, k: int) -> None:
        self.sampling = Sampling(self.sampling.temperature, self.sampling.top_p, k)

    @property
    def max_new_tokens(self) -> int:
        """The limit on new tokens in all (the prefill's first token included)."""
        return self._max_new_tokens

    @max_new_tokens.setter
    def max_new_tokens(self, n: int) -> None:
        """Raise or lower the limit. Below the tokens already generated is refused; a session that
        ended at the old limit goes on under a larger one; reaching the new one ends it now."""
        self._check_max_new(n)
        have = len(self.generated)
        if n < have:
            raise ValueError(f"max_new_tokens={n} is below the {have} new tokens this session already has; "
                             f"the limit counts all new tokens, so give at least {have}")
        self._max_new_tokens = n
        if self.finish_reason and self.finish_reason.startswith("reached max_new_tokens"):
            self.finish_reason = None
        if self.finish_reason is None and have >= n:
            self.finish_reason = f"reached max_new_tokens={n}"
        self.trace.finish_reason = self.finish_reason

    @staticmethod
    def _check_max_new(n) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"max_new_tokens={n!r} must be a positive integer")


    @property
    def text(self) -> str:
        """The generated text so far (without the prompt)."""
        return self.models.tokenizer.decode(self.generated)

    @property
    def full_text(self) -> str:
        return self.prompt + self.text

    def kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The target cache as (keys, values) per layer, [1, kv_heads, start, head_dim] each.

        Views of the cache's buffers, valid until the next step (which writes into them); ``.clone()``
        what you keep."""
        return [(layer.keys, layer.values) for layer in self._target_cache.layers]

    def __repr__(self) -> str:
        state = f"finished: {self.finish_reason}" if self.finished else "running"
        sp = self.sampling
        setting = setting_label(str(self.policy), sp.temperature, sp.top_p, sp.top_k)
        return (f"Session({setting}, {len(self.cycles)} cycles, "
                f"{len(self.generated)} new tokens, {state})")

    # ---------------------------------------------------------------- running
    def _clock(self) -> float:
        return clock(self.models.device)

    @torch.inference_mode()
    def _prefill(self) -> None:
        m = self.models
        t0 = self._clock()
        self._target_cache = BufferedCache(m.target.config)
        self._draft_cache = BufferedCache(m.draft.config)
        self._masks = MaskBuffer(m.dtype, m.device)
        ids = torch.tensor([self.prompt_ids], device=m.device)
        pos = torch.arange(len(self.prompt_ids), device=m.device)[None]
        out = run_target(m.target, ids, pos, self._target_cache, ForwardMode.EXTEND, m.target_layer_ids,
                         capture=self.capture)
        choice, _ = target_choice(out.logits[:, -1:], self.sampling, self.generator)
        top2 = out.logits[0, -1].topk(2)  # the first token's runner-up, for wb.first_divergence
        self.trace.meta["prefill_top2"] = {"tokens": top2.indices.tolist(), "logits": top2.values.float().tolist()}
        self._context = out.features  # [1, P, F]: drafter context not yet in its cache
        self.trace.prefill = out.record
        self.trace.prefill_seconds = self._clock() - t0
        self._append([int(choice[0, 0])])

    def _append(self, toks: list[int]) -> int:
        """Extend the output, stopping at end-of-text or the token limit. -> tokens kept."""
        kept = 0
        for t in toks:
            if len(self.generated) >= self.max_new_tokens:
                self.finish_reason = f"reached max_new_tokens={self.max_new_tokens}"
                break
            self.generated.append(t)
            kept += 1
            if t in self.models.eos_token_ids:
                self.finish_reason = "end of text"
                break
        if self.finish_reason is None:
            if len(self.generated) >= self.max_new_tokens:
                self.finish_reason = f"reached max_new_tokens={self.max_new_tokens}"
            elif self.start >= self.models.max_positions - 1:
                self.finish_reason = f"reached the target's {self.models.max_positions} positions"
        self.trace.finish_reason = self.finish_reason
        self.trace.new_tokens = len(self.generated)
        return kept

    @torch.inference_mode()
    def step(self) -> Cycle:
        """Run one draft/verify cycle and return its record."""
        if self.finished:
            raise SessionFinished(
                f"session finished ({self.finish_reason}) after {len(self.generated)} new tokens in "
                f"{len(self.cycles)} cycles; start a new session, or run(max_new_tokens=N) with a larger N"
            )
        sw = Stopwatch(self.models.device)
        sw.start("other")  # checks and bookkeeping between the named stages
        m, policy, start, root = self.models, self.policy, self.start, self.bonus
        # Never draft past the token limit or the model's positions.
        depth = min(m.block_size - 1, self.max_new_tokens - len(self.generated) - 1, m.max_positions - 1 - start)
        uses_draft = not isinstance(policy, AR) and depth > 0
        max_depth = depth if uses_draft else 0  # a root-only tree needs no ancestry work

        sw.start("draft")
        drafted = None
        if uses_draft:
            drafted = stages.draft(m, self._draft_cache, root, start, self._context, depth, self.capture)
            self._context = self._context[:, :0]
        sw.start("tree_build")
        tree = stages.tree_build(policy, drafted, root, m.device)
        sw.start("tree_compile")
        compiled = stages.tree_compile(tree, start, max_depth)
        sw.start("verify")
        mode = ForwardMode.DECODE if isinstance(policy, AR) else ForwardMode.TARGET_VERIFY
        verified = stages.verify(m, self._target_cache, tree, compiled, start, mode, self.sampling,
                                 self.generator, True, self._masks, self.capture)
        sw.start("accept")
        accepted = stages.accept(self.kernel_backend, tree, compiled, verified, max_depth)
        sw.start("commit")
        committed = stages.commit(self._target_cache, tree, accepted, verified.features, start)
        self._context = torch.cat([self._context, committed.context], dim=1)
        kept = self._append(committed.tokens)
        sw.start("record")
        times = sw.times  # the Cycle holds this dict: "record" and the rest of "other" land in it below
        cycle = self._record(policy, start, root, drafted, tree, compiled, verified, committed, kept, times)
        self.trace.append(cycle)
        sw.stop()
        return cycle

    def _record(self, policy, start, root, drafted, tree, compiled, verified, committed, kept, times) -> Cycle:
        k = self.record_topk
        top = drafted.top(k) if drafted is not None and k > 0 else None  # shared with the tree build when it ran
        host = to_host(
            tokens=tree.tokens[0], parents=tree.parents[0], depth=tree.depth[0], rank=tree.rank[0],
            score=tree.score[0].float(), position_ids=compiled.positions[0], visibility=compiled.visibility[0],
            retrieve_next_token=compiled.retrieve_next_token[0],
            retrieve_next_sibling=compiled.retrieve_next_sibling[0], target_choice=verified.choice[0],
            target_prob=verified.choice_prob[0].float(), accepted_nodes=committed.nodes,
            target_top2_tokens=verified.top2_tokens[0], target_top2_logits=verified.top2_logits[0].float(),
            draft_topk_logprobs=top[0][0] if top else torch.zeros(0, k),
            draft_topk_tokens=top[1][0] if top else torch.zeros(0, k, dtype=torch.long),
        )
        return Cycle(
            index=len(self.trace.cycles), policy=str(policy), start=start, root_token=root,
            accepted_tokens=host["tokens"][host["accepted_nodes"]], bonus=committed.bonus, committed=kept,
            stage_seconds=times,
            forwards=tuple(r for r in ((drafted.record if drafted else None), verified.record) if r is not None),
            temperature=self.sampling.temperature, top_p=self.sampling.top_p, top_k=self.sampling.top_k,
            **host,
        )

    def run(self, max_new_tokens: int | None = None) -> Trace:
        """Step until end-of-text or ``max_new_tokens`` generated in all (the session's limit by default;
        a value sets the limit, as ``s.max_new_tokens = n`` does)."""
        if max_new_tokens is not None:
            self.max_new_tokens = max_new_tokens
        while not self.finished:
            self.step()
        return self.trace
