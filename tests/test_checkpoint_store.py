"""Checkpoints through the store, clean attempts and their provenance (migration 0007).

- The store: an attempt deletes its trial's rows past the step it starts from, in the
  transaction that records it (no trace is ever stitched from two attempts); checkpoints are
  replaced, not piled up; a dead driver's open attempt ends as ``lost``.
- A machine that shares only the database: a PostgreSQL sweep's driver SIGKILLed mid-run,
  resumed from another working directory with another HOME and TMPDIR and no checkpoint
  folder: every unfinished trial continues from its stored checkpoint, the rows stored before
  the kill stay byte-identical (``elapsed_s`` included), the final evals equal an
  uninterrupted run's, and no checkpoint file is written anywhere.
- A trial whose checkpoint cannot be had restarts from nothing, and its lost attempt's rows
  are gone the moment the new attempt starts.
- A database whose checkpoints are files (the default folder beside a SQLite file, before
  revision 0007) upgraded and resumed from them.
- The code-change guard, refused and allowed.
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
import sqlalchemy as sa

from orchestrator.cli import main
from orchestrator.store import attempts, repo
from orchestrator.store.engine import make_engine, open_store_engine

from conftest import backend_url, migrate, query, sweep_evals, two_arm_spec

CLI = [sys.executable, "-m", "orchestrator.cli"]


# ---- the store --------------------------------------------------------------------------------


def _one_trial(url: str) -> tuple[sa.engine.Engine, int, int]:
    from orchestrator.spec import load

    engine, _ = open_store_engine(url)
    sweep = load("<t>", text=two_arm_spec("st"))
    sid = repo.ensure_sweep(engine, "st", sweep.text, sweep.hash)
    with engine.begin() as conn:
        ids = repo.add_trials(conn, sid, sweep.trials[:1])
    return engine, sid, next(iter(ids.values()))


ENV = {"host": "h1", "device": "cpu", "precision": "fp32", "code_version": "git:a", "code_hash": "a" * 64}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_an_attempt_deletes_the_rows_past_its_step_and_closes_a_lost_one(tmp_path, backend):
    url, drop = backend_url(tmp_path, backend)
    try:
        engine, sid, tid = _one_trial(url)
        rows = [
            {"trial_id": tid, "step": s, "acc": s / 100, "loss": 1.0, "elapsed_s": s / 10} for s in range(0, 101, 10)
        ]
        with engine.begin() as conn:
            assert attempts.begin_attempt(conn, tid, None, ENV, "d:1") == 1
            repo.upsert_evals(conn, rows)
            attempts.save_checkpoints(conn, [attempts.StoredCheckpoint(tid, 40, b"forty")])
            attempts.save_checkpoints(conn, [attempts.StoredCheckpoint(tid, 50, b"fifty")])  # replaces
        with engine.connect() as conn:
            assert attempts.load_checkpoint(conn, tid) == attempts.StoredCheckpoint(tid, 50, b"fifty")
            assert conn.execute(sa.text("SELECT COUNT(*) FROM trial_checkpoints")).scalar() == 1
        # The driver died with attempt 1 open; attempt 2 starts from the checkpoint at 50.
        with engine.begin() as conn:
            assert attempts.begin_attempt(conn, tid, 50, {**ENV, "host": "h2"}, "d:2") == 2
        steps = [r[0] for r in query(url, "SELECT step FROM evals ORDER BY step")]
        assert steps == [0, 10, 20, 30, 40, 50]
        got = query(url, "SELECT attempt, from_step, host, outcome, driver FROM trial_attempts ORDER BY attempt")
        assert [tuple(r) for r in got] == [(1, None, "h1", "lost", "d:1"), (2, 50, "h2", None, "d:2")]
        # Attempt 3 has no checkpoint to start from: nothing of the trial's past stays.
        with engine.begin() as conn:
            attempts.begin_attempt(conn, tid, None, ENV, "d:3")
            attempts.close_attempts(conn, [tid], "completed")
        assert query(url, "SELECT COUNT(*) FROM evals")[0][0] == 0
        assert query(url, "SELECT COUNT(*) FROM trial_checkpoints")[0][0] == 0
        assert [r[0] for r in query(url, "SELECT outcome FROM attempts ORDER BY attempt")] == [
            "lost",
            "lost",
            "completed",
        ]
        # Deleting the sweep takes its attempts and checkpoints along.
        with engine.begin() as conn:
            counts = repo.delete_sweep(conn, sid)
        assert counts["attempts"] == 3 and query(url, "SELECT COUNT(*) FROM attempts")[0][0] == 0
        engine.dispose()
    finally:
        drop()


# ---- a machine that shares only the database -----------------------------------------------------


def _env(home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    # A TMPDIR of its own, short: Ray puts its sockets there (at most 107 bytes a path).
    tmp = tempfile.mkdtemp(prefix="orch-m-", dir="/tmp")
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "RAY_ADDRESS": "local",  # a Ray of its own, as on another machine
        "ORCH_LEASE_TTL_S": "6",
        "HOME": str(home),
        "TMPDIR": tmp,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
    }


def _driver(args: list[str], url: str, cwd: Path) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        CLI + args + ["--db", url, "--quiet"],
        cwd=cwd,
        env=_env(cwd / "home"),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait(p: subprocess.Popen, ready, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while p.poll() is None and time.time() < deadline and not ready():
        time.sleep(0.05)
    assert p.poll() is None, f"the driver ended before the kill: {p.communicate()[1]}"


def _kill(p: subprocess.Popen) -> None:
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def _rows(url: str) -> dict[tuple[str, int], tuple]:
    """Every stored eval row, all columns (elapsed_s and metrics as stored), by (key, step)."""
    got = query(
        url,
        "SELECT t.key, e.step, e.acc, e.loss, e.train_loss, e.step_lr, e.elapsed_s, e.metrics, e.nonfinite "
        "FROM evals e JOIN trials t ON t.id = e.trial_id",
    )
    return {(r[0], r[1]): tuple(r[2:]) for r in got}


def _checkpoint_steps(url: str) -> dict[str, int]:
    got = query(url, "SELECT t.key, c.step FROM trial_checkpoints c JOIN trials t ON t.id = c.trial_id")
    return {r[0]: r[1] for r in got}


def _two_trials(name: str) -> str:
    """The fault tests' sweep cut to its two seed-0 trials (one per arm): trial keys do not
    depend on the seeds beside them, so the shared reference run covers them."""
    return two_arm_spec(name, retries=2).replace("seed: 0..2", "seed: 0..0")


def _reference(url: str, ref: str) -> list[tuple]:
    keys = {r[0] for r in query(url, "SELECT key FROM trials")}
    return [r for r in sweep_evals(ref) if r[0] in keys]


def _count(url: str, sql: str) -> int:
    try:
        return query(url, sql)[0][0]
    except Exception:  # the database is not made yet
        return 0


@pytest.mark.slow
def test_a_postgres_sweep_continues_elsewhere_from_its_stored_checkpoints(tmp_path, two_arm_reference_db):
    url, drop = backend_url(tmp_path, "postgresql")
    try:
        spec = tmp_path / "spec.yaml"
        spec.write_text(_two_trials("elsewhere"))
        # Machine A: killed once two trials hold checkpoints past step 0.
        a = _driver(["submit", str(spec)], url, tmp_path / "machine_a")
        _wait(a, lambda: _count(url, "SELECT COUNT(*) FROM trial_checkpoints WHERE step >= 60") >= 2)
        _kill(a)
        before, ckpt = _rows(url), _checkpoint_steps(url)
        finished = {r[0] for r in query(url, "SELECT key FROM trials WHERE status = 'completed'")}
        unfinished = {k: s for k, s in ckpt.items() if k not in finished}
        assert unfinished and all(s > 0 for s in unfinished.values())
        # With checkpoint_every_s: 0 every row stored is covered by its trial's checkpoint.
        assert all(step <= ckpt[key] for key, step in before)

        # Machine B: another working directory, HOME and TMPDIR; the same database.
        b = _driver(["resume", "elsewhere"], url, tmp_path / "machine_b")
        _, err = b.communicate(timeout=600)
        assert b.returncode == 0, err
        after = _rows(url)
        assert {k: after[k] for k in before} == before  # byte-identical, elapsed_s included
        assert sweep_evals(url) == _reference(url, two_arm_reference_db)
        tried = query(url, "SELECT key, attempt, from_step, outcome FROM trial_attempts WHERE attempt = 2")
        resumed = {r[0]: r[2] for r in tried}
        assert resumed == unfinished  # each continued from its stored checkpoint's step
        lost = query(url, "SELECT key FROM trial_attempts WHERE attempt = 1 AND outcome = 'lost'")
        assert {r[0] for r in lost} == set(unfinished)
        assert not list(tmp_path.rglob("*.pt"))  # no checkpoint file on either machine
    finally:
        drop()


@pytest.mark.slow
def test_a_trial_without_its_checkpoint_restarts_clean_never_stitched(tmp_path, two_arm_reference_db, shared_ray):
    """Before revision 0007 a trial whose checkpoint file could not be seen trained again from
    step 0 while its lost attempt's later rows stayed: a trace stitched from two runs, for good
    when the new run stopped earlier. Now the new attempt deletes them as it starts."""
    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    spec = tmp_path / "spec.yaml"
    spec.write_text(_two_trials("stitch"))
    a = _driver(["submit", str(spec)], url, tmp_path / "a")
    _wait(a, lambda: _count(url, "SELECT COUNT(*) FROM trial_checkpoints WHERE step >= 100") >= 1)
    _kill(a)
    first = _rows(url)
    # The checkpoints "cannot be seen": gone, as on a machine without the old folder.
    lost = {
        r[0]
        for r in query(
            url, "SELECT t.key FROM trial_checkpoints c JOIN trials t ON t.id = c.trial_id WHERE t.status = 'running'"
        )
    }
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM trial_checkpoints"))
    engine.dispose()
    assert lost
    # Stopped again as soon as the lost trials' new attempts have started. Counted for those
    # trials alone: the other trial (running without a checkpoint yet) may start its second
    # attempt in an earlier flush, and a kill then would find the lost trial not yet restarted.
    b = _driver(["resume", "stitch"], url, tmp_path / "b")
    keys = ", ".join(f"'{k}'" for k in sorted(lost))
    _wait(
        b,
        lambda: (
            _count(
                url,
                "SELECT COUNT(*) FROM attempts a JOIN trials t ON t.id = a.trial_id "
                f"WHERE a.attempt = 2 AND t.key IN ({keys})",
            )
            >= len(lost)
        ),
    )
    _kill(b)
    now = _rows(url)
    for key in lost:
        old = {s: v for (k, s), v in first.items() if k == key}
        kept = {s: v for (k, s), v in now.items() if k == key and s > 0 and old.get(s) == v}
        assert not kept, f"{key}: rows of the lost attempt outlived the new one: steps {sorted(kept)}"
    # The last resume needs no Ray of its own: in-process, on the session's.
    assert main(["resume", "stitch", "--db", url, "-q", "--address", shared_ray]) == 0
    assert sweep_evals(url) == _reference(url, two_arm_reference_db)


@pytest.mark.slow
def test_a_database_with_file_checkpoints_is_upgraded_and_resumed_from_them(tmp_path, two_arm_reference_db, shared_ray):
    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    spec = tmp_path / "spec.yaml"
    spec.write_text(_two_trials("files"))
    folder = tmp_path / "checkpoints"  # the default folder beside the SQLite file
    a = _driver(["submit", str(spec), "--checkpoint-dir", str(folder)], url, tmp_path / "a")
    _wait(a, lambda: _count(url, "SELECT COUNT(*) FROM evals") >= 8 and len(list(folder.rglob("*.pt"))) >= 2)
    _kill(a)
    # As it was before revision 0007: no stored checkpoints, no attempts.
    engine = make_engine(url)
    migrate(engine, "0006_nonfinite", down=True)
    engine.dispose()
    files = {p.stem for p in folder.rglob("*.pt")}
    assert main(["db", "upgrade", "--db", url]) == 0
    # no --checkpoint-dir: the default folder; in-process, on the session's Ray
    assert main(["resume", "files", "--db", url, "-q", "--address", shared_ray]) == 0
    assert sweep_evals(url) == _reference(url, two_arm_reference_db)
    started = query(url, "SELECT key, from_step FROM trial_attempts WHERE from_step IS NOT NULL")
    assert {r[0] for r in started} & files, "no trial resumed from its file checkpoint"
    assert all(r[1] > 0 for r in started)


# ---- the code-change guard ----------------------------------------------------------------------


@pytest.mark.slow
def test_the_code_change_guard_refuses_then_allows_and_records(tmp_path, shared_ray, capsys):

    def cli(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main([*argv, "--db", url])
        got = capsys.readouterr()
        return code, got.out + got.err

    url = f"sqlite:///{tmp_path / 'g.db'}"
    spec = tmp_path / "spec.yaml"
    spec.write_text(two_arm_spec("guard").replace("seed: 0..2", "seed: 0..0").replace("steps: 240", "steps: 40"))
    assert cli("submit", str(spec), "-q", "--address", shared_ray)[0] == 0
    # Another machine's code ran one trial; the other is to be run again.
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE attempts SET code_hash = 'other', code_version = 'git:0ther' WHERE trial_id = 1"))
        conn.execute(sa.text("UPDATE trials SET status = 'interrupted' WHERE id = 2"))
    engine.dispose()
    versions = query(url, "SELECT COUNT(*) FROM sweep_specs")[0][0]
    code, text = cli("resume", "guard", "-q")
    assert code == 2 and "git:0ther" in text and "--allow-code-change" in text
    assert len(text.strip().splitlines()) == 1
    assert query(url, "SELECT status FROM trials WHERE id = 2")[0][0] == "interrupted"  # nothing run
    assert query(url, "SELECT COUNT(*) FROM attempts WHERE trial_id = 2")[0][0] == 1
    # A re-submit is refused the same way.
    code, text = cli("submit", str(spec), "-q")
    assert code == 2 and "--allow-code-change" in text
    assert cli("resume", "guard", "-q", "--address", shared_ray, "--allow-code-change")[0] == 0
    assert query(url, "SELECT status FROM trials WHERE id = 2")[0][0] == "completed"
    recorded = query(url, "SELECT code_change FROM sweep_specs ORDER BY version")
    assert len(recorded) == versions + 1 and "git:0ther" in recorded[-1][0]
    code, text = cli("status", "guard")
    assert "ran with 2 code/torch versions" in text and "git:0ther" in text
    key = query(url, "SELECT key FROM trials WHERE id = 2")[0][0]
    code, text = cli("status", "guard", "--trial", key)
    assert code == 0 and f"guard {key}: completed" in text
    code, text = cli("status", "guard", "--trial", key, "--json")
    tried = json.loads(text)["attempts"]
    assert [(a["attempt"], a["from_step"], a["outcome"]) for a in tried] == [
        (1, None, "completed"),
        (2, 40, "completed"),
    ]
    assert all(a["code_version"] != "git:0ther" and a["torch_version"] for a in tried)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_analyze_groups_and_filters_by_the_attempts_code_host_and_device(tmp_path, backend):
    """The confound check is one command: ``--by code_version`` (and ``host``, ``device`` in
    ``--where``), from each trial's newest attempt, checked against counts made here."""
    import orchestrator
    from orchestrator.analysis.data import load_sweep
    from orchestrator.spec import load

    url, drop = backend_url(tmp_path, backend)
    try:
        engine, _ = open_store_engine(url)
        sweep = load("<t>", text=two_arm_spec("conf"))
        sid = repo.ensure_sweep(engine, "conf", sweep.text, sweep.hash)
        finals = {}
        with engine.begin() as conn:
            ids = repo.add_trials(conn, sid, sweep.trials)
            for i, (key, tid) in enumerate(sorted(ids.items())):
                code = "git:old" if i < 2 else "git:new"
                device = "NVIDIA A100" if i % 2 else "cpu"
                # a first attempt elsewhere, then the one that produced the trace
                attempts.begin_attempt(conn, tid, None, {**ENV, "code_version": "git:lost", "host": "gone"}, "d")
                attempts.begin_attempt(conn, tid, None, {**ENV, "code_version": code, "device": device}, "d")
                acc = 0.95 if i % 3 == 0 else 0.2
                finals[key] = (code, device, acc >= 0.9)
                repo.upsert_evals(conn, [{"trial_id": tid, "step": s, "acc": acc, "loss": 1.0} for s in (0, 20, 240)])
                repo.finish_trial(conn, tid, "completed")
        engine.dispose()
        got = orchestrator.analyze("conf", "lockin", db=url, by="code_version", lockin=0.9)
        for code in ("git:old", "git:new"):
            mine = [locked for c, _, locked in finals.values() if c == code]
            row = got.summary.set_index("group").loc[code]
            assert (row["n"], row["k"]) == (len(mine), sum(mine))
        on_gpu = load_sweep(url, "conf", where="device = 'NVIDIA A100' AND host = 'h1'")
        assert len(on_gpu.trials) == sum(d == "NVIDIA A100" for _, d, _ in finals.values()) > 0
    finally:
        drop()
