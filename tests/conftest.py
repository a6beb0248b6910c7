"""Shared test fixtures.

Tests run on 2 cores next to each other: torch is pinned to one thread here so timings and
float reductions are the same in every test process.

``db_url`` runs a test once on a fresh SQLite file and, when ``ORCH_TEST_POSTGRES_URL`` is set
(``.ci/run`` sets it), once on PostgreSQL in a schema of its own that is dropped afterwards.

The suite runs on two pytest-xdist workers (``pytest -n 2``, as CI runs it), so every test is
independent of every other: each has its own temp folder, SQLite file or PostgreSQL schema (and
reader role: role changes take ``readonly.ROLE_DDL_LOCK``); the tests that change the machine
make what they change under names and ports of their own (network namespaces and a /24 tagged
per harness in ``hosts.py``, a SLURM with its own state folder, munge socket and free ports, a
PostgreSQL server of its own in ``pg_server.py``). A session fixture is made once per worker,
but for the two-arm reference run, made once and shared under a file lock.

``shared_ray`` is the session's one local Ray (one per worker): a test that runs sweeps but is
not about Ray's own start-up asks for it, and the product, finding Ray initialised, runs on it
and leaves it running (a start and stop costs ~10 s). The tests of start-up, kills and clusters run their
drivers in subprocesses with a Ray of their own.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import quote

import pytest
import sqlalchemy as sa
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Back to one torch thread after every test: a command run in-process may change it
    (``bench cells --threads 2`` does, even when it then refuses its flags), and every later
    test would run two threads on a shared 2-core machine, several times slower."""
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _no_stray_ray(request):
    """A test that leaves a Ray running in this process other than the session's (Ray starts
    one by itself, with a dashboard and every core, when an actor or task is made before
    ``ray.init``) fails here: every later in-process sweep on this worker would run on it."""
    yield
    import sys

    if "ray" not in sys.modules:
        return
    import ray

    if ray.is_initialized() and ray.get_runtime_context().gcs_address not in _shared_ray_address:
        ray.shutdown()
        pytest.fail(f"{request.node.nodeid} left a Ray of its own running in the test process", pytrace=False)


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

    def drop() -> None:  # idempotent: a test may drop mid-run and again in its cleanup
        with admin.connect() as c:
            c.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            if reader:
                drop_role(c, role)
        admin.dispose()

    return url, drop


@contextmanager
def role_ddl(conn: sa.Connection) -> Iterator[None]:
    """Hold the advisory lock every reader-role change takes (``readonly.ROLE_DDL_LOCK``) on
    an autocommit connection: tests on two xdist workers drop roles while others make them."""
    from orchestrator.store.readonly import ROLE_DDL_LOCK

    conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": ROLE_DDL_LOCK})
    try:
        yield
    finally:
        conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": ROLE_DDL_LOCK})


def drop_role(conn: sa.Connection, role: str) -> None:
    """Drop ``role`` and what it owns or was granted, if it exists (autocommit ``conn``)."""
    with role_ddl(conn):
        if conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first():
            conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
            conn.execute(sa.text(f'DROP ROLE "{role}"'))


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


def fill_sweep(engine: sa.engine.Engine, name: str = "s1", n_trials: int = 3, n_steps: int = 4) -> tuple[int, dict]:
    """A sweep of ``n_trials`` trials (arms alternating, seeds 0..), each with an eval every
    10 steps up to ``n_steps * 10``, written through the store; (sweep id, {key: trial id})."""
    from orchestrator.store import repo

    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, name, f"name: {name}", "h")
        trials = [
            (
                f"k{i}",
                {
                    "arm": "armed_gdn" if i % 2 else "gated_deltanet",
                    "task": "mqar",
                    "seed": i,
                    "lr": 1e-3,
                    "batch_size": 8,
                    "steps": n_steps * 10,
                    "eval_every": 10,
                    "model.conv": 4,
                    "task.K": 16,
                    "tag.v": "x",
                },
            )
            for i in range(n_trials)
        ]
        ids = repo.add_trials(conn, sid, trials)
        rows = [
            {
                "trial_id": ids[f"k{i}"],
                "step": 10 * s,
                "acc": 0.1 * s + 0.01 * i,
                "loss": 1.0 / (s + 1),
                "train_loss": 2.0,
                "step_lr": 1e-3,
                "elapsed_s": float(s),
                "metrics": {"rebind_acc": 0.04},
            }
            for i in range(n_trials)
            for s in range(1, n_steps + 1)
        ]
        repo.upsert_evals(conn, rows)
    return sid, ids


