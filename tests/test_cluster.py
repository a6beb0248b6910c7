"""A real two-node Ray cluster on this machine, as docs/how-to/clusters.md builds it: ``ray start
--head`` and a second ``ray start --address`` (separate raylets, free ports, token
authentication with a token file), a driver that lacks the token refused in one line that
names the fix, then a sweep on PostgreSQL whose trials ran on both nodes; and a node killed
under a running trial, which finishes on the other node from its checkpoint in the database
(no shared folder). The tests stop the nodes by their process ids (each started in a session
of its own)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from conftest import POSTGRES_URL, make_pg_schema_url
from proc_support import free_port

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not POSTGRES_URL, reason="needs ORCH_TEST_POSTGRES_URL")]

RAY = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"]
ORCH = [sys.executable, "-m", "orchestrator.cli"]
# Trials of a few seconds: a trial that ends before the second node's worker has started
# would hand its warm actor to the next trial (reuse_actors), and one node would run all four.
# Trials long enough (seconds each on a loaded machine) that the second node's first worker
# is up before the first node's reused actor could have run all four. The bench_sleep cell's
# steps sleep (8 s a trial): the trials wait instead of spinning cores the suite shares.
SPEC = """name: two_nodes
plugins: [orchestrator.bench.fixed_duration]
fixed: {task: mqar, task.K: 4, d_model: 16, batch_size: 8, arm: bench_sleep, model.step_ms: 10}
axes: {seed: [0, 1, 2, 3]}
budget: {steps: 800, eval_every: 100}
resources: {cpu: 1}
"""


def _node(args: list[str], env: dict[str, str], log: Path, node_manager_port: int | None = None) -> subprocess.Popen:
    # A session of its own: the node's gcs_server, raylet and workers are its process group.
    return subprocess.Popen(
        RAY
        + [
            "start",
            "--block",
            "--num-cpus=1",
            "--disable-usage-stats",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--node-manager-port={node_manager_port or free_port()}",
            f"--object-manager-port={free_port()}",
            *args,
        ],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    try:  # whatever of the node's group outlived `ray start`
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_for_port(port: int, head: subprocess.Popen, timeout: float = 60) -> None:
    """Until the head's GCS port accepts connections (what a joining node or driver needs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert head.poll() is None, "the head node exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the head's port {port} did not open")


def _wait_for_nodes(address: str, env: dict[str, str], n: int, timeout: float = 120) -> None:
    """Until the cluster at ``address`` counts ``n`` live nodes. A probe that hangs is one
    failed try, not the end of the wait: a driver joining a GCS that is still starting keeps
    retrying inside ``ray.init`` (up to a minute), and on a loaded machine one probe once took
    the whole wait (CI, test_fleet)."""
    code = (
        "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False, "
        "logging_level='ERROR'); print(sum(x['Alive'] for x in ray.nodes()))"
    )
    deadline = time.monotonic() + timeout
    last = ""
    while (left := deadline - time.monotonic()) > 0:
        try:
            r = subprocess.run(
                [sys.executable, "-c", code, address], env=env, capture_output=True, text=True, timeout=min(30, left)
            )
        except subprocess.TimeoutExpired as exc:
            last = f"a probe hung: {(exc.stderr or b'')[-500:]!r}"
            continue
        if r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == [str(n)]:
            return
        last = f"the probe said {r.stdout.strip()[-200:]!r} {r.stderr.strip()[-500:]!r}"
        time.sleep(1)
    raise AssertionError(f"the cluster did not reach {n} nodes within {timeout:g} s ({last})")


