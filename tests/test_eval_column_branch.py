"""A new per-eval number, added as a branch would add it, is two product files.

The test copies the product (orchestrator, cells, tasks, kernels, migrations, pyproject.toml)
and makes the change there, as a developer's branch would: ``param_norm``, the global L2 norm
of the trial's parameters at each eval point. The honest count is 2 product files:

- ``orchestrator/evals.py``: the field, and its producer with it (``evals.measured``: the
  training loop measures it from the parameters of the lone trial or of each seed-pack
  member at every eval point; nothing else in the loop changes);
- ``migrations/versions/00NN_param_norm.py``: the column on ``evals`` and the ``trial_trace``
  view recreated with it (the views live in the migrations only, as frozen SQL).

Everything else follows from ``evals.py``: the model's table, the runner's wire form, the
writer's upsert and ``nonfinite`` marks, the checkpoint trace, the reader, the dashboard's
traces and CSV, the export and the JSONL import. A number that is not a function of the
parameters at the eval point (the gradient norm before clipping, a per-step mean) needs its
producer in the training loop as well (``train/loop.py``, and ``train/pack.py`` for packs):
three files, or four.

Then, in a subprocess that imports the copy (its own Ray, so the workers train with the
copy's code too): a small sweep (a seed pack of two and a lone trial) on SQLite and, when
``ORCH_TEST_POSTGRES_URL`` is set, on PostgreSQL; the models against the migrated schema
(autogenerate finds no difference); ``orchestrator sql`` selecting the column
from ``evals`` and ``trial_trace``; the dashboard's traces API and its traces CSV; and
``orchestrator export`` as CSV. Each gives the column, finite and equal to the norm of the
model the trial trained (retrained in-process from its stored parameters)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import POSTGRES_URL, make_pg_schema_url

pytestmark = pytest.mark.slow  # a subprocess that starts Ray and runs sweeps

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("orchestrator", "cells", "tasks", "kernels", "migrations")
NAME = "param_norm"

FIELD = f"""\
    # The global L2 norm of the trial's parameters at the eval point.
    {NAME}: float | None = measured(lambda ps: sum(float(p.float().pow(2).sum()) for p in ps) ** 0.5)
"""

MIGRATION = '''\
"""evals.{name}: the global L2 norm of the trial's parameters at each eval point
(orchestrator/evals.py); the trace view shows it, after its other columns. Rows written
before this revision have it NULL (not recorded).

(Alembic revision {revision}, a test branch.)
"""

import importlib

import sqlalchemy as sa
from alembic import op

revision, down_revision = "{revision}", "{head}"

# The trace view as {view_from} froze it, and this revision's copy: the new column last.
TRIAL_TRACE_BEFORE = importlib.import_module("migrations.versions.{view_from}").TRIAL_TRACE
TRIAL_TRACE = TRIAL_TRACE_BEFORE.replace("\\n    FROM evals e", ", e.{name} AS {name}\\n    FROM evals e", 1)
assert TRIAL_TRACE != TRIAL_TRACE_BEFORE


def upgrade() -> None:
    _change_evals(lambda b: b.add_column(sa.Column("{name}", sa.Double)), TRIAL_TRACE)


def downgrade() -> None:
    _change_evals(lambda b: b.drop_column("{name}"), TRIAL_TRACE_BEFORE)


def _change_evals(change, view: str) -> None:
    # The view reads evals: dropped while its columns change, recreated after.
    op.execute("DROP VIEW IF EXISTS trial_trace")
    with op.batch_alter_table("evals", recreate="never") as b:
        change(b)
    op.execute(f"CREATE VIEW trial_trace AS {{view}}")
'''

# Three seeds in packs of two: a pack (its members measured from their slices of the stacked
# parameters) and a lone trial.
SPEC = """\
name: branch
fixed: {arm: gated_deltanet, task: mqar, task.K: 8, task.eval_size: 32, d_model: 8, n_layers: 1, batch_size: 8}
axes: {seed: 0..2}
budget: {steps: 20, eval_every: 10}
resources: {cpu: 1}
pack_seeds: 2
"""

# Run in the copy: each database gets the sweep, then every reader is asked for the column.
SCRIPT = """\
import contextlib, csv, io, json, logging, sys, time