def record_sweep(url: str, text: str) -> None:
    """A submitted sweep nobody runs yet: the rows `submit` writes before it runs."""
    from orchestrator.spec import load
    from orchestrator.store import repo
    from orchestrator.store.engine import open_store_engine

    sweep = load("<test>", text=text)
    engine, _ = open_store_engine(url)
    sid = repo.ensure_sweep(engine, sweep.name, sweep.text, sweep.hash)
    with engine.begin() as conn:
        version = repo.record_spec_version(conn, sid, sweep.text, sweep.hash)
        repo.add_trials(conn, sid, sweep.trials, spec_version=version)
    engine.dispose()


@contextmanager
def claimed_writer(db_url: str, n_trials: int, n_steps: int = 0) -> Iterator[tuple]:
    """A sweep of ``n_trials`` (:func:`fill_sweep`) that a live driver session has claimed,
    and that session's writer with no flush timer (only the flushes a test makes, as the feed
    makes before each claim): (engine, trial ids in order, session, writer)."""
    from orchestrator.runner.lifecycle import DriverSession
    from orchestrator.runner.writer import StoreWriter
    from orchestrator.store import claims
    from orchestrator.store.engine import open_store_engine
    from orchestrator.store.sweep_store import SweepStore

    engine, _ = open_store_engine(db_url)
    sid, ids = fill_sweep(engine, n_trials=n_trials, n_steps=n_steps)
    try:
        with DriverSession(
            SweepStore(engine), sid, "s1", handle_signals=False, ttl=600, take_lease=False, command="join"
        ) as session:
            with engine.begin() as conn:
                assert len(claims.claim_batch(conn, sid, session.owner, n_trials, ttl=600) or []) == n_trials
            yield engine, sorted(ids.values()), session, StoreWriter(session, flush_s=3600)
    finally:
        engine.dispose()


# Every stored time a lease, claim, heartbeat or staleness rule compares with the clock.
_CLOCK_COLUMNS = {
    "sweeps": ("lease_expires_at", "lease_renewed_at"),
    "trials": ("claim_expires_at", "heartbeat_at", "updated_at", "started_at"),
    "drivers": ("heartbeat_at", "started_at"),
}


def pass_time(engine: sa.engine.Engine, seconds: float) -> None:
    """As if ``seconds`` went by on the database clock with nobody writing: every stored
    expiry and heartbeat moves that far into the past (instead of a test sleeping past a
    TTL; the rules compare these columns with the clock and nothing else)."""
    with engine.begin() as conn:
        for table, cols in _CLOCK_COLUMNS.items():
            if engine.dialect.name == "sqlite":
                sets = ", ".join(f"{c} = datetime({c}, '-{float(seconds):.3f} seconds')" for c in cols)
            else:
                sets = ", ".join(f"{c} = {c} - interval '{float(seconds):.3f} seconds'" for c in cols)
            conn.execute(sa.text(f"UPDATE {table} SET {sets}"))


def query(url: str, sql: str, **params: object) -> list[sa.Row]:
    """The rows of one statement on the database at ``url`` (its own engine, disposed after)."""
    from orchestrator.store.engine import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(sql), params).all()
    finally:
        engine.dispose()


def rows_of(engine: sa.engine.Engine, *sqls: str) -> tuple[list[sa.Row], ...]:
    """The rows of each statement, read in one connection: a snapshot that a migration test
    takes before an upgrade or downgrade and compares with one taken after."""
    with engine.connect() as conn:
        return tuple(conn.execute(sa.text(sql)).all() for sql in sqls)


def upgrade_keeps_rows(engine: sa.engine.Engine, db_url: str, *sqls: str) -> tuple[list[sa.Row], ...]:
    """Upgrade the database at ``db_url`` to head as a user does (``orchestrator db upgrade``)
    and check that it got there with each statement's rows unchanged; returns those rows, for
    the test to compare with after its own later migrations."""
    from orchestrator.cli import main
    from orchestrator.store.engine import current_revision, head_revision

    before = rows_of(engine, *sqls)
    assert main(["db", "upgrade", "--db", db_url]) == 0
    assert current_revision(engine) == head_revision()
    assert rows_of(engine, *sqls) == before
    return before


