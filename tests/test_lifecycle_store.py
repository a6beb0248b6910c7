"""The lifecycle's store side on SQLite and PostgreSQL: the 0003 migration keeps data,
leases are exclusive (a race of claimers has exactly one winner), expire on the database
clock and free a dead holder's sweep; stale trials are shown as stale; delete removes a
sweep whole and refuses a leased one. No Ray here (tests/test_lifecycle.py runs sweeps)."""

from __future__ import annotations

import json
import os
import threading

import pytest
import sqlalchemy as sa

from conftest import fill_sweep, migrate, old_database, pass_time, rows_of, upgrade_keeps_rows
from orchestrator.cli import main
from orchestrator.store import lease, repo
from orchestrator.store.engine import make_engine, open_store_engine


def test_lifecycle_migration_keeps_data(db_url):
    """A database written at 0002 upgrades through 0003 to head with every row intact; the new statuses
    are accepted after, and a downgrade back to 0002 keeps the rows too."""
    engine = old_database(
        db_url,
        "0002_step_lr",
        "INSERT INTO trials (sweep_id, key, params, status, steps) VALUES "
        "(1, 'a', '{}', 'running', 20), (1, 'b', '{}', 'completed', 20)",
        "INSERT INTO trial_params (trial_id, name, value_num) VALUES (1, 'seed', 0), (2, 'seed', 1)",
        "INSERT INTO evals (trial_id, step, acc, step_lr) VALUES "
        "(1, 10, 0.5, 0.001), (2, 10, 0.25, 0.001), (2, 20, 0.75, 0.0005)",
    )

    queries = (
        "SELECT id, key, status, steps FROM trials ORDER BY id",
        "SELECT trial_id, step, acc, step_lr FROM evals ORDER BY trial_id, step",
        "SELECT trial_id, name, value_num FROM trial_params ORDER BY trial_id",
        "SELECT trial_id, step, acc FROM trial_trace ORDER BY trial_id, step",
    )
    before = upgrade_keeps_rows(engine, db_url, *queries)  # through 0003_lifecycle (and later)
    with engine.connect() as conn:
        # The stored spec became version 1, the creator of the existing trials.
        assert conn.execute(sa.text("SELECT sweep_id, version, spec_text, spec_hash FROM sweep_specs")).all() == [
            (1, 1, "t", "h")
        ]
        assert conn.execute(sa.text("SELECT DISTINCT spec_version FROM trials")).all() == [(1,)]
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE trials SET status = 'interrupted' WHERE key = 'a'"))
        conn.execute(sa.text("INSERT INTO trial_errors (trial_id, kind, error) VALUES (1, 'config', 'x')"))
        with pytest.raises(sa.exc.IntegrityError):
            with conn.begin_nested():
                conn.execute(sa.text("UPDATE trials SET status = 'bogus' WHERE key = 'b'"))
    migrate(engine, "0002_step_lr", down=True)
    after = rows_of(engine, *queries)
    assert after[1:] == before[1:]
    assert [tuple(r) for r in after[0]] == [(1, "a", "pending", 20), (2, "b", "completed", 20)]
    engine.dispose()


