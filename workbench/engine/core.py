"""The engine (loaded models) and its sessions (one generation each, stepped a cycle at a time)."""
from __future__ import annotations

import os

import torch

from ddtree_kernels import check_backend
from workbench.engine import observers, validate
from workbench.engine.batch import BatchSession
from workbench.engine.hooks import as_pairs
from workbench.records.cycle import Trace
from workbench.engine.loading import PACKAGE_PREFIX, Models, load_models, model_ref
from workbench.engine.policies import DDTree, Policy, as_policy
from workbench.engine.prompting import Prompt, encode_prompt
from workbench.engine.runner import SessionFinished, Stopwatch, clock  # noqa: F401  (re-exported: wb.SessionFinished)
from workbench.engine.sampling import Sampling
from workbench.engine.session import DEFAULT_MAX_NEW_TOKENS, Session, SessionState, to_host  # noqa: F401
from workbench.interface import registry
from workbench.interface.base import BaseEngine, BaseSession

EMBEDDED = PACKAGE_PREFIX + "assets/"  # how model_ref names the embedded pairs ('workbench/assets/hybrid/target')


def load(target=None, draft=None, device: str = "cpu", dtype="auto", kernel_backend: str = "torch",
         threads: int | None = None, device_map=None, trust_remote_code: bool = False,
         cuda_graphs: bool = False, engine: str = "workbench", **engine_options) -> BaseEngine:
    """Load a target and a DFlash drafter (default: the embedded pair) into the engine named ``engine``
    (``workbench.interface.registry``: "workbench", the default, or "vllm"); an unknown name is refused in
    one line listing the known ones.

    ``engine="vllm"``: the same pair in vLLM's own engine, in this process, with vLLM's DFlash method
    (``workbench.adapters.vllm_engine.VllmEngine``: sessions step one vLLM engine step = one cycle and
    record Cycles; ``engine_options`` go to it, e.g. ``workarounds=True``). vLLM is optional.

    ``wb.load(target=DIR, draft=DIR, device="cuda")`` for real checkpoints: ``dtype="auto"`` keeps the
    checkpoint's own dtype; ``device_map`` (e.g. "auto") spreads a large target over devices;
    ``trust_remote_code=True`` runs a checkpoint's own code (Kimi-K2). See ``workbench.engine.loading``.
    ``cuda_graphs=True`` (CUDA only): every session runs with static shapes, and its draft and verify
    forwards are captured once per (batch, nodes, length bucket) and replayed (``workbench.engine.graphs``).
    """
    return registry.load(engine, target, draft, device=device, dtype=dtype, kernel_backend=kernel_backend,
                         threads=threads, device_map=device_map, trust_remote_code=trust_remote_code,
                         cuda_graphs=cuda_graphs, **engine_options)


