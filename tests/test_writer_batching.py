"""The writer stores a trial's start and end in its flushes (issue 34 item 1): in the steady
state the end of one trial, the start of the next and the rows of both share one commit, and
what it stores is what the unbatched writes stored (the same order: starts, rows, ends)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import sqlalchemy as sa

from conftest import claimed_writer, query
from orchestrator.runner.messages import AttemptStart, Checkpoint, EvalRow, Placement, Report, TrialFinal
from orchestrator.status import Status
from orchestrator.train.loop import EvalPoint

ENV = {"host": "h1", "device": "cpu", "precision": "fp32", "code_version": "git:abc"}


def _trial(tid: int, final: Status | None = None) -> SimpleNamespace:
    """What the writer reads of a Tune trial: its unit's members and its last report."""
    last = Report(finals=(TrialFinal(tid, final),)).to_wire() if final is not None else None
    return SimpleNamespace(
        trial_id=f"tune{tid}", config={"unit": {"members": [{"trial_id": tid, "key": f"k{tid}"}]}}, last_result=last
    )


def _point(step: int) -> EvalPoint:
    return EvalPoint(step, step / 100, 1.0 / step, 1.0, 1e-3, step / 10)


def _first(tid: int, from_step: int | None = None) -> dict:
    """A unit's first report: where it runs, the attempt's start, its first row."""
    step = (from_step or 0) + 10
    return Report(
        evals=(EvalRow(tid, _point(step)),),
        placement=Placement("h1", "ab" * 28, "cpu (fp32)"),
        attempt=AttemptStart(((tid, from_step),), ENV),
    ).to_wire()


def _rows(tid: int, *steps: int) -> dict:
    return Report(evals=tuple(EvalRow(tid, _point(s)) for s in steps)).to_wire()


class _Commits:
    """Commits made on the calling thread (the driver's lease thread renews on its own)."""

    def __init__(self, engine: sa.engine.Engine) -> None:
        self.n = 0
        self._thread = threading.get_ident()
        sa.event.listen(engine, "commit", self._on)

    def _on(self, conn) -> None:
        if threading.get_ident() == self._thread:
            self.n += 1


def test_six_trials_one_after_another_take_one_commit_each_and_store_what_they_did(db_url):
    with claimed_writer(db_url, 6) as (engine, tids, session, writer):
        commits = _Commits(engine)
        for tid in tids:
            trial = _trial(tid, Status.completed)
            writer.on_trial_start(0, [], trial)
            writer.on_trial_result(0, [], trial, _first(tid))
            writer.on_trial_result(0, [], trial, _rows(tid, 20, 30))
            writer.on_trial_complete(0, [], trial)
            assert writer.outcomes.get(tid) is None  # queued, not stored yet
            writer.flush()  # what the feed does before its next claim
            assert writer.outcomes[tid] == "completed" and tid not in session.running
        assert commits.n == 6
    got = query(
        db_url,
        "SELECT t.id, t.status, t.attempts, t.final_step, t.final_acc, t.claimed_by, t.host, "
        "(SELECT COUNT(*) FROM evals e WHERE e.trial_id = t.id), "
        "(SELECT COUNT(*) FROM attempts a WHERE a.trial_id = t.id AND a.outcome = 'completed') "
        "FROM trials t ORDER BY t.id",
    )
    assert [tuple(r) for r in got] == [(t, "completed", 1, 30, 0.3, None, "h1", 3, 1) for t in tids]


