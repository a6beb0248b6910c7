"""The store on SQLite and PostgreSQL: migrations, models == migrations, upserts, views,
the schema gate, and read-only SQL."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from conftest import fill_sweep, old_database
from orchestrator.cli import main
from orchestrator.errors import UserError
from orchestrator.store import repo
from orchestrator.store.engine import (
    VERSION_TABLE,
    current_revision,
    ensure_schema,
    head_revision,
    make_engine,
    open_store_engine,
)
from orchestrator.store.models import Base, Trial
from orchestrator.store.readonly import readonly_query


def test_migrate_empty_to_head_and_models_match(db_url):
    engine = make_engine(db_url)
    assert current_revision(engine) is None
    ensure_schema(engine, db_url)
    assert current_revision(engine) == head_revision()
    insp = sa.inspect(engine)
    assert {"sweeps", "trials", "trial_params", "evals", VERSION_TABLE} <= set(insp.get_table_names())
    assert {"trial_trace", "trial_final"} <= set(insp.get_view_names())
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": VERSION_TABLE})
        diff = [
            d
            for d in compare_metadata(ctx, Base.metadata)
            if not (d[0] == "remove_table" and d[1].name == VERSION_TABLE)
        ]
    assert diff == []


def test_upserts_are_idempotent_and_views_answer(db_url):
    engine, _ = open_store_engine(db_url)
    sid, ids = fill_sweep(engine)
    with engine.begin() as conn:
        # Re-reporting a step rewrites it; it never duplicates it.
        repo.upsert_evals(conn, [{"trial_id": ids["k0"], "step": 40, "acc": 0.99, "loss": 0.1}])
        again = repo.add_trials(
            conn, sid, [("k0", {"arm": "x", "task": "y"}), ("k9", {"arm": "armed_gdn", "task": "mqar", "seed": 9})]
        )
        assert again["k0"] == ids["k0"] and again["k9"] not in ids.values()
        repo.finish_trial(conn, ids["k0"], "completed")
    with engine.connect() as conn:
        n = conn.execute(sa.text("SELECT COUNT(*) FROM evals WHERE trial_id = :t"), {"t": ids["k0"]}).scalar_one()
        assert n == 4
        final = conn.execute(sa.text("SELECT final_step, final_acc, best_acc FROM trial_final WHERE key = 'k0'")).one()
        assert (final.final_step, final.final_acc, final.best_acc) == (40, 0.99, 0.99)
        trace = conn.execute(
            sa.text("SELECT step, acc FROM trial_trace WHERE sweep = 's1' AND seed = 1 ORDER BY step")
        ).all()
        assert [r.step for r in trace] == [10, 20, 30, 40]
        t = conn.execute(sa.text("SELECT status, final_acc FROM trials WHERE key='k0'")).one()
        assert t.status == "completed" and t.final_acc == 0.99
        knob = conn.execute(
            sa.text("SELECT COUNT(*) FROM trial_params WHERE name = 'task.K' AND value_num = 16")
        ).scalar_one()
        assert knob == 3
        label = conn.execute(sa.text("SELECT value_text FROM trial_params WHERE name = 'tag.v' LIMIT 1")).scalar_one()
        assert label == "x"


def test_old_schema_is_refused_with_upgrade_hint(db_url):
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL)"))
        conn.execute(sa.text(f"INSERT INTO {VERSION_TABLE} VALUES ('0001_initial')"))
    with pytest.raises(UserError, match="run `orchestrator db upgrade"):
        ensure_schema(engine, db_url)
    # A revision this code does not know is not "older": upgrading would not help.
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '0000_unknown'"))
    with pytest.raises(UserError, match="does not know"):
        ensure_schema(engine, db_url)


WRITES = [
    "DELETE FROM evals",
    "UPDATE trials SET status = 'failed'",
    "INSERT INTO sweeps (name, spec_text, spec_hash) VALUES ('x', 'y', 'z')",
    "DROP TABLE evals",
    "SELECT 1; DELETE FROM evals",
    "CREATE TABLE x (a int)",
    "ATTACH DATABASE '/tmp/evil.db' AS evil",
    "PRAGMA journal_mode = DELETE",
    "PRAGMA user_version = 7",
    "WITH d AS (DELETE FROM evals RETURNING *) SELECT * FROM d",
    "/* sneaky */ DELETE FROM evals",
]


def _snapshot(engine):
    with engine.connect() as conn:
        return (
            conn.execute(sa.text("SELECT COUNT(*) FROM evals")).scalar_one(),
            conn.execute(sa.text("SELECT COUNT(*) FROM sweeps")).scalar_one(),
            sorted(sa.inspect(engine).get_table_names()),
            conn.execute(sa.text("SELECT status FROM trials ORDER BY id")).scalars().all(),
        )


def test_sql_is_read_only(db_url):
    engine, url = open_store_engine(db_url)
    fill_sweep(engine)
    before = _snapshot(engine)
    got = readonly_query(url, "SELECT arm, COUNT(*) AS n FROM trial_final GROUP BY arm ORDER BY arm")
    cols, rows = got.columns, got.rows
    assert cols == ["arm", "n"] and [tuple(r) for r in rows] == [("armed_gdn", 1), ("gated_deltanet", 2)]
    for stmt in WRITES:
        with pytest.raises(UserError):
            readonly_query(url, stmt)
    assert _snapshot(engine) == before


def test_sql_command_csv_and_refusal(db_url, capsys):
    engine, url = open_store_engine(db_url)
    fill_sweep(engine)
    assert (
        main(["sql", "SELECT key, step, acc FROM trial_trace WHERE key = 'k2' ORDER BY step", "--db", url, "--csv"])
        == 0
    )
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "key,step,acc" and len(out) == 5 and out[1].startswith("k2,10,")
    assert main(["sql", "DELETE FROM evals", "--db", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "read-only" in err[0]


def test_db_upgrade_command(db_url, capsys):
    assert main(["db", "upgrade", "--db", db_url]) == 0
    assert head_revision() in capsys.readouterr().out
    assert current_revision(make_engine(db_url)) == head_revision()


def test_ls_and_status_commands(db_url, capsys):
    engine, url = open_store_engine(db_url)
    fill_sweep(engine)
    assert main(["ls", "--db", url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["name"] == "s1" and rows[0]["trials"] == 3
    assert main(["status", "s1", "--db", url, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)["sweeps"][0]
    assert st["counts"]["pending"] == 3
    assert {r["value"] for r in st["axes"]["arm"]} == {"armed_gdn", "gated_deltanet"}
    assert main(["status", "nope", "--db", url]) == 2


def test_step_lr_migration_keeps_data(db_url):
    """A database written at 0001 (evals.lr) upgrades to head with every eval value under
    evals.step_lr, and the trace view still calls it step_lr."""

    engine = old_database(db_url, "0001_initial")
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO trials (sweep_id, key, params, lr) VALUES (1, 'k', '{}', 0.003)"))
        conn.execute(
            sa.text("INSERT INTO evals (trial_id, step, acc, lr) VALUES (1, 1, 0.5, 0.0015), (1, 2, 0.75, 0.003)")
        )
    assert current_revision(engine) == "0001_initial"
    main(["db", "upgrade", "--db", db_url])
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT step, acc, step_lr FROM evals ORDER BY step")).all()
        trace = conn.execute(sa.text("SELECT lr, step_lr FROM trial_trace ORDER BY step")).all()
        cols = {c["name"] for c in sa.inspect(conn).get_columns("evals")}
    assert [tuple(r) for r in rows] == [(1, 0.5, 0.0015), (2, 0.75, 0.003)]
    assert [tuple(r) for r in trace] == [(0.003, 0.0015), (0.003, 0.003)]
    assert "step_lr" in cols and "lr" not in cols
    engine.dispose()


def test_status_members_are_stored_as_their_strings(db_url):
    """A Status member handed straight to the store is written as today's string on both
    backends, and read back as a plain str."""
    from orchestrator.status import ALL, Status

    engine, _ = open_store_engine(db_url)
    _, ids = fill_sweep(engine, n_trials=len(ALL))
    with engine.begin() as conn:
        for (key, tid), st in zip(sorted(ids.items()), ALL):
            conn.execute(sa.update(Trial).where(Trial.id == tid).values(status=st))
        repo.finish_trial(conn, ids["k0"], Status.diverged, "x")
    with engine.connect() as conn:
        got = dict(conn.execute(sa.text("SELECT key, status FROM trials")).all())
    assert got == {"k0": "diverged", **{f"k{i}": ALL[i].value for i in range(1, len(ALL))}}
    assert all(type(v) is str for v in got.values())
    engine.dispose()


def _open_schema(url: str) -> str:
    from orchestrator.store.engine import open_store_engine

    try:
        open_store_engine(url)
        return "ok"
    except Exception as exc:  # returned, not raised: the parent reports every process's outcome
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_drivers_opening_one_fresh_database_together_all_get_the_schema(tmp_path, backend):
    """Every process that opens a new database at once must find it at head: never tables
    without a version row (SQLite: the migration is one write transaction), never a failed
    CREATE for the process that lost the race (PostgreSQL: it finds the winner's schema)."""
    import multiprocessing as mp

    from conftest import POSTGRES_URL, make_pg_schema_url

    if backend == "postgresql" and not POSTGRES_URL:
        pytest.skip("ORCH_TEST_POSTGRES_URL not set")
    ctx = mp.get_context("spawn")  # a fresh interpreter per driver, as two CLIs would be
    with ctx.Pool(6) as pool:
        for i in range(4 if backend == "sqlite" else 2):
            url, drop = (
                (f"sqlite:///{tmp_path / f'fresh{i}.db'}", lambda: None)
                if backend == "sqlite"
                else make_pg_schema_url()
            )
            try:
                outcomes = pool.map(_open_schema, [url] * 6)
                assert outcomes == ["ok"] * 6, outcomes
                assert current_revision(make_engine(url)) == head_revision()
            finally:
                drop()


def _connect_at(args: tuple[str, float]) -> str:
    import time

    from orchestrator.store.engine import make_engine

    url, start = args
    while time.time() < start:  # every process converts the new file at the same moment
        pass
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.exec_driver_sql("PRAGMA journal_mode").scalar_one())
    except Exception as exc:  # returned, not raised: the parent reports every outcome
        return f"{type(exc).__name__}: {exc}"
    finally:
        engine.dispose()


