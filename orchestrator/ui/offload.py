"""A big sweep's eval read, run in a child process, off the dashboard server's GIL.

At 100,000 trials the read of 5 million eval rows is seconds of work, and the server's
threads share one interpreter lock: while it runs, the trial table, the bands and the
analyses wait. A child process reads the same rows
(:func:`orchestrator.analysis.data.read_evals`, through the backend's columnar driver where
it has one: Arrow's for SQLite, under half the tuple read's CPU) with its own reader engine
(the same URL reopened by :func:`~orchestrator.store.reader.open_reader_engine`: a reader's
rights, never more) and sends back the columns as arrays (their names, dtypes and lengths,
then their bytes, read straight into the server's arrays), while the server builds the table
on its own core. With several cores, several children read a range of the trials each, side
by side, and their columns are joined as they arrive.

Children come from a forkserver that has the analysis layer imported already (started by
:func:`warm` when a big sweep's page is asked for), so a read does not pay the imports. Each
read is a process of its own that ends with it: the memory of its Python rows goes back to the
system, not into the server. The request's deadline and the server's stop reach the child as a
kill, and the request ends as a cut-short read does in the server.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.store import deadline

# Sweeps with more trials than this read their evals in a child (50 evals a trial: half a
# million rows, about half a second in-process, where a child's start and the transfer
# would cost about as much as they save).
OFFLOAD_TRIALS = 10_000
# Children that read one sweep's evals side by side, a range of its trials each: at 100,000
# trials one reader's Python tuples were the page's longest wait (about 6 s on 2 cores).
PARTS = max(1, min(4, os.cpu_count() or 1))
# Imported once in the forkserver, so a child starts with them: the main module too (a
# child would otherwise import the `orchestrator` script again, and with it the whole CLI),
# the eval reader, and the columnar SQLite driver with pyarrow (0.4 s a child; where it is
# missing the forkserver skips it and the children read tuples).
_PRELOAD = [
    "__main__",
    "orchestrator.ui.offload",
    "orchestrator.analysis.data",
    "adbc_driver_sqlite.dbapi",
]
_LOCK = threading.Lock()
_CTX: Any = None
POLL_S = 0.05
CHILD_NAME = "orchestrator-offload"
JOIN_S = 5.0


class ChildFailed(RuntimeError):
    """The child process died without an answer (killed from outside, out of memory)."""


class Unavailable(RuntimeError):
    """No child process could be started here (the caller reads in-process instead)."""


def _context() -> Any:
    global _CTX
    with _LOCK:
        if _CTX is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(_PRELOAD)
            _CTX = ctx
        return _CTX


def warm() -> None:
    """Start the forkserver (importing the analysis layer there) in the background, so the
    first read does not wait for it."""

    def start() -> None:
        from multiprocessing import forkserver

        try:
            _context()
            forkserver.ensure_running()
        except Exception:  # noqa: S110 - the first read starts it, or reads in-process
            pass

    threading.Thread(target=start, name="offload-warm", daemon=True).start()


def _portable(exc: BaseException) -> BaseException:
    """``exc`` as it can cross to the server: itself when it pickles back, else an error of
    the nearest kind the server answers alike (a 404 for an unknown sweep) with its text."""
    from orchestrator.errors import UserError
    from orchestrator.store.reader import NotFound

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        for kind in (NotFound, UserError):
            if isinstance(exc, kind):
                return kind(str(exc))
        return RuntimeError(f"{type(exc).__name__}: {exc}")


Columns = dict[str, np.ndarray]


def _child(out: Connection, fn: Callable[..., Columns], args: tuple, seconds: float | None) -> None:
    """``fn(*args)`` within ``seconds`` (one array a column), sent back as the columns' names,
    dtypes and lengths, then each column's bytes as they are (no pickle of 100s of MB); or
    the error it raised."""
    try:
        try:
            with deadline.within(seconds):
                value = {name: np.ascontiguousarray(a) for name, a in fn(*args).items()}
            bad = next((n for n, a in value.items() if a.ndim != 1 or a.dtype.hasobject), None)
            if bad is not None:
                raise TypeError(f"column {bad!r}: not a 1-D array of numbers")
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the request
            out.send(("error", _portable(exc)))
            return
        out.send(("columns", [(name, a.dtype.str, len(a)) for name, a in value.items()]))
        # Then the bytes, unframed: the server reads each column straight into its place.
        with io.FileIO(out.fileno(), "wb", closefd=False) as raw:
            for a in value.values():
                view = a.data.cast("B")
                while view:
                    view = view[raw.write(view) :]
    finally:
        out.close()


def _wait(proc: Any, recv: Connection) -> None:
    """Until the child's pipe has bytes to read, within the calling thread's deadline."""
    while not recv.poll(POLL_S):
        if deadline.passed():
            raise TimeoutError("the child's read ran past the request's deadline")
        if not proc.is_alive() and not recv.poll(0):
            raise ChildFailed(f"the child process ended with exit code {proc.exitcode} and no answer")


def _head(proc: Any, recv: Connection) -> list[tuple[str, str, int]]:
    """A child's columns (name, dtype, length), waited for within the calling thread's
    deadline; the error it raised is raised here."""
    _wait(proc, recv)
    try:
        kind, payload = recv.recv()
    except EOFError:
        raise ChildFailed(f"the child process ended with exit code {proc.exitcode} and no answer") from None
    if kind == "error":
        raise payload
    return payload


def _run(fn: Callable[..., Columns], calls: list[tuple]) -> Columns:
    """``fn(*args)`` for each ``args`` of ``calls``, one child process each, side by side;
    each gives the same columns (one 1-D array each), and they are joined end to end in the
    order of ``calls``: each child's bytes are received straight into their place in the
    joined arrays (no part kept, no concatenation: 0.4 s at 5 million rows). Past the
    calling thread's deadline (or once the server stops) the children are killed and
    :class:`TimeoutError` raised; an error raised in a child is raised here."""
    ctx = _context()
    left = deadline.remaining()
    started: list[tuple[Any, Connection]] = []
    try:
        for args in calls:
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(send, fn, args, left), name=CHILD_NAME, daemon=True)
            try:
                proc.start()
            except (OSError, RuntimeError) as exc:  # no processes here (limits, an embedding main module)
                recv.close()
                raise Unavailable(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__) from exc
            finally:
                send.close()
            started.append((proc, recv))
        heads = [_head(proc, recv) for proc, recv in started]
        layout = [(name, dtype) for name, dtype, _n in heads[0]]
        if any([(name, dtype) for name, dtype, _n in h] != layout for h in heads):
            raise ChildFailed("the child processes sent different columns")
        joined = {name: np.empty(sum(h[i][2] for h in heads), dtype=dtype) for i, (name, dtype) in enumerate(layout)}
        at = dict.fromkeys(joined, 0)
        for (proc, recv), head in zip(started, heads):
            # Read off the pipe into the joined arrays: no message buffer in between.
            with io.FileIO(recv.fileno(), "rb", closefd=False) as raw:
                for name, _dtype, n in head:
                    width = joined[name].itemsize
                    view = joined[name].data.cast("B")[at[name] * width : (at[name] + n) * width]
                    while view:
                        _wait(proc, recv)
                        got = raw.readinto(view)
                        if not got:
                            raise ChildFailed(f"the child process ended with exit code {proc.exitcode} mid-answer")
                        view = view[got:]
                    at[name] += n
            proc.join(JOIN_S)  # a child that answered ends by itself
        return joined
    finally:
        for proc, recv in started:
            recv.close()
            if proc.is_alive():
                proc.kill()
                proc.join()


def _read_part(url: str, sweep: str, trial_ids: tuple[int, int | None] | None) -> Columns:
    """In a child: the evals of a range of the sweep's trials, one array a column, read
    through a reader's engine (the URL reopened: a reader's rights, never more) and the
    backend's columnar driver where it has one."""
    from orchestrator.analysis.data import read_evals
    from orchestrator.store.reader import open_reader_engine

    engine, _ = open_reader_engine(url, pool_size=1)
    try:
        frame = read_evals(engine, sweep, trial_ids, columnar=True)
    finally:
        engine.dispose()
    return {c: np.ascontiguousarray(frame[c].to_numpy()) for c in frame.columns}


def read_evals(url: str, sweep: str, bounds: list[tuple[int, int | None]] | None = None) -> pd.DataFrame:
    """:func:`orchestrator.analysis.data.read_evals` of ``sweep`` at ``url`` (a reader's
    URL), read by child processes, one per trial-id range of ``bounds``
    (:func:`orchestrator.store.reader.trial_id_bounds`, in order; one child for the whole
    sweep when None) side by side; the frame is equal to the in-process one. Past the
    calling thread's deadline (or once the server stops) the children are killed and
    :class:`TimeoutError` raised; an error of the read (a missing sweep) is raised here as
    it was there."""
    ranges: list[tuple[int, int | None] | None] = list(bounds) if bounds else [None]
    # Consecutive ranges, each sorted by trial and step: joined, the whole read's order.
    columns = _run(_read_part, [(url, sweep, r) for r in ranges])
    # The arrays as they are, not copied into 2-D blocks per dtype (0.4 s at 5 million rows).
    return pd.DataFrame(columns, copy=False)
