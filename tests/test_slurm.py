"""SLURM as a fleet (runner/slurm.py, cli/slurm_cmds.py):

- the array script as text: the #SBATCH lines, the user's sbatch options verbatim, every
  argument quoted, no password; a task's id and its local Ray's size from its environment;
- ``orchestrator slurm --dry-run`` prints the script; bad input is one line and exit 2;
- the drivers and attempts record the SLURM task they ran in, and ``status`` shows it;
- the script's TERM forwarding, run by bash on a stand-in for the join (no SLURM needed);
- against a real SLURM (slurmctld + slurmd + munged started here, as root): an array of 3
  tasks on one PostgreSQL sweep, one task requeued mid-trial and another cancelled; every
  trial completes once, the evals equal an uninterrupted run's, the requeued task's trial
  continues from its stored checkpoint.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from conftest import POSTGRES_URL, fill_sweep, make_pg_schema_url, query, record_sweep, sweep_evals, two_arm_spec
from orchestrator.cli import main
from orchestrator.runner import slurm
from orchestrator.store import attempts, claims
from orchestrator.store.engine import make_engine
from orchestrator.store.sweep_store import SweepStore
from proc_support import free_port, stop

BIN = ["/venv/bin/orchestrator"]


def _opts(**kw) -> slurm.ScriptOptions:
    base = dict(sweep="qs", db="postgresql://lab@db.host/sweeps", jobs=3, command=BIN, log_dir="/logs")
    return slurm.ScriptOptions(**{**base, **kw})


def _join_argv(text: str) -> list[str]:
    """The join's argv as bash will see it (the setsid line, unquoted)."""
    (line,) = [ln for ln in text.splitlines() if ln.startswith("setsid ")]
    assert line.endswith(" &")
    return shlex.split(line[: -len(" &")])


# ---- the script as text -----------------------------------------------------------------------


def test_script_has_the_array_requeue_signal_and_per_task_output():
    text = slurm.script(_opts(grace_s=90, job_name="lab-run"))
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    sb = [ln for ln in lines if ln.startswith("#SBATCH ")]
    assert sb == [
        "#SBATCH --job-name=lab-run",
        "#SBATCH --array=0-2",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:TERM@90",
        "#SBATCH --output=/logs/%x-%A_%a.out",
        "#SBATCH --open-mode=append",
    ]
    # The join's own grace fits well inside SLURM's.
    assert 'export ORCH_STOP_GRACE_S="${ORCH_STOP_GRACE_S:-10}"' in lines
    assert _join_argv(text) == ["setsid", *BIN, "join", "qs", "--db", "postgresql://lab@db.host/sweeps", "--quiet"]
    # Every #SBATCH line precedes the first command (sbatch stops reading them there).
    first_cmd = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH")) < first_cmd


def test_script_defaults_and_sbatch_args_verbatim_in_order():
    text = slurm.script(
        _opts(jobs=1, sbatch_args=("--partition=a100", "--gres=gpu:1", "--account=lab x"), max_concurrent=2)
    )
    sb = [ln for ln in text.splitlines() if ln.startswith("#SBATCH ")]
    assert sb[0] == "#SBATCH --job-name=orch-qs" and sb[1] == "#SBATCH --array=0-0"
    assert "#SBATCH --signal=B:TERM@60" in sb
    assert sb[-3:] == ["#SBATCH --partition=a100", "#SBATCH --gres=gpu:1", "#SBATCH --account=lab x"]
    assert _join_argv(text)[-2:] == ["--max-concurrent", "2"]


def test_script_quotes_the_sweep_the_url_and_the_command():
    odd_db = "postgresql://lab@db.host/sweeps?options=-csearch_path%3Dt x;$(rm -rf ~)"
    opts = _opts(sweep="a'b c", db=odd_db, command=["/opt/my venv/bin/orchestrator"])
    argv = _join_argv(slurm.script(opts))
    assert argv == ["setsid", "/opt/my venv/bin/orchestrator", "join", "a'b c", "--db", odd_db, "--quiet"]


@pytest.mark.parametrize(
    "kw,says",
    [
        (dict(jobs=0), "--jobs 0: an array needs at least one task"),
        (dict(grace_s=0), "--grace 0"),
        (dict(sbatch_args=("--array=0-9",)), "the array is --jobs"),
        (dict(sbatch_args=("partition=a",)), "an sbatch option"),
        (dict(sbatch_args=("--comment=a\n#SBATCH --array=1",)), "one line each"),
        (dict(job_name="bad name"), "--job-name 'bad name'"),
    ],
)
def test_script_refuses_bad_options(kw, says):
    from orchestrator.errors import UserError

    with pytest.raises(UserError) as got:
        slurm.script(_opts(**kw))
    assert says in str(got.value) and "\n" not in str(got.value)