t0 = time.monotonic()
times = {}
import ray

import orchestrator.runner.tune_runner  # noqa: F401  (the runner's Ray settings)
from orchestrator import evals
from orchestrator.cli import main
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from orchestrator.store.engine import VERSION_TABLE, make_engine
from orchestrator.store.models import Base
from orchestrator.store.reader import open_reader_engine
from orchestrator.ui.app import create_app
from orchestrator.train import Trainer

sys.path.append(sys.argv[1])  # the suite's tests folder, for ui_support
from ui_support import asgi_call

spec, out_dir, urls = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
# One CPU: the pack and the lone trial run in turn on one trial actor, not two actors'
# imports at once on the suite's two cores.
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
         logging_level=logging.ERROR, object_store_memory=256 * 1024**2)
times["start"] = time.monotonic() - t0

def cli(*argv):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(list(argv))
    assert rc == 0, (argv, rc, buf.getvalue())
    return buf.getvalue()

def rows(text):
    return list(csv.DictReader(io.StringIO(text)))

result = {"numbers": list(evals.NUMBERS)}
for i, url in enumerate(urls):
    got = result[str(i)] = {}
    cli("submit", spec, "--db", url, "--quiet", "--checkpoint-dir", f"{out_dir}/ck{i}")
    times[f"submit{i}"] = time.monotonic() - t0
    got["sql_evals"] = rows(cli("sql", "SELECT t.key, t.params, e.step, e.param_norm FROM evals e "
                                "JOIN trials t ON t.id = e.trial_id ORDER BY t.key, e.step", "--db", url, "--csv"))
    got["sql_view"] = rows(cli("sql", "SELECT key, step, param_norm FROM trial_trace WHERE sweep = 'branch' "
                               "ORDER BY key, step", "--db", url, "--csv"))
    engine = make_engine(url)  # the models (built from evals.py) against the migrated schema
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": VERSION_TABLE})
        got["model_diff"] = [repr(d) for d in compare_metadata(ctx, Base.metadata)
                             if not (d[0] == "remove_table" and d[1].name == VERSION_TABLE)]
    engine.dispose()
    engine, shown = open_reader_engine(url)
    app = create_app(engine, shown)
    code, _, body = asgi_call(app, "/api/sweeps/branch/traces?full=1")
    assert code == 200, body
    got["ui_traces"] = json.loads(body)["columns"]
    code, _, body = asgi_call(app, "/api/sweeps/branch/csv/traces")
    assert code == 200, body
    got["ui_csv"] = rows(body.decode())
    engine.dispose()
    cli("export", "branch", "--format", "csv", "--out", f"{out_dir}/export{i}", "--db", url)
    with open(f"{out_dir}/export{i}/evals.csv") as f:
        got["export"] = list(csv.DictReader(f))
    times[f"read{i}"] = time.monotonic() - t0

# The norm of the model each trial trained, retrained here from its stored parameters (a lone
# trial is deterministic on one device; a pack member equal to its lone run up to rounding).
norms = {}
for r in result["0"]["sql_evals"]:
    if r["key"] not in norms:
        t = Trainer(json.loads(r["params"]), device="cpu")
        for _ in t.run():
            pass
        norms[r["key"]] = sum(float(p.detach().pow(2).sum()) for p in t.model.parameters()) ** 0.5
