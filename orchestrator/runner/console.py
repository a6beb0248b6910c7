"""What a unit writes to stdout and stderr, kept: the last ``$ORCH_LOG_TAIL_KIB`` KiB
(default 64) of it, sent to the driver with the unit's reports and stored with each
member's attempt (``attempts.log``), so a failing trial's page and ``orchestrator logs``
show what it printed. The output still goes where it went (the worker's own log).

Python-level writes are captured (``print``, ``warnings``, tracebacks printed by Python);
what C++ code writes to the file descriptors directly is not.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

DEFAULT_TAIL_KIB = 64
SEND_EVERY_S = 5.0  # a changed tail rides along with a report at most this often


def tail_bytes() -> int:
    try:
        kib = int(os.environ.get("ORCH_LOG_TAIL_KIB", DEFAULT_TAIL_KIB))
    except ValueError:
        kib = DEFAULT_TAIL_KIB
    return max(1, min(kib, 16 * 1024)) * 1024


class Tail:
    """The last ``limit`` characters written, thread-safe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[str] = []
        self._size = 0
        self._lock = threading.Lock()
        self.changed = False
        self.dropped = 0  # characters that fell off the front

    def write(self, text: str) -> None:
        if not text:
            return
        with self._lock:
            self._parts.append(text)
            self._size += len(text)
            if self._size > 2 * self.limit:
                whole = "".join(self._parts)
                self.dropped += len(whole) - self.limit
                self._parts, self._size = [whole[-self.limit :]], self.limit
            self.changed = True

    def text(self) -> str:
        with self._lock:
            whole = "".join(self._parts)
            cut = len(whole) - self.limit
            head = (
                f"[... {self.dropped + max(cut, 0):,} earlier characters not kept]\n" if self.dropped or cut > 0 else ""
            )
            return head + (whole[-self.limit :] if cut > 0 else whole)


class _Tee:
    """A text stream that writes to ``stream`` and to ``tail``."""

    def __init__(self, stream: TextIO, tail: Tail) -> None:
        self._stream, self._tail = stream, tail

    def write(self, text: str) -> int:
        self._tail.write(text)
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class Capture:
    """The unit's console tail, and when to send it (:meth:`due`)."""

    def __init__(self, limit: int) -> None:
        self.tail = Tail(limit)
        self._sent_at = 0.0

    def due(self) -> str | None:
        """The tail, when it changed and was not sent in the last few seconds."""
        if not self.tail.changed or time.monotonic() - self._sent_at < SEND_EVERY_S:
            return None
        return self.now()

    def now(self) -> str | None:
        """The tail if anything was written since it was last sent."""
        if not self.tail.changed:
            return None
        self.tail.changed = False
        self._sent_at = time.monotonic()
        return self.tail.text()


@contextmanager
def captured(limit: int | None = None) -> Iterator[Capture]:
    """Tee ``sys.stdout`` and ``sys.stderr`` into one :class:`Capture` while the block runs."""
    cap = Capture(tail_bytes() if limit is None else limit)
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Tee(old[0], cap.tail), _Tee(old[1], cap.tail)  # type: ignore[assignment]
    try:
        yield cap
    finally:
        sys.stdout, sys.stderr = old
