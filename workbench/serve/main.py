"""``python -m workbench serve``: check the arguments, load the models once, print how to attach, serve."""
from __future__ import annotations

import gc
import logging
import os
import tempfile
import warnings
from pathlib import Path

from workbench.serve import token_file


def read_or_make_token(path: str | None) -> tuple[str, str]:
    """(token, where it came from). A missing token file is created with a new token, readable by its owner
    only. An existing one is used only if it is a regular file of this user that no one else can read or
    write (as ssh and Jupyter insist): on a shared host, a planted or readable file gives the token away."""
    from workbench.serve.server import check_token, new_token

    if path is None:
        return new_token(), "generated"
    p = Path(path).expanduser()
    fd = token_file.open_checked(p, f"--token-file {p}", remake=True)
    if fd is not None:  # checked and read through one descriptor: nothing can swap the file in between
        with os.fdopen(fd) as fh:
            token = fh.read().strip()
        return check_token(token, f"--token-file {p}", "remove the file and a new token is written to it"), \
            f"read from {p}"
    token = new_token()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")  # mode 600
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return token, f"generated, written to {p}"


def serve_main(args, out, err, load_engine, usage_error) -> int:
    from workbench.serve.server import Limits

    if not args.session_ttl > 0:
        raise usage_error(f"--session-ttl {args.session_ttl} must be a positive number of seconds")
    try:
        limits = Limits(max_sessions=args.max_sessions, max_new_tokens=args.max_new_tokens,
                        max_budget=args.max_budget, session_ttl=args.session_ttl, max_body_bytes=args.max_body_bytes,
                        max_reply_bytes=args.max_reply_bytes, max_connections=args.max_connections,
                        header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                        send_timeout=args.send_timeout, max_stream_cycles=args.max_stream_cycles,
                        max_stream_bytes=args.max_stream_bytes, max_stream_seconds=args.max_stream_seconds,
                        batching=args.batching, max_batch_rows=args.max_batch_rows,
                        max_batch_nodes=args.max_batch_nodes)
    except ValueError as e:
        raise usage_error(f"--{str(e).split('=')[0].replace('_', '-')}: {e}") from None
    from workbench.serve.server import listen

    sock = listen(args.host, args.port)  # a port in use is refused now: before a token file or a model load
    try:
        token, origin = read_or_make_token(args.token_file)
    except BaseException:
        sock.close()
        raise
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("workbench serve: %(message)s"))
    log = logging.getLogger("workbench.serve")
    log.addHandler(handler)
    log.setLevel(args.log_level.upper())
    log.propagate = False
    try:
        return _serve(args, out, err, load_engine, limits, token, origin, log, sock)
    finally:
        log.removeHandler(handler)  # main() may be called again in-process (tests) with other streams
        log.propagate = True


def _serve(args, out, err, load_engine, limits, token, origin, log, sock) -> int:
    from workbench.serve.server import EngineServer, is_loopback

    if not is_loopback(args.host):
        print(f"workbench serve: WARNING: binding {args.host} makes the engine reachable from other machines; "
              "anyone with the token can run it. Prefer 127.0.0.1 and an SSH tunnel.", file=err, flush=True)
    try:
        engine = load_engine(args)
        with warnings.catch_warnings():  # the warning above says it already, before the models load
            warnings.simplefilter("ignore", UserWarning)
            server = EngineServer(engine, host=args.host, port=args.port, token=token, limits=limits,
                                  log_level="warning", sock=sock)
    except BaseException:
        sock.close()
        raise
    print(f"workbench serve: {engine!r}", file=out)
    print(f"workbench serve: listening on {server.url}", file=out)
    # A token that went to a file stays there: stdout ends up in logs and scrollback.
    print(f"workbench serve: token ({origin}): {token}" if origin == "generated"
          else f"workbench serve: token ({origin})", file=out)
    print(f"workbench serve: limits {limits.to_dict()}", file=out)
    print(f"workbench serve: {attach_line(server.url, args.token_file)}; stop with Ctrl-C", file=out, flush=True)
    # What is loaded by now (the models, the libraries: ~0.4 M objects) lives as long as the server: out of the
    # cyclic collector's way while it serves, a full collection (the interpreter's own, or the sweeper's) walks
    # only what serving made, instead of stopping every stream for 0.16 s.
    gc.freeze()
    try:
        server.run()
    finally:
        gc.unfreeze()  # (main() may run again in this process: tests)
    return 0


def attach_line(url: str, token_file: str | None) -> str:
    """How a notebook attaches: with the token file the server read (the token is not printed then), else
    with the token printed above."""
    if token_file is None:
        return f"attach with wb.connect({url!r}, token=...)"
    return f"attach with wb.connect({url!r}, token_file={str(Path(token_file).expanduser())!r})"
