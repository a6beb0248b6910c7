"""Per-trial claims of many drivers on one sweep (store/claims.py, migration 0008), on SQLite
and PostgreSQL, no Ray: concurrent claimers (threads, each with its own engine) never get
the same trial and together get every one; a dead driver's claims lapse after the TTL on
the database clock and are taken over (its running trial back to pending, its open attempt
lost) while a live one's are not; an exclusive step (the sweep's lease) holds claims off;
cancel flags only live drivers; --takeover ends the others; a resume leaves trials a live
driver holds alone. tests/test_join.py runs real drivers."""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

from conftest import claimed_writer, fill_sweep, pass_time, query
from orchestrator.store import attempts, claims, lease, repo
from orchestrator.store.engine import make_engine, open_store_engine
from orchestrator.store.outage import write_with_retry


def _sweep_with_drivers(db_url: str, n_trials: int, drivers: dict[str, str]) -> tuple[sa.engine.Engine, int, dict]:
    """A store holding a sweep of ``n_trials`` trials (:func:`fill_sweep`, one eval each) and
    ``drivers`` ({owner: command}) registered on it, in that order: (engine, sweep id,
    {key: trial id})."""
    engine, _ = open_store_engine(db_url)
    sid, ids = fill_sweep(engine, n_trials=n_trials, n_steps=1)
    with engine.begin() as conn:
        for owner, command in drivers.items():
            claims.register(conn, sid, owner, command=command)
    return engine, sid, ids


