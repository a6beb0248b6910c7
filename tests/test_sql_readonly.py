"""``orchestrator sql`` on both backends: the statement runs exactly as written, every write
is refused by the connection (bytes / rows unchanged), stacked statements are refused by
the tokenizer, and a long query is cancelled at --timeout."""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest
import sqlalchemy as sa

from cli_support import run_cli
from orchestrator.store.dialect import sqlite_path
from sql_support import filled_fixture, write_runs

COMMON_WRITES = [
    "DELETE FROM evals",
    "delete from trials where id > 0",
    "UPDATE trials SET status = 'failed'",
    "UPDATE evals SET acc = 1.0 WHERE step = 1",
    "INSERT INTO sweeps (name, spec_text, spec_hash) VALUES ('x', 'y', 'z')",
    "INSERT INTO evals SELECT * FROM evals",
    "DROP TABLE evals",
    "DROP TABLE IF EXISTS trial_params",
    "DROP VIEW trial_final",
    "CREATE TABLE x (a int)",
    "CREATE TEMP TABLE x (a int)",
    "CREATE INDEX ix_x ON evals (acc)",
    "CREATE VIEW v AS SELECT 1 AS a",
    "ALTER TABLE evals ADD COLUMN z int",
    "ALTER TABLE evals RENAME TO e2",
    "WITH x AS (SELECT 1) DELETE FROM evals",
    "DELETE FROM evals RETURNING *",
    "UPDATE sweeps SET name = name || 'x' RETURNING name",
    "/* a comment */ DELETE FROM evals",
    "-- leading comment\nUPDATE trials SET final_acc = 1.0",
    "  \n\tDELETE FROM sweeps",
    "SELECT 1; DELETE FROM evals",
    "SELECT 1;DROP TABLE evals",
    "select 1 -- x\n; delete from evals",
    "SELECT 'a;' AS s; DELETE FROM evals",
    "SELECT 1 /* ; */ ; UPDATE trials SET status = 'x'",
    "DELETE FROM evals; SELECT 1",
    "COMMIT",
    "ROLLBACK",
    "REINDEX evals",
    "CREATE TRIGGER t AFTER INSERT ON evals BEGIN DELETE FROM evals; END",
    "INSERT INTO trials (sweep_id, key, params) VALUES (1, 'k', '{}')",
    "UPDATE trial_params SET value_num = 0",
    "DELETE FROM trial_params WHERE name = 'seed'",
    "VACUUM",
    "DROP INDEX ix_trials_sweep_status",
    "UPDATE sweeps SET spec_text = ''",
    "DELETE FROM orchestrator_alembic_version",
]
SQLITE_WRITES = [
    "REPLACE INTO sweeps (id, name, spec_text, spec_hash) VALUES (1, 'x', 'y', 'z')",
    "INSERT OR REPLACE INTO evals (trial_id, step, acc) VALUES (1, 1, 1.0)",
    "PRAGMA journal_mode = DELETE",
    "PRAGMA user_version = 7",
    "PRAGMA user_version(7)",
    "PRAGMA writable_schema = ON",
    "ATTACH DATABASE ':memory:' AS x",
    "ANALYZE",
    "VACUUM INTO '/tmp/orch-vacuum-copy.db'",
    # On PostgreSQL BEGIN and SAVEPOINT are no-ops inside the read-only transaction.
    "BEGIN",
    "SAVEPOINT s1",
]
PG_WRITES = [
    "TRUNCATE evals",
    "WITH d AS (DELETE FROM evals RETURNING *) SELECT count(*) FROM d",
    "SELECT nextval('trials_id_seq')",
    "SELECT setval('trials_id_seq', 1)",
    "DO $$ BEGIN DELETE FROM evals; END $$",
    "COPY evals FROM '/tmp/nothing.csv'",
    "ALTER SEQUENCE trials_id_seq RESTART WITH 1000",
    "GRANT ALL ON evals TO PUBLIC",
    "SET TRANSACTION READ WRITE",
    "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$",
    "MERGE INTO evals e USING evals s ON e.trial_id = s.trial_id AND e.step = s.step "
    "WHEN MATCHED THEN UPDATE SET acc = 1",
    "SELECT pg_advisory_xact_lock(1) FROM evals FOR UPDATE",
    "SELECT 1; SELECT $$;$$",
    "COMMENT ON TABLE evals IS 'x'",
]


def _fill(url: str) -> None:
    write_runs(url, lambda s: {"acc": 0.1 * s, "loss": 1.0})


