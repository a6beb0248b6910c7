"""`orchestrator import` against hostile files (tests/bad_imports/): each refused with exit 2,
one line, nothing written; it never writes into a submitted sweep; sweep names follow the
spec rule; diverged traces (NaN, Infinity, 1e400) are stored as diverged trials."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from orchestrator.analysis.data import load_sweep
from orchestrator.cli import main
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine
from orchestrator.store.import_jsonl import write_records

CORPUS = Path(__file__).parent / "bad_imports"
FILES = sorted(CORPUS.glob("*.jsonl"))
P = {"arm": "mlstm", "seed": 1, "task": "mad_recall"}


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _refused(code, err):
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_corpus_size():
    assert len(FILES) >= 20


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_bad_import_writes_nothing(path, tmp_path, capsys):
    db = tmp_path / "x.db"
    code, out, err = _run(capsys, "import", str(path), "--sweep", "pub", "--db", str(db))
    _refused(code, err)
    assert out == "" and not db.exists()


def test_bad_import_leaves_an_existing_database_byte_identical(tmp_path, capsys):
    db = tmp_path / "x.db"
    engine, _ = open_store_engine(str(db))
    write_records(engine, "pub", [{"params": P, "trace": [{"step": 1, "acc": 0.5}]}])
    engine.dispose()  # checkpoints the WAL into the file

    def digest():
        return [
            hashlib.sha256(p.read_bytes() if p.exists() else b"").hexdigest() for p in (db, db.with_name("x.db-wal"))
        ]

    before = digest()
    for path in FILES:
        code, _, err = _run(capsys, "import", str(path), "--sweep", "pub", "--db", str(db))
        _refused(code, err)
    assert digest() == before


def test_bad_import_through_a_real_process(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "import",
            str(CORPUS / "params_nested_5000.jsonl"),
            "--sweep",
            "pub",
            "--db",
            str(tmp_path / "x.db"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("name", ["..", ".", "a/b", "[bold]x", "", " ", "../runs", "x" * 201])
def test_sweep_names_follow_the_spec_rule(name, tmp_path, capsys):
    f = tmp_path / "ok.jsonl"
    f.write_text(json.dumps({"params": P, "trace": [{"step": 1, "acc": 0.1}]}) + "\n")
    code, _, err = _run(capsys, "import", str(f), "--sweep", name, "--db", str(tmp_path / "x.db"))
    _refused(code, err)
    assert "sweep name" in err and not (tmp_path / "x.db").exists()


def test_import_cannot_overwrite_a_submitted_trial(db_url, tmp_path, capsys):
    engine, _ = open_store_engine(db_url)
    from orchestrator.keys import trial_key

    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, "real", "name: real\nfixed: {}\n", "h")
        ids = repo.add_trials(conn, sid, [(trial_key(P), P)])
        repo.upsert_evals(
            conn,
            [
                {
                    "trial_id": ids[trial_key(P)],
                    "step": 10,
                    "acc": 0.04,
                    "loss": 3.0,
                    "train_loss": None,
                    "step_lr": None,
                    "elapsed_s": None,
                    "metrics": None,
                }
            ],
        )
        repo.finish_trial(conn, ids[trial_key(P)], "completed")
    f = tmp_path / "over.jsonl"
    f.write_text(json.dumps({"params": P, "trace": [{"step": 10, "acc": 1.0}]}) + "\n")
    code, _, err = _run(capsys, "import", str(f), "--sweep", "real", "--db", db_url)
    _refused(code, err)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT final_acc FROM trials")).scalar_one() == 0.04
        assert conn.execute(sa.text("SELECT acc FROM evals")).scalars().all() == [0.04]


def test_diverged_traces_are_stored_as_diverged_with_their_finite_points(db_url, tmp_path, capsys):
    lines = [
        # Python's json writes a diverged loss as NaN / Infinity
        json.dumps(
            {
                "params": {**P, "seed": 1},
                "trace": [
                    {"step": 1, "acc": 0.1, "loss": 2.0},
                    {"step": 2, "acc": 0.2, "loss": 1.5},
                    {"step": 3, "acc": 0.0, "loss": float("nan")},
                ],
            }
        ),
        json.dumps(
            {
                "params": {**P, "seed": 2},
                "trace": [{"step": 1, "acc": 0.1, "loss": 2.0}, {"step": 2, "acc": 0.1, "loss": float("inf")}],
            }
        ),
        # a literal that overflows a double is the infinity it is, never NULL
        '{"params": {"arm": "mlstm", "seed": 3, "task": "mad_recall"}, "trace": '
        '[{"step": 1, "acc": 0.3, "loss": 2.0}, {"step": 2, "acc": 0.3, "loss": 1e400}]}',
        json.dumps(
            {
                "params": {**P, "seed": 4},
                "trace": [{"step": 1, "acc": 0.4, "loss": 2.0}, {"step": 2, "acc": None, "loss": -float("inf")}],
            }
        ),
        # a null loss is a loss that was not recorded: still a completed run
        json.dumps(
            {
                "params": {**P, "seed": 5},
                "trace": [{"step": 1, "acc": 0.5, "loss": None}, {"step": 2, "acc": 0.6, "loss": 1.0}],
            }
        ),
    ]
    f = tmp_path / "div.jsonl"
    f.write_text("\n".join(lines) + "\n")
    code, out, err = _run(capsys, "import", str(f), "--sweep", "div", "--db", db_url)
    assert code == 0, err
    assert "4 diverged" in out
    engine, _ = open_store_engine(db_url, auto_create=False)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT t.seed, t.status, t.final_step, t.final_acc, t.final_loss, "
                "(SELECT count(*) FROM evals e WHERE e.trial_id = t.id) FROM trials t "
                "ORDER BY t.seed"
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        (1, "diverged", 2, 0.2, 1.5, 2),
        (2, "diverged", 1, 0.1, 2.0, 1),
        (3, "diverged", 1, 0.3, 2.0, 1),
        (4, "diverged", 1, 0.4, 2.0, 1),
        (5, "completed", 2, 0.6, 1.0, 2),
    ]
    # the analysis reads them as it reads the training loop's diverged trials
    data = load_sweep(engine, "div")
    assert sorted(data.trials["status"]) == ["completed"] + ["diverged"] * 4
    # re-importing the same file into the imported sweep is idempotent
    code, out, _ = _run(capsys, "import", str(f), "--sweep", "div", "--db", db_url)
    assert code == 0 and "0 new" in out
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM evals")).scalar_one() == 7
