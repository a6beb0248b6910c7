"""``orchestrator export``: trials (one column per parameter), evals and the spec text, read
back by pyarrow in a process that cannot import orchestrator, and as CSV."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import sqlalchemy as sa

import orchestrator
from orchestrator.cli import main
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine
from orchestrator.store.import_jsonl import write_records

SPEC = "name: ex\nfixed: {task: mqar}\n"

READER = r"""
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("orchestrator", "cells", "tasks", "kernels", "pandas"):
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, Block())
import pyarrow.parquet as pq
t = pq.read_table(sys.argv[1] + "/trials.parquet")
e = pq.read_table(sys.argv[1] + "/evals.parquet")
print(json.dumps({"trials": t.num_rows, "tcols": t.column_names, "evals": e.num_rows,
                  "ecols": e.column_names, "acc": sorted(e.column("acc").to_pylist()),
                  "K": t.column("task.K").to_pylist(), "impl": t.column("model.impl").to_pylist(),
                  "rb": e.column("metrics.rebind_acc").to_pylist()}))
"""


def _db(tmp_path) -> str:
    db = str(tmp_path / "ex.db")
    recs = [
        {
            "params": {
                "arm": "deltanet",
                "seed": s,
                "model": {"impl": impl},
                "task": {"name": "mqar", "K": 8 * (s + 1)},
            },
            "trace": [{"step": 10 * i, "acc": 0.1 * i + 0.01 * s, "loss": 1.0 / i} for i in (1, 2)],
        }
        for s, impl in ((0, "auto"), (1, 3))
    ]
    write_records(db, "ex", recs)
    engine, _ = open_store_engine(db)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE sweeps SET spec_text = :t"), {"t": SPEC})
        conn.execute(sa.text("""UPDATE evals SET metrics = '{"rebind_acc": 0.5}'"""))
    return db


@pytest.mark.slow
def test_export_parquet_reads_without_orchestrator(tmp_path, capsys):
    db = _db(tmp_path)
    out = tmp_path / "out"
    assert main(["export", "ex", "--format", "parquet", "--out", str(out), "--db", db]) == 0
    assert capsys.readouterr().out.split() == [str(out / f) for f in ("trials.parquet", "evals.parquet", "spec.yaml")]
    r = subprocess.run([sys.executable, "-c", READER, str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["trials"] == 2 and got["evals"] == 4
    assert {"key", "status", "arm", "seed", "task.K", "model.impl"} <= set(got["tcols"])
    assert "K" not in got["tcols"] and "task_K" not in got["tcols"]
    assert got["ecols"][:7] == ["trial_id", "step", "acc", "loss", "train_loss", "step_lr", "elapsed_s"]
    assert got["acc"] == sorted([0.1, 0.2, 0.11, 0.21]) or all(
        abs(a - b) < 1e-12 for a, b in zip(got["acc"], sorted([0.1, 0.2, 0.11, 0.21]))
    )
    assert sorted(got["K"]) == [8, 16] and sorted(got["impl"]) == ["3", "auto"]  # mixed: text
    assert got["rb"] == [0.5] * 4
    assert (out / "spec.yaml").read_text() == SPEC


def test_export_csv_and_bad_input(tmp_path, capsys):
    db = _db(tmp_path)
    out = tmp_path / "csv"
    assert main(["export", "ex", "--format", "csv", "--out", str(out), "--db", db]) == 0
    with open(out / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["task.K"] for r in rows) == ["16", "8"]
    capsys.readouterr()
    assert main(["export", "ex", "--format", "xlsx", "--out", str(out), "--db", db]) == 2
    assert "expected parquet or csv" in capsys.readouterr().err
    assert main(["export", "nope", "--out", str(out), "--db", db]) == 2
    assert "no sweep named 'nope'" in capsys.readouterr().err


def test_every_parameter_kept_and_placement_in_its_own_columns(tmp_path, capsys):
    # `device: auto` is a parameter (what was asked); where the trial ran (cpu, fp32) is not.
    db = str(tmp_path / "pl.db")
    recs = [
        {
            "params": {"arm": "deltanet", "seed": s, "device": "auto", "status": "odd"},
            "trace": [{"step": 1, "acc": 0.5}],
        }
        for s in (0, 1)
    ]
    write_records(db, "pl", recs)
    engine, _ = open_store_engine(db)
    with engine.begin() as conn:
        ids = [r[0] for r in conn.execute(sa.text("SELECT id FROM trials ORDER BY id"))]
        repo.set_placement(conn, ids[0], "node-a", "n0", "cpu (fp32)")
        repo.set_placement(conn, ids[1], "node-b", None, "cuda:0 (bf16)")
    engine.dispose()
    trials, _ = orchestrator.load("pl", db=db)
    assert list(trials["device"]) == ["auto", "auto"]
    assert list(trials["placement_host"]) == ["node-a", "node-b"]
    assert list(trials["placement_device"]) == ["cpu (fp32)", "cuda:0 (bf16)"]
    assert trials["placement_node_id"].iloc[0] == "n0" and trials["placement_node_id"].iloc[1] is None
    # An imported parameter named like a column of the frame is kept under params.<name>.
    assert list(trials["status"]) == ["completed", "completed"] and list(trials["params.status"]) == ["odd", "odd"]
    assert "host" not in trials.columns and "node_id" not in trials.columns
    # Every stored parameter has its column, in the export too.
    with engine.connect() as conn:
        names = {r[0] for r in conn.execute(sa.text("SELECT DISTINCT name FROM trial_params"))}
    assert names <= set(trials.columns) | {"status"}
    out = tmp_path / "csv"
    assert main(["export", "pl", "--format", "csv", "--out", str(out), "--db", db]) == 0
    with open(out / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["device"], r["placement_device"]) for r in rows] == [("auto", "cpu (fp32)"), ("auto", "cuda:0 (bf16)")]
    # The Python API's export writes the same files.
    paths = orchestrator.export("pl", db=db, out=tmp_path / "py", format="csv")
    assert [p.name for p in paths] == ["trials.csv", "evals.csv", "spec.yaml"]
    assert (tmp_path / "py" / "trials.csv").read_text() == (out / "trials.csv").read_text()


def test_nonfinite_column_kept_in_every_format(tmp_path, capsys):
    # A NaN loss and a loss never recorded are both NULL in `loss`; only `nonfinite` tells them apart.
    db = str(tmp_path / "nf.db")
    recs = [
        {
            "params": {"arm": "deltanet", "seed": 0},
            "trace": [
                {"step": 10, "acc": 0.25, "loss": float("nan")},
                {"step": 20, "acc": 0.5},
                {"step": 30, "acc": 0.75, "loss": 0.5},
            ],
        }
    ]
    write_records(db, "nf", recs)
    for fmt in ("csv", "parquet"):
        out = tmp_path / fmt
        assert main(["export", "nf", "--format", fmt, "--out", str(out), "--db", db]) == 0
        capsys.readouterr()
        if fmt == "csv":
            with open(out / "evals.csv") as f:
                rows = list(csv.DictReader(f))
            got = [(int(r["step"]), r["loss"], r["nonfinite"]) for r in rows]
            assert got == [(10, "", "loss=nan"), (20, "", ""), (30, "0.5", "")]
        else:
            import pyarrow.parquet as pq

            t = pq.read_table(out / "evals.parquet")
            assert t.column("step").to_pylist() == [10, 20, 30]
            assert t.column("nonfinite").to_pylist() == ["loss=nan", None, None]
            loss = t.column("loss").to_pylist()
            assert loss[2] == 0.5 and all(x is None or x != x for x in loss[:2])
