"""Ray start-up: without --address the driver always starts its own local Ray, whatever a
dead `ray start` cluster left in the temp folder; with --address, a cluster that does not
answer is one line within the bounded join time; a sweep started from a process that
already runs Ray (a notebook, the test session) runs on that Ray and leaves it running."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

SPEC = """
name: tiny
fixed: {task: mqar, task.K: 8, arm: armed_gdn, d_model: 16, n_layers: 1}
budget: {steps: 6, eval_every: 3}
"""


def _dead_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def stale_ray_tmp():
    # A short path: Ray's unix sockets live under it (107-byte limit).
    root = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    (root / "ray").mkdir()
    (root / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{_dead_port()}\n")
    env = {**os.environ, "RAY_TMPDIR": str(root), "ORCH_RAY_JOIN_TIMEOUT_S": "20"}
    env.pop("RAY_ADDRESS", None)
    yield root, env
    shutil.rmtree(root, ignore_errors=True)


def _cli(args, env, cwd, timeout):
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return r, time.monotonic() - t0


@pytest.mark.slow
def test_submit_without_address_ignores_a_stale_cluster_file(stale_ray_tmp, tmp_path):
    root, env = stale_ray_tmp
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    db = tmp_path / "o.db"
    r, _ = _cli(["submit", str(spec), "--db", str(db), "-q"], env, tmp_path, 300)
    assert r.returncode == 0, r.stderr[-2000:]
    eng = sa.create_engine(f"sqlite:///{db}")
    with eng.connect() as c:
        assert c.execute(sa.text("SELECT status FROM trials")).scalars().all() == ["completed"]
    eng.dispose()


@pytest.mark.slow
def test_address_of_a_dead_cluster_is_one_line(stale_ray_tmp, tmp_path):
    # (Not `--address auto`: Ray's "auto" also joins any live cluster it finds on the machine.)
    root, env = stale_ray_tmp
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    for address in (f"127.0.0.1:{_dead_port()}", "127.0.0.1:notaport"):
        r, took = _cli(
            ["submit", str(spec), "--db", str(tmp_path / "o.db"), "--address", address, "-q"], env, tmp_path, 120
        )
        assert r.returncode == 2, r.stderr[-2000:]
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "cannot join the Ray cluster" in lines[0], r.stderr[-2000:]
        assert took < 60
        assert not (tmp_path / "o.db").exists()


@pytest.mark.slow
def test_a_sweep_in_a_process_running_ray_uses_it_and_leaves_it_running(shared_ray, tmp_path):
    import ray

    import orchestrator

    node = ray.get_runtime_context().get_node_id()
    for name in ("first", "second"):  # the second finds the Ray the first must not have stopped
        run = orchestrator.submit(
            SPEC.replace("name: tiny", f"name: {name}"), db=str(tmp_path / "o.db"), checkpoint_dir=str(tmp_path / "ck")
        )
        assert run.outcomes == {"completed": 1}
        assert ray.is_initialized(), "the sweep shut down a Ray it did not start"
        ctx = ray.get_runtime_context()
        assert (ctx.gcs_address, ctx.get_node_id()) == (shared_ray, node)