# ---- a task's environment -----------------------------------------------------------------------


def test_job_id_of_an_array_task_a_plain_job_and_no_job():
    assert slurm.job_id({"SLURM_ARRAY_JOB_ID": "812", "SLURM_ARRAY_TASK_ID": "2", "SLURM_JOB_ID": "815"}) == "812_2"
    assert slurm.job_id({"SLURM_JOB_ID": "815"}) == "815"
    assert slurm.job_id({}) is None
    assert slurm.restart_count({"SLURM_RESTART_COUNT": "2"}) == 2 and slurm.restart_count({}) == 0


def test_ray_size_follows_the_allocation():
    env = {"SLURM_JOB_ID": "9", "SLURM_CPUS_PER_TASK": "4", "SLURM_GPUS_ON_NODE": "1", "SLURM_MEM_PER_NODE": "8000"}
    got = slurm.ray_size(env)
    assert got is not None and (got.num_cpus, got.num_gpus) == (4, 1)
    assert got.object_store_memory == int(8000 * 2**20 * 0.3)
    assert got.memory == 8000 * 2**20 - got.object_store_memory
    # No GPU asked for: none, whatever the node has; CUDA_VISIBLE_DEVICES counted otherwise.
    assert slurm.ray_size({"SLURM_JOB_ID": "9", "SLURM_JOB_CPUS_PER_NODE": "2(x3)"}) == slurm.RaySize(2, 0, None, None)
    assert slurm.ray_size({"SLURM_JOB_ID": "9", "CUDA_VISIBLE_DEVICES": "0,3"}).num_gpus == 2
    per_cpu = slurm.ray_size({"SLURM_JOB_ID": "9", "SLURM_CPUS_PER_TASK": "2", "SLURM_MEM_PER_CPU": "1000"})
    assert per_cpu.object_store_memory + per_cpu.memory == 2000 * 2**20
    assert slurm.ray_size({"CUDA_VISIBLE_DEVICES": "0"}) is None  # not a SLURM job: Ray sizes itself


# ---- the command -----------------------------------------------------------------------------------


