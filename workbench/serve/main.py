"""``python -m workbench serve``: check the arguments, load the models once, print how to attach, serve."""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path


def read_or_make_token(path: str | None) -> tuple[str, str]:
    """(token, where it came from). A missing token file is created with a new token, readable by its owner only."""
    from workbench.serve import new_token

    if path is None:
        return new_token(), "generated"
    p = Path(path).expanduser()
    if p.is_file():
        token = p.read_text().strip()
        if len(token) < 8:
            raise ValueError(f"--token-file {p}: the token in it is shorter than 8 characters")
        return token, f"read from {p}"
    if p.exists():
        raise ValueError(f"--token-file {p} exists but is not a file")
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
    from workbench.serve import Limits

    if not args.session_ttl > 0:
        raise usage_error(f"--session-ttl {args.session_ttl} must be a positive number of seconds")
    limits = Limits(max_sessions=args.max_sessions, max_new_tokens=args.max_new_tokens,
                    max_budget=args.max_budget, session_ttl=args.session_ttl)
    token, origin = read_or_make_token(args.token_file)
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("workbench serve: %(message)s"))
    log = logging.getLogger("workbench.serve")
    log.addHandler(handler)
    log.setLevel(args.log_level.upper())
    log.propagate = False
    try:
        return _serve(args, out, err, load_engine, limits, token, origin, log)
    finally:
        log.removeHandler(handler)  # main() may be called again in-process (tests) with other streams
        log.propagate = True


def _serve(args, out, err, load_engine, limits, token, origin, log) -> int:
    from workbench.serve import EngineServer, is_loopback

    if not is_loopback(args.host):
        print(f"workbench serve: WARNING: binding {args.host} makes the engine reachable from other machines; "
              "anyone with the token can run it. Prefer 127.0.0.1 and an SSH tunnel.", file=err, flush=True)
    engine = load_engine(args)
    server = EngineServer(engine, host=args.host, port=args.port, token=token, limits=limits, log_level="warning")
    print(f"workbench serve: {engine!r}", file=out)
    print(f"workbench serve: listening on {server.url}", file=out)
    print(f"workbench serve: token ({origin}): {token}" if "generated" in origin
          else f"workbench serve: token {origin}", file=out)
    print(f"workbench serve: limits {limits.to_dict()}", file=out)
    print(f"workbench serve: attach with wb.connect({server.url!r}, token=...); stop with Ctrl-C", file=out, flush=True)
    server.run()
    return 0
