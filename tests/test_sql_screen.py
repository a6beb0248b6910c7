"""The statement screen of ``orchestrator sql`` (``store/sql_screen.py``) and its output
limits: PostgreSQL statements are parsed by PostgreSQL's own parser and may call read
functions only, however a name is quoted, qualified or escaped; results past the row and
byte limits are cut with a note on both backends; the --timeout covers drawing the table;
bad input is one line."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import sqlparse

from conftest import POSTGRES_URL, make_pg_schema_url
from cli_support import run_cli
from orchestrator.errors import UserError
from orchestrator.store.sql_screen import screen_postgresql, screen_sqlite
from sql_support import filled_fixture, write_runs

ROOT = Path(__file__).resolve().parents[1]

# Each was let through by the old name-matching screen (or is a server action by another name).
PG_REFUSED = [
    "SELECT \"pg_catalog\".\"set_config\"('work_mem', '1GB', false)",
    "SELECT pg_catalog.set_config('work_mem', '1GB', false)",
    'SELECT U&"pg_advisory_lock"(42)',
    'SELECT U&"pg\\005fadvisory\\005flock"(42)',
    "SELECT U&\"pg!005fadvisory!005flock\" UESCAPE '!' (42)",
    "SELECT '\\', pg_advisory_lock(42) -- '",
    "SELECT '\\' AS a, pg_terminate_backend(pg_backend_pid()) AS b --'",
    "SELECT query_to_xml('SELECT pg_advisory_lock(42)', true, true, '')",
    "SELECT * FROM query_to_xml_and_xmlschema('SELECT 1', true, true, '')",
    "SELECT pg_terminate_backend(1)",
    "SELECT pg_cancel_backend(1)",
    "SELECT pg_sleep(5)",
    "SELECT pg_catalog.pg_sleep_for('5 s')",
    "SELECT * FROM dblink('dbname=test', 'DELETE FROM evals') AS t(a text)",
    "SELECT dblink_exec('dbname=test', 'DELETE FROM evals')",
    "SELECT lo_import('/etc/hostname')",
    "SELECT lo_export(1, '/tmp/x')",
    "SELECT pg_read_file('/etc/hostname')",
    "SELECT pg_read_binary_file('/etc/hostname')",
    "SELECT * FROM pg_ls_dir('.')",
    "SELECT pg_stat_file('/etc/hostname')",
    "SELECT pg_reload_conf()",
    "SELECT nextval('trials_id_seq')",
    "SELECT txid_current()",
    "SELECT public.count(*) FROM evals",
    "SELECT x.pg_catalog.count(*) FROM evals",
    "SELECT count(*) FROM evals WHERE pg_advisory_lock(step) IS NULL",
    "SELECT (SELECT pg_try_advisory_lock(1)) AS x",
    "WITH x AS (SELECT pg_advisory_xact_lock(1)) SELECT * FROM x",
    "EXPLAIN ANALYZE SELECT pg_sleep(5)",
    "WITH d AS (DELETE FROM evals RETURNING *) SELECT count(*) FROM d",
    "SELECT * FROM evals FOR UPDATE",
    "SELECT * INTO copy FROM evals",
    "EXPLAIN ANALYZE DELETE FROM evals",
    "SET work_mem = '1GB'",
    "SELECT 1; SELECT 2",
    "SELECT '\\'; DELETE FROM evals; --'",
    "SELEC 1",
    "COMMIT",
]


@pytest.mark.parametrize("q", PG_REFUSED)
def test_postgresql_screen_refuses_server_actions_however_spelled(q):
    with pytest.raises(UserError) as got:
        screen_postgresql(q)
    assert "\n" not in str(got.value)


def _doc_queries() -> list[str]:
    """Every query of the docs' SQL page, README and tutorial."""
    text = (ROOT / "docs/how-to/sql.md").read_text()
    block = text.split("```sql", 1)[1].split("```", 1)[0]
    qs = [q.strip() for q in sqlparse.split(block) if q.strip()]
    for page in ("README.md", "docs/tutorial.md"):
        qs += re.findall(r'orchestrator sql --csv "([^"]+)"', (ROOT / page).read_text())
    qs += [
        q.strip("'\"")
        for q in re.findall(r"orchestrator sql (\"[^\"]+\")", (ROOT / "orchestrator/cli/help.py").read_text())
    ]
    return qs


