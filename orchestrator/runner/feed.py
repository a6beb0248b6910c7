"""What one Ray Tune run of a driver works through: units of trials, handed to Tune one at a
time as it has room for another (a Tune ``Searcher`` whose suggestion is the next unit).

A driver's whole run is one Tune run. Its units come from a fixed list (a sequential look)
or from claims on the database (every other run: :class:`ClaimSource`). When the queue runs
dry the feed claims the next batch in one short transaction, so a trial that frees a slot is
followed by the next within Tune's step, never by a new Tune run's start-up (its actors, the
checkpoint loader: seconds each time).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ray.tune.search import Searcher

from orchestrator.runner.unit import Unit

if TYPE_CHECKING:
    from orchestrator.runner.lifecycle import DriverSession
    from orchestrator.runner.sequential import LookGate

Trials = list[tuple[int, str, dict[str, Any]]]
# Tune's "no more suggestions" (a string where its type says a config).
_FINISHED: Any = Searcher.FINISHED


TRIALS_PER_TUNE_RUN = 1000


def trials_per_tune_run() -> int:
    """Tune trials (units: a trial, a seed pack, a chain) one Tune run of a driver starts
    before it ends and the next begins ($ORCH_TRIALS_PER_TUNE_RUN, default 1000): what bounds
    the driver's memory in a long sweep."""
    raw = os.environ.get("ORCH_TRIALS_PER_TUNE_RUN", "")
    return max(1, int(raw)) if raw.strip().isdigit() else TRIALS_PER_TUNE_RUN


# A chain is made to last about this long ($ORCH_CHAIN_S; 0: no chains). Each chain costs a
# Ray Tune trial's end and start (~25 ms on a 2-core machine) and a claim every `slots`
# chains; at 1,000 one-second trials on two slots, 10 s chains took the overhead from 4.9%
# and 4.5% (5 s chains) to 4.1% side by side (docs/SCALING.md, N24). Longer ones would hold
# more claimed trials away from other drivers for little more.
CHAIN_S = 10.0
# The most trials in one chain, and how many ended trials' durations the policy looks at.
MAX_CHAIN = 32
_DURATIONS = 64


def chain_seconds() -> float:
    """How long a chain of short trials is made to last ($ORCH_CHAIN_S, default 10 s; 0 turns
    chains off)."""
    try:
        return max(0.0, float(os.environ.get("ORCH_CHAIN_S", CHAIN_S)))
    except ValueError:
        return CHAIN_S