def _fingerprint(url: str) -> object:
    path = sqlite_path(url)
    if path is not None:
        # (an empty -wal file is no content: a reader of a WAL database may create one)
        return tuple(
            hashlib.sha256(p.read_bytes() if p.exists() else b"").hexdigest()
            for p in (path, path.with_name(path.name + "-wal"))
        )
    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            tables = sorted(
                c.execute(
                    sa.text("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")
                ).scalars()
            )
            return tables, [
                c.execute(
                    sa.text(f"SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM \"{t}\" t")
                ).scalar()
                for t in tables
            ]
    finally:
        eng.dispose()


filled = filled_fixture(_fill)


def test_every_write_is_refused_and_nothing_changes(filled, capsys):
    pg = not filled.startswith("sqlite")
    writes = COMMON_WRITES + (PG_WRITES if pg else SQLITE_WRITES)
    assert len(writes) >= 40
    before = _fingerprint(filled)
    accepted = []
    for q in writes:
        code, out, err = run_cli(capsys, "sql", "--db", filled, "--csv", "--", q)
        lines = err.strip().splitlines()
        if code != 2 or len(lines) != 1 or "Traceback" in err:
            accepted.append((q, code, err))
    assert not accepted
    assert _fingerprint(filled) == before
    assert not os.path.exists("/tmp/orch-vacuum-copy.db") or pg


QUOTED = [
    # (query, expected rows as CSV lines after the header)
    ("SELECT 'a/*' AS a, count(*) AS n, '*/' AS z FROM evals", ["a/*,9,*/"]),
    ("SELECT count(*) AS n FROM trials WHERE arm NOT LIKE '%--%'", ["3"]),
    ("SELECT ';' AS s, '--' AS d", [";,--"]),
    ("SELECT count(*) AS n FROM evals -- trailing comment", ["9"]),
    ("SELECT count(*) AS n FROM evals /* ; DELETE FROM evals */;", ["9"]),
    ('SELECT "step" FROM evals WHERE step = 2 AND acc = 0', ["2"]),
]


def test_statement_runs_unchanged(filled, capsys):
    pg = not filled.startswith("sqlite")
    cases = QUOTED + ([("SELECT $$;$$ AS d", [";"]), ("SELECT $t$ -- ; $t$ AS d", [" -- ; "])] if pg else [])
    for q, want in cases:
        code, out, err = run_cli(capsys, "sql", "--db", filled, "--csv", "--", q)
        assert code == 0, (q, err)
        assert [ln for ln in out.splitlines()[1:]] == want, q
    code, out, _ = run_cli(capsys, "sql", QUOTED[0][0], "--db", filled, "--csv")
    assert out.splitlines()[0] == "a,n,z"


def test_timeout_cancels_a_long_query(filled, capsys):
    # (pg_sleep is refused by the screen: an endless recursion runs on both backends)
    q = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    code, _, err = run_cli(capsys, "sql", q, "--db", filled, "--timeout", "0.5")
    assert code == 2 and "timeout" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "sql", "SELECT 1", "--db", filled, "--timeout", "-1")
    assert code == 2 and "--timeout" in err