def test_concurrent_claimers_never_get_the_same_trial(db_url):
    owners = [f"driver{i}" for i in range(6)]
    engine, sid, ids = _sweep_with_drivers(db_url, 40, dict.fromkeys(owners, "join"))
    got: dict[str, list[int]] = {o: [] for o in owners}
    errors: list[str] = []
    barrier = threading.Barrier(len(owners))

    def claimer(owner: str) -> None:
        eng = make_engine(db_url)
        try:
            barrier.wait()
            while True:
                batch = write_with_retry(eng, lambda c: claims.claim_batch(c, sid, owner, 3, ttl=60), budget_s=60)
                if not batch:
                    return
                got[owner] += [tid for tid, _, _ in batch]
                time.sleep(0.02)  # "runs" its batch: the others get their turn, as drivers would
        except Exception as exc:  # every failure counts
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            eng.dispose()

    threads = [threading.Thread(target=claimer, args=(o,)) for o in owners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    claimed = [tid for tids in got.values() for tid in tids]
    assert sorted(claimed) == sorted(ids.values())  # every trial once, none twice
    assert sum(1 for tids in got.values() if tids) >= 2
    with engine.connect() as conn:
        stored = dict(conn.execute(sa.text("SELECT id, claimed_by FROM trials")).all())
    assert stored == {tid: o for o, tids in got.items() for tid in tids}
    engine.dispose()


def test_a_dead_drivers_claims_lapse_and_are_taken_over(db_url):
    engine, sid, ids = _sweep_with_drivers(db_url, 4, {"A": "submit", "B": "join"})
    with engine.begin() as conn:
        mine = [tid for tid, _, _ in claims.claim_batch(conn, sid, "A", 2, ttl=2)]
    assert mine == sorted(ids.values())[:2]
    with engine.begin() as conn:
        repo.mark_running(conn, mine[0])
        attempts.begin_attempt(conn, mine[0], None, {}, "A")
    with engine.begin() as conn:
        theirs = [tid for tid, _, _ in claims.claim_batch(conn, sid, "B", 10, ttl=60)]
    assert theirs == sorted(ids.values())[2:]
    with engine.begin() as conn:
        assert claims.claim_batch(conn, sid, "B", 10, ttl=60) == []
        assert claims.held_elsewhere(conn, sid, "B") == 2
        # A resume's release leaves a live driver's running trial alone.
        assert repo.release_unfinished(conn, sid) == 0
        listed = {d.owner: (d.claimed, d.running, d.live) for d in claims.drivers(conn, sid, ttl=60)}
    assert listed == {"A": (2, 1, True), "B": (2, 0, True)}
    pass_time(engine, 3.2)  # past A's claims' expiry on the database clock: A is dead
    with engine.begin() as conn:
        taken = [tid for tid, _, _ in claims.claim_batch(conn, sid, "B", 10, ttl=60)]
    assert taken == mine
    with engine.connect() as conn:
        status = dict(conn.execute(sa.text("SELECT id, status FROM trials")).all())
        outcome = conn.execute(sa.text("SELECT outcome FROM attempts")).scalar_one()
    assert status[mine[0]] == "pending" and outcome == attempts.LOST
    with engine.begin() as conn:
        # A wakes up: it learns that the trial it ran is another driver's now.
        renewal = claims.renew(conn, "A", ttl=60, running=[mine[0]])
        assert renewal.alive and renewal.lost == (mine[0],) and not renewal.cancel
        # An exclusive step (a design write under the sweep's lease) holds claims off.
        claims.end(conn, "B", "finished")
        assert lease.claim(conn, sid, "A", ttl=60)
        assert claims.claim_batch(conn, sid, "B", 10, ttl=60) is None
        lease.release(conn, sid, "A")
        assert len(claims.claim_batch(conn, sid, "C", 10, ttl=60) or []) == 4
    engine.dispose()


def test_a_driver_never_takes_its_own_lapsed_trial_as_an_orphan(db_url):
    """A renewal starved past the TTL (a loaded machine) lets this driver's own claims lapse:
    its next claim must not take the trial it is running as a dead driver's (back to pending,
    attempt lost: a stop then found nothing to mark interrupted). Another driver still may."""
    engine, sid, ids = _sweep_with_drivers(db_url, 3, {"A": "submit", "B": "join"})
    with engine.begin() as conn:
        mine = [tid for tid, _, _ in claims.claim_batch(conn, sid, "A", 1, ttl=2)]
        repo.mark_running(conn, mine[0])
        attempts.begin_attempt(conn, mine[0], None, {}, "A")
    pass_time(engine, 3.2)  # A's claim lapses on the database clock
    with engine.begin() as conn:
        again = [tid for tid, _, _ in claims.claim_batch(conn, sid, "A", 10, ttl=60)]
    assert mine[0] not in again and sorted(again) == sorted(set(ids.values()) - set(mine))
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT status, claimed_by FROM trials WHERE id = :i"), {"i": mine[0]}).one()
        open_attempts = conn.execute(sa.text("SELECT COUNT(*) FROM attempts WHERE ended_at IS NULL")).scalar_one()
    assert tuple(row) == ("running", "A") and open_attempts == 1
    with engine.begin() as conn:  # the stop marks it interrupted, as it runs here
        assert claims.interrupt(conn, owner="A") == 1
        repo.mark_running(conn, mine[0])
    pass_time(engine, 3.2)
    with engine.begin() as conn:  # a lapsed claim is still another driver's to take over
        assert [tid for tid, _, _ in claims.claim_batch(conn, sid, "B", 10, ttl=60)] == mine
    engine.dispose()


def test_cancel_flags_live_drivers_and_takeover_ends_them(db_url):
    engine, sid, _ = _sweep_with_drivers(db_url, 2, {"A": "join", "B": "join", "gone": "join"})
    with engine.begin() as conn:
        claims.end(conn, "gone", "finished")
        claims.claim_batch(conn, sid, "A", 1, ttl=60)
    with engine.begin() as conn:
        assert claims.request_cancel(conn, sid, ttl=60) == 2
        assert claims.renew(conn, "A", ttl=60).cancel
    with engine.begin() as conn:  # a driver started after the cancel is not flagged
        claims.register(conn, sid, "late", command="join")
        assert not claims.renew(conn, "late", ttl=60).cancel
        assert claims.take_over(conn, sid, "late", ttl=60) == 2
        assert not claims.renew(conn, "A", ttl=60).alive  # A stops: the sweep was taken over
        # A's claim was freed with it.
        assert [t for t, _, _ in claims.claim_batch(conn, sid, "late", 10, ttl=60) or []] == [1, 2]
        live = [d.owner for d in claims.drivers(conn, sid, ttl=60, live_only=True)]
        reasons = dict(conn.execute(sa.text("SELECT owner, end_reason FROM drivers")).all())
    assert live == ["late"]
    assert reasons == {"A": claims.TAKEN_OVER, "B": claims.TAKEN_OVER, "gone": "finished", "late": None}
    engine.dispose()


def test_a_dead_driver_on_this_host_is_reaped_at_once(db_url):
    """A driver starting here frees a dead local driver's claims without waiting out the TTL."""
    engine, sid, ids = _sweep_with_drivers(db_url, 3, {"dead": "submit", "alive": "join"})
    with engine.begin() as conn:
        claims.claim_batch(conn, sid, "dead", 2, ttl=600)
        claims.claim_batch(conn, sid, "alive", 1, ttl=600)
        conn.execute(sa.text("UPDATE drivers SET pid = 999999999 WHERE owner = 'dead'"))
    with engine.begin() as conn:
        assert claims.reap_dead(conn, sid, alive=lease.pid_alive) == 1
        got = [tid for tid, _, _ in claims.claim_batch(conn, sid, "new", 10, ttl=60) or []]
        reasons = dict(conn.execute(sa.text("SELECT owner, end_reason FROM drivers")).all())
    assert got == sorted(ids.values())[:2]
    assert reasons == {"dead": "died", "alive": None}
    engine.dispose()


def test_join_refuses_an_unknown_sweep(tmp_path, capsys):
    """One line, exit 2, before Ray starts or anything is written."""
    from orchestrator.cli import main

    db = str(tmp_path / "j.db")
    engine, _ = open_store_engine(db)
    capsys.readouterr()
    assert main(["join", "nope", "--db", db, "-q"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "no sweep named 'nope'" in err[0]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM drivers")).scalar_one() == 0
    engine.dispose()


def test_a_cut_off_driver_writes_nothing_for_a_trial_taken_over(db_url):
    """A driver whose claim lapsed (cut off from the database longer than the TTL) and whose
    trial another driver took over meanwhile: its writer's next flush stores its rows and
    checkpoint for the trials it still holds, and nothing for the one taken over."""
    from orchestrator.runner.messages import Checkpoint, EvalRow
    from orchestrator.train.loop import EvalPoint

    with claimed_writer(db_url, 2, n_steps=1) as (engine, (mine, taken), session, writer):
        with engine.begin() as conn:
            # The other driver's claim on the lapsed trial (claim_batch's UPDATE, as it makes it).
            conn.execute(sa.text("UPDATE trials SET claimed_by = 'other' WHERE id = :t"), {"t": taken})
        writer._rows += [EvalRow(t, EvalPoint(50, 0.5, 1.0, 1.0, 1e-3, 9.0)) for t in (mine, taken)]
        writer._ckpts = {t: Checkpoint(t, 50, b"state") for t in (mine, taken)}
        writer.flush()
        assert writer.rows_written == 1 and not writer._rows and not writer._ckpts
    assert query(db_url, "SELECT trial_id FROM evals WHERE step = 50") == [(mine,)]
    assert query(db_url, "SELECT trial_id FROM trial_checkpoints") == [(mine,)]


def test_a_cut_off_driver_keeps_nothing_alive_of_a_trial_taken_over(db_url):
    """The trials a cut-off driver still thinks it runs, once its link is back: one taken over
    and still running elsewhere, one taken over and already ended and let go (no claim). Its
    renewal heartbeats neither (only the one it holds), and its writes hold neither."""
    engine, sid, ids = _sweep_with_drivers(db_url, 3, {"A": "join"})
    mine, elsewhere, ended = sorted(ids.values())
    with engine.begin() as conn:
        assert len(claims.claim_batch(conn, sid, "A", 3, ttl=600) or []) == 3
        conn.execute(sa.text("UPDATE trials SET status = 'running', heartbeat_at = NULL"))
        conn.execute(sa.text("UPDATE trials SET claimed_by = 'B' WHERE id = :t"), {"t": elsewhere})
        conn.execute(sa.text("UPDATE trials SET claimed_by = NULL, status = 'completed' WHERE id = :t"), {"t": ended})
    statements: list[str] = []

    def count(conn, cursor, statement, *args):
        statements.append(statement)

    sa.event.listen(engine, "before_cursor_execute", count)
    with engine.begin() as conn:
        got = claims.renew(conn, "A", ttl=600, running=[mine])
        assert (got.alive, got.cancel, got.lost) == (True, False, ())
        # Every running trial held: three statements (the driver, its claims, the heartbeat).
        assert len(statements) == 3, statements
        got = claims.renew(conn, "A", ttl=600, running=[mine, elsewhere, ended])
        assert len(statements) == 3 + 4, statements[3:]  # and one read of those not held
        sa.event.remove(engine, "before_cursor_execute", count)
        assert got.lost == (elsewhere,)
        assert claims.taken_from(conn, "A", [mine, elsewhere, ended]) == {elsewhere, ended}
    with engine.connect() as conn:
        beat = dict(conn.execute(sa.text("SELECT id, heartbeat_at IS NOT NULL FROM trials")).all())
    assert {t: bool(b) for t, b in beat.items()} == {mine: True, elsewhere: False, ended: False}
    engine.dispose()


def test_an_attempts_provenance_is_cut_to_its_columns(db_url):
    # A long `git describe` or host name is kept to its column's length on every backend
    # (PostgreSQL refuses a longer value: the attempt, and the trial with it, would fail).
    engine, _ = open_store_engine(db_url)
    sid, ids = fill_sweep(engine, n_trials=1, n_steps=1)
    tid = next(iter(ids.values()))
    env = {"code_version": "v" * 200, "host": "h" * 300, "precision": "float32-long"}
    with engine.begin() as conn:
        attempts.begin_attempt(conn, tid, None, env, "A")
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT code_version, host, precision FROM attempts")).one()
    assert tuple(row) == ("v" * 80, "h" * 255, "float32-")
    engine.dispose()
