"""A deadline for the reads one thread makes on a reader engine.

The dashboard runs each request in a worker thread inside :func:`within`; the reader engines
(:meth:`~orchestrator.store.dialect.Dialect.reader_engine`) look at :func:`remaining` and cut
the database work short when it passes: SQLite through a progress handler that interrupts
the running statement, PostgreSQL through a ``statement_timeout`` set for each transaction to
what is left. A ``stop`` event (the server shutting down) counts as a deadline passed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_local = threading.local()


class Stop:
    """A server's stop signal: once set, every read made under it counts as past its
    deadline, and the statements running under it that registered a cancel (PostgreSQL's,
    through the reader engine) are cancelled at once."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._cancels: dict[int, Callable[[], object]] = {}

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()
        with self._lock:
            cancels = list(self._cancels.values())
        for cancel in cancels:
            try:
                cancel()
            except Exception:  # noqa: S112 - a connection already gone has nothing to cancel
                continue

    def register(self, key: int, cancel: Callable[[], object]) -> None:
        with self._lock:
            self._cancels[key] = cancel

    def unregister(self, key: int) -> None:
        with self._lock:
            self._cancels.pop(key, None)


def current_stop() -> Stop | None:
    state = getattr(_local, "state", None)
    return None if state is None else state[1]


@contextmanager
def within(seconds: float | None, stop: Stop | None = None) -> Iterator[None]:
    """Reads made by this thread inside the block end once ``seconds`` have passed (None:
    no time limit) or ``stop`` is set."""
    prev = getattr(_local, "state", None)
    _local.state = (None if seconds is None else time.monotonic() + seconds, stop)
    try:
        yield
    finally:
        _local.state = prev


def remaining() -> float | None:
    """Seconds left to this thread's reads (0 or less: passed), None when unbounded."""
    state = getattr(_local, "state", None)
    if state is None:
        return None
    at, stop = state
    if stop is not None and stop.is_set():
        return 0.0
    return None if at is None else at - time.monotonic()


def passed() -> bool:
    left = remaining()
    return left is not None and left <= 0