def test_reading_pragmas_still_work_on_sqlite(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    _fill(url)
    code, out, err = run_cli(capsys, "sql", "PRAGMA table_info(evals)", "--db", url, "--csv")
    assert code == 0 and "acc" in out


@pytest.mark.skipif(not os.environ.get("ORCH_TEST_POSTGRES_URL"), reason="needs PostgreSQL")
def test_reader_role_cannot_use_admin_functions(capsys):
    from conftest import make_pg_schema_url, role_ddl

    url, drop = make_pg_schema_url()
    role = f"orch_reader_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        _fill(url)
        os.environ["ORCH_TEST_READER_PW"] = "s3cret-reader"
        code, out, err = run_cli(
            capsys, "db", "create-reader", role, "--db", url, "--password-env", "ORCH_TEST_READER_PW"
        )
        assert code == 0, err
        assert "s3cret-reader" not in out
        u = sa.engine.make_url(url).set(username=role, password="s3cret-reader")
        rurl = u.render_as_string(hide_password=False)
        code, out, err = run_cli(capsys, "sql", "SELECT count(*) AS n FROM evals", "--db", rurl, "--csv")
        assert code == 0 and out.splitlines()[1] == "9", err
        with admin.connect() as c:
            admin_pid = c.execute(sa.text("SELECT pg_backend_pid()")).scalar()
            before = _fingerprint(url)
            for q in [
                f"SELECT pg_terminate_backend({admin_pid})",
                "SELECT pg_reload_conf()",
                "SELECT pg_stat_reset()",
                "SELECT pg_read_file('/etc/hostname')",
                "SELECT lo_import('/etc/hostname')",
                "DELETE FROM evals",
                "SELECT pg_cancel_backend(" + str(admin_pid) + ")",
            ]:
                code, out, err = run_cli(capsys, "sql", q, "--db", rurl)
                assert code == 2 and len(err.strip().splitlines()) == 1, (q, code, out, err)
            # the admin's session survived, and nothing changed
            assert c.execute(sa.text("SELECT 1")).scalar() == 1
            assert _fingerprint(url) == before
    finally:
        os.environ.pop("ORCH_TEST_READER_PW", None)
        with admin.connect() as c, role_ddl(c):
            if c.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).scalar():
                schema = c.execute(sa.text("SELECT current_schema()")).scalar()
                db = c.execute(sa.text("SELECT current_database()")).scalar()
                for st in (
                    f'REVOKE ALL ON ALL TABLES IN SCHEMA "{schema}" FROM "{role}"',
                    f'ALTER DEFAULT PRIVILEGES IN SCHEMA "{schema}" REVOKE SELECT ON TABLES FROM "{role}"',
                    f'REVOKE ALL ON SCHEMA "{schema}" FROM "{role}"',
                    f'REVOKE ALL ON DATABASE "{db}" FROM "{role}"',
                    f'DROP ROLE IF EXISTS "{role}"',
                ):
                    c.execute(sa.text(st))
        admin.dispose()
        drop()


def test_output_is_capped_by_rows_and_bytes_with_a_note(filled, capsys):
    code, out, err = run_cli(
        capsys, "sql", "SELECT step FROM evals ORDER BY trial_id, step", "--db", filled, "--csv", "--max-rows", "4"
    )
    assert code == 0, err
    assert out.splitlines() == ["step", "1", "2", "3", "1"]
    assert "note: output stopped after 4 row(s) at --max-rows 4" in err
    # 9 rows of 8 "bytes" each (numbers count 8): 40 bytes hold 5
    code, out, err = run_cli(capsys, "sql", "SELECT step FROM evals", "--db", filled, "--csv", "--max-bytes", "40")
    assert code == 0 and len(out.splitlines()) == 1 + 5 and "--max-bytes 40" in err
    code, out, err = run_cli(capsys, "sql", "SELECT step FROM evals", "--db", filled, "--csv")
    assert code == 0 and len(out.splitlines()) == 1 + 9 and "note" not in err


def test_a_huge_value_is_refused_or_cut_within_the_timeout(filled, capsys):
    import time

    pg = not filled.startswith("sqlite")
    q = "SELECT repeat('x', 300000000) AS big" if pg else "SELECT randomblob(1000000000) AS big"
    t0 = time.monotonic()
    code, out, err = run_cli(capsys, "sql", q, "--db", filled, "--timeout", "20", "--max-bytes", "1000000")
    took = time.monotonic() - t0
    assert took < 20, took
    assert len(err.strip().splitlines()) <= 2
    if pg:  # fetched, then left out at the byte cap
        assert code == 0 and "--max-bytes 1000000" in err and out.strip() != ""
    else:  # SQLite refuses to build it at all
        assert code == 2 and "--max-bytes" in err, err


def test_where_is_bounded_in_time_and_value_size():
    import time

    import pandas as pd

    from orchestrator.analysis.where import filter_trial_ids
    from orchestrator.errors import UserError

    frame = pd.DataFrame({"trial_id": range(200), "key": [f"k{i}" for i in range(200)], "lr": [0.1] * 200})
    slow = "(SELECT count(*) FROM trials a, trials b, trials c, trials d WHERE a.lr + b.lr + c.lr + d.lr > 0) > 0"
    t0 = time.monotonic()
    with pytest.raises(UserError, match="cancelled after 1 s"):
        filter_trial_ids(frame, slow, timeout_s=1)
    assert time.monotonic() - t0 < 5
    with pytest.raises(UserError, match="too big"):
        filter_trial_ids(frame, "length(zeroblob(1000000000)) > 0")
    assert filter_trial_ids(frame, "lr > 0.05 AND trial_id < 3") == [0, 1, 2]