def sweep_evals(url: str) -> list[tuple]:
    """Every stored eval value but ``elapsed_s``, by trial key and step, metrics parsed
    (SQLite returns JSON as text): what an interrupted and resumed run must reproduce."""
    rows = query(
        url,
        "SELECT t.key, e.step, e.acc, e.loss, e.train_loss, e.step_lr, e.metrics "
        "FROM evals e JOIN trials t ON t.id = e.trial_id ORDER BY t.key, e.step",
    )
    return [tuple(r[:-1]) + (json.loads(r[-1]) if isinstance(r[-1], str) else r[-1],) for r in rows]


def backend_url(tmp_path, backend: str) -> tuple[str, callable]:
    """A fresh database on ``backend`` (sqlite or postgresql; skips without a server) and a
    function that drops it."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'sweep.db'}", (lambda: None)
    if not POSTGRES_URL:
        pytest.skip("ORCH_TEST_POSTGRES_URL not set")
    return make_pg_schema_url()


def migrate(engine: sa.engine.Engine, revision: str, *, down: bool = False) -> None:
    """Move ``engine``'s schema up (or ``down``) to ``revision``."""
    from alembic import command

    from orchestrator.store.engine import _alembic_config

    with engine.begin() as conn:
        (command.downgrade if down else command.upgrade)(_alembic_config(conn), revision)


def old_database(db_url: str, revision: str, *statements: str) -> sa.engine.Engine:
    """An engine on a database migrated only to ``revision`` and holding one sweep, ``s``
    (id 1), and whatever the SQL ``statements`` then write (in the same transaction): the
    migration tests write old rows into it, then upgrade."""
    from orchestrator.store.engine import make_engine

    engine = make_engine(db_url)
    migrate(engine, revision)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO sweeps (name, spec_text, spec_hash) VALUES ('s', 't', 'h')"))
        for sql in statements:
            conn.execute(sa.text(sql))
    return engine


@pytest.fixture(scope="session")
def two_arm_reference_db(tmp_path_factory) -> str:
    """A SQLite URL holding one uninterrupted run of :func:`two_arm_spec`, made once per test
    run: the lifecycle and fault tests compare their interrupted runs against it (trial keys
    do not depend on the sweep's name, so one run serves every name). Under pytest-xdist the
    first worker to need it makes it, holding a file lock in the run's shared temp folder;
    the others wait and read it (it is only read), instead of each spending a 50-s sweep."""
    import subprocess
    import sys

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    tmp = root / "two_arm_reference"
    url = f"sqlite:///{tmp / 'ref.db'}"
    with FileLock(str(root / "two_arm_reference.lock")):
        if not (tmp / "made").exists():
            shutil.rmtree(tmp, ignore_errors=True)  # what a worker that failed here left
            tmp.mkdir()
            spec = tmp / "spec.yaml"
            spec.write_text(two_arm_spec("reference", retries=2))
            # A driver process of its own, as the runs it is compared with; on this worker's Ray.
            address = ensure_shared_ray()
            env = shared_env({**os.environ, "PYTHONUNBUFFERED": "1"})
            cmd = [sys.executable, "-m", "orchestrator.cli", "submit", str(spec), "--db", url, "--quiet"]
            cmd += ["--address", address, "--checkpoint-dir", str(tmp / "ck")]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            assert res.returncode == 0, res.stderr
            (tmp / "made").touch()
    assert len(sweep_evals(url)) == 6 * 13
    return url


# The tiny trial the loop, pack and non-finite tests train (armed_gdn on MQAR K = 8, d 16,
# 30 steps, an eval every 10): about half a second of CPU.
TINY_TRIAL = {
    "arm": "armed_gdn",
    "task": "mqar",
    "task.K": 8,
    "task.eval_size": 64,
    "d_model": 16,
    "n_layers": 1,
    "batch_size": 16,
    "steps": 30,
    "eval_every": 10,
    "lr": 3e-3,
}


