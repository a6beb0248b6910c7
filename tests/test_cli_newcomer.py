"""The CLI a newcomer meets: --version, every command's help (purpose, option texts, an
example, one database sentence), the no-database message, and `db upgrade` on unversioned
and unknown-revision databases."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import sqlalchemy as sa
import typer.main

from orchestrator.cli import app, main
from orchestrator.cli.app import DB_HELP

ORCH = [sys.executable, "-m", "orchestrator.cli"]


def _commands():
    root = typer.main.get_command(app)

    def walk(cmd, path):
        yield path, cmd
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, f"{path} {name}".strip())

    return list(walk(root, ""))


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"orchestrator {version('orchestrator')}"


@pytest.mark.parametrize("path,cmd", _commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_help_has_purpose_option_texts_and_an_example(path, cmd):
    first = (cmd.help or "").strip().splitlines()
    assert first and first[0].strip(), f"`orchestrator {path}` has no one-line purpose"
    for p in cmd.params:
        if p.param_type_name == "option" and not p.hidden and p.name != "help":
            assert p.help, f"`orchestrator {path}` option {p.opts} has no description"
            if "--db" in p.opts:
                assert p.help == DB_HELP
            if p.is_flag:
                assert p.metavar == "", f"flag {p.opts} of `{path}` shows a type"
    assert "Examples:" in (cmd.epilog or ""), f"`orchestrator {path}` has no example"
    for line in cmd.epilog.splitlines()[2:]:
        assert line.strip().startswith("$ ") and "orchestrator " in line, line


def test_command_listing_is_each_first_sentence_on_one_line(capsys, monkeypatch):
    """`orchestrator --help` lists each command by its first sentence, wrapped by the
    terminal and not by the docstring's line breaks (which cut the listing mid-sentence)."""
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["--help"]) == 0
    listing = capsys.readouterr().out.split("Commands")[1]
    rows: dict[str, str] = {}
    name = ""
    for line in listing.splitlines():
        cells = line.strip("│ ").split("  ", 1) if line.startswith("│") else []
        if len(cells) == 2 and cells[0] and " " not in cells[0]:
            name, text = cells[0], cells[1].strip()
            rows[name] = text
        elif cells and name:
            rows[name] += " " + line.strip("│ ")
    for path, cmd in _commands():
        if " " in path or not path or path not in rows:
            continue
        full = " ".join((cmd.help or "").split())
        assert rows[path] and full.startswith(rows[path]), (path, rows[path])
        assert rows[path].endswith(".") or rows[path] == full, (path, rows[path])
    assert {"submit", "cancel", "join", "status"} <= set(rows)
    assert "A trial runs in one place" not in listing  # join's second sentence: its own --help
    # wrapped by rich at the width: every line of an entry but its last is nearly full
    entry: list[str] = []
    for line in [*listing.splitlines(), "│ end  x"]:
        if not line.startswith("│"):
            continue
        if line[2:4].strip() and entry:  # a new command's name: check the previous entry
            assert all(len(x.rstrip("│ ").rstrip()) > 80 for x in entry[:-1]), entry
            entry = []
        entry.append(line)


@pytest.mark.slow
def test_submit_help_as_printed():
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
    out = subprocess.run(ORCH + ["submit", "--help"], capture_output=True, text=True, env=env)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "Examples:" in text and "$ orchestrator submit sweeps/quickstart.yaml" in text
    assert "$ORCH_DB" in text and "runs/orchestrator.db" in text
    assert "<bool>" not in text.split("--help")[0]  # flags show no type column


def test_no_database_says_where_it_looked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORCH_DB", raising=False)
    assert main(["ls"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(tmp_path / "runs" / "orchestrator.db") in err
    assert "$ORCH_DB not set" in err and "--db" in err and "ORCH_DB=" in err
    monkeypatch.setenv("ORCH_DB", str(tmp_path / "elsewhere.db"))
    assert main(["ls"]) == 2
    assert "from $ORCH_DB" in capsys.readouterr().err


def _dump(path: Path) -> list[str]:
    with sqlite3.connect(path) as c:
        return list(c.iterdump())


def _at(path: Path, revision: str) -> None:
    from alembic import command

    from orchestrator.store.engine import _alembic_config

    eng = sa.create_engine(f"sqlite:///{path}")
    with eng.begin() as conn:
        command.upgrade(_alembic_config(conn), revision)
    eng.dispose()


@pytest.mark.parametrize("rev", ["0001_initial", "0002_step_lr"])
def test_db_upgrade_stamps_an_unversioned_database(tmp_path, capsys, rev):
    from orchestrator.store.engine import VERSION_TABLE, head_revision

    db = tmp_path / "old.db"
    _at(db, rev)
    with sqlite3.connect(db) as c:
        c.execute("INSERT INTO sweeps (name, spec_text, spec_hash) VALUES ('s', 'x', 'h')")
        c.execute(f"DROP TABLE {VERSION_TABLE}")
    assert main(["ls", "--db", str(db)]) == 2  # refused while unversioned
    assert "db upgrade" in capsys.readouterr().err
    assert main(["db", "upgrade", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert f"unversioned (stamped {rev}) -> {head_revision()}" in out
    with sqlite3.connect(db) as c:
        assert c.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall() == [(head_revision(),)]
        assert c.execute("SELECT name FROM sweeps").fetchall() == [("s",)]
    assert main(["ls", "--db", str(db)]) == 0


def test_db_upgrade_refuses_unknown_revision_and_foreign_tables(tmp_path, capsys):
    from orchestrator.store.engine import VERSION_TABLE, head_revision

    db = tmp_path / "future.db"
    _at(db, "head")
    with sqlite3.connect(db) as c:
        c.execute(f"UPDATE {VERSION_TABLE} SET version_num = '9999_from_the_future'")
    before = _dump(db)
    assert main(["db", "upgrade", "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'9999_from_the_future'" in err and "newer" in err
    assert head_revision() in err
    assert _dump(db) == before
    assert main(["ls", "--db", str(db)]) == 2  # the gate says the same
    assert "9999_from_the_future" in capsys.readouterr().err

    odd = tmp_path / "odd.db"
    with sqlite3.connect(odd) as c:
        c.execute("CREATE TABLE trials (id INTEGER PRIMARY KEY, whatever TEXT)")
    assert main(["db", "upgrade", "--db", str(odd)]) == 2
    assert "match no known revision" in capsys.readouterr().err


def test_db_upgrade_stamps_and_refuses_on_every_backend(db_url, capsys):
    """The same two cases through SQLAlchemy, on SQLite and (when configured) PostgreSQL."""
    from conftest import old_database
    from orchestrator.store.engine import VERSION_TABLE, head_revision

    engine = old_database(db_url, "0001_initial")
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {VERSION_TABLE}"))
    assert main(["db", "upgrade", "--db", db_url]) == 0
    assert f"unversioned (stamped 0001_initial) -> {head_revision()}" in capsys.readouterr().out
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT name FROM sweeps")).all() == [("s",)]
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = 'zz_future'"))
    assert main(["db", "upgrade", "--db", db_url]) == 2
    err = capsys.readouterr().err
    assert "'zz_future'" in err and "does not know" in err and len(err.strip().splitlines()) == 1
    with engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == "zz_future"
    engine.dispose()


def test_join_hint_names_the_fix(monkeypatch):
    from orchestrator.runner.cluster import join_hint

    msg = "Failed to connect to Ray cluster at 10.0.0.1:6379"
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert "export RAY_AUTH_MODE=token" in join_hint(msg)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert "is the head's" in join_hint(msg)
    assert join_hint("Ray has not been started yet") == ""
