"""The engine (loaded models) and its sessions (one generation each, stepped a cycle at a time)."""
from __future__ import annotations

import os

import torch

from ddtree_kernels import check_backend
from workbench.batch import BatchSession
from workbench.cycle import Trace
from workbench.loading import Models, load_models
from workbench.policies import DDTree, Policy, as_policy
from workbench.runner import SessionFinished, Stopwatch, clock  # noqa: F401  (re-exported: wb.SessionFinished)
from workbench.sampling import Sampling
from workbench.session import DEFAULT_MAX_NEW_TOKENS, Session, SessionState, to_host  # noqa: F401


def load(target=None, draft=None, device: str = "cpu", dtype=None, kernel_backend: str = "torch",
         threads: int | None = None) -> "Engine":
    """Load a target and a DFlash drafter (default: the embedded pair) into an Engine.

    ``wb.load(target=DIR, draft=DIR, device="cuda", dtype="bfloat16")`` for real checkpoints.
    """
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
                kernel_backend: str | None = None, record_topk: int = 8, capture=None) -> Session:
        """Start a generation from ``prompt`` (runs the prefill now)."""
        return Session(self, prompt, as_policy(policy), Sampling(temperature, top_p, top_k), seed,
                       max_new_tokens, kernel_backend or self.kernel_backend, record_topk, capture)

    def batch_session(self, prompts: list[str], policy=DDTree(32), **kw) -> BatchSession:
        """Several generations in one batch (``policy``: one, or one per prompt); see ``workbench.batch``."""
        return BatchSession(self, prompts, policy, **kw)

    def generate(self, prompt: str, policy: Policy = DDTree(32), max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                 **kw) -> Trace:
        """Run a whole session and return its trace."""
        s = self.session(prompt, policy, max_new_tokens=max_new_tokens, **kw)
        return s.run()
