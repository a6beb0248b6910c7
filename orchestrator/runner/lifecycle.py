"""A driver's hold on a sweep while it runs: its row in ``drivers`` and its claims on trials
(store/claims.py: claimed in batches, renewed on the database clock by a thread, released at
exit), the sweep's lease for the exclusive steps (a design written or amended), heartbeats of the trials it runs, and the ways a run is
asked to stop: SIGINT/SIGTERM, ``orchestrator cancel`` (a flag on every live driver's row the
renewal thread reads), a lost lease or claim (``--takeover`` by another driver), a database
that stays unreachable, or one that is gone (its SQLite file deleted or replaced, its tables
dropped: ``fatal``, after which nothing is written).

The training loop knows nothing of this: heartbeats are written here, on the driver, for
the trials the writer callback has seen start and not yet end.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.errors import UserError
from orchestrator.store import claims, lease
from orchestrator.store.outage import DatabaseGone

if TYPE_CHECKING:  # the runner reaches the database only through orchestrator.store
    from sqlalchemy.engine import Connection

    from orchestrator.store.sweep_store import SweepStore

T = TypeVar("T")

# Exit code of a run stopped by a signal or a cancel (128 + SIGINT, what shells expect).
EXIT_INTERRUPTED = 130


class LeaseHeld(UserError):
    """Another live driver holds the sweep."""


LOST = "lease lost"


class DriverSession:
    """Context manager: on enter, register the driver and (``lease``) take the sweep's lease,
    waiting a moment for another driver's exclusive step to end (or raise LeaseHeld); renew
    in a thread, stop on signals, release on exit. ``stop_reason`` is None while the run
    should go on.

    The caller writes what needs the sweep alone under the lease, calls :meth:`share` and
    runs the trials it claims (:meth:`claim`) beside any other driver. ``take_lease=False``
    (``join``): never take the lease; claims wait while another driver's exclusive step runs."""

    def __init__(
        self,
        store: SweepStore,
        sweep_id: int,
        sweep_name: str,
        *,
        takeover: bool = False,
        note: Callable[[str], None] | None = None,
        ttl: float | None = None,
        handle_signals: bool = True,
        take_lease: bool = True,
        command: str = "submit",
        max_concurrent: int | None = None,
        slurm_job: str | None = None,
    ):
        self.store = store
        self.sid = sweep_id
        self.name = sweep_name
        self.takeover = takeover
        self.note = note or (lambda msg: None)
        self.ttl = ttl if ttl is not None else lease.lease_ttl_s()
        self.owner = lease.new_owner()
        self.handle_signals = handle_signals
        self.wants_lease = take_lease
        self.holds_lease = False
        # share() gives the lease back while the renewal thread may be renewing it.
        self._lease_lock = threading.Lock()
        self.command = command
        self.max_concurrent = max_concurrent
        # ``JOBID_TASKID`` of the SLURM array task this driver is (runner/slurm.job_id).
        self.slurm_job = slurm_job
        self.running: set[int] = set()
        self.stop_reason: str | None = None
        # The database is gone: the run ends with this error and never writes again.
        self.fatal: DatabaseGone | None = None
        self.stop_event = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._old_handlers: dict[int, Any] = {}
        # How a claim's transaction is run: on its own, or (during a Tune run) after the
        # writer's buffered ends and rows, in their transaction (runner/tune_runner.py).
        # Called with None: only store what is buffered.
        self.claim_through: Callable[[Callable[[Connection], Any] | None], Any] = self.write_if

    # ---- stopping ------------------------------------------------------------------------
    def stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self.stop_event.set()

    def fail(self, exc: DatabaseGone) -> None:
        """The database is gone: stop every trial now; the run raises ``exc``."""
        if self.fatal is None:
            self.fatal = exc
        self.stop("database gone")

    # ---- writing -------------------------------------------------------------------------
    def write(self, fn: Callable[[Connection], T], *, budget_s: float | None = None) -> T:
        """Run ``fn`` in a transaction: the one way the runner writes. A database outage is
        ridden out (store.outage, up to ``budget_s``, default $ORCH_DB_OUTAGE_S); a database
        that is gone (file deleted or replaced, tables dropped) stops the session and is
        never written again."""
        if self.fatal is not None:
            raise self.fatal
        try:
            return self.store.write(fn, budget_s=budget_s)
        except DatabaseGone as exc:
            self.fail(exc)
            raise

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.stop_event.is_set():
            if signum == signal.SIGTERM and self.stop_reason == name:
                # The same stop delivered twice: SLURM signals every process of a task
                # (proctrack/cgroup) and its batch shell forwards its own TERM as well.
                return
            # A second signal: the user means it; stop waiting for Tune to wind down.
            raise KeyboardInterrupt
        self.stop(name)

    # ---- lease ---------------------------------------------------------------------------
    def _register(self, conn: Connection) -> None:
        # A driver starting here frees a dead local driver's trials at once (a SIGKILLed
        # driver's `resume` need not wait out the TTL); a running one waits for the TTL.
        claims.reap_dead(conn, self.sid, alive=lease.pid_alive)
        claims.register(
            conn,
            self.sid,
            self.owner,
            command=self.command,
            max_concurrent=self.max_concurrent,
            slurm_job=self.slurm_job,
        )
        if self.takeover:
            n = claims.take_over(conn, self.sid, self.owner, self.ttl)
            if n:
                self.note(f"sweep {self.name}: took over from {n} live driver(s) (--takeover)")

    def _take_lease(self) -> None:
        """The sweep's lease, waiting (up to a minute, or the TTL if longer) while another
        driver's short exclusive step (a design write) holds it."""

        def claim(conn: Connection) -> tuple[lease.Holder | None, bool]:
            held = lease.holder(conn, self.sid)
            dead = held.owner if held is not None and held.expired else None
            ok = lease.claim(conn, self.sid, self.owner, ttl=self.ttl, force=self.takeover, dead_owner=dead)
            if ok:
                self._register(conn)
            return held, ok

        deadline = time.monotonic() + max(self.ttl, 60.0)
        while True:
            held, ok = self.write(claim)
            if ok or time.monotonic() >= deadline:
                break
            time.sleep(0.25)
        if not ok:
            held = self.store.read(lambda conn: lease.holder(conn, self.sid))
            who = held.summary() if held else "another driver"
            raise LeaseHeld(
                f"sweep {self.name!r} is being run by {who}; wait for it, "
                f"`orchestrator cancel {self.name}`, or pass --takeover"
            )
        self.holds_lease = True
        if held is not None and held.owner != self.owner:
            why = "took over (--takeover)" if self.takeover and not held.expired else "took over an expired lease"
            self.note(f"sweep {self.name}: {why} from {held.summary()}")

    def __enter__(self) -> DriverSession:
        if self.wants_lease:
            self._take_lease()
        else:
            self.write(self._register)
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        self._thread = threading.Thread(target=self._renew_loop, name="orchestrator-lease", daemon=True)
        self._thread.start()
        return self

    def share(self) -> None:
        """End the exclusive step: give the lease back, so other drivers run beside this one."""
        with self._lease_lock:
            if self.holds_lease:
                self.write(lambda conn: lease.release(conn, self.sid, self.owner))
                self.holds_lease = False

    def claim(
        self, n: int, gate: Callable[[Connection], Any] | None = None
    ) -> list[tuple[int, str, dict[str, Any]]] | None:
        """Claim up to ``n`` free trials (id, key, params) in one transaction, of those
        ``gate`` lets run (store.claims.claim_batch); None while another driver's exclusive
        step holds the sweep (try again shortly)."""

        def claim(conn: Connection) -> list[tuple[int, str, dict[str, Any]]] | None:
            return claims.claim_batch(conn, self.sid, self.owner, n, ttl=self.ttl, gate=gate)

        if gate is not None:
            # A look locks the sweep's row and may skip trials other drivers hold: what the
            # writer holds is committed first, so this transaction holds no trial's row while
            # it waits for the sweep's (another driver's look could wait for one of those).
            self.claim_through(None)
            return self.write(claim)
        return self.claim_through(claim)

    def write_if(self, fn: Callable[[Connection], T] | None) -> T | None:
        """:meth:`write` of ``fn``; nothing when it is None."""
        return self.write(fn) if fn is not None else None

    def held_elsewhere(self) -> int:
        """Unfinished trials other live drivers hold (they come free once those drivers
        stop renewing their claims, after the TTL)."""
        return self.store.read(lambda conn: claims.held_elsewhere(conn, self.sid, self.owner))

    def release_claims(self, trial_ids: list[int]) -> None:
        """Give back the claims on trials this driver has ended (or will not run)."""
        self.write(lambda conn: claims.release(conn, self.owner, trial_ids))

    def _renew_loop(self) -> None:
        period = self.ttl / 4

        def renew(conn: Connection) -> tuple[claims.Renewal, bool]:
            got = claims.renew(conn, self.owner, ttl=self.ttl, running=sorted(self.running))
            held = lease.renew(conn, self.sid, self.owner, ttl=self.ttl) if self.holds_lease else True
            return got, held

        while not self._done.wait(period) and self.fatal is None:
            try:
                # One try a period (the next period is the retry). Also the check that stops
                # trials which report rarely, when no other write would find the database gone.
                with self._lease_lock:
                    got, held = self.write(renew, budget_s=0)
            except DatabaseGone:
                return  # write() stopped the session
            except Exception:  # an outage: the writer owns riding it out; try again next period
                continue
            if not held or not got.alive:
                self.stop(f"{LOST} (another driver took the sweep over)")
            elif got.lost:
                self.stop(f"{LOST} ({len(got.lost)} trial(s) taken over by another driver)")
            elif got.cancel:
                self.stop("cancel requested (`orchestrator cancel`)")

    @property
    def lost(self) -> bool:
        return self.stop_reason is not None and self.stop_reason.startswith(LOST)

    def interrupt_running(self, conn) -> int:
        """Mark this driver's running trials interrupted (unless another driver took them
        over, who owns them now): those it claimed."""
        if self.lost:
            return 0
        return claims.interrupt(conn, owner=self.owner)

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        if self.fatal is None:
            try:
                self.store.check()
            except DatabaseGone as gone:  # went at the very end: the run did not land
                self.fatal = gone
        if self.fatal is not None:
            # Nothing is written to a database that is not the sweep's any more.
            if exc[0] is None:
                raise self.fatal
            return
        stopped = self.stop_reason is not None or exc[0] is not None
        reason = self.stop_reason or (type(exc[1]).__name__ if exc[0] is not None else None)

        def release(conn: Connection) -> None:
            if stopped:
                self.interrupt_running(conn)
            claims.end(conn, self.owner, reason)
            if self.holds_lease:
                lease.release(conn, self.sid, self.owner)

        try:
            self.write(release, budget_s=0)  # one try: a driver on its way out does not wait
        except Exception:
            # Database unreachable: the lease expires by itself, the trials show as stale.
            pass