def test_dry_run_prints_the_script_without_the_password(capsys):
    code = main(["slurm", "qs", "--db", "postgresql://lab:s3cret@db.host/sweeps", "--jobs", "3", "--dry-run"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert cap.out.startswith("#!/bin/bash\n") and "#SBATCH --array=0-2" in cap.out
    assert "s3cret" not in cap.out and "lab@db.host/sweeps" in cap.out
    assert "password is left out of the script" in cap.err
    assert _join_argv(cap.out)[1].endswith("orchestrator")


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["slurm", "qs", "--db", str(tmp_path / "x.db"), "--jobs", "0", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: --jobs 0: an array needs at least one task"
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["db", "upgrade", "--db", url]) == 0
    capsys.readouterr()
    # Not a dry run: a sweep the database lacks is refused before sbatch is looked for.
    assert main(["slurm", "nosuch", "--db", url, "--jobs", "2"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: no sweep named 'nosuch'")


# ---- what the store records ----------------------------------------------------------------------


def test_drivers_and_attempts_record_their_slurm_task_and_status_shows_it(db_url, capsys):
    engine = make_engine(db_url)
    from orchestrator.store.engine import upgrade

    upgrade(engine)
    sid, ids = fill_sweep(engine)
    tid = next(iter(ids.values()))
    with engine.begin() as conn:
        claims.register(conn, sid, "owner-a", command="join", slurm_job="812_2")
        claims.register(conn, sid, "owner-b", command="join")
        attempts.begin_attempt(conn, tid, None, {"host": "n1"}, "owner-a", slurm_job="812_2")
    with engine.connect() as conn:
        rows = {d.owner: d.slurm_job for d in claims.drivers(conn, sid, ttl=60)}
        stored = conn.execute(sa.text("SELECT slurm_job, driver FROM attempts")).all()
    engine.dispose()
    assert rows == {"owner-a": "812_2", "owner-b": None}
    assert [tuple(r) for r in stored] == [("812_2", "owner-a")]
    assert main(["status", "s1", "--db", db_url]) == 0
    shown = capsys.readouterr().out
    assert "run by 2 driver(s)" in shown and "(SLURM 812_2)" in shown and shown.count("SLURM") == 1
    key = next(iter(ids))
    assert main(["status", "s1", "--db", db_url, "--trial", key, "--json"]) == 0
    assert '"slurm_job": "812_2"' in capsys.readouterr().out


# ---- the TERM forwarding, run by bash ------------------------------------------------------------

# A stand-in for `orchestrator join`: says it is up, counts the TERMs it gets, exits 130 on
# the first (as a stopped join does) after a moment's "checkpointing".
FAKE_JOIN = """#!/bin/bash
trap 'echo TERM >> "$MARK"; sleep 1; exit 130' TERM
echo up > "$MARK.up"
while :; do sleep 0.1; done
"""


@pytest.mark.slow
def test_the_script_forwards_term_to_the_join_and_exits_with_its_code(tmp_path):
    fake = tmp_path / "fake-orchestrator"
    fake.write_text(FAKE_JOIN)
    fake.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(slurm.script(_opts(command=[str(fake)], log_dir=str(tmp_path))))
    mark = tmp_path / "mark"
    env = {**os.environ, "MARK": str(mark), "TMPDIR": str(tmp_path), "SLURM_JOB_ID": "41"}
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 30
        while not (tmp_path / "mark.up").exists():
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.05)
        assert (tmp_path / "orch-41_0-0").is_dir()  # the task's own temp folder
        os.kill(proc.pid, signal.SIGTERM)  # what --signal=B:TERM sends: the batch shell only
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    assert mark.read_text() == "TERM\n"  # forwarded once
    assert "join exited 130" in out
    assert not (tmp_path / "orch-41_0-0").exists()  # cleaned up after the join ended


# ---- a real SLURM ----------------------------------------------------------------------------------

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "sinfo")


def _slurm_missing() -> str | None:
    if any(shutil.which(b) is None for b in SLURM_BINARIES):
        return "slurm-wlm/munge not installed"
    if os.geteuid() != 0:
        return "not root"
    return None


SLURM_CONF = """ClusterName=orchtest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SchedulerType=sched/backfill
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
KillWait=30
MinJobAge=600
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def _sh(env: dict[str, str], *argv: str, check: bool = True) -> str:
    res = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=60)
    if check:
        assert res.returncode == 0, f"{argv}: {res.stderr}"
    return res.stdout


@pytest.fixture
def slurm_cluster():
    """A one-node SLURM of this test's own (munged, slurmctld, slurmd in the foreground, as
    root, on free ports, every file under one temp folder); the clients' environment and the
    folder. Every job is cancelled and every daemon stopped (by pid) after, pass or fail."""
    why = _slurm_missing()
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="orch-slurm-", dir="/tmp"))
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    daemons: list[subprocess.Popen] = []
    try:
        for sub in ("state", "spool"):
            (root / sub).mkdir()
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        log = open(root / "daemons.log", "w")  # noqa: SIM115 - closed with the folder
        daemons.append(
            subprocess.Popen(
                ["munged", "-F", "--force", f"--key-file={key}", f"--socket={root / 'munge.sock'}"]
                + [f"--pid-file={root / 'munged.pid'}", f"--log-file={root / 'munged.log'}"]
                + [f"--seed-file={root / 'munged.seed'}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        deadline = time.time() + 20
        while not (root / "munge.sock").exists():
            assert time.time() < deadline and daemons[0].poll() is None, "munged did not start"
            time.sleep(0.1)
        (root / "slurm.conf").write_text(SLURM_CONF.format(root=root, ctld_port=free_port(), d_port=free_port()))
        conf = str(root / "slurm.conf")
        for argv in (["slurmctld", "-D", "-f", conf], ["slurmd", "-D", "-N", "localhost", "-f", conf]):
            daemons.append(
                subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
        deadline = time.time() + 60
        while _sh(env, "sinfo", "-h", "-o", "%t", check=False).strip() not in ("idle", "mix", "alloc"):
            assert time.time() < deadline and all(d.poll() is None for d in daemons), (
                "SLURM did not come up: " + (root / "daemons.log").read_text()[-2000:]
            )
            time.sleep(0.5)
        yield env, root
    finally:
        if len(daemons) == 3 and all(d.poll() is None for d in daemons):
            jobs = _sh(env, "squeue", "-h", "-o", "%A", check=False).split()
            if jobs:
                _sh(env, "scancel", *sorted(set(jobs)), check=False)
            deadline = time.time() + 60
            while _sh(env, "squeue", "-h", check=False).strip() and time.time() < deadline:
                time.sleep(0.5)
        for d in reversed(daemons):
            stop(d, timeout=15)
        shutil.rmtree(root, ignore_errors=True)


def _until(ready, what: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if ready():
                return
        except sa.exc.OperationalError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _running_past(url: str, task: str, step: int) -> int:
    """Trials that ``task``'s live driver runs with a stored checkpoint past ``step``."""
    return query(
        url,
        "SELECT COUNT(*) FROM trials t JOIN drivers d ON d.owner = t.claimed_by JOIN trial_checkpoints c "
        "ON c.trial_id = t.id WHERE d.slurm_job = :task AND d.ended_at IS NULL AND t.status = 'running' "
        "AND c.step >= :step",
        task=task,
        step=step,
    )[0][0]


TTL = 6


@pytest.mark.slow
def test_a_slurm_array_runs_a_sweep_through_a_requeue_and_a_cancel(slurm_cluster, two_arm_reference_db, tmp_path):
    if not POSTGRES_URL:
        pytest.skip("ORCH_TEST_POSTGRES_URL not set")
    env, root = slurm_cluster
    url, drop = make_pg_schema_url()
    job = None
    try:
        record_sweep(url, two_arm_spec("slurmy", retries=2))
        logs = tmp_path / "logs"
        run_env = {
            **env,
            "PYTHONUNBUFFERED": "1",
            "ORCH_LEASE_TTL_S": str(TTL),  # sbatch hands this environment to the tasks
            "TMPDIR": "/tmp",  # short: each task's Ray sockets live under it
        }
        run_env.pop("RAY_ADDRESS", None)
        cli = [sys.executable, "-m", "orchestrator.cli", "slurm", "slurmy", "--db", url, "--jobs", "3"]
        cli += ["--sbatch-arg=--cpus-per-task=1", "--max-concurrent", "1", "--log-dir", str(logs), "--grace", "30"]
        res = subprocess.run(cli, env=run_env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        job = res.stdout.split("submitted array job ")[1].split()[0]
        scripts = list(logs.glob("*.sbatch"))
        assert len(scripts) == 1 and "#SBATCH --array=0-2" in scripts[0].read_text()

        # The first task found running a trial with a checkpoint stored past step 40 is
        # requeued mid-trial (which task gets a trial first is the scheduler's choice).
        picked: list[str] = []

        def one_running() -> bool:
            picked[:] = [f"{job}_{i}" for i in range(3) if _running_past(url, f"{job}_{i}", 40)][:1]
            return bool(picked)

        _until(one_running, "a task running past a checkpoint", 180)
        requeued = picked[0]
        _sh(env, "scontrol", "requeue", requeued)
        # Another task, once it has joined (running a trial, if it gets one soon), is cancelled.
        others = [f"{job}_{i}" for i in range(3) if f"{job}_{i}" != requeued]
        cancelled = others[1]
        _until(lambda: query(url, "SELECT id FROM drivers WHERE slurm_job = :t", t=cancelled), "a second task", 120)
        try:
            _until(lambda: _running_past(url, cancelled, 20) > 0, f"{cancelled} running a trial", 45)
        except AssertionError:
            pass  # the others took every trial: it is cancelled idle
        _sh(env, "scancel", cancelled)

        # SLURM holds a requeued batch job back two minutes (BeginTime): let it start now.
        def restarted() -> bool:
            state = _sh(env, "squeue", "-h", "-j", requeued, "-o", "%T", check=False).strip()
            if state == "PENDING":
                _sh(env, "scontrol", "update", f"JobId={requeued}", "StartTime=now", check=False)
            return len(query(url, "SELECT id FROM drivers WHERE slurm_job = :t", t=requeued)) == 2

        _until(restarted, "the requeued task to join again", 120)
        _until(lambda: not _sh(env, "squeue", "-h", "-j", job, check=False).strip(), "the array to end", 240)

        assert dict(query(url, "SELECT status, COUNT(*) FROM trials GROUP BY status")) == {"completed": 6}
        assert sweep_evals(url) == sweep_evals(two_arm_reference_db)
        assert query(url, "SELECT COUNT(*) FROM trials WHERE claimed_by IS NOT NULL")[0][0] == 0
        # Every attempt names the task its driver was; each driver too.
        assert query(url, "SELECT COUNT(*) FROM attempts WHERE slurm_job IS NULL")[0][0] == 0
        tasks = {r[0] for r in query(url, "SELECT DISTINCT slurm_job FROM drivers")}
        assert tasks == {f"{job}_0", f"{job}_1", f"{job}_2"}
        # The requeued task's first run stopped in order: its running trial interrupted at a checkpoint, and
        # that trial's next attempt (whichever task ran it) continued from it.
        first = query(url, "SELECT owner, end_reason FROM drivers WHERE slurm_job = :t ORDER BY id", t=requeued)
        assert first[0].end_reason == "SIGTERM", first
        stopped = query(
            url,
            "SELECT trial_id, attempt FROM attempts WHERE driver = :o AND outcome = 'interrupted'",
            o=first[0].owner,
        )
        assert stopped, "the requeued task interrupted nothing"
        for tid, number in stopped:
            nxt = query(
                url,
                "SELECT from_step, outcome FROM attempts WHERE trial_id = :t AND attempt = :n",
                t=tid,
                n=number + 1,
            )
            assert nxt and nxt[0].from_step and nxt[0].from_step > 0 and nxt[0].outcome == "completed", nxt
        out1 = next(logs.glob(f"*-{requeued}.out")).read_text()
        assert "restart 0" in out1 and "restart 1" in out1 and "join exited 130" in out1, out1
        # The requeued task's second run and the third task ended with nothing left: exit 0.
        assert out1.rstrip().endswith("join exited 0"), out1
        assert "join exited 0" in next(logs.glob(f"*-{others[0]}.out")).read_text()
        assert "join exited 130" in next(logs.glob(f"*-{cancelled}.out")).read_text()
    finally:
        if job is not None:
            _sh(env, "scancel", job, check=False)
        for (pid,) in query(url, "SELECT pid FROM drivers WHERE ended_at IS NULL") if job else []:
            try:  # a join the array left behind (SLURM killed its shell): ours, end it
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        drop()


def test_a_repeated_term_is_one_stop_and_a_ctrl_c_after_it_escalates(tmp_path):
    """A SLURM task's join may get the same TERM twice (from SLURM and from its batch shell):
    that is one orderly stop; a Ctrl-C on top of a stop still means "now"."""
    from orchestrator.runner.lifecycle import DriverSession

    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        session = DriverSession(SweepStore(engine), 1, "x", handle_signals=False)
        session._on_signal(signal.SIGTERM, None)
        session._on_signal(signal.SIGTERM, None)  # the same stop again: not a KeyboardInterrupt
        assert session.stop_reason == "SIGTERM" and session.stop_event.is_set()
        with pytest.raises(KeyboardInterrupt):
            session._on_signal(signal.SIGINT, None)
    finally:
        engine.dispose()


# What a stand-in sbatch records of its call: its arguments and the password it was handed.
FAKE_SBATCH = """#!/bin/bash
echo "$@" > "$SBATCH_LOG"
echo "PGPASSWORD=${PGPASSWORD:-}" >> "$SBATCH_LOG"
echo "4242;orchtest"
"""


@pytest.mark.slow
def test_submitting_hands_sbatch_the_password_but_never_writes_it(tmp_path, monkeypatch, capsys):
    if not POSTGRES_URL:
        pytest.skip("ORCH_TEST_POSTGRES_URL not set")
    url, drop = make_pg_schema_url(reader=False)
    try:
        # The test server trusts local connections: any password reaches it.
        with_pw = url.replace("://", "://root:hunter2@", 1)
        record_sweep(url, two_arm_spec("pw"))
        bindir = tmp_path / "bin"
        bindir.mkdir()
        (bindir / "sbatch").write_text(FAKE_SBATCH)
        (bindir / "sbatch").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("SBATCH_LOG", str(tmp_path / "sbatch.log"))
        monkeypatch.delenv("PGPASSWORD", raising=False)
        logs = tmp_path / "logs"
        assert main(["slurm", "pw", "--db", with_pw, "--jobs", "2", "--log-dir", str(logs)]) == 0
        cap = capsys.readouterr()
        assert "sweep pw: submitted array job 4242 (2 task(s))" in cap.out
        (script,) = logs.glob("orch-pw-*.sbatch")
        text = script.read_text()
        assert "hunter2" not in text and "root@127.0.0.1" in text and "#SBATCH --array=0-1" in text
        called = (tmp_path / "sbatch.log").read_text().splitlines()
        assert called == [f"--parsable {script}", "PGPASSWORD=hunter2"]
    finally:
        drop()
