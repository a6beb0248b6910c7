"""Database URLs, engines and the schema-version gate.

SQLite and PostgreSQL are both first-class; what differs between them lives in
:mod:`orchestrator.store.dialect`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from orchestrator.errors import UserError
from orchestrator.store import dialect
from orchestrator.store.dialect import describe, sqlite_path, sqlite_url, storage_problem  # noqa: F401  (re-exported)

DEFAULT_DB_PATH = Path("runs") / "orchestrator.db"
VERSION_TABLE = "orchestrator_alembic_version"
_MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def resolve_url(db: str | None, spec_storage: str | None = None) -> str:
    """The database URL to use: ``--db``, else the spec's ``storage``, else ``$ORCH_DB``, else
    ``runs/orchestrator.db`` under the current directory, routed by the backends
    (:func:`~orchestrator.store.dialect.route_url`: plain paths mean SQLite files). A given
    value that is empty or in memory is refused (:func:`storage_problem`), never replaced by
    the next source; an empty ``$ORCH_DB`` counts as unset."""
    for value, source in ((db, "--db"), (spec_storage, "storage:"), (os.environ.get("ORCH_DB"), "$ORCH_DB")):
        if value is None or (source == "$ORCH_DB" and value == ""):
            continue
        problem = storage_problem(value)
        if problem is not None:
            raise UserError(f"{source} {value!r} {problem}")
        url = value
        break
    else:
        url = str(DEFAULT_DB_PATH)
    return dialect.route_url(url)


def url_source(db: str | None, spec_storage: str | None = None) -> str:
    """Where :func:`resolve_url` found the database, for messages."""
    if db:
        return "from --db"
    if spec_storage:
        return "from the spec's storage:"
    if os.environ.get("ORCH_DB"):
        return "from $ORCH_DB"
    return f"the default {DEFAULT_DB_PATH} under {Path.cwd()}: no --db given, $ORCH_DB not set"


def make_engine(url: str, *, create_dir: bool = True) -> Engine:
    """Engine for reading and writing. Creates the SQLite file's directory when asked."""
    return dialect.for_url(url).make_engine(url, create_dir=create_dir)


def _alembic_config(connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS_DIR))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None  # the migrations have one head
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return ctx.get_current_revision()