class ChainPolicy:
    """How many short trials one Tune trial runs one after another (a chain:
    runner/trainable._run_chain). Ray Tune pays tens of milliseconds to start and end each of
    its trials (actor reuse, placement, bookkeeping): a tenth of a half-second trial. A
    chain pays that once for several trials of a few seconds in all.

    The length is ``seconds`` over the median training time of the last trials that ended
    here (their last row's ``elapsed_s``; none until ``slots`` have ended: the first batch
    runs alone, and so does every trial of a sweep whose trials are long), at most :data:`MAX_CHAIN`, and at most what keeps
    four chains a slot of what is left, so the sweep's end is not one long chain on one slot
    while the others idle."""

    def __init__(self, slots: int, seconds: float | None = None) -> None:
        self.slots = max(1, slots)
        self.seconds = chain_seconds() if seconds is None else seconds
        self.durations: deque[float] = deque(maxlen=_DURATIONS)

    def observe(self, seconds: float) -> None:
        self.durations.append(seconds)

    def length(self, left: int) -> int:
        if self.seconds <= 0 or len(self.durations) < self.slots:
            return 1
        typical = max(statistics.median(self.durations), 1e-3)
        by_time = int(self.seconds // typical)
        by_tail = left // (4 * self.slots)
        return max(1, min(MAX_CHAIN, by_time, by_tail))


class UnitFeed(Searcher):
    """Tune's source of trials: each suggestion is one unit (``{"unit": Unit}``).

    ``next_batch()`` gives more trials when the queue is empty: a list (empty: none now, ask
    again later), or None when there will be no more. ``units_of`` groups a batch into units
    (seed packs, GPU placement); ``stopped()`` ends the feed (a signal, cancel, lost lease).

    With none now and none of its own running, the feed ends the Tune run (``idle``): Tune
    keeps an idle trial actor cached while it expects more trials, and on a Ray shared with
    other drivers that actor's CPUs or GPU could be what their queued trials wait for. The
    caller waits for work outside Tune and starts another run (:meth:`ClaimSource.wait`).

    After ``max_trials`` Tune trials (:func:`trials_per_tune_run`) the feed claims no more, lets
    the run's trials end and ends the run the same way: Tune keeps every trial of a run in the
    driver's memory until the run ends (its ``Trial`` objects, their configs and last
    results; ray-project/ray#64231), so a sweep of 20,000 trials in one run grows the driver
    by each one. A fresh run costs a few seconds (a drain of the slots and Tune's start) once
    per ``max_trials``; chains of short trials make it rarer per trial."""

    def __init__(
        self,
        next_batch: Callable[[], Trials | None],
        units_of: Callable[[Trials], list[dict[str, Any]]],
        stopped: Callable[[], bool],
        max_trials: int | None = None,
    ) -> None:
        super().__init__()
        self._next_batch = next_batch
        self.max_trials = max_trials
        self._units_of = units_of
        self._stopped = stopped
        self._queue: deque[dict[str, Any]] = deque()
        self._live: set[str] = set()  # Tune trials suggested and not yet complete
        self.taken: list[int] = []  # every trial id handed to this run, in order
        self.units = 0  # Tune trials suggested
        self.idle = False  # ended with nothing to run now, more possibly later

    def suggest(self, trial_id: str) -> dict | None:
        if self._stopped():
            return _FINISHED
        if not self._queue:
            if self.max_trials is not None and self.units >= self.max_trials:
                if not self._live:  # this run's share has ended: the caller starts the next
                    self.idle = True
                    return _FINISHED
                return None
            batch = self._next_batch()
            if batch is None:
                return _FINISHED
            if not batch:
                if not self._live:
                    self.idle = True
                    return _FINISHED
                return None  # Tune asks again at its next step
            self.taken += [tid for tid, _, _ in batch]
            self._queue.extend(self._units_of(batch))
        self._live.add(trial_id)
        self.units += 1
        return {"unit": Unit(self._queue.popleft())}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        # Only counted here: the writer records every outcome (runner/writer.py).
        self._live.discard(trial_id)

    def save_to_dir(self, checkpoint_dir: str, session_str: str = "default") -> None:
        pass  # Tune's own restore is never used: a restart resumes from our checkpoints

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its config for that restore; the closures (the session) stay here.
        return {"taken": list(self.taken)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _queue=deque(), _stopped=lambda: True)


class ClaimSource:
    """``next_batch`` through claims: the next batch of free trials, claimed for this driver.

    An unpacked sweep claims ``slots`` trials at a time (what the driver runs at once), so it
    holds little that another driver could run; once its trials prove short, ``slots`` chains
    of them (:class:`ChainPolicy`). A sweep that packs seeds claims half of what it
    believes is left (never less than twice its slots), so packs form across seeds as they
    would in one driver's run. With nothing free it asks again every ``poll_s`` while another
    live driver holds unfinished trials (they come free if it dies), and ends when none does.
    A sequential design claims through its ``gate`` (runner/sequential.LookGate): only the
    current look's trials, and the feed lasts until every look is decided."""

    def __init__(
        self,
        session: DriverSession,
        *,
        pending: int,
        slots: int,
        packs: bool,
        gate: LookGate | None = None,
        chains: bool = False,
    ) -> None:
        self.session = session
        self.left = pending
        self.slots = max(1, slots)
        self.packs = packs
        self.gate = gate
        # Chains of short trials: lone trials claimed freely (no packs, no looks).
        self.chains = ChainPolicy(self.slots) if chains and not packs and gate is None else None
        self.chain = 1  # the length the last claim was sized for (``units_of`` groups by it)
        self.poll_s = min(2.0, session.ttl / 4)
        self._quiet_until = 0.0
        self._ready: Trials | None = None  # a batch claimed by :meth:`wait`, for the next run

    def size(self) -> int:
        if self.packs:
            return max(2 * self.slots, math.ceil(self.left / 2))
        self.chain = self.chains.length(self.left) if self.chains is not None else 1
        return self.slots * self.chain

    def wait(self) -> bool:
        """Between Tune runs: wait until a batch is claimed (True; the next run starts with
        it) or there will be none (False), or the session stops (False)."""
        while not self.session.stop_event.is_set():
            batch = self()
            if batch is None:
                return False
            if batch:
                self._ready = batch
                return True
            self.session.stop_event.wait(max(0.05, self._quiet_until - time.monotonic()))
        return False

    def __call__(self) -> Trials | None:
        if self._ready is not None:
            ready, self._ready = self._ready, None
            return ready
        now = time.monotonic()
        if now < self._quiet_until:
            return []
        batch = self.session.claim(self.size(), self.gate)
        if self.gate is not None:
            self.gate.settle()
            if not batch and not self.gate.done:
                # The current look waits for trials running here or at other drivers.
                self._quiet_until = now + min(self.poll_s, 0.5)
                return []
        if batch is None or (not batch and self.session.held_elsewhere()):
            self._quiet_until = now + self.poll_s  # an exclusive step, or other drivers' trials
            return []
        if not batch:
            return None
        self.left = max(0, self.left - len(batch))
        return batch