def test_lease_is_exclusive_expires_and_frees_a_dead_holder(db_url, monkeypatch):
    engine, _ = open_store_engine(db_url)
    sid, _ = fill_sweep(engine)
    with engine.begin() as conn:
        assert lease.claim(conn, sid, "A", ttl=2)
    with engine.begin() as conn:
        assert not lease.claim(conn, sid, "B", ttl=60)
        held = lease.holder(conn, sid)
    assert held.owner == "A" and held.pid == os.getpid() and not held.expired
    with engine.begin() as conn:  # --takeover: taken from a live holder, who loses it
        assert lease.claim(conn, sid, "T", ttl=60, force=True)
        assert not lease.renew(conn, sid, "A", ttl=2)
        assert lease.holder(conn, sid).owner == "T"
        conn.execute(sa.text("UPDATE sweeps SET lease_owner = 'A'"))
        assert lease.renew(conn, sid, "A", ttl=2)
    pass_time(engine, 3.2)  # past A's expiry on the database clock
    with engine.begin() as conn:
        assert lease.holder(conn, sid).expired
        assert lease.claim(conn, sid, "B", ttl=60)
        held = lease.renew(conn, sid, "A", ttl=60)
    assert not held  # A lost it
    # A holder whose process is gone on this host is free at once, TTL or not.
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE sweeps SET lease_pid = 999999999"))
    with engine.begin() as conn:
        h = lease.holder(conn, sid)
        assert h.expired
        assert lease.claim(conn, sid, "C", ttl=60, dead_owner=h.owner)
    with engine.begin() as conn:
        assert lease.renew(conn, sid, "C", ttl=60)
        lease.release(conn, sid, "C")
        assert lease.holder(conn, sid) is None
    engine.dispose()


