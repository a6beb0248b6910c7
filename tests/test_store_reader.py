"""The one store reader: every reader names an unknown sweep alike, the dialect-free
helpers behave on both backends, and no module outside ``store/dialect.py`` branches on the
backend (a source check that fails on a new branch)."""

from __future__ import annotations

import ast
import datetime as dt
import json
import re
import typing
from pathlib import Path

import pytest

from orchestrator import analysis as oa
from orchestrator.status import Status
from orchestrator.store import dialect, reader
from orchestrator.store.import_jsonl import ImportRecord, write_records

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "orchestrator"
# The backend's own module; migrations/ (outside the package) may branch too.
ALLOWED = {PACKAGE / "store" / "dialect.py"}

# A string that names a backend: "sqlite", "postgresql+psycopg://...", "postgres://".
_BACKEND_VALUE = re.compile(r"^(sqlite|postgres(ql)?)(\+\w+)?(:.*)?$", re.I)
_BACKEND_WORD = re.compile(r"sqlite|postgres", re.I)
_PREFIX_CALLS = {"startswith", "endswith", "removeprefix"}
_REGEX_CALLS = {"match", "fullmatch", "search"}
_BACKEND_CLASSES = {"SQLite", "PostgreSQL"}


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def backend_branches(source: str) -> list[tuple[int, str]]:
    """(line, what) of every place ``source`` tells the backends apart itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            if node.attr == "name" and isinstance(node.value, ast.Attribute) and node.value.attr == "dialect":
                found.append((node.lineno, ".dialect.name"))
            elif node.attr == "get_backend_name":
                found.append((node.lineno, "get_backend_name"))
        elif isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                found += [(node.lineno, f"compares with {s!r}") for s in _strings(side) if _BACKEND_VALUE.match(s)]
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            args = [s for a in node.args for s in _strings(a)]
            if name in _PREFIX_CALLS:
                found += [(node.lineno, f"{name}({s!r})") for s in args if _BACKEND_VALUE.match(s)]
            elif name in _REGEX_CALLS:
                found += [(node.lineno, f"{name}({s!r})") for s in args if _BACKEND_WORD.search(s)]
            elif name == "isinstance" and len(node.args) == 2:
                kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                for k in kinds:
                    kname = k.attr if isinstance(k, ast.Attribute) else k.id if isinstance(k, ast.Name) else ""
                    if kname in _BACKEND_CLASSES:
                        found.append((node.lineno, f"isinstance(..., {kname})"))
    return found


def test_no_backend_branch_outside_the_dialect():
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in ALLOWED
        for line, what in backend_branches(path.read_text(encoding="utf-8"))
    ]
    assert not bad, "backend branches outside orchestrator/store/dialect.py (make them Dialect methods):\n" + "\n".join(
        bad
    )


@pytest.mark.parametrize(
    "snippet",
    [
        'if conn.dialect.name == "sqlite":\n    pass',
        'if engine.url.get_backend_name() == "x":\n    pass',
        'x = url.startswith(("postgresql://", "postgres://"))',
        'x = re.match(r"(sqlite|postgresql)(\\+\\w+)?://", v)',
        'x = dialect.for_url(url).name != "postgresql"',
        'x = kind in ("sqlite", "duckdb")',
        "x = isinstance(d, dialect.SQLite)",
    ],
)
def test_the_branch_check_catches_a_new_branch(snippet):
    assert backend_branches(snippet), snippet


def test_the_branch_check_lets_messages_and_names_be():
    ok = (
        'raise UserError(f"{url!r}: expected a file path, sqlite:///PATH or postgresql://HOST/DB")\n'
        'if "postgres_ingest" in result:\n    pass\n'
        'help_text = typer.Option(None, help="postgresql:// URL")\n'
    )
    assert backend_branches(ok) == []


def _defs(name: str) -> list[str]:
    return [
        f"{p.relative_to(ROOT)}:{n.lineno}"
        for p in sorted(PACKAGE.rglob("*.py"))
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(n, ast.FunctionDef) and n.name == name
    ]


def test_one_sweep_lookup_and_one_time_helper():
    for name in ("sweep_id", "find_sweep", "aware", "db_now"):
        assert {d.rsplit(":", 1)[0] for d in _defs(name)} == {"orchestrator/store/reader.py"}, _defs(name)
    for old in ("_sweep_id", "_aware", "read_sweep", "_since_param", "open_engine"):
        assert [d for d in _defs(old) if not d.startswith("orchestrator/store/reader.py")] == [], old


def _sweep(url: str) -> None:
    recs = [
        {
            "params": {"arm": "a", "seed": s, "task": {"name": "mqar", "K": 8}},
            "trace": [{"step": 10 * i, "acc": 0.2 * i, "loss": 1.0 / i} for i in (1, 2, 3)],
        }
        for s in (0, 1)
    ]
    write_records(url, "grid", recs)


def test_an_unknown_sweep_is_one_error_everywhere(db_url):
    """The reader, export/load, the analysis, the status report and the dashboard all say
    the same line, and the dashboard answers it with 404."""
    from orchestrator import api
    from orchestrator.store.progress import progress_report
    from orchestrator.ui.app import create_app

    from ui_support import asgi_get

    _sweep(db_url)
    want = "no sweep named 'nope' in this database (sweeps: grid)"
    engine = reader.open_engine(db_url)

    def lookup():
        with engine.connect() as conn:
            reader.sweep_id(conn, "nope")

    calls = [
        lookup,
        lambda: api.load("nope", db=engine),
        lambda: oa.load_sweep(engine, "nope"),
        lambda: progress_report(engine, "nope"),
    ]
    for call in calls:
        with pytest.raises(reader.UnknownSweep) as info:
            call()
        assert str(info.value) == want
    ro, url = reader.open_reader_engine(db_url)
    try:
        app = create_app(ro, url)
        for path in ("/api/sweeps/nope/trials", "/api/sweeps/nope/traces", "/api/sweeps/nope/km"):
            status, _, body = asgi_get(app, path)
            assert (status, json.loads(body)) == (404, {"error": want}), path
        status, _, body = asgi_get(app, "/api/sweeps/grid/trials")
        assert status == 200 and len(json.loads(body)["trials"]) == 2
    finally:
        ro.dispose()
        engine.dispose()


def test_touched_trials_compare_with_the_database_clock(db_url):
    """``Dialect.time_param`` makes a Python time compare with stored ``updated_at`` on
    either backend (SQLite keeps it as text)."""
    _sweep(db_url)
    engine = reader.open_engine(db_url)
    try:
        with engine.connect() as conn:
            now = reader.db_now(conn)
            assert now.tzinfo is not None
            ids = {r[0] for r in reader.analysis_rows(engine, "grid", [Status.completed]).trials}
            assert len(ids) == 2
            assert reader.touched_trials(conn, "grid", now - dt.timedelta(minutes=5)) == ids
            assert reader.touched_trials(conn, "grid", now + dt.timedelta(minutes=5)) == set()
    finally:
        engine.dispose()


def test_aware_reads_every_stored_form():
    utc = dt.timezone.utc
    assert reader.aware(None) is None
    assert reader.aware("2024-01-02 03:04:05") == dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=utc)
    assert reader.aware(dt.datetime(2024, 1, 2)) == dt.datetime(2024, 1, 2, tzinfo=utc)
    plus2 = dt.timezone(dt.timedelta(hours=2))
    assert reader.aware(dt.datetime(2024, 1, 2, tzinfo=plus2)).tzinfo == plus2


def test_urls_route_through_the_backends(tmp_path):
    assert dialect.route_url("postgres://h/db") == "postgresql+psycopg://h/db"
    assert dialect.route_url("postgresql://h/db") == "postgresql+psycopg://h/db"
    assert dialect.route_url("postgresql+psycopg://h/db") == "postgresql+psycopg://h/db"
    assert dialect.route_url("sqlite:///x.db") == "sqlite:///x.db"
    assert dialect.route_url(str(tmp_path / "a b.db")) == dialect.sqlite_url(tmp_path / "a b.db")
    with pytest.raises(dialect.UserError, match="expected a file path, sqlite:///PATH or postgresql://HOST/DB"):
        dialect.route_url("mysql://h/db")
    assert dialect.for_value("mysql://h/db") is None and dialect.for_value("x.db").name == "sqlite"
    assert dialect.storage_problem("sqlite://") and dialect.storage_problem(":memory:")
    assert dialect.storage_problem("postgres://h/db") is None and dialect.storage_problem("mysql://x") is None


def test_the_import_format_words_are_statuses():
    words = typing.get_args(ImportRecord.model_fields["status"].annotation)
    assert words and all(w in {s.value for s in Status} for w in words)


_SQL_BUILDERS = {"text", "select", "insert", "update", "delete", "func"}


def sql_outside_the_store(source: str) -> list[tuple[int, str]]:
    """(line, what) of SQL built, or the models imported, in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in _SQL_BUILDERS:
            if isinstance(node.value, ast.Name) and node.value.id in ("sa", "sqlalchemy"):
                found.append((node.lineno, f"{node.value.id}.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("orchestrator.store.models"):
            found.append((node.lineno, "imports orchestrator.store.models"))
        elif isinstance(node, ast.ImportFrom) and node.module == "sqlalchemy":
            found += [(node.lineno, f"from sqlalchemy import {a.name}") for a in node.names if a.name in _SQL_BUILDERS]
    return found


def test_only_the_store_writes_sql():
    """The analysis, the dashboard, the API and the CLI read through store.reader (the
    runner through the store's functions); the benchmarks time the store itself."""
    inside = (PACKAGE / "store", PACKAGE / "bench")
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if not any(path.is_relative_to(d) for d in inside)
        for line, what in sql_outside_the_store(path.read_text(encoding="utf-8"))
    ]
    assert not bad, "SQL outside orchestrator/store (add a function to store/reader.py):\n" + "\n".join(bad)
    assert sql_outside_the_store('import sqlalchemy as sa\nq = sa.text("SELECT 1")') == [(2, "sa.text")]
    assert sql_outside_the_store("from orchestrator.store.models import Trial") != []
