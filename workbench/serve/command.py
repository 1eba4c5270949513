"""``python -m workbench serve``: one loaded engine over HTTP; notebooks attach with ``wb.connect(url, token)``.
The options live here; checking them, loading the engine once and serving are ``workbench.serve.main``'s.

``--engine`` takes the workbench's engine or one built on it (an installed package's included): the server
batches its clients' steps as rows of the engine's own cycle (``workbench.engine.scheduler``), so an engine
without those model states (vLLM in process: it has its own server, ``vllm serve``) is refused before any
model loads.
"""
from __future__ import annotations

from workbench.engine import validate
from workbench.cli_args.engine_options import add_model_args, load_engine, require_own_engine
from workbench.cli_args.values import UsageError, finite_float, positive_int
from workbench.engine.validate import as_arg

SERVED_MAX_NEW_TOKENS = 1024  # `serve --max-new-tokens`'s default: the limit of bench-serve's servers too
SERVED_MAX_SESSIONS = 16  # `serve --max-sessions`'s default (and --max-batch-rows'): bench-serve's most clients


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve one loaded engine over HTTP; notebooks attach with wb.connect(url, token)")
    add_model_args(p, engine_help="the engine to serve: workbench (default) or one built on it, by its registry "
                                  "name (an installed package's engines too)")
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=as_arg(validate.port), default=8765, help="port (default 8765; 0 picks a free one)")
    g.add_argument("--token-file", metavar="FILE",
                   help="read the token from FILE; if FILE does not exist, write a new token there (mode 600)")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="server log verbosity (default info)")
    g = p.add_argument_group("limits")
    g.add_argument("--session-ttl", type=finite_float, default=600.0, metavar="S",
                   help="drop a session idle for S seconds (default 600)")
    g.add_argument("--max-sessions", type=positive_int, default=SERVED_MAX_SESSIONS,
                   help=f"live sessions at once (default {SERVED_MAX_SESSIONS})")
    g.add_argument("--max-new-tokens", type=positive_int, default=SERVED_MAX_NEW_TOKENS,
                   help=f"per session (default {SERVED_MAX_NEW_TOKENS})")
    g.add_argument("--max-budget", type=positive_int, default=1024, help="largest DDTree budget (default 1024)")
    g.add_argument("--max-body-bytes", type=positive_int, default=2**20, metavar="N",
                   help="largest request body; a larger one is answered 413 unread (default 1 MiB)")
    g.add_argument("--max-reply-bytes", type=positive_int, default=4 * 2**20, metavar="N",
                   help="cycles per reply up to about N bytes; clients fetch the rest in pages (default 4 MiB)")
    g.add_argument("--max-connections", type=positive_int, default=256, metavar="N",
                   help="open connections; a new one closes the longest-waiting idle one (default 256)")
    g.add_argument("--header-timeout", type=finite_float, default=5.0, metavar="S",
                   help="close a connection whose request head is not in after S seconds (default 5)")
    g.add_argument("--body-timeout", type=finite_float, default=10.0, metavar="S",
                   help="close a connection whose request body is not in S seconds after its head (default 10)")
    g.add_argument("--send-timeout", type=finite_float, default=30.0, metavar="S",
                   help="close a connection that leaves a reply's bytes untaken for S seconds (default 30)")
    g.add_argument("--max-stream-cycles", type=positive_int, default=1024, metavar="N",
                   help="cycles one /run stream carries; the client then asks again (default 1024)")
    g.add_argument("--max-stream-bytes", type=positive_int, default=64 * 2**20, metavar="N",
                   help="about N bytes per /run stream; the client then asks again (default 64 MiB)")
    g.add_argument("--max-stream-seconds", type=finite_float, default=600.0, metavar="S",
                   help="how long one /run stream may run; the client then asks again (default 600)")
    g = p.add_argument_group("batching (the sessions' steps run as rows of shared cycles: workbench.engine.scheduler)")
    g.add_argument("--no-batching", dest="batching", action="store_false",
                   help="drive every session apart, one cycle at a time under one lock (the pre-batching server)")
    g.add_argument("--max-batch-rows", type=positive_int, default=16, metavar="N",
                   help="sessions per batched cycle (default 16)")
    g.add_argument("--max-batch-nodes", type=positive_int, default=4096, metavar="N",
                   help="rows x padded tree nodes per batched verify (default 4096)")


def run(args, out, err) -> int:
    from workbench.serve.main import serve_main

    require_own_engine(args.engine, "serve")
    return serve_main(args, out, err, load_engine, UsageError)
