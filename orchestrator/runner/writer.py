"""The driver-side Tune callback: the one process that writes the database during a sweep.

Eval rows are buffered and flushed as batched upserts (every ``flush_rows`` rows or
``flush_s`` seconds, and whenever a trial starts, ends or fails). A row lost in the buffer
when the driver dies is not lost for good: the trial's checkpoint holds its trace and the
resumed trial re-reports it.
"""
from __future__ import annotations

import time
from typing import Any, TYPE_CHECKING

from ray import tune

from orchestrator.status import Status
from orchestrator.store import repo

if TYPE_CHECKING:  # the runner reaches the database only through orchestrator.store
    from sqlalchemy.engine import Engine


def _error_text(trial) -> str:
    text = None
    try:
        err = trial.get_pickled_error() or trial.get_error()
        text = str(err) if err is not None else None
    except Exception:  # pragma: no cover - storage hiccup; fall back to the file
        pass
    if not text and trial.error_file:
        try:
            with open(trial.error_file) as fh:
                text = fh.read()
        except OSError:
            text = None
    if not text:
        return "trial failed (no error text recorded by Ray)"
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    # Last line first (the exception), then the tail of the traceback for context.
    return (lines[-1] + "\n" + "\n".join(lines[-40:]))[-4000:] if lines else text[-4000:]


class StoreWriter(tune.Callback):
    def __init__(self, engine: Engine, *, flush_rows: int = 2000, flush_s: float = 0.5,
                 on_event=None):
        self.engine = engine
        self.flush_rows = flush_rows
        self.flush_s = flush_s
        self.on_event = on_event or (lambda *a, **k: None)
        self._rows: list[dict[str, Any]] = []
        self._touched: set[int] = set()
        self._last_flush = time.monotonic()
        self.rows_written = 0
        self.outcomes: dict[int, str] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its run config (callbacks included) for its own experiment restore,
        # which we never use: an engine and a progress closure cannot travel.
        state = self.__dict__.copy()
        state.update(engine=None, on_event=None, _rows=[], _touched=set())
        return state

    @staticmethod
    def _tids(trial) -> list[int]:
        """Our trial ids behind one Tune trial (a lone trial, or every member of a pack)."""
        return [int(m["trial_id"]) for m in trial.config["unit"]["members"]]

    def flush(self) -> None:
        if not self._rows and not self._touched:
            return
        with self.engine.begin() as conn:
            self.rows_written += repo.upsert_evals(conn, self._rows)
            repo.touch(conn, self._touched)
        self._rows.clear()
        self._touched.clear()
        self._last_flush = time.monotonic()

    def on_trial_start(self, iteration, trials, trial, **info):
        self.flush()
        with self.engine.begin() as conn:
            for tid in self._tids(trial):
                repo.mark_running(conn, tid)
        self.on_event("start", trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        evals = result.get("evals") or ()
        self._rows.extend(evals)
        self._touched.update(self._tids(trial))
        placement = result.get("placement")
        if placement:
            self.flush()
            with self.engine.begin() as conn:
                for tid in self._tids(trial):
                    repo.set_placement(conn, tid, placement.get("host"),
                                       placement.get("node_id"), placement.get("device"))
        if (len(self._rows) >= self.flush_rows
                or time.monotonic() - self._last_flush >= self.flush_s):
            self.flush()
        if evals:
            self.on_event("result", trial, step=evals[-1]["step"], evals=evals)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.flush()
        final = (trial.last_result or {}).get("final") or {}
        with self.engine.begin() as conn:
            for tid in self._tids(trial):
                status, error, *extra = (final.get(tid) or final.get(str(tid))
                                         or (Status.completed.value, None))
                repo.finish_trial(conn, tid, status, error)
                if extra and extra[0]:  # stopped by the spec's stop rule
                    repo.record_stop(conn, tid, **extra[0])
                self.outcomes[tid] = status
                self.on_event(status, trial)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.flush()
        text = _error_text(trial)
        with self.engine.begin() as conn:
            for tid in self._tids(trial):
                repo.record_error(conn, tid, text)
        self.on_event("retry", trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self.flush()
        text = _error_text(trial)
        with self.engine.begin() as conn:
            for tid in self._tids(trial):
                repo.finish_trial(conn, tid, Status.failed.value, text)
                self.outcomes[tid] = Status.failed.value
                self.on_event(Status.failed.value, trial)

    def on_experiment_end(self, trials, **info):
        self.flush()
