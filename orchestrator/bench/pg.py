"""A throwaway PostgreSQL schema for benchmarks (dropped afterwards)."""

from __future__ import annotations

import contextlib
import uuid
from urllib.parse import quote

import sqlalchemy as sa

from orchestrator.store.engine import resolve_url


@contextlib.contextmanager
def scratch_schema(base_url: str):
    base = resolve_url(base_url)
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()
