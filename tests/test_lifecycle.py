"""A sweep's life through a real Ray runtime: Ctrl-C and `orchestrator cancel` stop it
(exit 130, trials interrupted) and resume finishes it equal to an uninterrupted run; two
drivers started together on one sweep: both finish and every trial runs exactly once; a
configuration error fails at once without retries, with one line in trials.error and the
traceback in trial_errors; `device: cuda` without a GPU is refused before anything is
written."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.store.engine import make_engine

from conftest import OWN_RAY, backend_url, query, shared_env, sweep_evals, two_arm_spec

pytestmark = pytest.mark.slow

SPEC = two_arm_spec("life", retries=2)
CLI = [sys.executable, "-m", "orchestrator.cli"]
# OWN_RAY: each driver starts a Ray of its own, of one CPU (one trial at a time), never joins
# a cluster another test (or engineer) left running on this machine.
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", **OWN_RAY, "ORCH_LEASE_TTL_S": "4"}


def _driver(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``orchestrator ARGS`` as a driver process in a session of its own (a signal to its
    group is a Ctrl-C to it alone), its stderr kept for the stop line."""
    return subprocess.Popen(
        CLI + list(args),
        env=env or ENV,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _submit(spec: Path, url: str, ck: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return _driver("submit", str(spec), "--db", url, "--quiet", "--checkpoint-dir", str(ck), *extra, env=env)


def _wait_mid(url: str, proc: subprocess.Popen, timeout: float = 300, last: int = 200, first: int = 40) -> None:
    """Until a trial is running with its last eval between step ``first`` and ``last`` (of 240)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            if query(
                url,
                "SELECT COUNT(*) FROM trials t WHERE status = 'running' AND "
                "(SELECT MAX(step) FROM evals e WHERE e.trial_id = t.id) "
                f"BETWEEN {int(first)} AND {int(last)}",
            )[0][0]:
                return
        except Exception:
            pass
        time.sleep(0.2)
    detail = proc.communicate()[1] if proc.poll() is not None else ""
    raise AssertionError(f"no trial was caught mid-way (driver exit {proc.poll()}): {detail}")


@pytest.fixture(scope="module")
def reference(two_arm_reference_db):
    """The uninterrupted run every interrupted one must equal."""
    return sweep_evals(two_arm_reference_db)


# SIGINT and SIGTERM stop one SQLite sweep in turn (the submit, then a resume of it: the
# same sweep's run twice, not two runs of it); `cancel` stops a PostgreSQL one.
@pytest.mark.parametrize("hows,backend", [(("sigint", "sigterm"), "sqlite"), (("cancel",), "postgresql")])
def test_stop_marks_interrupted_exits_130_and_resume_equals_uninterrupted(
    tmp_path, capsys, reference, shared_ray, hows, backend
):
    url, drop = backend_url(tmp_path, backend)
    try:
        spec = tmp_path / "spec.yaml"
        spec.write_text(SPEC)
        stops = list(hows)
        tries = 0
        while stops:
            how = stops[0]
            if tries == 0:
                proc = _submit(spec, url, tmp_path / "ck")
            else:
                proc = _driver("resume", "life", "--db", url, "--quiet", "--checkpoint-dir", str(tmp_path / "ck"))
            tries += 1
            # A cancel is read by the driver's renewal (every TTL/4 = 1 s): caught early, and
            # asked in-process, where a CLI process spends seconds importing while a 240-step
            # trial (about 100 steps a second) runs out.
            _wait_mid(url, proc, first=20 if how == "cancel" else 40, last=80 if how == "cancel" else 200)
            t0 = time.time()
            if how == "cancel":
                capsys.readouterr()
                code = main(["cancel", "life", "--db", url])
                said = capsys.readouterr().err
                assert code == 0 and "cancel requested" in said, said
            else:
                # Ctrl-C reaches the whole foreground process group; SIGTERM just the driver.
                sig = signal.SIGINT if how == "sigint" else signal.SIGTERM
                (os.killpg if how == "sigint" else os.kill)(proc.pid, sig)
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 130, (how, err)
            assert time.time() - t0 < 60
            last = [ln for ln in err.splitlines() if ln.strip()][-1]
            assert "stopped" in last and f"orchestrator resume life --db {shlex.quote(url)}`" in last  # pasteable
            by_status = dict(query(url, "SELECT status, COUNT(*) FROM trials GROUP BY status"))
            assert "running" not in by_status, (how, by_status)
            if how == "cancel" and not by_status.get("interrupted") and by_status.get("pending") and tries < 3:
                # The cancel was read as the running trial ended (a loaded machine): nothing was
                # running to interrupt, nothing started after it; the next trial is another try.
                assert by_status.get("completed", 0) == tries, by_status
                continue
            assert by_status.get("interrupted", 0) >= 1, (how, by_status)
            assert query(url, "SELECT COUNT(*) FROM sweeps WHERE lease_owner IS NOT NULL")[0][0] == 0
            stops.pop(0)
        # The stops are the real CLI processes' (signals, exit code); the resume that must equal
        # the uninterrupted run is not about Ray's start-up: in-process, on the session's Ray.
        capsys.readouterr()
        code = main(["resume", "life", "--db", url, "--quiet", "--checkpoint-dir", str(tmp_path / "ck")])
        assert code == 0, capsys.readouterr().err
        assert dict(query(url, "SELECT status, COUNT(*) FROM trials GROUP BY status")) == {"completed": 6}
        got = sweep_evals(url)
        assert [r[:6] for r in got] == [r[:6] for r in reference]  # row for row, bit for bit
    finally:
        drop()


# Ctrl-C on trials younger than their checkpoint cadence (600 s: none was due): each running
# trial stores a checkpoint of the step it reached before it stops, the stop line says where
# each continues, and resume continues there, equal to an uninterrupted run. SQLite (SIGINT
# to the process group) and PostgreSQL (SIGTERM to the driver); checkpoints in the database.
# (A cancel stops through the same path once the driver's renewal thread reads its flag.)
@pytest.mark.parametrize("how,backend", [("sigint", "sqlite"), ("sigterm", "postgresql")])
def test_a_stop_checkpoints_where_the_trials_are(tmp_path, capsys, reference, shared_ray, how, backend):
    import re

    url, drop = backend_url(tmp_path, backend)
    try:
        spec = tmp_path / "spec.yaml"
        spec.write_text(SPEC.replace("checkpoint_every_s: 0", "checkpoint_every_s: 600"))
        proc = _driver("submit", str(spec), "--db", url, "--quiet")
        _wait_mid(url, proc)
        if how == "sigint":
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        else:
            os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        said = dict(re.findall(r"trial (\w+): continues from step ([\d,]+)", err))
        stored = dict(
            query(
                url,
                "SELECT t.key, c.step FROM trial_checkpoints c JOIN trials t ON t.id = c.trial_id "
                "WHERE t.status = 'interrupted'",
            )
        )
        assert stored, err  # the stop caught trials mid-way, and each stored where it was
        assert {k: int(v.replace(",", "")) for k, v in said.items()} == stored, err
        assert all(0 < step < 240 for step in stored.values())
        assert "starts again" not in err
        capsys.readouterr()
        assert main(["resume", "life", "--db", url, "--quiet"]) == 0, capsys.readouterr().err
        starts = dict(
            query(
                url,
                "SELECT t.key, MAX(a.from_step) FROM attempts a JOIN trials t ON t.id = a.trial_id GROUP BY t.key",
            )
        )
        for key, step in stored.items():
            assert starts[key] == step, (key, starts[key], step)  # continued, not restarted
        got = sweep_evals(url)
        assert [r[:6] for r in got] == [r[:6] for r in reference]
    finally:
        drop()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_drivers_started_together_run_every_trial_exactly_once(tmp_path, backend, shared_ray):
    """Before many drivers could share a sweep the second one was refused; now it claims
    what the first has not (either may get none, if the other claimed everything first)."""
    url, drop = backend_url(tmp_path, backend)
    try:
        spec = tmp_path / "spec.yaml"
        spec.write_text(SPEC)
        # Both real driver processes, joining the session's Ray (a Ray of their own each
        # would be two start-ups at once on 2 cores; this is about the claims, not Ray).
        argv = CLI + ["submit", str(spec), "--db", url, "--quiet", "--checkpoint-dir", str(tmp_path / "ck")]
        argv += ["--address", shared_ray]
        a, b = (
            subprocess.Popen(
                argv,
                env=shared_env(),
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        )
        out_a, err_a = a.communicate(timeout=600)
        out_b, err_b = b.communicate(timeout=600)
        assert (a.returncode, b.returncode) == (0, 0), (err_a, err_b)
        assert query(url, "SELECT status, attempts, COUNT(*) FROM trials GROUP BY status, attempts") == [
            ("completed", 1, 6)
        ]
        assert query(url, "SELECT COUNT(*) FROM evals")[0][0] == 6 * 13
        owners = {r.pid: r.owner for r in query(url, "SELECT pid, owner FROM drivers")}
        # Both ran as drivers; or one started so late (a loaded machine: CI once) that the other
        # had settled every trial, and it said so without starting a driver at all.
        late = {a.pid: out_a, b.pid: out_b}.keys() - owners.keys()
        assert owners.keys() <= {a.pid, b.pid} and len(late) < 2, (owners, a.pid, b.pid)
        for pid in late:
            said = out_a if pid == a.pid else out_b
            assert "nothing ran" in said and "6 completed" in said, said
        tried = query(url, "SELECT trial_id, COUNT(*), MIN(driver) FROM attempts GROUP BY trial_id")
        assert len(tried) == 6 and all(r[1] == 1 and r[2] in owners.values() for r in tried)
        assert query(url, "SELECT COUNT(*) FROM sweep_specs")[0][0] == 1  # the one design, recorded once
    finally:
        drop()


def test_config_error_fails_at_once_one_line_traceback_kept(tmp_path, capsys, shared_ray):
    """A trial whose setup fails (here: an unreadable checkpoint) fails on its first
    attempt although retries is 2; the others complete."""
    from orchestrator import spec as specs
    from orchestrator.runner import checkpoints

    text = SPEC.replace("seed: 0..2", "seed: 0..0").replace("steps: 240", "steps: 40")
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    sweep = specs.load(spec)
    bad_key = sweep.trials[0][0]
    bad = checkpoints.trial_path(tmp_path / "ck", "life", bad_key)
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a checkpoint")
    url = f"sqlite:///{tmp_path / 'c.db'}"
    assert main(["submit", str(spec), "--db", url, "--quiet", "--checkpoint-dir", str(tmp_path / "ck")]) == 1
    rows = {r.key: r for r in query(url, "SELECT key, status, attempts, error FROM trials")}
    assert rows[bad_key].status == "failed" and rows[bad_key].attempts == 1
    err = rows[bad_key].error
    assert "\n" not in err and err.startswith("config error: UnpicklingError")
    assert {r.status for k, r in rows.items() if k != bad_key} == {"completed"}
    tb = query(
        url,
        f"SELECT e.kind, e.traceback FROM trial_errors e JOIN trials t ON t.id = e.trial_id WHERE t.key = '{bad_key}'",
    )
    assert len(tb) == 1 and tb[0][0] == "config" and "Traceback (most recent call last)" in tb[0][1]
    capsys.readouterr()
    assert main(["status", "life", "--db", url]) == 0
    assert "failed 1" in capsys.readouterr().out


def test_cuda_without_gpu_is_refused_by_dry_run_and_submit(tmp_path, capsys, shared_ray):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("  seed: 0..2", "  seed: 0..0\n  device: [cpu, cuda]"))
    db = tmp_path / "never.db"
    assert main(["submit", str(spec), "--dry-run"]) == 2
    assert main(["submit", str(spec), "--db", str(db), "--quiet"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 2 and all("device: cuda" in ln and "no GPU" in ln for ln in err)
    assert not db.exists()


def test_changed_design_needs_amend_then_supersedes(tmp_path, capsys, shared_ray):
    """Re-submitting with another model size: refused (exit 2, one line naming the change,
    nothing written) without --amend; with it the old trials are kept as superseded,
    never run, listed by status and left out of analysis."""
    from orchestrator.analysis.data import load_sweep

    small = SPEC.replace("seed: 0..2", "seed: 0..0").replace("steps: 240", "steps: 40")
    spec = tmp_path / "spec.yaml"
    spec.write_text(small)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    args = ["submit", str(spec), "--db", url, "--quiet", "--checkpoint-dir", str(tmp_path / "ck")]
    assert main(args) == 0

    def snapshot():
        return (
            query(url, "SELECT key, status, steps, spec_version FROM trials ORDER BY key"),
            query(url, "SELECT COUNT(*) FROM evals"),
            query(url, "SELECT spec_text FROM sweeps"),
            query(url, "SELECT version, spec_hash FROM sweep_specs"),
        )

    before = snapshot()
    spec.write_text(small.replace("d_model: 16", "d_model: 8"))
    capsys.readouterr()
    assert main(args) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "another design: 2 trial(s) added, 2 superseded (d_model: 16 -> 8)" in err[0]
    assert "--amend" in err[0]
    assert snapshot() == before
    assert main(args + ["--amend"]) == 0
    rows = query(
        url,
        "SELECT d_model, status, spec_version, COUNT(*) FROM "
        "(SELECT json_extract(params, '$.d_model') AS d_model, status, spec_version FROM trials) "
        "GROUP BY d_model, status, spec_version ORDER BY d_model",
    )
    assert [tuple(r) for r in rows] == [(8, "completed", 2, 2), (16, "superseded", 1, 2)]
    assert len(query(url, "SELECT version FROM sweep_specs")) == 2
    capsys.readouterr()
    assert main(["status", "life", "--db", url]) == 0
    assert "superseded 2" in capsys.readouterr().out
    data = load_sweep(make_engine(url), "life")
    assert sorted(data.trials["d_model"]) == [8, 8]
    assert data.budget_steps == 2 * 40  # the superseded trials' budgets are not the design's