def test_an_end_merged_with_the_next_start_stores_nothing_of_a_trial_taken_over(db_url):
    """A's end and B's start wait in one flush; meanwhile another driver took A over (this
    one was cut off past the TTL). The flush stores B's start and rows and nothing of A, and
    the driver stops as when its renewal finds a trial taken."""
    with claimed_writer(db_url, 2) as (engine, (a, b), session, writer):
        ta = _trial(a, Status.completed)
        writer.on_trial_start(0, [], ta)
        writer.on_trial_result(0, [], ta, _first(a))
        writer.flush()
        writer.on_trial_result(0, [], ta, _rows(a, 20))
        writer.on_trial_complete(0, [], ta)
        tb = _trial(b)
        writer.on_trial_start(0, [], tb)
        writer.on_trial_result(0, [], tb, _first(b))
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE trials SET claimed_by = 'other' WHERE id = :t"), {"t": a})
        writer.flush()
        assert session.stop_reason is not None and "taken over" in session.stop_reason
        assert writer.outcomes == {}  # nothing of A, and B has not ended
    rows = {r.id: r for r in query(db_url, "SELECT id, status, claimed_by, finished_at FROM trials")}
    assert (rows[a].status, rows[a].claimed_by, rows[a].finished_at) == ("running", "other", None)
    assert rows[b].status == "running"
    assert query(db_url, "SELECT trial_id, step FROM evals ORDER BY trial_id, step") == [(a, 10), (b, 10)]
    assert query(db_url, "SELECT trial_id, outcome FROM attempts ORDER BY trial_id") == [(a, None), (b, None)]


def test_a_new_attempt_stores_the_old_attempts_buffered_rows_first_and_deletes_past_its_step(db_url):
    """Rows and a checkpoint of attempt 1 still buffered when Tune restarts the unit from its
    step-20 checkpoint: they land before the start (whose attempt deletes what lies past step
    20), never after it, where they would stitch a trace from two attempts."""
    with claimed_writer(db_url, 1) as (engine, (tid,), session, writer):
        trial = _trial(tid, Status.completed)
        writer.on_trial_start(0, [], trial)
        writer.on_trial_result(0, [], trial, _first(tid))
        writer.on_trial_result(0, [], trial, _rows(tid, 20, 30, 40))
        writer._ckpts[tid] = Checkpoint(tid, 40, b"attempt-1")
        writer.on_trial_result(0, [], trial, _first(tid, from_step=20))  # attempt 2, from step 20
        writer.on_trial_result(0, [], trial, _rows(tid, 40))
        writer.on_trial_complete(0, [], trial)
        writer.flush()
    assert query(db_url, "SELECT step, acc FROM evals ORDER BY step") == [(10, 0.1), (20, 0.2), (30, 0.3), (40, 0.4)]
    assert query(db_url, "SELECT attempt, from_step, outcome FROM attempts ORDER BY attempt") == [
        (1, None, "lost"),
        (2, 20, "completed"),
    ]
    assert query(db_url, "SELECT COUNT(*) FROM trial_checkpoints")[0][0] == 0  # past step 20: deleted


class _Statements:
    """Statements sent on the calling thread: through SQLAlchemy's cursor events, and those
    of the raw fast paths (dialect.raw_statements: the eval rows' upsert), which the events
    never see."""

    def __init__(self, engine: sa.engine.Engine) -> None:
        from orchestrator.store import dialect

        self._raw = dialect.raw_statements
        self._raw0 = self._raw.sent
        self.texts: list[str] = []
        self._thread = threading.get_ident()
        sa.event.listen(engine, "before_cursor_execute", self._on)

    def _on(self, conn, cursor, statement, *args) -> None:
        if threading.get_ident() == self._thread:
            self.texts.append(" ".join(statement.split()))

    @property
    def n(self) -> int:
        return len(self.texts) + self._raw.sent - self._raw0


