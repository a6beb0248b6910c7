"""SweepStore's written contract, clause by clause, on a real SQLite file and a real
PostgreSQL server: a write lands whole or not at all; a transient error (a connection the
server killed) is retried by calling the function again; a database that is gone is never
written; a read sees committed data only; one store serves many threads at once."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from conftest import POSTGRES_URL, fill_sweep
from orchestrator.store import repo
from orchestrator.store.outage import DatabaseGone, DatabaseUnavailable
from orchestrator.store.sweep_store import SweepStore


def _evals(store: SweepStore) -> int:
    return store.read(lambda c: c.execute(sa.text("SELECT COUNT(*) FROM evals")).scalar_one())


@pytest.fixture
def store(db_url):
    s = SweepStore.open(db_url)
    yield s
    s.dispose()


def test_a_write_lands_whole_or_not_at_all(store):
    _, ids = fill_sweep(store._engine, n_trials=2, n_steps=2)
    before = _evals(store)

    def half(conn) -> None:
        repo.upsert_evals(conn, [{"trial_id": ids["k0"], "step": 500, "acc": 0.5, "loss": 1.0}])
        raise ValueError("the caller's own error, after one row")

    with pytest.raises(ValueError, match="own error"):
        store.write(half)
    assert _evals(store) == before  # rolled back, and not retried (not an outage)
    n = store.write(
        lambda c: repo.upsert_evals(c, [{"trial_id": ids["k0"], "step": s, "acc": 0.5} for s in (600, 700)])
    )
    assert n == 2 and _evals(store) == before + 2


@pytest.mark.skipif(not POSTGRES_URL, reason="ORCH_TEST_POSTGRES_URL not set")
def test_a_killed_connection_is_retried_by_calling_the_function_again(tmp_path):
    from conftest import make_pg_schema_url

    url, drop = make_pg_schema_url()
    store = SweepStore.open(url)
    admin = sa.create_engine(url.split("?")[0])
    try:
        _, ids = fill_sweep(store._engine, n_trials=1, n_steps=1)
        calls: list[int] = []

        def write(conn) -> int:
            calls.append(1)
            if len(calls) == 1:  # the server ends this very session, as a restart would
                pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
                with admin.connect() as a:
                    a.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            return repo.upsert_evals(conn, [{"trial_id": ids["k0"], "step": 900, "acc": 0.25}])

        assert store.write(write, budget_s=30) == 1
        assert len(calls) == 2  # called again from the start on a fresh connection
        assert store.read(lambda c: c.execute(sa.text("SELECT acc FROM evals WHERE step = 900")).all()) == [(0.25,)]
        # Without a budget the same error is an outage at once (exit 75), nothing written.
        calls.clear()

        def once(conn) -> None:
            pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            with admin.connect() as a:
                a.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            repo.upsert_evals(conn, [{"trial_id": ids["k0"], "step": 901, "acc": 0.5}])

        with pytest.raises(DatabaseUnavailable) as e:
            store.write(once, budget_s=0)
        assert e.value.exit_code == 75
        assert store.read(lambda c: c.execute(sa.text("SELECT COUNT(*) FROM evals WHERE step = 901")).scalar_one()) == 0
    finally:
        store.dispose()
        admin.dispose()
        drop()


def test_a_deleted_sqlite_file_is_never_written_again(tmp_path):
    path = tmp_path / "s.db"
    store = SweepStore.open(str(path))
    _, ids = fill_sweep(store._engine, n_trials=1, n_steps=1)
    store.check()
    calls: list[int] = []
    path.unlink()
    with pytest.raises(DatabaseGone, match="was deleted") as e:
        store.write(lambda c: calls.append(1))
    assert e.value.exit_code == 74
    assert calls == [] and not path.exists()  # nothing ran, and no new file was made
    with pytest.raises(DatabaseGone):
        store.read(lambda c: calls.append(1))
    assert calls == []
    store.dispose()


def test_a_read_sees_committed_rows_only(store):
    _, ids = fill_sweep(store._engine, n_trials=1, n_steps=1)
    before = _evals(store)
    inside, release = threading.Event(), threading.Event()

    def slow_write(conn) -> None:
        repo.upsert_evals(conn, [{"trial_id": ids["k0"], "step": s, "acc": 0.5} for s in range(100, 110)])
        inside.set()
        assert release.wait(30)

    t = threading.Thread(target=store.write, args=(slow_write,))
    t.start()
    try:
        assert inside.wait(30)
        assert _evals(store) == before  # the open transaction's rows are not seen
    finally:
        release.set()
        t.join(30)
    assert _evals(store) == before + 10


def test_one_store_serves_many_threads_at_once(store):
    _, ids = fill_sweep(store._engine, n_trials=1, n_steps=1)
    before = _evals(store)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for j in range(5):
                row = {"trial_id": ids["k0"], "step": 1000 + 10 * i + j, "acc": 0.1}
                store.write(lambda c, row=row: repo.upsert_evals(c, [row]))
                _evals(store)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert _evals(store) == before + 40
