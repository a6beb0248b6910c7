"""Every command and subcommand of the CLI, run once on a tiny real input: exit 0 and a row or
figure printed, so a stale import or a renamed helper inside a command fails here rather than
in a user's hands. The read commands share one SQLite database made per module by
``orchestrator import`` (no Ray). A command whose real run must start Ray, a server or a
subprocess (submit, resume, ui, bench pack) runs here on its cheap path (a dry run, or its
help) and for real in the slow part at the end. ``test_every_command_has_a_smoke_run`` walks
the typer app and fails on a command this list does not name."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import uuid
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from scipy.stats import norm

from conftest import POSTGRES_URL, make_pg_schema_url
from orchestrator.cli import app, main

GRID = [1, 100, 200, 300, 400]
# arm -> escape step of seeds 0..3 (None: stays at chance)
ESCAPES = {"armed_gdn": [100, 200, 200, None], "gated_deltanet": [300, None, None, 400]}

SPEC = """
name: tiny
fixed: {arm: gated_deltanet, task: mqar, task.K: 8, task.eval_size: 32, d_model: 8, n_layers: 1, batch_size: 8}
axes: {seed: 0..1}
budget: {steps: 20, eval_every: 10}
resources: {cpu: 1}
"""


# A sequential design over the smoke sweep's arms and seeds, for `design replay`.
SEQ_SPEC = """
name: seq
fixed: {task: mqar, task.K: 8, d_model: 16, n_layers: 1, steps: 400, eval_every: 100}
axes: {arm: [armed_gdn, gated_deltanet], seed: 0..3}
sequential: {compare: {by: arm, groups: [armed_gdn, gated_deltanet]}, test: logrank, looks: [2, 4]}
"""


def _smoke_records() -> list[dict]:
    return [
        {
            "params": {"arm": arm, "seed": seed, "task": {"name": "mqar", "K": 8}, "d_model": 16},
            "trace": [{"step": s, "acc": 0.9 if esc is not None and s >= esc else 0.05, "loss": 1.0} for s in GRID],
        }
        for arm, escapes in ESCAPES.items()
        for seed, esc in enumerate(escapes)
    ]


def _scaling_records() -> list[dict]:
    """A small recall-scaling grid (2 vocabularies x 5 widths x 3 state sizes) whose final
    accuracy follows the law with kappa 0.5, for ``analyze SWEEP scaling``."""
    rng = np.random.default_rng(0)
    out = []
    for V in (256, 4096):
        for D in (8, 16, 32, 64, 128):
            for N in (2, 8, 32):
                nf = 16
                p = 1 / nf + (1 - 1 / nf) * norm.cdf(0.5 * math.sqrt(N * D / nf) - math.sqrt(2 * math.log(V)))
                params = {"arm": "mlstm", "seed": 0, "d_model": D, "n_layers": 1, "model.d_state": N}
                params["task"] = {"name": "ar_scaling", "vocab_size": V, "n_facts": nf}
                acc = float(rng.binomial(2048, p) / 2048)
                out.append({"params": params, "trace": [{"step": 1, "acc": 1 / nf}, {"step": 100, "acc": acc}]})
    return out


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def _record_a_look(url: str) -> None:
    """One group-sequential look on the smoke sweep, decided and stored as the runner does."""
    from orchestrator.design.sequential import SurvivalData, decide_look, parse_sequential
    from orchestrator.store import repo
    from orchestrator.store.engine import open_store_engine

    seq = parse_sequential(
        {"compare": {"by": "arm", "groups": list(ESCAPES)}, "test": "logrank", "looks": [4, 8], "spending": "pocock"}
    )
    data = {
        arm: SurvivalData(times=[float(e or GRID[-1]) for e in escapes], events=[e is not None for e in escapes])
        for arm, escapes in ESCAPES.items()
    }
    rec = decide_look(seq, 1, data)
    engine, _ = open_store_engine(url, auto_create=False)
    with engine.begin() as conn:
        sid = repo.find_sweep(conn, "smoke")[0]
        repo.record_look(conn, sid, json.dumps({}), 1, rec.decision, rec.as_dict())
    engine.dispose()


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory) -> Path:
    """A folder holding ``smoke.db`` (sweeps ``smoke``: 2 arms x 4 seeds with one stored look,
    and ``scale``: a scaling grid), both imported through ``orchestrator import``, and the
    JSONL files and spec they came from."""
    d = tmp_path_factory.mktemp("smoke")
    url = f"sqlite:///{d / 'smoke.db'}"
    for name, records in (("smoke", _smoke_records()), ("scale", _scaling_records())):
        assert main(["import", str(_jsonl(d / f"{name}.jsonl", records)), "--sweep", name, "--db", url]) == 0
    _record_a_look(url)
    (d / "tiny.yaml").write_text(SPEC)
    (d / "seq.yaml").write_text(SEQ_SPEC)
    return d


# (command path, extra argv, text the output must contain). {db}: the smoke database (a fresh
# copy for the commands that write), {dir}: the smoke folder, {tmp}: the test's own folder.
READ = "--db {db}"
CASES: list[tuple[str, str, str]] = [
    ("ls", READ, "8/8 completed"),
    ("status", "smoke " + READ, "smoke: 8 trials: completed 8"),
    ("sql", "'SELECT arm, count(*) AS n FROM trials GROUP BY arm ORDER BY arm' " + READ, "armed_gdn"),
    ("analyze", "smoke lockin --by arm " + READ, "armed_gdn  3  4  0.75"),
    ("analyze", "smoke outcomes --by arm " + READ, "median_escape"),
    ("analyze", "smoke fisher --by arm " + READ, "armed_gdn: k=3, n=4"),
    ("analyze", "smoke permutation --by arm " + READ, "n_relabellings: 70"),
    ("analyze", "smoke mcnemar --by arm " + READ, "n_pairs: 4"),
    ("analyze", "smoke km --by arm " + READ, "Kaplan-Meier on escape times"),
    ("analyze", "smoke logrank --by arm " + READ, "armed_gdn: n=4, escapes=3"),
    ("analyze", "smoke hazard --by arm " + READ, "5 escapes, 8 trials"),
    ("analyze", "smoke sequential " + READ, "seeds saved in all: 0"),
    ("analyze", "scale scaling " + READ, "law: kappa = 0.5"),
    ("report", "smoke --by arm --out {tmp}/report " + READ, "sweep smoke: 8 trials"),
    ("export", "smoke --format csv --out {tmp}/export " + READ, "trials.csv"),
    (
        "import",
        "{dir}/smoke.jsonl --sweep again --db sqlite:///{tmp}/new.db",
        "imported 8 trials (8 new, 40 eval rows)",
    ),
    ("cancel", "smoke " + READ, "0 leftover running trial(s) marked interrupted"),
    ("delete", "smoke --yes " + READ, "deleted sweep smoke: 8 trials, 40 evals"),
    ("db upgrade", READ, "copy.db: schema "),
    ("db create-reader", "{role} --db {pg}", "GRANT"),
    ("db prune", "smoke --dry-run " + READ, "smoke: would free 0 checkpoint(s)"),
    ("cells", "--arms deltanet,armed_gdn", "1,024"),
    ("tasks", "", "Masked MQAR"),
    ("tasks selftest", "--json", '"ok": true'),
    ("design power", "--test fisher --rates 0.9,0.4", "fixed design: 17 seeds per group"),
    ("design replay", "{dir}/seq.yaml --sweep smoke " + READ, "replayed on sweep smoke"),
    ("logs", "smoke --trial {key} " + READ, ": no attempt recorded yet"),  # imported: no attempts
    ("submit", "{dir}/tiny.yaml --dry-run", "sweep tiny: 2 trials"),
    ("resume", "--help", "from their checkpoints"),
    ("join", "--help", "Add a driver"),
    ("slurm", "smoke --jobs 2 --dry-run " + READ, "#SBATCH --array=0-1"),
    ("ui", "--help", "read-only"),
    ("bench analysis", "--trials 20 --evals 5", "hazard fit straight from the DB"),
    ("bench store", "--rows 200 --steps 2 --sweep-trials 0", "SQLite ingest"),
    ("bench pack", "--help", "seed pack"),
    ("bench overhead", "--help", "plain Ray Tune"),
    (
        "bench checkpoints",
        "--spec sweeps/quickstart.yaml --growth sweeps/quickstart.yaml --steps 10 --repeats 1 --rows 1000 "
        "--postgres ''",
        "database grows",
    ),
    ("bench ui", "--trials 30 --evals 5 --repeats 1 --json", '"eval_rows": 150'),
    ("bench cells", "--arms deltanet --seq-len 8 --d-model 8 --batch 2 --repeats 1", "deltanet"),
    ("bench kernels", "--quick --device cpu", "dplr_scan   quick_B2"),
    ("bench tasks", "--only s5 --reps 1 --batch 4", "depth=16"),
]
# The real runs of the commands above that only show their help or a dry run here.
SLOW_RUNS = {"submit", "resume", "join", "ui", "bench pack", "bench overhead"}
WRITES = {"cancel", "delete", "db upgrade"}


def _commands(typer_app, prefix: tuple[str, ...] = ()) -> set[str]:
    """Every command path of a typer app: its commands, its groups' commands, and each group
    that does something when called alone (``tasks``)."""
    out = set()
    for c in typer_app.registered_commands:
        out.add(" ".join((*prefix, c.name or c.callback.__name__.replace("_", "-"))))
    for g in typer_app.registered_groups:
        sub = g.typer_instance
        path = (*prefix, g.name)
        if sub.registered_callback is not None and sub.registered_callback.invoke_without_command:
            out.add(" ".join(path))
        out |= _commands(sub, path)
    return out


def test_every_command_has_a_smoke_run():
    known = _commands(app)
    listed = {c for c, _, _ in CASES}
    assert known - listed == set(), "commands without a smoke run in tests/test_cli_smoke.py"
    assert listed - known == set(), "smoke runs of commands that no longer exist"
    assert SLOW_RUNS <= known
    from orchestrator.analysis import KINDS

    kinds = {a.split()[1] for c, a, _ in CASES if c == "analyze"}
    assert kinds == set(KINDS), "an analysis kind without a smoke run"


def _argv(command: str, args: str, smoke_dir: Path, tmp_path: Path, pg: tuple[str, str] | None) -> list[str]:
    import shlex

    db = smoke_dir / "smoke.db"
    if command in WRITES:  # its own copy (SQLite's backup: the WAL's rows too); the module's stays
        with closing(sqlite3.connect(db)) as src, closing(sqlite3.connect(tmp_path / "copy.db")) as dst:
            src.backup(dst)
        db = tmp_path / "copy.db"
    url, role = pg or ("", "")
    with closing(sqlite3.connect(db)) as con:
        key = con.execute("SELECT key FROM trials ORDER BY id LIMIT 1").fetchone()[0]
    filled = args.format(db=f"sqlite:///{db}", dir=smoke_dir, tmp=tmp_path, pg=url, role=role, key=key)
    return [*command.split(), *shlex.split(filled)]


@pytest.fixture
def pg_schema():
    """A fresh PostgreSQL schema and a role name of this run's own, both dropped after."""
    if not POSTGRES_URL:
        pytest.skip("db create-reader is PostgreSQL only: set ORCH_TEST_POSTGRES_URL")
    from conftest import _pg_base, drop_role

    url, drop = make_pg_schema_url(reader=False)
    role = f"orch_smoke_{uuid.uuid4().hex[:12]}"
    try:
        yield url, role
    finally:
        admin = sa.create_engine(_pg_base(), isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            drop_role(c, role)
        admin.dispose()
        drop()


@pytest.mark.parametrize(
    "command,args,says", CASES, ids=[f"{c}:{a.split()[1] if c == 'analyze' else ''}".rstrip(":") for c, a, _ in CASES]
)
def test_command_runs_on_a_tiny_input(command, args, says, smoke_dir, tmp_path, capsys, request):
    pg = request.getfixturevalue("pg_schema") if "{pg}" in args else None
    code = main(_argv(command, args, smoke_dir, tmp_path, pg))
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert says in cap.out + cap.err, cap.out + cap.err
    if command == "tasks selftest":  # (was tests/test_tasks_cli.py) the collision checks ran
        assert any(c["name"].startswith("rebinding collision") for c in json.loads(cap.out)["checks"])
    if command == "bench ui":  # (was tests/test_bench_smoke.py) every request timed, every body sent
        got = json.loads(cap.out)
        assert got["n_trials"] == 30 and any("/traces" in path for path in got["requests"])
        assert all(r["server_s"] > 0 and r["bytes"] > 0 for r in got["requests"].values())
        assert got["eval_read"]["columnar_s"] > 0 and got["eval_read"]["tuples_s"] > 0
    if command == "delete":
        assert main(["ls", "--db", f"sqlite:///{tmp_path / 'copy.db'}"]) == 0
        assert "8/8" not in capsys.readouterr().out


# ---- the real runs: Ray, a server, subprocesses -----------------------------------------------


@pytest.mark.slow
def test_submit_then_resume_a_tiny_sweep(smoke_dir, tmp_path, capsys, shared_ray):
    db = f"sqlite:///{tmp_path / 'run.db'}"
    ck = str(tmp_path / "ck")
    assert main(["submit", str(smoke_dir / "tiny.yaml"), "--db", db, "--checkpoint-dir", ck]) == 0
    assert "sweep tiny: 2 completed" in capsys.readouterr().out
    assert main(["resume", "tiny", "--db", db, "--checkpoint-dir", ck]) == 0
    assert "sweep tiny: nothing ran (the sweep: 2 completed; 2 trials)" in capsys.readouterr().out
    # Re-submitting the finished sweep says so without reaching Ray: in a fresh process (no
    # Ray of the test's), an address where no cluster listens would fail the run if it tried.
    got = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "submit", str(smoke_dir / "tiny.yaml"), "--db", db]
        + ["--address", "127.0.0.1:9"],
        capture_output=True,
        text=True,
        env={**os.environ, "ORCH_RAY_JOIN_TIMEOUT_S": "3"},
        timeout=120,
    )
    assert got.returncode == 0, got.stderr
    assert "sweep tiny: nothing ran (the sweep: 2 completed; 2 trials)" in got.stdout
    assert "2 in sweep, 2 already finished, 0 to run" in got.stderr


@pytest.mark.slow
def test_ui_serves_the_index(smoke_dir):
    from ui_support import get, ui_server

    with ui_server(f"sqlite:///{smoke_dir / 'smoke.db'}") as base:
        code, body = get(base + "/")
    assert code == 200 and b"smoke" in body


@pytest.mark.slow
def test_bench_pack_lone_vs_packed(capsys):
    assert main(["bench", "pack", "--seeds", "2", "--steps", "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["seeds"], got["steps"]) == (2, 2) and got["pack_wall_s"] > 0