# The arms with a rank-one (delta-rule family) state update: 1024 state elements each at the
# factorial setting (d_model 32, one layer).
RANK1_ARMS = (
    "deltanet",
    "gated_deltanet",
    "armed_gdn",
    "armed_gdn_fwd",
    "dg_rank",
    "dg_diag",
    "armed_dg_rank",
    "armed_dg_diag",
)


def fate_trace(
    fate: tuple, steps: list[int], *, solved: float, mid: float, chance: float, collapsed: float, loss_drop: float
) -> list[dict]:
    """The eval points of a simulated trial whose ``fate`` is (outcome, escape step or None,
    collapse step or None): chance accuracy, ``solved`` from its escape, ``collapsed`` from
    its collapse, ``mid`` at the last step of a 'mid' trial; loss 4 - loss_drop * acc."""
    kind, esc, col = fate
    out = []
    for s in steps:
        if col is not None and s >= col:
            a = collapsed
        elif esc is not None and s >= esc:
            a = solved
        elif kind == "mid" and s == steps[-1]:
            a = mid
        else:
            a = chance
        out.append({"step": s, "acc": a, "loss": 4.0 - loss_drop * a})
    return out


# The `fixed:` block of the small MQAR sweeps the end-to-end tests run (TINY_TRIAL's trial
# but for its arm and budget).
TINY_FIXED = "fixed:\n  task: mqar\n  task.K: 8\n  task.eval_size: 64\n  d_model: 16\n  n_layers: 1\n  batch_size: 16\n"


def two_arm_spec(name: str, *, retries: int | None = None) -> str:
    """The small two-arm, three-seed MQAR sweep the runner, lifecycle and fault tests kill,
    cancel and resume (240 steps, an eval every 20: 13 rows a trial, checkpoint every step)."""
    return (
        f"\nname: {name}\n" + TINY_FIXED + "  checkpoint_every_s: 0\n"
        "axes:\n  arm: [gated_deltanet, armed_gdn]\n  seed: 0..2\n"
        "budget: {steps: 240, eval_every: 20}\nresources: {cpu: 1}\nmax_concurrent: 2\n"
        + (f"retries: {retries}\n" if retries is not None else "")
    )


# ---- one Ray for the session ------------------------------------------------------------------

# A fixed, small cluster: one CPU on every machine, so what fits a slot does not depend on
# where the suite runs. One, not two: the suite is CPU-bound on its 2 cores (two xdist workers,
# each with a Ray of its own, plus the drivers with Rays of their own), and every Ray Tune run
# starts a trial actor per slot it fills, each about 7 CPU-s of imports (torch, Ray Tune, and
# torch._dynamo, which torch.optim's step imports) before its first step. With one slot a run
# of several trials starts one actor and reuses it: the 17 modules that use this Ray took
# 20:45 and 2,421 CPU-s against 25:32 and 3,028 with two (`pytest -n 2`, one run each, in a
# row). $ORCH_TEST_RAY_CPUS sets it (a machine with cores to spare).
# Its own short temp folder (Ray's socket paths must stay under ~107 characters), so no
# `ray_current_cluster` file of it is left where other drivers look.
SHARED_RAY_CPUS = int(os.environ.get("ORCH_TEST_RAY_CPUS", "1"))
_shared_ray_dir: list[str] = []
_shared_ray_address: list[str] = []


def ensure_shared_ray() -> str:
    """Start the session's local Ray unless this process already has one; its GCS address
    (for subprocess drivers: ``submit --address``)."""
    import ray

    # The runner's Ray and Tune settings (environment variables its workers inherit), set on
    # import, as they are before the product starts a Ray of its own.
    import orchestrator.runner.tune_runner  # noqa: F401

    if not ray.is_initialized():
        if not _shared_ray_dir:
            _shared_ray_dir.append(tempfile.mkdtemp(prefix="orch-ray-", dir="/tmp"))
        ray.init(
            address="local",
            num_cpus=SHARED_RAY_CPUS,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            object_store_memory=256 * 1024**2,  # sweeps pass small results; the machine is shared
            _temp_dir=_shared_ray_dir[0],
        )
        _shared_ray_address[:] = [ray.get_runtime_context().gcs_address]
    return ray.get_runtime_context().gcs_address


