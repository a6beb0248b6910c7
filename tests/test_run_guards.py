"""What a running driver does when the ground moves under it (issue 21), through a real Ray
runtime, real SQLite files, the local PostgreSQL server and real training steps:

- the database deleted, replaced by another file, or its schema dropped mid-sweep: the
  driver stops within seconds with one line and exit 74, trials stop training, and nothing
  is written to what is at the database's place now (a PostgreSQL outage is not this:
  tests/test_faults.py still rides a restart out);
- the end-of-sweep hint names the ``--db`` it was given, shell-quoted, on one line however
  long: pasted into bash it queries that database;
- a training step that raises ends its trial ``diverged`` (parameters went non-finite) or
  ``failed``, one line per trial on the console, the traceback stored, Ray's own log of it
  shown only with ``--debug``;
- an unwritable checkpoint location is refused before Ray starts: one line, exit 2, nothing
  written.
"""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import torch

from orchestrator.cli import main
from orchestrator.store.engine import make_engine, open_store_engine

from conftest import OWN_RAY, POSTGRES_URL, make_pg_schema_url

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "orchestrator.cli"]


def _env(*paths: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **OWN_RAY, **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *map(str, paths), env.get("PYTHONPATH", "")])
    env.pop("ORCH_DEBUG", None)
    env.pop("ORCH_DB", None)
    return env


def _spec(name: str, *, steps: int, every: int, seeds: str = "[0, 1]", step_ms: float | None = None) -> str:
    """A two-trial sweep; with ``step_ms``, of the ``bench_sleep`` cell, whose steps sleep that
    long: a trial that only has to be running while the ground moves waits instead of
    spinning two cores the tests beside it need."""
    arm = "arm: gated_deltanet" if step_ms is None else f"arm: bench_sleep\n  model.step_ms: {step_ms}"
    return (
        f"name: {name}\n"
        + ("" if step_ms is None else "plugins: [orchestrator.bench.fixed_duration]\n")
        + f"fixed:\n  {arm}\n  task: mqar\n  task.K: 8\n  task.eval_size: 64\n  d_model: 16\n"
        "  n_layers: 1\n  batch_size: 16\n  checkpoint_every_s: 0\n"
        f"axes:\n  seed: {seeds}\n"
        f"budget: {{steps: {steps}, eval_every: {every}}}\nresources: {{cpu: 1}}\nmax_concurrent: 2\n"
    )


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: "), err
    return lines[0]


