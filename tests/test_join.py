"""Many drivers on one PostgreSQL sweep, each a subprocess with a local Ray of its own, its own
HOME, TMPDIR and working directory (as on machines that share only the database):

- two ``join``ed drivers started together on a sweep of 16 trials: every trial ran exactly
  once (one attempt each, named after the driver that claimed it), and both drivers ran trials;
- one of two drivers SIGKILLed (its whole process group) mid-run: the other takes its trials
  over once their claims lapse (``ORCH_LEASE_TTL_S``), each continuing from its stored
  checkpoint, and the final evals equal an uninterrupted run's;
- ``orchestrator status`` lists both live drivers, and ``orchestrator cancel`` stops both (exit
  130, their trials interrupted, nothing left running).

The claim protocol itself (concurrent claimers, lapsed claims) is tested without Ray in
tests/test_claims.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import OWN_RAY, TINY_FIXED, backend_url, query, record_sweep, shared_env, sweep_evals, two_arm_spec
from orchestrator.cli import main

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "orchestrator.cli"]
TTL = 6


def _driver(args: list[str], url: str, cwd: Path, address: str | None = None) -> subprocess.Popen:
    """A driver with a Ray of its own, or, given the session's Ray ``address`` (for a test not
    about machines going down), a driver joined to that one."""
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "home").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        **OWN_RAY,  # a Ray of its own (one CPU), as on another machine
        "ORCH_LEASE_TTL_S": str(TTL),
        "HOME": str(cwd / "home"),
        # Short: Ray puts its sockets there (at most 107 bytes a path).
        "TMPDIR": tempfile.mkdtemp(prefix="orch-j-", dir="/tmp"),
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    if address is not None:
        env = shared_env(env)
        env["HOME"] = os.environ.get("HOME", env["HOME"])  # the session Ray's token (~/.ray) is there
        args = [*args, "--address", address]
    return subprocess.Popen(
        CLI + args + ["--db", url, "--quiet"],
        cwd=cwd,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _until(ready, procs: list[subprocess.Popen], timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            raise AssertionError(f"a driver ended early: {[p.communicate()[1] for p in procs if p.poll() is not None]}")
        try:
            if ready():
                return
        except Exception:  # a table not made yet
            pass
        time.sleep(0.1)
    raise AssertionError("timed out")


def _owners(url: str) -> dict[int, str]:
    return {r.pid: r.owner for r in query(url, "SELECT pid, owner FROM drivers")}


def test_two_joined_drivers_run_every_trial_exactly_once(tmp_path):
    url, drop = backend_url(tmp_path, "postgresql")
    try:
        text = (
            "\nname: many\n" + TINY_FIXED + "  checkpoint_every_s: 0\n"
            "axes:\n  arm: [gated_deltanet, armed_gdn]\n  seed: 0..7\n"
            "budget: {steps: 30, eval_every: 10}\nresources: {cpu: 1}\nmax_concurrent: 2\n"
        )
        record_sweep(url, text)
        a = _driver(["join", "many"], url, tmp_path / "a")
        b = _driver(["join", "many"], url, tmp_path / "b")
        out_a, err_a = a.communicate(timeout=600)
        out_b, err_b = b.communicate(timeout=600)
        assert (a.returncode, b.returncode) == (0, 0), (err_a, err_b)
        assert "many: " in out_a and "completed" in out_a, out_a
        assert query(url, "SELECT status, attempts, COUNT(*) FROM trials GROUP BY status, attempts") == [
            ("completed", 1, 16)
        ]
        tried = query(url, "SELECT trial_id, COUNT(*), MIN(driver), MIN(outcome) FROM attempts GROUP BY trial_id")
        assert len(tried) == 16 and all(r[1] == 1 and r[3] == "completed" for r in tried)
        owners = _owners(url)
        by_driver = {o: sum(1 for r in tried if r[2] == o) for o in (owners[a.pid], owners[b.pid])}
        assert all(n > 0 for n in by_driver.values()), by_driver  # both drivers ran trials
        assert sum(by_driver.values()) == 16
        assert query(url, "SELECT COUNT(*) FROM evals")[0][0] == 16 * 4
        ends = query(url, "SELECT end_reason, COUNT(*) FROM drivers WHERE ended_at IS NOT NULL GROUP BY end_reason")
        assert ends == [("finished", 2)]
        assert query(url, "SELECT COUNT(*) FROM trials WHERE claimed_by IS NOT NULL")[0][0] == 0
    finally:
        drop()


def test_a_killed_drivers_trials_are_taken_over_and_equal_an_uninterrupted_run(tmp_path, two_arm_reference_db):
    url, drop = backend_url(tmp_path, "postgresql")
    try:
        record_sweep(url, two_arm_spec("takeover", retries=2))
        a = _driver(["join", "takeover", "--max-concurrent", "1"], url, tmp_path / "a")
        b = _driver(["join", "takeover"], url, tmp_path / "b")
        # B is up, and A runs a trial with a checkpoint past step 0.
        _until(
            lambda: (
                len(_owners(url)) == 2
                and query(
                    url,
                    "SELECT COUNT(*) FROM trials t JOIN drivers d ON d.owner = t.claimed_by JOIN trial_checkpoints c "
                    f"ON c.trial_id = t.id WHERE d.pid = {a.pid} AND t.status = 'running' AND c.step >= 40",
                )[0][0]
            ),
            [a, b],
        )
        owner_a = _owners(url)[a.pid]
        os.killpg(a.pid, signal.SIGKILL)
        a.wait()
        held = {r[0]: r[1] for r in query(url, f"SELECT id, status FROM trials WHERE claimed_by = '{owner_a}'")}
        assert held and "running" in held.values()
        _, err = b.communicate(timeout=600)
        assert b.returncode == 0, err
        assert dict(query(url, "SELECT status, COUNT(*) FROM trials GROUP BY status")) == {"completed": 6}
        assert sweep_evals(url) == sweep_evals(two_arm_reference_db)
        owner_b = _owners(url)[b.pid]
        # Each trial A was running: its attempt lost, continued by B from its checkpoint.
        for tid, status in held.items():
            tried = query(
                url, f"SELECT driver, from_step, outcome FROM attempts WHERE trial_id = {tid} ORDER BY attempt"
            )
            assert tried[-1].driver == owner_b and tried[-1].outcome == "completed"
            if status == "running":
                assert [(r.driver, r.outcome) for r in tried[:-1]] == [(owner_a, "lost")]
                assert tried[-1].from_step and tried[-1].from_step > 0
        # A never ended its row: it was killed; its claims lapsed and went to B.
        assert query(url, f"SELECT ended_at FROM drivers WHERE owner = '{owner_a}'")[0][0] is None
    finally:
        drop()


def test_cancel_stops_every_driver_and_status_lists_them(tmp_path):
    url, drop = backend_url(tmp_path, "postgresql")
    try:
        # Trials far too long to end before the cancel lands, however loaded the machine (a
        # minute each), of the bench_sleep cell: they wait rather than spin the shared cores.
        record_sweep(
            url,
            "\nname: halt\nplugins: [orchestrator.bench.fixed_duration]\n" + TINY_FIXED + "  arm: bench_sleep\n"
            "  model.step_ms: 300\naxes:\n  seed: 0..5\nbudget: {steps: 200, eval_every: 5}\n"
            "resources: {cpu: 1}\nmax_concurrent: 2\n",
        )
        a = _driver(["join", "halt", "--max-concurrent", "1"], url, tmp_path / "a")
        b = _driver(["join", "halt", "--max-concurrent", "1"], url, tmp_path / "b")
        _until(
            lambda: (
                query(
                    url,
                    "SELECT COUNT(DISTINCT claimed_by) FROM trials t WHERE status = 'running' AND "
                    "EXISTS (SELECT 1 FROM evals e WHERE e.trial_id = t.id)",
                )[0][0]
                == 2
            ),
            [a, b],
        )
        env = {**os.environ, "ORCH_LEASE_TTL_S": str(TTL), "HOME": str(tmp_path)}
        st = subprocess.run(CLI + ["status", "halt", "--db", url, "--json"], env=env, capture_output=True, text=True)
        drivers = json.loads(st.stdout)["sweeps"][0]["drivers"]
        assert sorted(d["pid"] for d in drivers) == sorted([a.pid, b.pid])
        assert all(d["claimed"] >= 1 and d["running"] >= 1 and d["heartbeat_at"] for d in drivers)
        shown = subprocess.run(CLI + ["status", "halt", "--db", url], env=env, capture_output=True, text=True).stdout
        assert "run by 2 driver(s)" in shown and f"pid {a.pid}" in shown and f"pid {b.pid}" in shown
        res = subprocess.run(CLI + ["cancel", "halt", "--db", url], env=env, capture_output=True, text=True)
        assert res.returncode == 0 and "cancel requested; 2 driver(s)" in res.stderr, res.stderr
        t0 = time.time()
        _, err_a = a.communicate(timeout=120)
        _, err_b = b.communicate(timeout=120)
        assert (a.returncode, b.returncode) == (130, 130), (err_a, err_b)
        assert time.time() - t0 < 60
        by_status = dict(query(url, "SELECT status, COUNT(*) FROM trials GROUP BY status"))
        assert "running" not in by_status and by_status.get("interrupted", 0) >= 2
        reasons = [r[0] for r in query(url, "SELECT end_reason FROM drivers")]
        assert len(reasons) == 2 and all(r.startswith("cancel requested") for r in reasons)
        assert query(url, "SELECT COUNT(*) FROM trials WHERE claimed_by IS NOT NULL")[0][0] == 0
    finally:
        drop()


SEQUENTIAL = (
    "\nname: seqmany\n" + TINY_FIXED + "axes:\n  arm: [armed_gdn, gated_deltanet]\n  seed: 0..7\n"
    "budget: {steps: 20, eval_every: 10}\nresources: {cpu: 1}\nmax_concurrent: 2\n"
    "sequential:\n  compare: {by: arm, groups: [armed_gdn, gated_deltanet]}\n  test: fisher\n"
    "  looks: [4, 8]\n  alpha: 0.05\nanalysis: {lockin: 0.9}\n"
)


def test_two_drivers_share_a_sequential_design_each_look_decided_once(tmp_path, shared_ray):
    """Two joined drivers on a group-sequential sweep: each look is decided once (by whichever
    driver found it complete), no trial of a later look starts before the look before it is
    decided, every trial ran at most once, and the looks, decisions and statuses equal one
    driver's run of the same design. Nothing here is about a machine going down: the two
    drivers are processes joined to the session's Ray, and the one-driver run is this
    process's own, on it too (three Rays of their own oversubscribed two cores)."""
    url, drop = backend_url(tmp_path, "postgresql")
    ref = f"sqlite:///{tmp_path / 'ref.db'}"
    try:
        record_sweep(url, SEQUENTIAL)
        a = _driver(["join", "seqmany"], url, tmp_path / "a", address=shared_ray)
        b = _driver(["join", "seqmany"], url, tmp_path / "b", address=shared_ray)
        record_sweep(ref, SEQUENTIAL)
        assert main(["join", "seqmany", "--db", ref, "--quiet", "--address", shared_ray]) == 0
        for p in (a, b):
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err
        looks_sql = "SELECT stratum, look, decision FROM sequential_looks ORDER BY stratum, look"
        looks = query(url, looks_sql)
        assert looks and [tuple(r) for r in looks] == [tuple(r) for r in query(ref, looks_sql)]
        assert len({(r.stratum, r.look) for r in looks}) == len(looks)  # once each
        status_sql = "SELECT key, status FROM trials ORDER BY key"
        assert query(url, status_sql) == query(ref, status_sql)
        tried = query(url, "SELECT trial_id, COUNT(*) FROM attempts GROUP BY trial_id")
        assert tried and all(n == 1 for _, n in tried)
        # Look 2 (seeds 4..7) starts only after look 1 (seeds 0..3) has ended.
        spans = query(
            url,
            "SELECT CAST(t.params->>'seed' AS INTEGER) < 4 AS first, MIN(a.started_at), MAX(a.ended_at) "
            "FROM attempts a JOIN trials t ON t.id = a.trial_id GROUP BY 1",
        )
        by = {r[0]: (r[1], r[2]) for r in spans}
        assert set(by) == {True, False}  # look 1 continues (as in the one-driver run): look 2 ran
        assert by[False][0] >= by[True][1]
        assert query(url, "SELECT COUNT(*) FROM trials WHERE claimed_by IS NOT NULL")[0][0] == 0
    finally:
        drop()