def test_connections_converting_one_new_file_to_wal_at_once_all_wait(tmp_path):
    """Two connections turning a new file to WAL at once deadlock on the lock upgrade, and
    SQLite answers one "database is locked" without its busy handler: the store's connect
    must wait instead (this failed a driver in about one round in four before it did)."""
    import multiprocessing as mp
    import time

    # forkserver, not fork: this pytest worker may hold Ray's threads (the session's shared
    # Ray), and a child forked while one of them held a lock hung CI for 15 minutes.
    with mp.get_context("forkserver").Pool(6) as pool:
        for i in range(40):
            url = f"sqlite:///{tmp_path / f'new{i}.db'}"
            outcomes = pool.map(_connect_at, [(url, time.time() + 0.1)] * 6)
            assert outcomes == ["wal"] * 6, (i, outcomes)


def test_trials_register_in_chunks_each_with_its_own_params(db_url, monkeypatch):
    """Registration inserts a chunk of trials at a time: every trial gets its id and its own
    typed columns and params across chunk boundaries; existing keys are kept, not duplicated."""
    monkeypatch.setattr(repo, "REGISTER_CHUNK", 3)
    engine, _ = open_store_engine(db_url)
    sid, ids = fill_sweep(engine, n_trials=7)
    with engine.begin() as conn:
        again = repo.add_trials(conn, sid, [("k2", {"seed": 99}), ("k7", {"arm": "x", "task": "t", "seed": 7})])
    with engine.connect() as conn:
        got = {k: (i, seed) for k, i, seed in conn.execute(sa.text("SELECT key, id, seed FROM trials")).all()}
        params = dict(
            conn.execute(
                sa.text(
                    "SELECT t.key, p.value_num FROM trial_params p JOIN trials t ON t.id = p.trial_id WHERE p.name = 'seed'"
                )
            ).all()
        )
    engine.dispose()
    assert len(set(ids.values())) == 7 and again["k2"] == ids["k2"]
    assert got == {**{f"k{i}": (ids[f"k{i}"], i) for i in range(7)}, "k7": (again["k7"], 7)}
    assert params == {f"k{i}": float(i) for i in range(8)}
