"""Output files: paths checked before any work, and text written atomically (never half-written).

The lowest floor of the house (records save traces with it; the engine's validation, the CLI and the
views' exports check their output paths with it), so it imports nothing from workbench.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def output_path(path, what: str = "output") -> Path:
    """An output file that can be written now: refused (one line naming it) when it is a directory,
    its parent directory does not exist (nothing is created to make it so), or it cannot be written."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{what} '{p}' is a directory; give a file name, e.g. {p / 'out'}")
    parent = p.parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist"
        raise ValueError(f"{what} '{p}': the folder '{parent}' {why}; create it first or give another path")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"{what} '{p}' cannot be written (no permission)")
    if p.exists() and not p.is_file():  # /dev/null, a fifo: an atomic write would replace it with a file
        raise ValueError(f"{what} '{p}' exists and is not a regular file; give a file name")
    _probe(parent, p, what)
    return p


def npz_output(path, kind: str, replace: bool, what: str = "--out") -> Path:
    """``output_path`` for the .npz a command makes (``kind``: what it holds, e.g. 'a pair head'): also refused
    when the name does not end in .npz, or when the file exists and ``replace`` (the command's --replace) is
    false, so a made file is never written over by mistake."""
    p = output_path(path, what)
    if p.suffix != ".npz":
        raise ValueError(f"{what} {p}: {kind} is an .npz file; give a name ending in .npz")
    if p.exists() and not replace:
        raise ValueError(f"{what} {p} exists; give --replace to write over it, or another path")
    return p


def _probe(parent: Path, p: Path, what: str) -> None:
    """Create and remove a temporary file where ``p`` will be written (as the atomic write will): a folder
    that only looks writable (/proc, a read-only mount, root's view of permissions) is refused now."""
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{p.name}.", suffix=".probe")
    except OSError as e:
        raise ValueError(f"{what} '{p}' cannot be written: no file can be created in '{parent}' "
                         f"({e.strerror or e}); give a path in a writable folder") from None
    os.close(fd)
    os.unlink(tmp)


def output_dir(path, what: str = "output folder") -> Path:
    """An output folder: an existing writable directory, or a new one whose parent exists."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{what} '{p}' is a file; give a directory")
    target = p if p.is_dir() else p.parent
    if not target.is_dir():
        raise ValueError(f"{what} '{p}': the folder '{target}' does not exist; create it first or give another path")
    if not os.access(target, os.W_OK | os.X_OK):
        raise ValueError(f"{what} '{p}' cannot be written (no permission)")
    return p


def _file_mode() -> int:
    """What open() would give a new file here (0o666 less the umask): every output gets the same mode."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_text_atomic(path, text_: str) -> Path:
    """Write to a temporary file beside ``path``, then rename over it: never half-written. The parent
    folder must exist (nothing is created); an error names ``path``, never the temporary file."""
    return write_bytes_atomic(path, text_.encode("utf-8"))


def write_bytes_atomic(path, data: bytes) -> Path:
    """``write_text_atomic`` for bytes (an .npz built in memory)."""
    path = output_path(path, "output")
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise OSError(f"cannot write '{path}': {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(f"cannot write '{path}': {e.strerror or e}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
