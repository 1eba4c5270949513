"""The models options of every command that runs an engine (``run``, ``bench``, ``serve``, ``bench-serve``) and
the engine they load.

``--engine`` takes any name the engine registry knows (``workbench.interface.registry``: the built-in engines,
those ``register_engine`` added, and those installed packages declare by entry point), so an engine shipped in
another package reaches every command with no edit here. The cheap checks (the pair's directories given
together, the kernel backend, device and dtype) run before any weight loads; an option the chosen engine cannot
honour is refused by its own ``load`` in one line, also before loading.
"""
from __future__ import annotations

import argparse

from workbench.cli_args.values import UsageError, device
from workbench.engine import validate
from workbench.engine.validate import as_arg

DEFAULT_ENGINE = "workbench"


def add_model_args(p: argparse.ArgumentParser, engine_help: str | None = None, threads_help: str | None = None) -> None:
    """The ``models`` option group; ``engine_help`` says what ``--engine`` means to this command, ``threads_help``
    what its ``--threads`` default is."""
    from workbench.interface.registry import engine_names

    g = p.add_argument_group("models")
    g.add_argument("--engine", choices=engine_names(), default=DEFAULT_ENGINE,
                   help=engine_help or "the engine that runs the pair, by its registry name (default workbench; "
                                       "an installed package's engines are listed too)")
    g.add_argument("--target", metavar="DIR", help="target model directory (default: the embedded pair), or "
                   "'hybrid' alone for the embedded hybrid pair")
    g.add_argument("--draft", metavar="DIR", help="DFlash drafter directory (with --target)")
    g.add_argument("--device", type=device, default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    g.add_argument("--dtype", default="auto",
                   help="auto (default: the checkpoint's own dtype), float32, bfloat16, float16")
    g.add_argument("--device-map", default=None, metavar="MAP",
                   help="transformers' device_map for the target, e.g. auto (a target larger than one GPU)")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="run a checkpoint's own Python code (e.g. Kimi-K2); refused without this flag")
    g.add_argument("--kernel-backend", default="torch", help="accept-walk kernels: torch (default), sglang (SGLang's CUDA JIT kernel "
                   "on CUDA, its Triton kernel on CPU) or sglang-triton")
    g.add_argument("--threads", type=as_arg(validate.threads), default=None,
                   help=threads_help or "CPU threads (default: up to 8)")


def engine_policy(engine: str, text: str | None):
    """The policy a command runs on ``engine`` (``--policy``; None: the engine's own default), refused in one
    line before any weight loads when the engine's sessions do not take its kind."""
    from workbench.engine.policies import parse_policy
    from workbench.engine.policies.calibration import check_named
    from workbench.interface.registry import engine_class

    cls = engine_class(engine)
    try:
        policy = parse_policy(text if text is not None else cls.default_policy)
    except ValueError as e:
        raise UsageError(f"--policy {text!r}: {e}") from None
    if cls.policy_kinds is not None and policy.kind not in cls.policy_kinds:
        raise UsageError(f"--policy {text}: the {engine} engine runs {', '.join(cls.policy_kinds)} only; give "
                         f"--policy {cls.policy_kinds[0]}, or leave --policy out")
    check_named([policy])  # a calibration file it names, read before any weight loads
    return policy


def load_engine(args):
    """The engine ``args.engine`` over the pair the options name, after the checks that need no weights."""
    from workbench.engine.loading import PAIRS, pair_name

    if bool(args.target) != bool(args.draft) and pair_name(args.target, args.draft) is None:
        raise UsageError("--target and --draft go together: give both model directories, or neither "
                         f"(or --target {' / '.join(PAIRS)} alone for an embedded pair)")
    from ddtree_kernels import check_backend
    from workbench.engine.core import load
    from workbench.engine.loading import resolve_device, resolve_dtype

    # Check the cheap things before loading any weights.
    check_backend(args.kernel_backend)
    resolve_device(args.device)
    resolve_dtype(args.dtype)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr is for our own progress and errors
    return load(target=args.target, draft=args.draft, device=args.device, dtype=args.dtype,
                kernel_backend=args.kernel_backend, threads=args.threads, device_map=args.device_map,
                trust_remote_code=args.trust_remote_code, engine=args.engine)


def require_own_engine(name: str, what: str) -> None:
    """Refuse, before anything loads, an engine ``what`` cannot run: ``what`` drives the model states of the
    workbench's own engine (``engine.models``: rows of a batched cycle, the plain decoder, the profiler), so it
    takes that engine or one built on it (``workbench.engine.core.Engine`` subclasses), not another."""
    from workbench.engine.core import Engine
    from workbench.interface.registry import engine_class

    if not issubclass(engine_class(name), Engine):
        raise UsageError(f"--engine {name}: {what} drives the workbench engine's own model states, which the "
                         f"{name} engine does not have: use --engine {DEFAULT_ENGINE}, or an engine built on "
                         "workbench.engine.core.Engine")
