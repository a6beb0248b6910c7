"""Reading a file a user names (a spec): a regular file only, its size checked before a byte
is read.

``Path.read_text`` on a symlink to ``/dev/zero`` fills memory without end, and on a FIFO or
``/dev/urandom``-like device it blocks or streams forever. So the path is ``stat``-ed first
(a FIFO is never opened on that path), then opened non-blocking and checked again on the open
descriptor (the path may have been swapped in between), and at most ``limit + 1`` bytes are
read whatever the file claims its size is.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator.errors import UserError

MAX_SPEC_BYTES = 1 << 20  # a spec is a page of YAML; 1 MiB is far past any real one

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _mib(n: int) -> str:
    return f"{n:,}-byte ({n / (1 << 20):g} MiB)"


def _check(st: os.stat_result, label: str, what: str, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{label}: is {_kind(st.st_mode)}, not a regular file (a {what} must be a regular file)")
    if st.st_size > limit:
        raise UserError(f"{label}: {st.st_size:,} bytes, above the {_mib(limit)} limit of a {what}")


def read_text_file(path: str | Path, *, limit: int, label: str | None = None, what: str = "spec") -> str:
    """The UTF-8 text of the regular file at ``path`` (symlinks followed), at most ``limit``
    bytes; anything else is a one-line :class:`UserError` naming ``label`` (default: the path)."""
    label = str(path) if label is None else label
    try:
        _check(os.stat(path), label, what, limit)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise UserError(f"{label}: no such file") from None
    except NotADirectoryError:
        raise UserError(f"{label}: no such file (a part of the path is not a folder)") from None
    except OSError as exc:
        raise UserError(f"{label}: cannot read: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "rb") as f:
            fd = -1
            _check(os.fstat(f.fileno()), label, what, limit)
            data = f.read(limit + 1)
    except OSError as exc:
        raise UserError(f"{label}: cannot read: {exc.strerror or exc}") from None
    finally:
        if fd != -1:
            os.close(fd)
    if len(data) > limit:  # a file that grew after the stat, or one that misreports its size
        raise UserError(f"{label}: more than the {_mib(limit)} limit of a {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{label}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
