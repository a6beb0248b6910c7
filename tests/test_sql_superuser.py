"""Reads on a user's behalf through a SUPERUSER PostgreSQL URL (the CI server's trust-auth
``root``): ``sql`` and ``ui`` log in as the reader role ``db create-reader`` made, or refuse in
one line naming that fix. Every way a superuser session could act on the server is tried
and each is refused, with the server left as it was."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from conftest import make_pg_schema_url
from orchestrator.cli import main
from orchestrator.errors import UserError
from orchestrator.store import dialect
from orchestrator.store.dialect import Limits
from orchestrator.store.engine import open_store_engine
from orchestrator.store.import_jsonl import write_records

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(not os.environ.get("ORCH_TEST_POSTGRES_URL"), reason="needs PostgreSQL"),
]


def _fill(url: str) -> None:
    recs = [{"params": {"arm": "a", "seed": s}, "trace": [{"step": 1, "acc": 0.5, "loss": 1.0}]} for s in range(3)]
    engine, _ = open_store_engine(url)
    write_records(engine, "w", recs, source="t")
    engine.dispose()


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def superuser_url():
    url, drop = make_pg_schema_url()
    try:
        _fill(url)
        eng = sa.create_engine(url)
        with eng.connect() as c:
            assert c.execute(sa.text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")).scalar()
        eng.dispose()
        yield url
    finally:
        drop()


def test_without_a_reader_role_sql_and_ui_refuse_naming_the_fix(capsys):
    url, drop = make_pg_schema_url(reader=False)
    try:
        _fill(url)
        code, out, err = _run(capsys, "sql", "SELECT count(*) FROM evals", "--db", url)
        assert code == 2 and out == ""
        assert len(err.strip().splitlines()) == 1, err
        assert "superuser" in err and "orchestrator db create-reader" in err
        from orchestrator.store.reader import open_reader_engine

        with pytest.raises(UserError, match="create-reader"):
            open_reader_engine(url)
    finally:
        drop()


def test_a_superuser_url_reads_as_the_reader_role(superuser_url, capsys):
    code, out, err = _run(
        capsys, "sql", "SELECT current_user AS who, count(*) AS n FROM evals", "--db", superuser_url, "--csv"
    )
    assert code == 0, err
    who, n = out.splitlines()[1].split(",")
    assert who.startswith("orch_r_") and n == "3"
    from orchestrator.store.reader import open_reader_engine

    engine, _ = open_reader_engine(superuser_url)
    try:
        with engine.connect() as c:
            assert c.execute(sa.text("SELECT current_user")).scalar() == who
            assert c.execute(sa.text("SHOW transaction_read_only")).scalar() == "on"
    finally:
        engine.dispose()


def _server_state(c, marker_dir: Path) -> dict:
    return {
        "conf_loaded": c.execute(sa.text("SELECT pg_conf_load_time()")).scalar(),
        "wal_file": c.execute(sa.text("SELECT pg_walfile_name(pg_current_wal_lsn())")).scalar(),
        "large_objects": c.execute(sa.text("SELECT count(*) FROM pg_largeobject_metadata")).scalar(),
        "stats_reset": c.execute(
            sa.text("SELECT stats_reset FROM pg_stat_database WHERE datname = current_database()")
        ).scalar(),
        "data": c.execute(sa.text("SELECT md5(string_agg(e::text, ',' ORDER BY e::text)) FROM evals e")).scalar(),
        "files": sorted(p.name for p in marker_dir.iterdir()),
        "role": c.execute(sa.text("SELECT current_user")).scalar(),
    }


def test_every_server_action_through_a_superuser_url_is_refused(superuser_url, capsys, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    marks.chmod(0o777)  # the server's OS user may write here: only a refusal keeps it empty
    hit = marks / f"x{uuid.uuid4().hex[:6]}"
    admin = sa.create_engine(superuser_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        admin_pid = c.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        before = _server_state(c, marks)
        attacks = [
            # program execution and server files
            f"COPY (SELECT 'x') TO PROGRAM 'touch {hit}'",
            f"COPY (SELECT 'x') TO '{hit}'",
            "COPY evals FROM '/etc/hostname'",
            "SELECT pg_read_file('/etc/hostname')",
            "SELECT pg_catalog.pg_read_binary_file('/etc/hostname')",
            "SELECT \"pg_read_file\"('/etc/hostname')",
            "select PG_READ_FILE('/etc/hostname')",
            "SELECT * FROM pg_ls_dir('.')",
            "SELECT query_to_xml('SELECT pg_read_file(''/etc/hostname'')', true, false, '')",
            # large objects
            "SELECT lo_import('/etc/hostname')",
            f"SELECT lo_export(1, '{hit}')",
            "SELECT lo_from_bytea(0, 'x')",
            # configuration, signals, WAL, statistics
            "SELECT pg_reload_conf()",
            "SELECT pg_rotate_logfile()",
            f"SELECT pg_terminate_backend({admin_pid})",
            f"SELECT pg_cancel_backend({admin_pid})",
            "SELECT pg_terminate_backend(pg_backend_pid())",
            "SELECT pg_switch_wal()",
            "SELECT pg_stat_reset()",
            "SELECT pg_create_restore_point('x')",
            # locks
            "LOCK TABLE evals IN ACCESS EXCLUSIVE MODE",
            "SELECT pg_advisory_lock(1)",
            "SELECT * FROM evals FOR UPDATE",
            # maintenance
            "ANALYZE evals",
            "ANALYZE",
            "VACUUM evals",
            "VACUUM FULL",
            "CHECKPOINT",
            # session settings and roles
            "SELECT set_config('role', 'root', false)",
            "SELECT set_config('default_transaction_read_only', 'off', false)",
            "SET ROLE root",
            "RESET ROLE",
            "SET SESSION AUTHORIZATION root",
            "SET statement_timeout = 0",
            "DO $$ BEGIN PERFORM pg_reload_conf(); END $$",
            "LISTEN x",
            "NOTIFY x",
            "SELECT pg_notify('x', 'y')",
        ]
        for q in attacks:
            code, out, err = _run(capsys, "sql", q, "--db", superuser_url)
            assert code == 2, (q, out, err)
            assert len(err.strip().splitlines()) == 1 and err.startswith("error: refused"), (q, err)
        # Past the statement screen, the role itself refuses: the reader lacks the rights.
        pg = dialect.for_url(superuser_url)
        for q in (
            "SELECT pg_read_file('/etc/hostname')",
            "SELECT pg_reload_conf()",
            "SELECT lo_import('/etc/hostname')",
        ):
            with pytest.raises(UserError, match="refused|read-only|permission"):
                pg.readonly_query(superuser_url, q, timeout_s=10, limits=Limits())
        assert c.execute(sa.text("SELECT pg_backend_pid()")).scalar() == admin_pid  # not terminated
        after = _server_state(c, marks)
    admin.dispose()
    assert after == before
    assert not hit.exists()