def revisions() -> list[str]:
    """Every known schema revision, oldest first (the chain ends at :func:`head_revision`)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS_DIR))
    return [r.revision for r in reversed(list(ScriptDirectory.from_config(cfg).walk_revisions()))]


def _columns(engine: Engine) -> dict[str, set[str]]:
    insp = sa.inspect(engine)
    return {t: {c["name"] for c in insp.get_columns(t)} for t in insp.get_table_names() if t != VERSION_TABLE}


def _schema_at(revision: str) -> dict[str, set[str]]:
    """The tables and columns a fresh database has at ``revision`` (built in memory)."""
    ref = sa.create_engine("sqlite://")
    with ref.begin() as conn:
        command.upgrade(_alembic_config(conn), revision)
    return _columns(ref)


def matching_revision(engine: Engine) -> str | None:
    """The newest revision whose tables and columns an unversioned database has exactly
    (tables that no revision creates, e.g. another tool's, are ignored)."""
    have = _columns(engine)
    for rev in reversed(revisions()):
        want = _schema_at(rev)
        if all(have.get(t) == cols for t, cols in want.items()):
            return rev
    return None


def _unknown_revision(url: str, current: str) -> UserError:
    known = revisions()
    return UserError(
        f"database {describe(url)} is at schema revision {current!r}, which this "
        f"orchestrator does not know (it knows {known[0]} .. {known[-1]}): it was "
        "written by a newer orchestrator; upgrade the orchestrator, not the database"
    )


@contextmanager
def _migration_transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction for a whole migration, holding the write lock from its first statement.

    PostgreSQL's DDL is transactional already. pysqlite opens transactions only before DML,
    so on SQLite each ``CREATE TABLE`` would commit on its own and a driver opening the same
    new file a moment later would see tables without their version row (or race to create
    them too). ``BEGIN IMMEDIATE`` (:meth:`Dialect.lock_for_migration`) makes the migration
    atomic and makes that second driver wait (busy_timeout) and then find the schema at head;
    Alembic then has nothing to do for it.
    """
    with engine.begin() as conn:
        dialect.for_connection(conn).lock_for_migration(conn)
        yield conn


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Bring the schema to head. Returns (revision before, revision after).

    A database with orchestrator tables but no version stamp (made before versioning, or by
    hand) is stamped with the revision its tables match, then upgraded; one that matches no
    revision, or carries a revision this code does not know, is refused with one line and
    left untouched."""
    url = engine.url.render_as_string(hide_password=True)
    try:
        before = current_revision(engine)
        if before is not None and before not in revisions():
            raise _unknown_revision(url, before)
        if before is None and set(sa.inspect(engine).get_table_names()) & {"sweeps", "trials", "evals"}:
            rev = matching_revision(engine)
            if rev is None:
                raise UserError(
                    f"database {describe(url)} has orchestrator tables but no schema "
                    "version, and its tables match no known revision: not touched "
                    "(export what you need and start a new database)"
                )
            with _migration_transaction(engine) as conn:
                command.stamp(_alembic_config(conn), rev)
            before = f"unversioned (stamped {rev})"
        with _migration_transaction(engine) as conn:
            command.upgrade(_alembic_config(conn), "head")
    except sa.exc.OperationalError as exc:  # an unwritable path, a server that is not there
        raise UserError(f"cannot open database {describe(url)}: {str(exc.orig).strip().splitlines()[0]}") from None
    return before, head_revision()


def ensure_schema(engine: Engine, url: str, *, auto_create: bool = True) -> None:
    """Upgrade a fresh (empty) database to head; refuse one at an older revision, so a
    running sweep never writes through a schema it does not know."""
    head = head_revision()
    try:
        current = current_revision(engine)
    except sa.exc.OperationalError as exc:
        raise UserError(f"cannot open database {describe(url)}: {exc.orig}") from exc
    if current == head:
        return
    if current is None:
        tables = set(sa.inspect(engine).get_table_names())
        if tables & {"sweeps", "trials", "evals"}:
            # Another driver may have created the schema between the two reads above.
            current = current_revision(engine)
            if current is None:
                raise UserError(
                    f"database {describe(url)} has orchestrator tables but no schema "
                    f"version: run `orchestrator db upgrade --db {describe(url)}`"
                )
        elif auto_create:
            try:
                upgrade(engine)
            except Exception:
                # Two drivers creating one fresh database: the loser's CREATE fails, and the
                # schema it wanted is there.
                if current_revision(engine) != head:
                    raise
            return
        else:
            raise UserError(f"database {describe(url)} is empty: run `orchestrator db upgrade`")
        if current == head:
            return
    if current not in revisions():
        raise _unknown_revision(url, current)
    raise UserError(
        f"database {describe(url)} is at schema revision {current}, this "
        f"orchestrator needs {head}: run `orchestrator db upgrade --db "
        f"{describe(url)}`"
    )


def open_store_engine(
    db: str | None, spec_storage: str | None = None, *, auto_create: bool = True
) -> tuple[Engine, str]:
    """Resolve, connect and gate on the schema version; the one way commands open the DB."""
    url = resolve_url(db, spec_storage)
    if not auto_create:
        path = dialect.for_url(url).missing(url)
        if path is not None:
            raise UserError(
                f"no database at {path} ({url_source(db, spec_storage)}); run a "
                "sweep first, or point at one with --db PATH|URL or "
                "ORCH_DB=PATH|URL"
            )
    engine = make_engine(url)
    ensure_schema(engine, url, auto_create=auto_create)
    return engine, url