def test_a_short_trials_whole_life_in_one_flush_is_six_statements(db_url):
    """A trial that starts, reports and ends within one flush (the steady state of short
    trials): its ownership check with its heartbeat and its row's start (the running mark,
    the placement and the attempt's read) in one UPDATE ... RETURNING, which takes SQLite's
    write lock too; the attempt, its rows, its checkpoint, the attempt's close and its end
    (finished and let go in one UPDATE): 6 statements on either backend. A fresh attempt
    deletes nothing (nothing lies past its start)."""
    with claimed_writer(db_url, 2) as (engine, (a, b), session, writer):
        count = _Statements(engine)
        trial = _trial(a, Status.completed)
        writer.on_trial_start(0, [], trial)
        writer.on_trial_result(0, [], trial, _first(a))
        writer.on_trial_result(0, [], trial, _rows(a, 20, 30))
        writer._ckpts[a] = Checkpoint(a, 30, b"final")
        writer.on_trial_complete(0, [], trial)
        writer.flush()
        assert count.n == 6, count.texts
        assert count.texts[0].startswith("UPDATE trials SET") and "RETURNING" in count.texts[0]
        assert not [t for t in count.texts if t.startswith("BEGIN")], count.texts
        assert not [t for t in count.texts if t.startswith("DELETE")], count.texts
        # The ended trial is let go; the other is still this driver's claim.
        held = dict(query(db_url, "SELECT id, claimed_by FROM trials"))
        assert held == {a: None, b: session.owner}
    got = query(
        db_url,
        "SELECT t.status, t.attempts, t.claimed_by, t.host, t.started_at IS NOT NULL, t.heartbeat_at IS NOT NULL, "
        "t.final_step, c.attempt, c.step FROM trials t JOIN trial_checkpoints c ON c.trial_id = t.id "
        "WHERE t.id = :t",
        t=a,
    )
    assert [tuple(r) for r in got] == [("completed", 1, None, "h1", True, True, 30, 1, 30)]
    assert query(db_url, "SELECT attempt, from_step, outcome, host FROM attempts WHERE trial_id = :t", t=a) == [
        (1, None, "completed", "h1")
    ]


def test_a_steady_flush_is_its_ownership_check_with_the_heartbeat_and_the_rows(db_url):
    """Rows of running trials between their start and end (every flush of a long trial):
    two statements, the ownership check that heartbeats the trials still held and the rows.
    A trial another driver took over meanwhile gets neither heartbeat nor rows."""
    with claimed_writer(db_url, 2) as (engine, (a, b), session, writer):
        for tid in (a, b):
            writer.on_trial_start(0, [], _trial(tid))
            writer.on_trial_result(0, [], _trial(tid), _first(tid))
        writer.flush()
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE trials SET heartbeat_at = NULL, updated_at = NULL"))
        count = _Statements(engine)
        writer.on_trial_result(0, [], _trial(a), _rows(a, 20, 30))
        writer.flush()
        assert count.n == 2, count.texts
        assert count.texts[0].startswith("UPDATE trials SET") and "RETURNING" in count.texts[0]
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE trials SET claimed_by = 'other' WHERE id = :t"), {"t": b})
        writer.on_trial_result(0, [], _trial(b), _rows(b, 20))
        writer.flush()  # the driver's next renewal finds the trial taken and stops it
    beats = {
        r.id: (r.hb, r.up)
        for r in query(db_url, "SELECT id, heartbeat_at IS NOT NULL AS hb, updated_at IS NOT NULL AS up FROM trials")
    }
    assert beats == {a: (True, True), b: (False, False)}
    assert query(db_url, "SELECT trial_id, step FROM evals ORDER BY trial_id, step") == [
        (a, 10),
        (a, 20),
        (a, 30),
        (b, 10),
    ]


def test_the_next_claim_shares_the_flushs_transaction_and_sees_its_ends(db_url):
    """The feed's claim runs last in the writer's flush (``flush(then=...)``): one commit for
    the trial that ended and the claim, and the claim sees the end settled."""
    from orchestrator.store import claims

    with claimed_writer(db_url, 1) as (engine, (a,), session, writer):
        commits = _Commits(engine)
        trial = _trial(a, Status.completed)
        writer.on_trial_start(0, [], trial)
        writer.on_trial_result(0, [], trial, _first(a))
        writer.on_trial_complete(0, [], trial)

        def claim(conn):
            status = conn.execute(sa.text("SELECT status FROM trials WHERE id = :t"), {"t": a}).scalar_one()
            return status, claims.claim_batch(conn, session.sid, session.owner, 5, ttl=600)

        status, batch = writer.flush(then=claim)
        assert commits.n == 1
        assert status == "completed" and batch == []  # the sweep's only trial has ended
        assert writer.outcomes[a] == "completed"
        # Nothing buffered: the claim runs in a transaction of its own.
        assert writer.flush(then=claim) == ("completed", []) and commits.n == 2