result["norms"] = norms
times["retrain"] = time.monotonic() - t0
result["times"] = times  # seconds since the start, after each phase
ray.shutdown()
print("RESULT " + json.dumps(result))
"""


def _digest(root: Path) -> dict[str, str]:
    """Every product file under ``root`` (relative path -> sha256), caches left out."""
    out = {}
    for pkg in PRODUCT:
        for p in sorted((root / pkg).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    out["pyproject.toml"] = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()
    return out


def _branch(tmp_path: Path) -> tuple[Path, set[str]]:
    """A copy of the product with the new number in it; the product files the change made
    or changed."""
    tree = tmp_path / "tree"
    for pkg in PRODUCT:
        shutil.copytree(ROOT / pkg, tree / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    before = _digest(tree)

    # 1. The field and its producer (evals.py says where new numbers go).
    path = tree / "orchestrator" / "evals.py"
    text = path.read_text()
    marker = "    # New numbers here, each defaulting to None.\n"
    assert text.count(marker) == 1
    path.write_text(text.replace(marker, marker + FIELD))

    # 2. One migration after the head, recreating the trace view from its newest copy.
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(tree / "migrations"))
    chain = list(reversed(list(ScriptDirectory.from_config(cfg).walk_revisions())))
    head = chain[-1].revision
    view_from = [Path(r.path).stem for r in chain if "TRIAL_TRACE =" in Path(r.path).read_text()][-1]
    revision = f"{len(chain) + 1:04d}_{NAME}"
    (tree / "migrations" / "versions" / f"{revision}.py").write_text(
        MIGRATION.format(name=NAME, revision=revision, head=head, view_from=view_from)
    )

    after = _digest(tree)
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    return tree, changed


def _finite(values) -> bool:
    return all(v not in (None, "") and math.isfinite(float(v)) for v in values)


def _new_migration(tree: Path) -> str:
    """The file name of the branch's migration (the one this test wrote)."""
    (path,) = [p for p in (tree / "migrations" / "versions").glob(f"*_{NAME}.py")]
    return path.name


def test_a_new_eval_number_is_two_files_and_reaches_every_reader(tmp_path):
    tree, changed = _branch(tmp_path)
    assert changed == {"orchestrator/evals.py", f"migrations/versions/{_new_migration(tree)}"}

    urls = [f"sqlite:///{tmp_path / 'branch.db'}"]
    drops = []
    if POSTGRES_URL:
        url, drop = make_pg_schema_url()
        urls.append(url)
        drops.append(drop)
    (tmp_path / "spec.yaml").write_text(SPEC)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(tree), PYTHONUNBUFFERED="1")
    try:
        res = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(ROOT / "tests"), str(tmp_path / "spec.yaml"), str(tmp_path)]
            + [json.dumps(urls)],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        for drop in drops:
            drop()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT ") :])
    print("phases (s since start):", result["times"])

    # The copy's eval point has the number last among its numbers.
    assert result["numbers"][-1] == NAME and "nonfinite" not in result["numbers"]
    norms = result["norms"]
    assert len(norms) == 3  # a pack of two and a lone trial
    for i in range(len(urls)):
        got = result[str(i)]
        assert got["model_diff"] == []
        evals_rows = got["sql_evals"]
        assert len(evals_rows) == 3 * 3 and _finite(r[NAME] for r in evals_rows)  # steps 1, 10, 20
        by_key: dict[str, list[float]] = {}
        for r in evals_rows:
            by_key.setdefault(r["key"], []).append(float(r[NAME]))
        for key, values in by_key.items():
            assert len(set(values)) == 3  # it changes as the trial trains
            assert values[-1] == pytest.approx(norms[key], rel=1e-5)  # the trained model's norm
        want = [(r["key"], int(r["step"]), float(r[NAME])) for r in evals_rows]
        assert [(r["key"], int(r["step"]), float(r[NAME])) for r in got["sql_view"]] == want

        cols = got["ui_traces"]
        assert NAME in cols and len(cols[NAME]) == len(want) and _finite(cols[NAME])
        assert sorted(cols[NAME]) == sorted(v for *_, v in want)
        assert sorted((r["key"], int(r["step"]), float(r[NAME])) for r in got["ui_csv"]) == want

        head = list(got["export"][0])
        assert head.index(NAME) == head.index("elapsed_s") + 1 and head.index("nonfinite") == head.index(NAME) + 1
        exported = sorted((int(r["step"]), float(r[NAME])) for r in got["export"])
        assert exported == sorted((s, v) for _, s, v in want)