PG_READS = [
    "SELECT key, acc, metrics::json->>'rebind_acc' AS rebind_acc FROM trial_trace",
    "SELECT extract(epoch FROM now()) > 0, substring('abc' FROM 2), trim(both ' ' FROM ' x '), position('b' IN 'abc')",
    "SELECT now() AT TIME ZONE 'UTC' IS NOT NULL, date_trunc('day', now()) <= now(), age(now(), now())",
    'SELECT "count"(*), pg_catalog.avg(step), stddev(acc), percentile_cont(0.5) WITHIN GROUP (ORDER BY acc) FROM evals',
    "SELECT row_number() OVER (PARTITION BY trial_id ORDER BY step), lag(acc) OVER w FROM evals WINDOW w AS (ORDER BY step)",
    "SELECT coalesce(loss, 0), greatest(acc, 0.5), nullif(step, 1), round(acc::numeric, 2), abs(-1), ln(2) FROM evals",
    "SELECT string_agg(key, ',' ORDER BY key), array_agg(DISTINCT arm), json_agg(seed) FROM trials",
    "SELECT * FROM generate_series(1, 3) g, unnest(ARRAY[1, 2]) u",
    "SELECT jsonb_extract_path_text(params::jsonb, 'arm'), jsonb_typeof(params::jsonb) FROM trials",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3) SELECT count(*) FROM c",
    "TABLE evals",
    "VALUES (1, 'a'), (2, 'b')",
    "EXPLAIN SELECT * FROM evals",
    "SHOW work_mem",
    "SELECT '\\' AS backslash",
    "SELECT $$;$$ AS d",
    "SELECT current_setting('work_mem'), version() IS NOT NULL, pg_size_pretty(pg_total_relation_size('evals'))",
]


def test_the_documented_queries_pass_both_screens():
    qs = _doc_queries()
    assert len(qs) >= 9, qs
    for q in qs:
        screen_sqlite(q)
        if "json_extract" not in q:  # the docs' SQLite form; PG_READS holds PostgreSQL's
            screen_postgresql(q)
    for q in PG_READS:
        screen_postgresql(q)


def _fill(url: str) -> None:
    write_runs(url, lambda s: {"acc": 0.1, "loss": 1.0, "rebind_acc": 0.05})


filled = filled_fixture(_fill)


def test_documented_queries_run_on_both_backends(filled, capsys):
    pg = not filled.startswith("sqlite")
    qs = [q for q in _doc_queries() if not (pg and "json_extract" in q)] + (PG_READS if pg else [])
    for q in qs:
        code, _, err = run_cli(capsys, "sql", "--db", filled, "--csv", "--", q)
        # (PostgreSQL has no round(double precision, int): the README's SQLite query
        # reaches the server, which says so; the screen lets every one through)
        assert code == 0 or (pg and err.startswith("error: query failed: function round(")), (q, err)


@pytest.mark.skipif(not POSTGRES_URL, reason="needs PostgreSQL")
def test_the_bypasses_do_nothing_on_the_server(capsys):
    url, drop = make_pg_schema_url()
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        _fill(url)
        with admin.connect() as c:
            pid = c.execute(sa.text("SELECT pg_backend_pid()")).scalar()
            for q in [
                'SELECT U&"pg_advisory_lock"(4242)',
                "SELECT '\\', pg_advisory_lock(4242) -- '",
                "SELECT \"pg_catalog\".\"set_config\"('work_mem', '1GB', false), pg_advisory_lock(4242)",
                "SELECT query_to_xml('SELECT pg_advisory_lock(4242)', true, true, '')",
                f"SELECT '\\', pg_terminate_backend({pid}) -- '",
                f'SELECT "pg_catalog"."pg_terminate_backend"({pid})',
            ]:
                code, out, err = run_cli(capsys, "sql", "--db", url, "--", q)
                assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (q, err)
                assert "read functions" in err, err
            held = c.execute(sa.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")).scalar()
            assert held == 0
            assert c.execute(sa.text("SELECT pg_backend_pid()")).scalar() == pid  # the session survived
    finally:
        admin.dispose()
        drop()


def test_sqlite_refuses_load_extension_however_spelled(tmp_path, capsys):
    filled = f"sqlite:///{tmp_path / 'x.db'}"
    _fill(filled)
    for q in [
        "SELECT load_extension('/tmp/x.so')",
        "SELECT \"load_extension\"('/tmp/x.so')",
        "SELECT LOAD_EXTENSION('x')",
    ]:
        code, _, err = run_cli(capsys, "sql", "--db", filled, "--", q)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "not authorized" in err, (q, err)
    # SQLite has no backslash escapes either: the second statement is seen, and refused
    code, _, err = run_cli(capsys, "sql", "--db", filled, "--", "SELECT '\\'; DELETE FROM evals; --'")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    code, out, _ = run_cli(capsys, "sql", "--db", filled, "--csv", "--", "SELECT count(*) AS n FROM evals")
    assert out.splitlines() == ["n", "9"]


ROWS_200K = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000) SELECT x FROM c"