def test_racing_claimers_have_exactly_one_winner(db_url):
    engine, _ = open_store_engine(db_url)
    sid, _ = fill_sweep(engine)
    engine.dispose()
    n = 8
    barrier = threading.Barrier(n)
    wins: list[str] = []

    def claimer(i: int) -> None:
        eng = make_engine(db_url)
        try:
            barrier.wait()
            with eng.begin() as conn:
                if lease.claim(conn, sid, f"owner{i}", ttl=60):
                    wins.append(f"owner{i}")
        finally:
            eng.dispose()

    for _ in range(3):
        wins.clear()
        with make_engine(db_url).begin() as conn:
            conn.execute(sa.text("UPDATE sweeps SET lease_owner = NULL"))
        threads = [threading.Thread(target=claimer, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1
        with make_engine(db_url).connect() as conn:
            assert conn.execute(sa.text("SELECT lease_owner FROM sweeps")).scalar_one() == wins[0]


def test_running_trial_without_heartbeat_is_stale(db_url, monkeypatch, capsys):
    monkeypatch.setenv("ORCH_LEASE_TTL_S", "2")
    engine, _ = open_store_engine(db_url)
    sid, ids = fill_sweep(engine)
    with engine.begin() as conn:
        repo.mark_running(conn, ids["k0"])
        repo.mark_running(conn, ids["k1"])
    pass_time(engine, 3.2)
    with engine.begin() as conn:
        lease.heartbeat(conn, [ids["k1"]])  # k1's driver is alive, k0's is not
    assert main(["status", "s1", "--db", db_url, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)["sweeps"][0]
    assert st["counts"]["stale"] == 1 and st["counts"]["running"] == 1
    assert st["eta_s"] is None  # no driver holds the sweep: no ETA for a dead run
    assert main(["ls", "--db", db_url]) == 0
    assert "1 stale" in capsys.readouterr().out
    # The analysis leaves running trials out and says so, naming the stale one.
    from orchestrator.analysis.data import load_sweep

    data = load_sweep(engine, "s1")
    assert (data.running, data.stale, len(data.trials)) == (2, 1, 0)
    assert data.unfinished_note().startswith("2 trial(s) still running, 1 of them stale")
    assert load_sweep(engine, "s1", statuses=["running"]).unfinished_note() is None
    # cancel with no live driver: the leftovers become interrupted, and resume would run them.
    assert main(["cancel", "s1", "--db", db_url]) == 0
    with engine.connect() as conn:
        assert sorted(conn.execute(sa.text("SELECT status FROM trials")).scalars()) == [
            "interrupted",
            "interrupted",
            "pending",
        ]
        assert len(repo.unfinished_trials(conn, sid)) == 3
    engine.dispose()


def test_status_counts_failed_as_failed_not_as_steps_done(db_url, capsys):
    engine, _ = open_store_engine(db_url)
    sid, ids = fill_sweep(engine, n_steps=2)  # each trial: steps 20, evals at 10 and 20
    with engine.begin() as conn:
        repo.finish_trial(conn, ids["k0"], "completed")
        conn.execute(
            sa.text("DELETE FROM evals WHERE trial_id IN (:a, :b) AND step = 20"), {"a": ids["k1"], "b": ids["k2"]}
        )
        repo.finish_trial(conn, ids["k1"], "failed", "ValueError: x")
    assert main(["status", "s1", "--db", db_url, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)["sweeps"][0]
    # completed 20 of 20 + failed at 10 of 20 + pending 10 of 20: the failed trial's unrun
    # steps are not done (a sweep with a failed trial is never "100% of steps").
    assert st["progress"] == pytest.approx(40 / 60)
    assert st["counts"]["failed"] == 1 and st["failed"][0]["error"] == "ValueError: x"
    with engine.begin() as conn:
        repo.finish_trial(conn, ids["k2"], "completed")
    assert main(["status", "s1", "--db", db_url]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert "failed 1" in line and "83% of steps" in line  # (20 + 10 + 20) / 60
    # The analyses leave the failed trial out, and say so.
    assert main(["analyze", "s1", "lockin", "--db", db_url]) == 0
    err = capsys.readouterr().err
    assert "the sweep's 1 failed trial(s)" in err and "are not in this analysis" in err
    assert main(["analyze", "s1", "lockin", "--db", db_url, "--statuses", "all"]) == 0
    assert "failed trial" not in capsys.readouterr().err
    engine.dispose()


def test_delete_removes_everything_and_refuses_bad_input(db_url, tmp_path, capsys):
    engine, _ = open_store_engine(db_url)
    sid, ids = fill_sweep(engine, "gone")
    fill_sweep(engine, "kept")
    with engine.begin() as conn:
        repo.add_trial_error(conn, ids["k0"], "runtime", "E: x", "Traceback...")
        repo.record_spec_version(conn, sid, "name: gone", "h1")
        repo.record_spec_version(conn, sid, "name: gone\n# v2", "h2")

    def counts():
        with engine.connect() as conn:
            return tuple(
                conn.execute(sa.text(f"SELECT COUNT(*) FROM {t}")).scalar_one()
                for t in ("sweeps", "trials", "trial_params", "evals", "trial_errors", "sweep_specs")
            )

    full = counts()
    assert full == (2, 6, 60, 24, 1, 2)  # 10 parameters a trial
    # Unknown sweep, no --yes (stdin is not a terminal), leased: one line, exit 2, no change.
    assert main(["delete", "nope", "--db", db_url, "--yes"]) == 2
    assert main(["cancel", "nope", "--db", db_url]) == 2
    assert main(["resume", "nope", "--db", db_url]) == 2
    assert main(["delete", "gone", "--db", db_url]) == 2
    with engine.begin() as conn:
        assert lease.claim(conn, sid, "live-driver", ttl=60)
    assert main(["delete", "gone", "--db", db_url, "--yes"]) == 2
    err = capsys.readouterr().err
    assert "no sweep named 'nope'" in err and "--yes" in err and "is being run by" in err
    assert counts() == full
    with engine.begin() as conn:
        lease.release(conn, sid, "live-driver")
    assert main(["delete", "gone", "--db", db_url, "--yes"]) == 0
    assert counts() == (1, 3, 30, 12, 0, 0)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT name FROM sweeps")).scalar_one() == "kept"
    engine.dispose()


def test_design_diff_supersedes_and_revives(db_url):
    """A re-submitted spec's trials against the stored ones: added, dropped (superseded:
    kept, never run again) and brought back; spec versions numbered, one per distinct text."""
    engine, _ = open_store_engine(db_url)
    old = [(f"k{i}", {"arm": "a", "task": "mqar", "seed": i, "steps": 200}) for i in range(3)]
    new = [(f"n{i}", {"arm": "a", "task": "mqar", "seed": i, "steps": 100}) for i in range(3)]
    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, "d", "v1", "h1")
        assert repo.design_diff(conn, sid, old).first
        assert repo.record_spec_version(conn, sid, "v1", "h1") == 1
        repo.add_trials(conn, sid, old, spec_version=1)
        assert not repo.design_diff(conn, sid, old).changed
        assert repo.record_spec_version(conn, sid, "v1", "h1") == 1  # same text: same version
        diff = repo.design_diff(conn, sid, new)
        assert diff.changed and sorted(diff.added) == ["n0", "n1", "n2"]
        assert sorted(diff.superseded) == ["k0", "k1", "k2"]
        assert diff.changes == ["steps: 200 -> 100"]
        assert diff.summary() == "3 trial(s) added, 3 superseded (steps: 200 -> 100)"
        assert repo.record_spec_version(conn, sid, "v2", "h2") == 2
        repo.apply_design(conn, sid, diff)
        repo.add_trials(conn, sid, new, spec_version=2)
        todo = {k for _, k, _ in repo.unfinished_trials(conn, sid)}
        assert todo == {"n0", "n1", "n2"}  # superseded trials are never run
        back = repo.design_diff(conn, sid, old)
        assert sorted(back.revived) == ["k0", "k1", "k2"] and sorted(back.superseded) == ["n0", "n1", "n2"]
        repo.apply_design(conn, sid, back)
        rows = dict(conn.execute(sa.text("SELECT key, status FROM trials")).all())
        versions = dict(conn.execute(sa.text("SELECT key, spec_version FROM trials")).all())
    assert rows == {
        "k0": "pending",
        "k1": "pending",
        "k2": "pending",
        "n0": "superseded",
        "n1": "superseded",
        "n2": "superseded",
    }
    assert versions == {"k0": 1, "k1": 1, "k2": 1, "n0": 2, "n1": 2, "n2": 2}
    engine.dispose()


def _columns(engine, table: str) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns(table)}


def test_one_protocol_migration_from_0009_drops_the_dead_columns_and_keeps_every_row(db_url):
    """A database at 0009 (the first with drivers) upgrades to head: the sweep-level cancel
    flag and ``drivers.exclusive`` are gone, the driver's own cancel flag and every row stay;
    a downgrade to 0012 brings the columns back empty and an upgrade drops them again."""
    engine = old_database(
        db_url,
        "0009_drivers",
        "UPDATE sweeps SET cancel_requested_at = CURRENT_TIMESTAMP",
        "INSERT INTO trials (sweep_id, key, params, status, steps) VALUES (1, 'a', '{}', 'running', 20)",
        "INSERT INTO drivers (sweep_id, owner, command, exclusive, cancel_requested_at) "
        "VALUES (1, 'd1', 'join', true, CURRENT_TIMESTAMP)",
    )
    assert {"cancel_requested_at"} <= _columns(engine, "sweeps") and "exclusive" in _columns(engine, "drivers")

    queries = (
        "SELECT id, name, spec_hash FROM sweeps",
        "SELECT id, key, status FROM trials",
        # The driver's own cancel flag survives: it is the one that is read.
        "SELECT owner, command, cancel_requested_at IS NOT NULL FROM drivers",
    )
    before = upgrade_keeps_rows(engine, db_url, *queries)  # at head, rows unchanged
    engine.dispose()
    assert "cancel_requested_at" not in _columns(engine, "sweeps")
    assert "exclusive" not in _columns(engine, "drivers")
    assert rows_of(engine, *queries) == before
    migrate(engine, "0012_system_slurm", down=True)
    engine.dispose()
    assert "cancel_requested_at" in _columns(engine, "sweeps") and "exclusive" in _columns(engine, "drivers")
    assert rows_of(engine, *queries) == before
    migrate(engine, "head")
    engine.dispose()
    assert "exclusive" not in _columns(engine, "drivers")
    engine.dispose()