def test_a_resumed_attempt_read_by_the_flushs_first_statement_closes_the_open_one_and_cuts_the_trace(db_url):
    """Two trials each with an attempt still open (its driver died) and rows, a system row
    and a checkpoint up to step 40; Tune resumes them from their step-20 checkpoints, both
    starts in one flush. The flush's first statement reads each trial's own attempts and
    rows (not another trial's, not another table's ids): each new attempt is number 2, the
    lost one is closed, and only what lies past its own start is deleted."""
    from orchestrator.train.sysmetrics import SAMPLE_FIELDS

    with claimed_writer(db_url, 3) as (engine, (a, b, c), session, writer):
        for tid in (c, a, b):  # attempt ids differ from trial ids: a read must name its trial
            trial = _trial(tid)
            writer.on_trial_start(0, [], trial)
            writer.on_trial_result(0, [], trial, _first(tid))
            writer.on_trial_result(0, [], trial, _rows(tid, 20, 30, 40))
            writer._ckpts[tid] = Checkpoint(tid, 40, b"attempt-1")
            writer.flush()
        writer._system.append({"trial_id": a, "step": 40, **dict.fromkeys(SAMPLE_FIELDS, 1.0)})
        writer.flush()
        count = _Statements(engine)
        # a resumes from 20, b from nothing (its rows all go), c keeps running as it was.
        for tid, start in ((a, 20), (b, None)):
            trial = _trial(tid)
            writer.on_trial_start(0, [], trial)
            writer.on_trial_result(0, [], trial, _first(tid, from_step=start))
        writer.flush()
        assert count.texts[0].startswith("UPDATE trials SET") and "RETURNING" in count.texts[0]
    assert query(db_url, "SELECT trial_id, attempt, from_step, outcome FROM attempts ORDER BY trial_id, attempt") == [
        (a, 1, None, "lost"),
        (a, 2, 20, None),
        (b, 1, None, "lost"),
        (b, 2, None, None),
        (c, 1, None, None),
    ]
    assert query(db_url, "SELECT trial_id, step FROM evals ORDER BY trial_id, step") == [
        (a, 10),
        (a, 20),
        (a, 30),  # attempt 2's first row (from step 20: step 30)
        (b, 10),  # attempt 2's first row
        (c, 10),
        (c, 20),
        (c, 30),
        (c, 40),
    ]
    assert query(db_url, "SELECT trial_id FROM trial_checkpoints ORDER BY trial_id") == [(c,)]
    assert query(db_url, "SELECT COUNT(*) FROM system_metrics WHERE trial_id = :t", t=a) == [(0,)]
    assert query(db_url, "SELECT id, attempts, status FROM trials ORDER BY id") == [
        (a, 2, "running"),
        (b, 2, "running"),
        (c, 1, "running"),
    ]


def test_results_are_stored_at_the_end_of_tunes_step_not_while_the_unit_waits(db_url):
    """Tune sends a unit its next train() (which its report waits for) only after the
    result's callbacks: the writer commits at the step's end instead, once ``flush_s`` has
    passed since its last flush, and not at all when it holds nothing."""
    with claimed_writer(db_url, 1) as (engine, (a,), session, writer):
        writer.flush_s = 0.0
        commits = _Commits(engine)
        writer.on_trial_start(0, [], _trial(a))
        writer.on_trial_result(0, [], _trial(a), _first(a))
        writer.on_trial_result(0, [], _trial(a), _rows(a, 20))
        assert commits.n == 0 and query(db_url, "SELECT COUNT(*) FROM evals")[0][0] == 0
        writer.on_step_end(0, [])
        assert commits.n == 1 and query(db_url, "SELECT step FROM evals ORDER BY step") == [(10,), (20,)]
        writer.on_step_end(0, [])  # nothing taken since
        assert commits.n == 1
        writer.flush_s = 3600.0
        writer.on_trial_result(0, [], _trial(a), _rows(a, 30))
        writer.on_step_end(0, [])  # taken, but its time has not come
        assert commits.n == 1
        writer.flush_s = 0.0
        writer.on_step_end(0, [])  # it has now
        assert commits.n == 2 and query(db_url, "SELECT MAX(step) FROM evals")[0][0] == 30
        # An end with no result after it (the run's last trial) is stored by a step's end too.
        writer.on_trial_complete(0, [], _trial(a, Status.completed))
        assert writer.outcomes.get(a) is None
        writer.on_step_end(0, [])
        assert commits.n == 3 and writer.outcomes[a] == "completed"