def test_sweep_runs_on_both_nodes_of_a_token_auth_cluster():
    tmp = Path(tempfile.mkdtemp(prefix="orc", dir="/tmp"))  # short: Ray's socket paths
    token = tmp / "token"
    token.write_text(uuid.uuid4().hex)
    auth = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    auth.pop("RAY_ADDRESS", None)
    port = free_port()
    address = f"127.0.0.1:{port}"
    url, drop = make_pg_schema_url()
    nodes = []
    try:
        nodes.append(
            _node(
                [
                    "--head",
                    f"--port={port}",
                    "--node-ip-address=127.0.0.1",
                    "--include-dashboard=false",
                    f"--temp-dir={tmp / 'ray'}",
                ],
                auth,
                tmp / "head.log",
            )
        )
        _wait_for_port(port, nodes[0])
        spec = tmp / "two_nodes.yaml"
        spec.write_text(SPEC)
        argv = ORCH + ["submit", str(spec), "--address", address, "--db", url, "--quiet"]

        # A driver without the token: refused in one line naming the fix, nothing written.
        # Ray retries the refused connection for a while before it gives up, so this driver
        # runs while the second node joins (it needs only the head).
        bare = {**auth, "RAY_AUTH_MODE": "disabled"}
        bare.pop("RAY_AUTH_TOKEN_PATH")
        refused = subprocess.Popen(argv, env=bare, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            nodes.append(_node([f"--address={address}"], auth, tmp / "node.log"))
            _wait_for_nodes(address, auth, 2)
            _, stderr = refused.communicate(timeout=300)
        finally:
            if refused.poll() is None:
                refused.kill()
                refused.wait()
        assert refused.returncode == 2, stderr[-2000:]
        err = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
        assert len(err) == 1 and "cannot join the Ray cluster" in err[0]
        assert "RAY_AUTH_MODE=token" in err[0] and "auth_token" in err[0]

        r = subprocess.run(argv, env=auth, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        engine = sa.create_engine(url)
        with engine.connect() as c:
            rows = c.execute(sa.text("SELECT status, node_id FROM trials")).all()
        engine.dispose()
        assert [s for s, _ in rows] == ["completed"] * 4
        assert len({n for _, n in rows}) == 2, rows  # both raylets ran trials
    finally:
        for p in reversed(nodes):
            _stop(p)
        drop()
        shutil.rmtree(tmp, ignore_errors=True)


# Sleeping steps again (8 s a trial): long enough to be caught mid-way on the second node.
KILL_SPEC = """name: node_lost
plugins: [orchestrator.bench.fixed_duration]
fixed: {task: mqar, task.K: 4, d_model: 16, batch_size: 8, arm: bench_sleep, model.step_ms: 20,
        checkpoint_every_s: 0}
axes: {seed: [0, 1]}
budget: {steps: 400, eval_every: 20}
resources: {cpu: 1}
retries: 2
"""


def _node_ids(address: str, env: dict[str, str]) -> dict[int, str]:
    """Node manager port -> node id of the cluster's live nodes."""
    code = (
        "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False, logging_level='ERROR');"
        "print(';'.join(f\"{n['NodeManagerPort']}={n['NodeID']}\" for n in ray.nodes() if n['Alive']))"
    )
    r = subprocess.run([sys.executable, "-c", code, address], env=env, capture_output=True, text=True, timeout=60)
    pairs = r.stdout.strip().splitlines()[-1].split(";")
    return {int(p.split("=")[0]): p.split("=")[1] for p in pairs}


def test_a_trial_whose_node_is_killed_finishes_on_the_other_from_its_stored_checkpoint():
    """No shared folder: the trial's checkpoint is in the database, so the surviving node
    continues it (step > 0), and its attempts name both nodes."""
    tmp = Path(tempfile.mkdtemp(prefix="orc", dir="/tmp"))
    token = tmp / "token"
    token.write_text(uuid.uuid4().hex)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    env.pop("RAY_ADDRESS", None)
    port, worker_port = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    url, drop = make_pg_schema_url()
    nodes: list[subprocess.Popen] = []
    driver = None
    try:
        head = ["--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false"]
        nodes.append(_node([*head, f"--temp-dir={tmp / 'ray'}"], env, tmp / "head.log"))
        time.sleep(3)
        nodes.append(_node([f"--address={address}"], env, tmp / "node.log", node_manager_port=worker_port))
        _wait_for_nodes(address, env, 2)
        worker = _node_ids(address, env)[worker_port]
        spec = tmp / "node_lost.yaml"
        spec.write_text(KILL_SPEC)
        argv = ORCH + ["submit", str(spec), "--address", address, "--db", url, "--quiet"]
        driver = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True, cwd=tmp)
        engine = sa.create_engine(url)
        on_worker = (
            "SELECT t.id, c.step FROM trials t JOIN trial_checkpoints c ON c.trial_id = t.id WHERE t.node_id = :n"
        )
        deadline = time.monotonic() + 240
        victim = None
        while time.monotonic() < deadline and driver.poll() is None and victim is None:
            try:
                with engine.connect() as c:
                    row = c.execute(sa.text(on_worker), {"n": worker}).first()
            except sa.exc.ProgrammingError:  # the driver has not made the tables yet
                row = None
            if row is not None and row.step >= 60:
                victim = row.id
            time.sleep(0.1)
        assert victim is not None, "no trial checkpointed on the second node"
        os.killpg(nodes[1].pid, signal.SIGKILL)  # the node and everything it ran
        _, err = driver.communicate(timeout=300)
        assert driver.returncode == 0, err[-3000:]
        with engine.connect() as c:
            statuses = c.execute(sa.text("SELECT status FROM trials")).scalars().all()
            tried = c.execute(
                sa.text(
                    "SELECT attempt, node_id, from_step, outcome FROM attempts WHERE trial_id = :t ORDER BY attempt"
                ),
                {"t": victim},
            ).all()
        engine.dispose()
        assert statuses == ["completed", "completed"]
        assert tried[0].node_id == worker and tried[-1].node_id != worker, tried
        assert tried[-1].from_step is not None and tried[-1].from_step >= 60, tried
        assert tried[-1].outcome == "completed" and tried[0].outcome in ("failed", "lost"), tried
        assert not list(tmp.rglob("*.pt"))  # no checkpoint file anywhere
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        for p in reversed(nodes):
            _stop(p)
        drop()
        shutil.rmtree(tmp, ignore_errors=True)
