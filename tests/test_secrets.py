"""A password in a spec's storage URL is never stored: not in any table, not in a log, not
in a checkpoint, not on the console (the spec text is stored with *** in its place)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
import sqlalchemy as sa

PG = os.environ.get("ORCH_TEST_POSTGRES_URL")
PASSWORD = "Hunter2-" + uuid.uuid4().hex[:10]


def _grep_tree(root: Path, needle: bytes) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            try:
                if needle in p.read_bytes():
                    hits.append(str(p))
            except OSError:
                pass
    return hits


@pytest.mark.slow
@pytest.mark.skipif(not PG, reason="needs PostgreSQL (ORCH_TEST_POSTGRES_URL)")
def test_password_never_stored(tmp_path):
    from conftest import make_pg_schema_url

    url, drop = make_pg_schema_url()
    u = sa.engine.make_url(url)
    user = u.username or os.environ.get("USER") or "root"
    schema = u.query["options"].split("=", 1)[1] if "options" in u.query else ""
    storage = (
        f"postgresql://{user}:{PASSWORD}@{u.host}:{u.port}/{u.database}?options={quote(f'-csearch_path={schema}')}"
    )
    ray_tmp = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))
    logs = tmp_path / "logs"
    try:
        spec = tmp_path / "s.yaml"
        spec.write_text(
            "name: secret\n"
            "fixed: {task: mqar, task.K: 8, arm: armed_gdn, d_model: 16, n_layers: 1}\n"
            "axes: {seed: [0, 1]}\n"
            "budget: {steps: 6, eval_every: 3}\n"
            f"storage: '{storage}'\n"
            f"checkpoint_dir: '{tmp_path / 'ckpt'}'\n"
        )
        env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "ORCH_LOG_DIR": str(logs)}
        env.pop("RAY_ADDRESS", None)
        r = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "submit", str(spec)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        assert PASSWORD not in r.stdout + r.stderr
        assert "PGPASSFILE" in r.stderr  # the warning
        eng = sa.create_engine(url)
        with eng.connect() as c:
            tables = (
                c.execute(
                    sa.text("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")
                )
                .scalars()
                .all()
            )
            assert {"sweeps", "trials", "evals"} <= set(tables)
            n = 0
            for t in tables:
                for row in c.execute(sa.text(f'SELECT t::text FROM "{t}" t')).scalars():
                    n += 1
                    assert PASSWORD not in row, t
            spec_text = c.execute(sa.text("SELECT spec_text FROM sweeps")).scalar_one()
            assert f"{user}:***@" in spec_text
            assert c.execute(sa.text("SELECT count(*) FROM trials WHERE status = 'completed'")).scalar_one() == 2
        eng.dispose()
        assert n > 2
        for root in (tmp_path, ray_tmp):
            assert (
                _grep_tree(root, PASSWORD.encode()) == [str(spec)]
                if root == tmp_path
                else _grep_tree(root, PASSWORD.encode()) == []
            )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
        drop()