def _session_pids(session: int) -> list[int]:
    """Processes still alive in the driver's session (its Ray workers, raylet, ...)."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.getsid(int(d)) == session:
                    pids.append(int(d))
            except (ProcessLookupError, PermissionError):
                continue
    return pids


def _checkpoint_steps(ck: Path) -> list[int]:
    return sorted(int(torch.load(p, weights_only=False)["step"]) for p in ck.rglob("*.pt"))


# ---- the database gone under a running driver ------------------------------------------------


def _sqlite_count(db: Path, q: str) -> int:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return conn.execute(q).fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


GONE_STEPS = 200  # a minute of training a trial: 300 ms a step, slept


def _gone_run(tmp_path: Path, url: str, every: int, ready, act) -> tuple[subprocess.CompletedProcess, float]:
    """Run a 2-trial sweep of GONE_STEPS steps (a minute of training each), ``act`` once
    ``ready``; returns the driver's outcome and the seconds it took to exit after ``act``."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(_spec("gone", steps=GONE_STEPS, every=every, step_ms=300))
    cmd = CLI + ["submit", str(spec), "--db", url, "-q", "--checkpoint-dir", str(tmp_path / "ck")]
    p = subprocess.Popen(
        cmd,
        env=_env(ORCH_LEASE_TTL_S="4", RAY_OVERRIDE_RESOURCES='{"CPU": 2}'),  # both trials at once
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while p.poll() is None and time.time() < deadline and not ready():
            time.sleep(0.2)
        assert p.poll() is None and ready(), p.communicate()[1]
        act()
        t0 = time.time()
        out, err = p.communicate(timeout=60)
        took = time.time() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    # Trials stopped with the driver: no Ray process of its session lives on.
    deadline = time.time() + 10
    while _session_pids(p.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert _session_pids(p.pid) == []
    return subprocess.CompletedProcess(cmd, p.returncode, out, err), took


def _stopped_line(res: subprocess.CompletedProcess, took: float, what: str) -> str:
    """The driver's one error line, once it is known to have exited 74 within 20 s of ``what``."""
    line = _one_error_line(res.stderr)
    print(f"\n{line} (exit {res.returncode}, {took:.1f} s after the {what})")
    assert res.returncode == 74, res.stderr
    assert took < 20
    return line


@pytest.mark.slow
def test_sqlite_file_deleted_mid_sweep_stops_the_driver(tmp_path):
    """Deleted while the trials train between evals (an eval every 100 steps, 30 s): no write is
    due, so the lease thread's check finds it, and the trials stop short of their budget."""
    db = tmp_path / "sweep.db"

    def ready() -> bool:  # both trials past their step-1 eval (checkpointed there), training on
        return len(list((tmp_path / "ck").rglob("*.pt"))) == 2

    def act() -> None:
        time.sleep(1.0)
        db.unlink()

    line = _stopped_line(*_gone_run(tmp_path, str(db), 100, ready, act), "delete")
    assert line == (
        f"error: database file {db} was deleted while the sweep ran; the sweep stopped and wrote nothing "
        "more (trial checkpoints are kept)"
    )
    assert not db.exists()  # the driver did not create an empty file in its place
    # Stopped short of the 200-step budget (on a quiet machine a trial may reach its step-100
    # eval within the seconds the lease thread takes to notice; nothing is written past it).
    assert all(s < GONE_STEPS for s in _checkpoint_steps(tmp_path / "ck"))


@pytest.mark.slow
def test_sqlite_file_replaced_mid_sweep_stops_the_driver_and_the_new_file_is_untouched(tmp_path):
    db = tmp_path / "sweep.db"
    other = tmp_path / "other.db"
    made, _ = open_store_engine(str(other))  # another orchestrator database, closed (no -wal left)
    made.dispose()

    def ready() -> bool:
        return _sqlite_count(db, "SELECT COUNT(*) FROM evals") >= 4

    def act() -> None:
        os.replace(other, db)
        # SQLite's rule for replacing a database: its -wal/-shm go with it (a stale -wal
        # beside a new file is replayed into it by SQLite itself, whoever opens it).
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)

    line = _stopped_line(*_gone_run(tmp_path, str(db), 1, ready, act), "replace")
    assert line == (
        f"error: database file {db} was replaced by another file while the sweep ran; the sweep stopped "
        "and wrote nothing more (trial checkpoints are kept)"
    )
    assert max(_checkpoint_steps(tmp_path / "ck")) < GONE_STEPS
    eng = make_engine(f"sqlite:///{db}")
    try:
        with eng.connect() as conn:
            counts = [conn.execute(sa.text(f"SELECT COUNT(*) FROM {t}")).scalar_one() for t in ("sweeps", "trials")]
            counts.append(conn.execute(sa.text("SELECT COUNT(*) FROM evals")).scalar_one())
    finally:
        eng.dispose()
    assert counts == [0, 0, 0]


@pytest.mark.slow
@pytest.mark.skipif(not POSTGRES_URL, reason="ORCH_TEST_POSTGRES_URL not set")
def test_postgres_schema_dropped_mid_sweep_stops_the_driver(tmp_path):
    url, drop = make_pg_schema_url()
    schema = url.rsplit("%3D", 1)[-1]
    eng = make_engine(url)

    def ready() -> bool:
        try:
            with eng.connect() as conn:
                return conn.execute(sa.text("SELECT COUNT(*) FROM evals")).scalar_one() >= 4
        except sa.exc.DBAPIError:
            return False

    dropped: list[bool] = []

    def act() -> None:
        eng.dispose()
        drop()
        dropped.append(True)

    try:
        res, took = _gone_run(tmp_path, url, 1, ready, act)
    finally:
        if not dropped:  # a second drop fails: its reader role is gone
            drop()
    line = _stopped_line(res, took, "drop")
    # Whichever finds it first names the table it missed: the writer (evals, or attempts when it looks up
    # each trial's newest attempt first) or the lease thread.
    assert re.fullmatch(
        r"error: database postgresql\+psycopg://\S+ lost the sweep's tables while it ran \(relation "
        r"\"(evals|sweeps|trials|drivers|attempts|checkpoints|system_metrics)\" does not exist[^)]*\); the sweep stopped and wrote nothing more",
        line,
    ), line
    assert max(_checkpoint_steps(tmp_path / "ck")) < GONE_STEPS
    admin = sa.create_engine(url.split("?")[0])
    try:
        with admin.connect() as conn:  # the driver did not recreate the schema's tables
            n = conn.execute(
                sa.text("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = :s"), {"s": schema}
            ).scalar_one()
    finally:
        admin.dispose()
    assert n == 0


def test_a_lost_table_is_gone_a_lost_server_is_an_outage(tmp_path):
    """The writer's classification on real errors: a missing table (SQLite file recreated
    empty, PostgreSQL schema dropped) ends the run; a server that does not answer is
    retried (a restart must still be ridden out)."""
    from orchestrator.store.outage import DatabaseGone, StorePin, is_gone, is_transient

    empty = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(sa.exc.OperationalError) as e:
        with empty.begin() as conn:
            conn.execute(sa.text("INSERT INTO evals (trial_id, step) VALUES (1, 1)"))
    assert is_gone(e.value) and not is_transient(e.value)
    down = sa.create_engine("postgresql+psycopg://127.0.0.1:1/none", connect_args={"connect_timeout": 2})
    with pytest.raises(sa.exc.OperationalError) as e:
        down.connect()
    assert is_transient(e.value) and not is_gone(e.value)
    if POSTGRES_URL:
        url, drop = make_pg_schema_url()
        drop()
        eng = make_engine(url)
        with pytest.raises(sa.exc.ProgrammingError) as e:
            with eng.begin() as conn:
                conn.execute(sa.text("SELECT COUNT(*) FROM evals"))
        eng.dispose()
        assert is_gone(e.value) and not is_transient(e.value)
    # The pin: the same file passes; deleted or replaced, it does not.
    db = tmp_path / "pinned.db"
    engine, _ = open_store_engine(str(db))
    pin = StorePin(engine)
    pin.check()
    other = tmp_path / "other.db"
    other.write_bytes(db.read_bytes())
    os.replace(other, db)
    with pytest.raises(DatabaseGone, match="replaced by another file"):
        pin.check()
    db.unlink()
    with pytest.raises(DatabaseGone, match="was deleted"):
        pin.check()
    engine.dispose()


# ---- the end-of-sweep hint and unwrapped output ----------------------------------------------


@pytest.mark.slow
def test_the_end_of_sweep_hint_pasted_into_bash_queries_the_same_database(tmp_path):
    folder = tmp_path / "a folder with spaces, so the hint runs past eighty columns"
    folder.mkdir()
    db = folder / "results.db"
    spec = tmp_path / "spec.yaml"
    spec.write_text(_spec("hinted", steps=20, every=10, seeds="[0]"))
    res = subprocess.run(
        CLI + ["submit", str(spec), "--db", str(db), "--checkpoint-dir", str(tmp_path / "ck")],
        env=_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    print("\n" + res.stdout)
    assert len(lines) == 1 and len(lines[0]) > 80, res.stdout  # one line, not wrapped
    assert lines[0].startswith("sweep hinted: 1 completed; query it with `orchestrator sql ")
    command = lines[0].split("`")[1]
    assert command.endswith(f" --db {shlex.quote(str(db))}")
    elsewhere = tmp_path / "elsewhere"  # no runs/orchestrator.db here, no $ORCH_DB
    elsewhere.mkdir()
    env = _env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    got = subprocess.run(["bash", "-c", command], env=env, cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    with make_engine(f"sqlite:///{db}").connect() as conn:
        key = conn.execute(sa.text("SELECT key FROM trials")).scalar_one()
    # The hinted columns, readable on a terminal: the trial's key, arm, status and accuracy.
    assert key in got.stdout and "completed" in got.stdout and "gated_deltanet" in got.stdout
    assert "final_acc" in got.stdout and "params" not in got.stdout
    assert got.stderr.strip() == "1 row(s)"


def test_hints_quote_the_db_for_the_shell_and_hide_a_password():
    from orchestrator.cli.run_cmds import _resume_hint, query_hint

    from orchestrator.cli.run_cmds import QUERY_COLUMNS

    query = f"SELECT {QUERY_COLUMNS} FROM trial_final WHERE sweep = 's1' ORDER BY arm, lr, seed"
    cmd = query_hint("s1", "/tmp/it's a $HOME/x.db")
    assert shlex.split(cmd) == ["orchestrator", "sql", query, "--db", "/tmp/it's a $HOME/x.db"]
    assert shlex.split(query_hint("s1", None)) == ["orchestrator", "sql", query]
    hint = _resume_hint("s1", "postgresql://me:hunter2@db.example/x")
    assert "hunter2" not in hint and shlex.split(hint.split("`")[1])[-2:] == [
        "--db",
        "postgresql://me:***@db.example/x",
    ]


def test_piped_output_is_not_wrapped(tmp_path, capsys):
    """Every command prints through the CLI's console: off a terminal a long row stays one line."""
    db = tmp_path / "w.db"
    assert main(["db", "upgrade", "--db", str(db)]) == 0
    capsys.readouterr()
    long = "x" * 300
    assert main(["sql", f"SELECT '{long}' AS v, 'two words' AS w", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if long in ln]
    assert len(rows) == 1 and "two words" in rows[0], out


# ---- an exception in a training step ---------------------------------------------------------

BOOM = '''
"""A cell whose forward raises at its ``at``-th training call: how 1 an OverflowError,
how 2 an OverflowError after its parameters went to inf, how 3 a RuntimeError."""
import torch
import torch.nn as nn

from cells import ArmSpec, Family, Knob, KnobSet, register_cell


class Boom(nn.Module):
    causal = True

    def __init__(self, d, at, how):
        super().__init__()
        self.inp, self.at, self.how, self.calls, self.d = nn.Linear(d, d), at, how, 0, d

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls >= self.at:
                if self.how == 2:
                    with torch.no_grad():
                        for p in self.parameters():
                            p.fill_(float("inf"))
                if self.how in (1, 2):
                    raise OverflowError("(34, 'Numerical result out of range')")
                raise RuntimeError("the kernel broke")
        return self.inp(torch.cumsum(x, dim=1))

    def state_elements(self):
        return self.d


FAMILY = Family("boom", lambda k, d: (lambda: Boom(d, k["at"], k["how"])), lambda arm, k, d: None)
register_cell(ArmSpec("boom", "boom", "raises in its forward (test plugin)", KnobSet({
    "at": Knob(3, "int", "training call that raises", minimum=1),
    "how": Knob(1, "int", "1 overflow, 2 overflow with inf parameters, 3 runtime error", minimum=1, maximum=3),
    "mlp": Knob(False, "bool", "MLP"),
    "mlp_ratio": Knob(2, "int", "MLP width multiple", minimum=1),
    "norm": Knob(True, "bool", "RMSNorm"),
}), d_model=16), FAMILY)
'''


@pytest.fixture(scope="module")
def boom(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("boomplug")
    (root / "boomplug").mkdir()
    (root / "boomplug" / "__init__.py").write_text("")
    (root / "boomplug" / "cells.py").write_text(textwrap.dedent(BOOM))
    return root


def _boom_spec(name: str, hows: str, retries: int) -> str:
    return (
        f"name: {name}\nplugins: [boomplug.cells]\n"
        "fixed:\n  arm: boom\n  task: mqar\n  task.K: 4\n  d_model: 16\n  batch_size: 8\n  model.at: 3\n"
        f"axes:\n  model.how: {hows}\nbudget: {{steps: 20, eval_every: 10}}\nmax_concurrent: 2\nretries: {retries}\n"
    )


@pytest.mark.slow
def test_a_raising_step_is_one_line_per_trial_and_its_traceback_is_stored(boom, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(_boom_spec("boom", "[1, 2, 3]", retries=1))
    db = tmp_path / "boom.db"
    res = subprocess.run(
        CLI + ["submit", str(spec), "--db", str(db), "-q", "--checkpoint-dir", str(tmp_path / "ck")],
        env=_env(boom),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print("\n" + res.stderr)
    assert res.returncode == 1, res.stderr
    for noise in ("Traceback", "ray::", "ERROR", "Trials did not complete"):
        assert noise not in res.stderr, res.stderr
    eng = make_engine(f"sqlite:///{db}")
    with eng.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT CAST(p.value_num AS INTEGER) AS how, t.id, t.key, t.status, t.attempts, t.error, "
                "(SELECT COUNT(*) FROM evals e WHERE e.trial_id = t.id) AS evals "
                "FROM trials t JOIN trial_params p ON p.trial_id = t.id AND p.name = 'model.how' ORDER BY how"
            )
        ).all()
        errors = conn.execute(sa.text("SELECT trial_id, kind, error, traceback FROM trial_errors ORDER BY id")).all()
    eng.dispose()
    by = {r.how: r for r in rows}
    overflow = "OverflowError: (34, 'Numerical result out of range')"
    assert (by[1].status, by[1].attempts, by[1].error) == ("failed", 1, f"{overflow} (at step 3)")
    assert (by[2].status, by[2].attempts, by[2].error) == (
        "diverged",
        1,
        f"non-finite parameters at step 3 ({overflow})",
    )
    assert (by[3].status, by[3].attempts, by[3].error) == ("failed", 2, "RuntimeError: the kernel broke")
    assert all(r.evals == 1 for r in rows)  # the step-1 eval, measured before the step that raised, is kept
    # Exactly one line per trial (the last the failure count), each naming the trial and why.
    lines = res.stderr.strip().splitlines()
    assert sorted(lines[:-1]) == sorted(
        [
            f"trial {by[1].key} (arm boom, lr 0.001, seed 0) failed: {overflow} (at step 3)",
            f"trial {by[2].key} (arm boom, lr 0.001, seed 0) diverged: non-finite parameters at step 3 ({overflow})",
            f"trial {by[3].key} (arm boom, lr 0.001, seed 0) failed: RuntimeError: the kernel broke",
        ]
    )
    assert lines[-1] == "2 trial(s) failed: see `orchestrator status boom` and the trials.error column"
    # Nothing is lost: every ending attempt's traceback, down to the cell's own frame.
    per = {}
    for tid, kind, error, tb in errors:
        per.setdefault(tid, []).append((kind, error))
        # (Ray's text of a worker's exception has no "Traceback" header; the frames are there.)
        assert 'boomplug/cells.py", line' in tb and error.split(":")[0].split("(")[-1] in tb, tb
    assert per[by[1].id] == [("runtime", by[1].error)]
    assert per[by[2].id] == [("runtime", by[2].error)]
    assert per[by[3].id] == [("runtime", by[3].error)] * 2


@pytest.mark.slow
def test_debug_shows_ray_s_traceback_of_a_failed_trial(boom, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(_boom_spec("boomdbg", "[3]", retries=0))
    res = subprocess.run(
        CLI + ["--debug", "submit", str(spec), "--db", str(tmp_path / "b.db"), "-q"],
        env=_env(boom),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 1, res.stderr
    assert (
        "Trial task failed" in res.stderr
        and "Traceback" in res.stderr
        and "RuntimeError: the kernel broke" in res.stderr
    )


def test_a_raising_step_ends_lone_and_packed_trials_by_their_parameters():
    """The loop's rule without Ray: parameters gone non-finite -> diverged; an arithmetic
    error on finite parameters -> failed; anything else is re-raised for a retry."""
    from orchestrator.train import Trainer
    from orchestrator.train.pack import PackTrainer

    base = {"arm": "gated_deltanet", "task": "mqar", "task.K": 4, "d_model": 16, "n_layers": 1, "batch_size": 8}
    base.update(steps=20, eval_every=10, device="cpu")

    def raise_at(module: torch.nn.Module, n: int, exc: Exception, before=lambda: None) -> None:
        calls = [0]

        def hook(mod, args):
            if mod.training:
                calls[0] += 1
                if calls[0] >= n:
                    before()
                    raise exc

        module.register_forward_pre_hook(hook)

    t = Trainer({**base, "seed": 0})
    raise_at(t.model, 3, OverflowError("too big"))
    points = list(t.run())
    assert [p.step for p in points] == [1] and t.status.value == "failed"
    assert t.error == "OverflowError: too big (at step 3)" and "Traceback" in (t.error_detail or "")

    t = Trainer({**base, "seed": 0})
    raise_at(t.model, 3, RuntimeError("out of memory"))
    with pytest.raises(RuntimeError, match="out of memory"):
        list(t.run())  # not the loop's to judge: Ray retries it

    # The issue's `lr: 1.0e+300` (refused at validation now, by the spec and the trial's
    # parameters; the loop still must not retry it), set on the optimizer behind their back:
    # AdamW's weight decay sends the parameters to inf, then its step overflows a float.
    def at_lr_1e300(params: dict) -> Trainer:
        t = Trainer(params)
        for g in t.optimizer.param_groups:
            g["base_lr"] = 1e300
        return t

    t = at_lr_1e300({**base, "seed": 0})
    assert list(t.run()) == [] and t.status.value == "diverged"
    assert t.error == (
        "non-finite parameters at step 1 (RuntimeError: value cannot be converted to type float without overflow)"
    )
    t = at_lr_1e300({**base, "seed": 0, "weight_decay": 0.0})
    assert list(t.run()) == [] and t.status.value == "failed"
    assert t.error == "RuntimeError: value cannot be converted to type float without overflow (at step 1)"

    pack = PackTrainer([{**base, "seed": 0}, {**base, "seed": 1}])

    def member_1_overflows() -> None:
        with torch.no_grad():
            next(iter(pack.params.values()))[1].fill_(float("inf"))

    raise_at(pack._base, 3, OverflowError("too big"), member_1_overflows)
    points = list(pack.run())
    assert [[j for j, _ in group] for group in points] == [[0, 1]]
    assert [m.status.value for m in pack.members] == ["failed", "diverged"]
    assert pack.members[1].error == "non-finite parameters at step 3 (OverflowError: too big)"


# ---- an unwritable checkpoint location ------------------------------------------------------


def _refused(argv: list[str], capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    return _one_error_line(err)


def test_an_unwritable_checkpoint_location_is_refused_before_anything_runs(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(_spec("ckpt", steps=20, every=10))
    db = tmp_path / "new.db"
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    hint = "(choose another with --checkpoint-dir DIR or checkpoint_dir: in the spec; nothing was written)"
    cases = [
        (str(a_file), f"error: checkpoint folder {a_file}/ckpt: {a_file} is not a folder {hint}"),
        (str(a_file / "sub"), f"error: checkpoint folder {a_file}/sub/ckpt: {a_file} is not a folder {hint}"),
    ]
    if Path("/sys/kernel").is_dir():  # a directory even root cannot write in (sysfs)
        cases.append(
            (
                "/sys/kernel/orch-ck",
                f"error: checkpoint folder /sys/kernel/orch-ck/ckpt is not writable: Operation not permitted {hint}",
            )
        )
    for where, want in cases:
        line = _refused(["submit", str(spec), "--db", str(db), "-q", "--checkpoint-dir", where], capsys)
        print(line)
        assert line == want
    assert not db.exists() and not Path("/sys/kernel/orch-ck").exists()

    # The default keeps checkpoints in the database: no folder to check (a file where the
    # pre-0007 folder beside a SQLite file would be is no obstacle).
    from orchestrator import spec as specs
    from orchestrator.runner.sweep import checkpoint_folder

    assert checkpoint_folder(specs.load(spec).spec, None) is None


def test_resume_checks_the_checkpoint_location_first(tmp_path, capsys):
    from orchestrator import spec as specs
    from orchestrator.store import repo

    spec = tmp_path / "spec.yaml"
    spec.write_text(_spec("ckres", steps=20, every=10))
    sweep = specs.load(spec)
    engine, _ = open_store_engine(str(tmp_path / "r.db"))
    sid = repo.ensure_sweep(engine, sweep.name, sweep.text, sweep.hash)
    with engine.begin() as conn:
        repo.add_trials(conn, sid, sweep.trials)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    line = _refused(["resume", "ckres", "--db", str(tmp_path / "r.db"), "--checkpoint-dir", str(a_file)], capsys)
    assert line.startswith(f"error: checkpoint folder {a_file}/ckres: {a_file} is not a folder")
    with engine.connect() as conn:
        got = conn.execute(sa.text("SELECT status, COUNT(*) FROM trials GROUP BY status")).all()
        lease = conn.execute(sa.text("SELECT lease_owner FROM sweeps")).scalar_one()
    engine.dispose()
    assert [tuple(r) for r in got] == [("pending", 2)] and lease is None


def test_hints_name_the_command_as_invoked(monkeypatch, tmp_path):
    # From a shell whose venv is not active, `orchestrator` is not on PATH: the hint says
    # the path the user typed, so it runs as printed.
    from orchestrator.cli.app import prog
    from orchestrator.cli.run_cmds import _resume_hint

    exe = tmp_path / "venv dir" / "bin" / "orchestrator"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr("sys.argv", [str(exe), "submit"])
    assert shlex.split(prog()) == [str(exe)]
    assert shlex.split(_resume_hint("s1", None).split("`")[1])[:3] == [str(exe), "resume", "s1"]
    monkeypatch.setenv("PATH", f"{exe.parent}:/usr/bin:/bin")  # now the shell finds it
    assert prog() == "orchestrator"
    monkeypatch.setattr("sys.argv", ["/usr/lib/python3/pytest"])
    assert prog() == "orchestrator"


def test_csv_rows_end_with_lf_and_status_counts_one_trial(tmp_path, capsys):
    from orchestrator.cli import main
    from orchestrator.store.import_jsonl import write_records

    db = f"sqlite:///{tmp_path / 'one.db'}"
    write_records(db, "one", [{"params": {"arm": "mlstm", "seed": 0}, "trace": [{"step": 1, "acc": 0.5}]}])
    capsys.readouterr()
    assert main(["sql", "--csv", "SELECT key, status FROM trials", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "\r" not in out and out.count("\n") == 2
    assert main(["status", "one", "--db", db]) == 0
    assert "one: 1 trial: completed 1" in capsys.readouterr().out