def test_a_result_past_the_limits_is_cut_with_a_note_on_both_backends(filled, capsys):
    code, out, err = run_cli(capsys, "sql", "--db", filled, "--csv", "--", ROWS_200K)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 1 + 100_000 and lines[1] == "1" and lines[-1] == "100000"
    assert "note: output stopped after 100000 row(s) at --max-rows 100000" in err
    code, out, err = run_cli(capsys, "sql", "--db", filled, "--csv", "--max-bytes", "800", "--", ROWS_200K)
    assert code == 0 and len(out.splitlines()) == 1 + 100 and "--max-bytes 800" in err, err
    # and the database still answers (the cut query was cancelled and rolled back)
    code, out, err = run_cli(capsys, "sql", "--db", filled, "--csv", "--", "SELECT count(*) AS n FROM evals")
    assert code == 0 and out.splitlines() == ["n", "9"], err


def test_the_timeout_covers_drawing_the_table(filled, capsys):
    q = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000) SELECT x, 'row ' || x AS t FROM c"
    t0 = time.monotonic()
    code, out, err = run_cli(capsys, "sql", "--db", filled, "--timeout", "2", "--", q)
    took = time.monotonic() - t0
    assert took < 6, took  # drawing all 100,000 rows takes rich tens of seconds
    assert code == 2 and len(err.strip().splitlines()) == 1 and "output cancelled after the 2 s timeout" in err, err
    # The count said is what was printed: some chunks on a quiet machine; none where the
    # deadline passed while the rows' widths were still being measured (a loaded one).
    shown = int(re.search(r"(\d+) row\(s\) printed", err).group(1))
    assert shown < 100_000
    if shown:
        assert f"row {shown}" in out and f"row {shown + 1} " not in out
    else:
        assert "row " not in out, out[:200]
    # a small result draws whole, as one table
    code, out, err = run_cli(capsys, "sql", "--db", filled, "--", "SELECT key, seed FROM trials ORDER BY seed")
    assert code == 0 and len([ln for ln in out.splitlines() if "│" in ln]) == 3 and "3 row(s)" in err


def test_a_timeout_past_what_postgresql_can_set_is_one_line(filled, capsys):
    code, out, err = run_cli(capsys, "sql", "SELECT 1", "--db", filled, "--timeout", "2147484")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "at most 2,147,483 seconds" in err
    code, out, err = run_cli(capsys, "sql", "SELECT 1 AS one", "--db", filled, "--timeout", "2147483", "--csv")
    assert code == 0 and out.splitlines() == ["one", "1"], err


def test_text_that_is_not_utf8_is_one_line(filled, capsys):
    bad = "SELECT 'caf\udce9' AS x"  # the byte 0xe9 of a Latin-1 terminal, as Python holds it
    code, out, err = run_cli(capsys, "sql", bad, "--db", filled)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not valid UTF-8" in err and "0xe9" in err, err
    code, out, err = run_cli(capsys, "analyze", "w", "outcomes", "--where", "arm = 'caf\udce9'", "--db", filled)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--where is not valid UTF-8" in err, err
