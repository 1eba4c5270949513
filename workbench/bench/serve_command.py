"""``python -m workbench bench-serve``: the served engine under load beside the same engine in process
(``workbench.bench.serve_load``): N clients at once, what the server adds per step and where it goes.

``--engine`` names the engine both sides run (the servers get it too); as for ``serve``, it is the workbench's
engine or one built on it, said before any server starts.
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import threading

from workbench.cli_args.engine_options import DEFAULT_ENGINE, add_model_args, load_engine, require_own_engine
from workbench.cli_args.values import UsageError, check_output, positive_int
from workbench.serve.command import SERVED_MAX_NEW_TOKENS, SERVED_MAX_SESSIONS


def spare_core_threads(cores: int) -> int:
    """The CPU threads both sides get by default: every core but one, at most 8 (the engine's own default). The
    clients run on this machine too, and the servers' event loops beside the engine; in a team of OpenMP threads
    that has every core, a neighbour's burst stalls the whole team (docs/figures.md: a process busy 1 ms in 5
    stretched the two-thread engine's batch-8 cycle by 18% on a 2-core machine, the one-thread engine's by 4%),
    so the ratio would measure the clients, not the server. On a host with more than 8 cores this is the engine's own default."""
    return max(1, min(cores - 1, 8))


class Stopped(KeyboardInterrupt):
    """bench-serve stopped by a signal: raised where it runs, so that its servers are stopped on the way out."""


@contextlib.contextmanager
def stopped_by_signals():
    """SIGTERM (a timeout wrapper, ``kill``) raises ``Stopped`` as Ctrl-C raises KeyboardInterrupt: by default it
    would end this process at once, before the servers it started are stopped. (A server also stops by itself
    once this process is gone, however it went: ``workbench.bench.served_child``.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(sig, _frame):
        raise Stopped(f"stopped by {signal.Signals(sig).name}")

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def add_parser(sub) -> None:
    p = sub.add_parser("bench-serve", help="the served engine under load beside the same engine in process: N "
                       "clients at once, what the server adds per step and where it goes")
    p.add_argument("--clients", default="1,4,8,16",
                   help=f"comma-separated client counts, each at most {SERVED_MAX_SESSIONS} (default 1,4,8,16)")
    p.add_argument("--modes", default="inproc,run,step,serial",
                   help="comma-separated, interleaved: inproc (one batch in this process), run (each client one "
                        "streamed request), step (one request per cycle), serial (run, one client after another), "
                        "whole (each client opens, runs and closes its session), unbatched (run on a --no-batching "
                        "server) (default inproc,run,step,serial,whole)")
    p.add_argument("--policy", default="ddtree:16", help="every client's policy (default ddtree:16)")
    p.add_argument("--max-new-tokens", type=positive_int, default=48, help="per session (default 48)")
    p.add_argument("--repeats", type=positive_int, default=1, help="rounds per (mode, clients), order alternating (default 1)")
    p.add_argument("--split", choices=["long", "short"], default="long", help="which held-out prompts (default long)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    add_model_args(p, engine_help="the engine both sides run: workbench (default) or one built on it, by its "
                                  "registry name (an installed package's engines too)",
                   threads_help="CPU threads of each side (default on CPU: every core but one, at most 8: the "
                                "clients and the servers' event loops share this machine; or OMP_NUM_THREADS)")


def run(args, out, err) -> int:
    import importlib.util

    for name in ("fastapi", "uvicorn"):  # its servers would fail to start, one by one: said before any starts
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)  # main() names the extra
    if args.max_new_tokens < 2:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens}: a session's first token comes from its prefill, "
                         "not a cycle, so there would be nothing to time; give 2 or more")
    if args.max_new_tokens > SERVED_MAX_NEW_TOKENS:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens}: bench-serve's servers allow "
                         f"{SERVED_MAX_NEW_TOKENS} new tokens per session (serve's default limit); give "
                         f"{SERVED_MAX_NEW_TOKENS} or fewer")
    from workbench.shipped import eval_prompts
    from workbench.bench.serve_load import measure_served_load, table
    from workbench.engine.policies import parse_policy
    from workbench.serve import wire

    try:
        clients = [int(x) for x in args.clients.split(",")]
    except ValueError:
        raise UsageError(f"--clients {args.clients!r} must be comma-separated whole numbers, e.g. 1,4,8,16") from None
    if any(n < 1 for n in clients) or len(set(clients)) != len(clients):
        raise UsageError(f"--clients {args.clients!r}: each count must be 1 or more, and each only once")
    if max(clients) > SERVED_MAX_SESSIONS:
        raise UsageError(f"--clients {args.clients!r}: at most {SERVED_MAX_SESSIONS} clients, a session each: a "
                         f"served engine holds {SERVED_MAX_SESSIONS} sessions (`serve --max-sessions`) and batches "
                         f"{SERVED_MAX_SESSIONS} rows a cycle by default; give counts from 1 to {SERVED_MAX_SESSIONS}")
    from workbench.bench.serve_load import MODES

    modes = [m.strip() for m in args.modes.split(",")]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes or len(set(modes)) != len(modes):
        raise UsageError(f"--modes {args.modes!r}: give each of {', '.join(MODES)} at most once, comma-separated"
                         + (f" ({unknown[0]!r} is none of them)" if unknown else ""))
    try:
        policy = wire.policy_to_wire(parse_policy(args.policy))
    except ValueError as e:
        raise UsageError(f"--policy {args.policy!r}: {e}") from None
    dest = check_output(args.json, "--json") if args.json else None
    require_own_engine(args.engine, "bench-serve")  # its servers batch the engine's own cycle, as serve does
    model_args = [a for k, v in (("--target", args.target), ("--draft", args.draft), ("--device", args.device),
                                 ("--dtype", args.dtype), ("--kernel-backend", args.kernel_backend),
                                 ("--engine", None if args.engine == DEFAULT_ENGINE else args.engine))
                  if v is not None for a in (k, str(v))]
    prompts = [p["prompt"] for p in eval_prompts(args.split)]
    if args.threads is None and (args.device or "cpu") == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        args.threads = spare_core_threads(os.cpu_count() or 1)

    def load_frozen():
        engine = load_engine(args)
        gc.freeze()  # what is loaded by now stays: see below
        return engine

    # The clients and the in-process engine share this process: what it has loaded (the models, the libraries:
    # ~0.4 M objects) is put out of the cyclic collector's way, as `serve` does, or a full collection (0.13 s)
    # stops every client thread and the in-process round at random, and both columns measure it.
    gc.freeze()
    try:
        with stopped_by_signals():
            res = measure_served_load(model_args, load_frozen, prompts, clients, policy, args.max_new_tokens,
                                      args.repeats, args.threads, modes,
                                      progress=lambda msg: print(f"bench-serve: {msg}", file=err, flush=True))
    finally:
        gc.unfreeze()  # (main() may run again in this process: tests)
    print(table(res), file=out)
    if dest is not None:
        from workbench.records.files import write_text_atomic

        write_text_atomic(dest, json.dumps(res, indent=2) + "\n")
    return 0