# The environment of a subprocess driver that starts a Ray of its own (a machine a kill takes
# down, another machine, a worker to lose): RAY_ADDRESS=local, never a cluster another test
# left, and one CPU, whatever the machine has. Ray reads RAY_OVERRIDE_RESOURCES as it sizes a
# new node, over what the driver asks for. With two slots such a driver starts two trial
# actors and Ray prestarts two idle workers, for a test that needs one trial running; on one,
# a submit of six short trials took 22-24 CPU-s against 28-37 (three runs each, this 2-core
# machine), and test_faults, test_lifecycle, test_join and test_run_guards 10:46 and 1,177 CPU-s
# against 12:11 and 1,350 (`pytest -n 2`). None of the tests that use it is about two trials at
# once on one driver (test_run_guards' gone-database runs ask for two CPUs).
OWN_RAY = {"RAY_ADDRESS": "local", "RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": 1})}


def shared_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) as a subprocess driver that joins the
    session's Ray (``submit --address``) needs it. Ray 2.60 turns on token authentication for
    a new local Ray by setting RAY_AUTH_MODE=token in the process that starts it; a driver
    joining by address without it is refused. RAY_ADDRESS is dropped: the address is given."""
    ensure_shared_ray()
    env = {**(os.environ if base is None else base)}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_OVERRIDE_RESOURCES", None)  # it joins a Ray, it starts none
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN"):
        if k in os.environ:
            env[k] = os.environ[k]
        else:
            env.pop(k, None)
    return env


@pytest.fixture
def shared_ray() -> str:
    """The session's one local Ray, started on first use and kept until the session ends:
    in-process sweeps run on it (the product reuses a running Ray and does not stop it)."""
    return ensure_shared_ray()


# ---- the order tests are handed to the xdist workers -----------------------------------------

# The modules whose slow tests take the most time (CI's --durations, summed by module), longest
# first. Only the order depends on this list: a module missing from it runs with the other
# slow tests.
HEAVIEST_FIRST = (
    "test_fault_schedule",
    "test_faults",
    "test_lifecycle",
    "test_checkpoint_store",
    "test_join",
    "test_fleet",
    "test_run_guards",
    "test_chains",
    "test_cluster",
    "test_multihost",
    "test_retention",
    "test_upgrade_identity",
    "test_identity",
    "test_bench_overhead",
    "test_slurm",
)


def pytest_collection_modifyitems(config, items) -> None:
    """Longest first: the heaviest slow tests, the other slow ones, then the fast tests (each
    group in collection order). Under pytest-xdist's worksteal scheduling (pyproject's
    addopts) a worker that runs out takes the back half of the other's queue, so what is
    left to share at the end is short tests, and the two workers finish together instead of
    one running a two-minute test alone at the end."""
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}

    def key(item) -> tuple[int, int]:
        if item.get_closest_marker("slow") is None:
            return (2, 0)
        module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
        return (0, rank[module]) if module in rank else (1, 0)

    items.sort(key=key)  # stable: collection order within a group


def pytest_sessionfinish(session, exitstatus) -> None:
    import sys

    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    for d in _shared_ray_dir:
        shutil.rmtree(d, ignore_errors=True)


def ray_trial_workers(session: int) -> list[int]:
    """Pids of Ray worker processes of the driver's session running a trial now: titled
    ``ray::ImplicitFunc.train`` while Tune's call into the trainable runs. An actor Tune keeps
    for reuse between trials is titled ``ray::ImplicitFunc``; killing that one fails no trial
    (Tune starts another), and a test that meant to kill one mid-trial would find nothing to
    check (test_chains' worker kill did so once)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                cmd = fh.read().decode(errors="replace")
            if "ImplicitFunc.train" in cmd and os.getsid(int(d)) == session:
                pids.append(int(d))
        except (OSError, ProcessLookupError):
            continue
    return pids


def kill_a_trial_worker(p: subprocess.Popen, due: Callable[[], bool], what: str, pause: float = 0.05) -> int:
    """SIGKILL one Ray worker running a trial of driver ``p`` (a session of its own) once
    ``due()`` holds, within 300 s; the worker's pid. Fails naming ``what`` if none was caught."""
    deadline = time.time() + 300
    while p.poll() is None and time.time() < deadline:
        workers = ray_trial_workers(p.pid) if due() else []
        if workers:
            os.kill(workers[0], signal.SIGKILL)
            return workers[0]
        time.sleep(pause)
    raise AssertionError(f"no worker caught {what}")