class Engine(BaseEngine):
    """Loaded models; holds no generation state, so its sessions are independent (with CUDA graphs they
    share the captured graphs, each replayed over the calling session's own buffers' addresses)."""

    name = "workbench"

    def __init__(self, models: Models, kernel_backend: str = "torch", cuda_graphs: bool = False):
        check_backend(kernel_backend, models.device)  # on CUDA, 'sglang' builds its JIT kernel now
        self.models = models
        self.kernel_backend = kernel_backend
        self.graphs = None
        if cuda_graphs:
            from workbench.engine.graphs import Graphs

            self.graphs = Graphs(models.device)

    @classmethod
    def load(cls, target=None, draft=None, device: str = "cpu", dtype="auto", kernel_backend: str = "torch",
             threads: int | None = None, device_map=None, trust_remote_code: bool = False,
             cuda_graphs: bool = False, **engine_options) -> "Engine":
        """``wb.load(...)`` for the workbench's own engine: every argument checked before any weight loads."""
        if engine_options:
            raise TypeError(f"load() got unexpected arguments {sorted(engine_options)} (options of another "
                            f"engine? engine= one of {', '.join(registry.engine_names())})")
        validate.device(device), validate.dtype(dtype), validate.threads(threads)  # one line each, before loading
        check_backend(kernel_backend)
        if cuda_graphs and torch.device(device).type != "cuda":
            raise ValueError(f"cuda_graphs=True needs a CUDA device, got device={device!r}; "
                             "load with device='cuda' or without cuda_graphs")
        if torch.device(device).type == "cpu":
            # An explicit OMP_NUM_THREADS wins over the default (busy or shared machines).
            env = os.environ.get("OMP_NUM_THREADS", "")
            torch.set_num_threads(threads or (int(env) if env.isdigit() and int(env) > 0 else min(os.cpu_count() or 1, 8)))
        return cls(load_models(target, draft, device, dtype, device_map, trust_remote_code), kernel_backend,
                   cuda_graphs)

    @property
    def tokenizer(self):
        return self.models.tokenizer

    @property
    def device(self) -> torch.device:
        return self.models.device

    def __repr__(self) -> str:
        t = self.models.target.config
        # An embedded pair by its place in the assets ('hybrid/target'), so wb.load("hybrid") says which it is.
        ref = model_ref(self.models.target_dir)
        name = ref[len(EMBEDDED):] if ref.startswith(EMBEDDED) else self.models.target_dir.name
        return (f"Engine(target={name}: {t.num_hidden_layers} layers, vocab {t.vocab_size}; "
                f"draft block {self.models.block_size}, reads target layers {self.models.target_layer_ids}; "
                f"device={self.device}, dtype={str(self.models.dtype).replace('torch.', '')}, "
                f"kernel_backend={self.kernel_backend!r})"
                + "".join(f"\n  note: {n}" for n in self.models.notes))

    def encode(self, prompt: str | None = None, *, messages=None, prompt_ids=None) -> Prompt:
        """The target tokenizer's encoding of one prompt (see ``workbench.engine.prompting``)."""
        m = self.models
        return encode_prompt(m.tokenizer, prompt, messages=messages, prompt_ids=prompt_ids,
                             max_positions=m.max_positions, vocab_size=m.target.get_input_embeddings().num_embeddings)

    def session(self, prompt: str | None = None, policy: Policy = DDTree(32), temperature: float = 0.0,
                top_p: float = 1.0, top_k: int = 0, seed: int = 0, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                kernel_backend: str | None = None, record_topk: int = 8, capture=None, *, messages=None,
                prompt_ids=None, static_shapes: bool | None = None, driver=None, dump=None,
                dump_replace: bool = False, hooks=None) -> Session:
        """Start a generation (runs the prefill now) from one of: ``prompt`` (raw text), ``messages``
        (chat, through the target's chat template) or ``prompt_ids`` (exact ids). ``static_shapes``: every
        draft and verify forward with the same shapes and storage (``workbench.engine.runner.Rows``; default: when
        the engine captures CUDA graphs). ``driver``: what steps the session and prefills it (default: a
        driver of its own; ``workbench.engine.scheduler.Scheduler.session`` passes itself). ``dump``: a path;
        every cycle is also written there as a cycle dump (docs/dump-format.md; off by default); an existing
        file is refused unless ``dump_replace=True``. ``hooks``: ``[(point, fn), ...]`` on the session from its
        prefill on (``prefill.hook_begin`` / ``prefill.hook_end`` fire only for hooks given here), checked as
        ``s.hooks(...)`` checks them, before the prefill."""
        hooks = as_pairs(hooks)
        if driver is not None and (static_shapes or self.graphs is not None):
            raise ValueError("static_shapes=True: a session with static shapes has rows of its own; it cannot "
                             "be driven with others (drop static_shapes, or drive it alone)")
        if static_shapes is False and self.graphs is not None:
            raise ValueError("static_shapes=False on an engine loaded with cuda_graphs=True: graphs replay "
                             "static shapes only; drop static_shapes or load without cuda_graphs")
        if isinstance(prompt, Prompt) and messages is None and prompt_ids is None:
            encoded = prompt  # encoded already (the server encodes outside its model lock)
        else:
            encoded = self.encode(prompt, messages=messages, prompt_ids=prompt_ids)
        if dump is None and dump_replace is not False:
            raise ValueError(f"dump_replace={dump_replace!r} without dump=: give dump=PATH, or leave dump_replace out")
        if dump is not None:
            if driver is not None:
                raise ValueError("dump= writes a session stepped by its own driver; a scheduler's sessions are not dumped")
            observers.observer("dump").check(dump, replace=dump_replace)  # the path, before the prefill
        s = Session(self, encoded, as_policy(policy),
                    Sampling(temperature, top_p, top_k), seed, max_new_tokens,
                    kernel_backend or self.kernel_backend, record_topk, capture, driver=driver,
                    static_shapes=bool(static_shapes) or self.graphs is not None, hooks=hooks)
        if dump is not None:  # the writer hangs on the request's hook points (workbench.conform.engine_dump)
            observers.attach("dump", self, [s], s._rows, dump, replace=dump_replace)
        return s

    def batch_session(self, prompts: list[str] | None = None, policy=DDTree(32), *, messages=None,
                      prompt_ids=None, **kw) -> BatchSession:
        """Several generations in one batch (``policy``: one, or one per prompt); see ``workbench.engine.batch``.
        ``messages``: one chat per request; ``prompt_ids``: one id list per request (instead of ``prompts``)."""
        given = {k: v for k, v in {"messages": messages, "prompt_ids": prompt_ids}.items() if v is not None}
        if given:
            if prompts is not None or len(given) > 1:
                raise ValueError("give exactly one of prompts=, messages= or prompt_ids= (one entry per request)")
            (name, items), = given.items()
            if not isinstance(items, (list, tuple)) or not items:
                raise ValueError(f"{name}= must be a non-empty list with one entry per request")
            prompts = [self.encode(**{name: x}) for x in items]
        dump = kw.pop("dump", None)  # a path: every cycle of every request also written there (docs/dump-format.md)
        dump_replace = kw.pop("dump_replace", False)  # an existing dump is refused unless this is True
        if dump is None and dump_replace is not False:
            raise ValueError(f"dump_replace={dump_replace!r} without dump=: give dump=PATH, or leave dump_replace out")
        if dump is not None:
            observers.observer("dump").check(dump, replace=dump_replace)
        b = BatchSession(self, prompts, policy, **kw)
        if dump is not None:
            observers.attach("dump", self, b.sessions, b._rows, dump, replace=dump_replace)
        return b

    def replay(self, trace: Trace, **kw) -> Session:
        """A new session that re-runs ``trace``: its prompt ids, its settings and every change it records
        (seed included) before the cycle it applied from (``workbench.engine.session.replay``)."""
        from workbench.engine.session import replay

        return replay(self, trace, **kw)

    def generate(self, prompt: str | None = None, policy: Policy = DDTree(32),
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, **kw) -> Trace:
        """Run a whole session and return its trace."""
        s = self.session(prompt, policy, max_new_tokens=max_new_tokens, **kw)
        return s.run()


BaseSession.register(Session)  # a Session offers every part of the declared session interface
