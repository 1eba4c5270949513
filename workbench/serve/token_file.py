"""The token file: used only if no one else could have read or planted it (as ssh and Jupyter insist).

``serve --token-file`` reads it (or writes a new one); ``wb.connect(url, token_file=)`` reads it. Both refuse
the same files (not a regular file, a symlink, another user's, readable or writable by group or others),
checked and read through one descriptor so that nothing can swap the file in between; each names its own
argument and its own fix (the server can make a new file, the client cannot).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path


def open_checked(p: Path, name: str, remake: bool) -> int | None:
    """A descriptor of ``p`` once it passed ``check``; None where there is no such file. ``name`` is how
    the message names the argument; ``remake``: removing the file makes a new one (the server)."""
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        where = ", or a path where a new one can be written" if remake else ""
        raise ValueError(f"{name}: cannot be read ({e.strerror}); it must be a regular file (not a "
                         f"symlink){where}") from None
    try:
        check(p, os.fstat(fd), name, remake)
    except ValueError:
        os.close(fd)
        raise
    return fd


def check(p: Path, st: os.stat_result, name: str, remake: bool) -> None:
    """Refuse a token file that is not a regular file, belongs to another user, or that group or others may
    read or write; the message says how to fix it."""
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{name} exists but is not a regular file")
    uid = os.getuid() if hasattr(os, "getuid") else None
    if uid is not None and st.st_uid != uid:
        fix = f"remove it (a new one is made), or `chown {uid} {p}` if it is yours" if remake else \
            f"`chown {uid} {p}` if it is yours, or ask the server's owner for the token (token=)"
        raise ValueError(f"{name} is owned by uid {st.st_uid}, not by you (uid {uid}): someone else may know "
                         f"the token; {fix}")
    if uid is not None and st.st_mode & 0o077:
        fix = f"run `chmod 600 {p}` (or remove it, and a new one is made)" if remake else \
            f"the server refuses such a file too; run `chmod 600 {p}`"
        raise ValueError(f"{name} has mode {stat.S_IMODE(st.st_mode):04o}: group or others can read or write "
                         f"it; {fix}")


def read(path, name: str = "token_file") -> str:
    """The client's read: the token in ``path``, refused as the server refuses the file (and a missing one
    named)."""
    p = Path(path).expanduser()
    label = f"{name}={p}"
    fd = open_checked(p, label, remake=False)
    if fd is None:
        raise ValueError(f"{label}: no such file; give the file the server was started with "
                         "(`serve --token-file FILE`), or token=")
    with os.fdopen(fd) as fh:
        return fh.read().strip()
