"""Shared test fixtures.

Tests run on 2 cores next to each other: torch is pinned to one thread here so timings and
float reductions are the same in every test process.

``db_url`` runs a test once on a fresh SQLite file and, when ``ORCH_TEST_POSTGRES_URL`` is set
(``.ci/run`` sets it), once on PostgreSQL in a schema of its own that is dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from urllib.parse import quote

import pytest
import sqlalchemy as sa
import torch

torch.set_num_threads(1)

POSTGRES_URL = os.environ.get("ORCH_TEST_POSTGRES_URL")
BACKENDS = ["sqlite"] + (["postgresql"] if POSTGRES_URL else [])


def _pg_base() -> str:
    url = POSTGRES_URL or ""
    if url.startswith(("postgresql://", "postgres://")):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_pg_schema_url(*, reader: bool = True) -> tuple[str, callable]:
    """A URL whose search_path is a brand-new schema, and a function that drops it.

    The URL's role (the CI server's ``root``) is a superuser, so ``sql`` and ``ui`` read
    through a reader role or refuse: with ``reader`` (the default) the schema gets one,
    made by ``orchestrator db create-reader`` as a lab's administrator would, and dropped
    with the schema."""
    base = _pg_base()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    role = f"orch_r_{schema[2:]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in base else "?"
    url = f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
    if reader:
        from orchestrator.store.readonly import create_reader

        create_reader(url, role)

    def drop() -> None:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            if reader:
                c.execute(sa.text(f'DROP OWNED BY "{role}"'))
                c.execute(sa.text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()

    return url, drop


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path):
    """A fresh, empty database URL on each available backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    url, drop = make_pg_schema_url()
    try:
        yield url
    finally:
        drop()


@pytest.fixture(scope="session")
def two_arm_reference_db(tmp_path_factory) -> str:
    """A SQLite URL holding one uninterrupted run of :func:`two_arm_spec`, made once per
    session: the lifecycle and fault tests compare their interrupted runs against it (trial
    keys do not depend on the sweep's name, so one run serves every name)."""
    import subprocess
    import sys

    tmp = tmp_path_factory.mktemp("two_arm_reference")
    spec = tmp / "spec.yaml"
    spec.write_text(two_arm_spec("reference", retries=2))
    url = f"sqlite:///{tmp / 'ref.db'}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_ADDRESS": "local"}
    cmd = [sys.executable, "-m", "orchestrator.cli", "submit", str(spec), "--db", url, "--quiet"]
    res = subprocess.run(
        cmd + ["--checkpoint-dir", str(tmp / "ck")], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr
    return url


def two_arm_spec(name: str, *, retries: int | None = None) -> str:
    """The small two-arm, three-seed MQAR sweep the runner, lifecycle and fault tests kill,
    cancel and resume (240 steps, an eval every 20: 13 rows a trial, checkpoint every step)."""
    return (
        f"\nname: {name}\n"
        "fixed:\n  task: mqar\n  task.K: 8\n  task.eval_size: 64\n  d_model: 16\n  n_layers: 1\n"
        "  batch_size: 16\n  checkpoint_every_s: 0\n"
        "axes:\n  arm: [gated_deltanet, armed_gdn]\n  seed: 0..2\n"
        "budget: {steps: 240, eval_every: 20}\nresources: {cpu: 1}\nmax_concurrent: 2\n"
        + (f"retries: {retries}\n" if retries is not None else "")
    )
