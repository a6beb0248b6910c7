"""``orchestrator import``: published traces become trials; a malformed file imports
nothing and names its bad lines."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from orchestrator import analysis as oa
from conftest import query
from orchestrator.cli import main
from orchestrator.store.engine import open_store_engine
from orchestrator.store.repo import upsert_sweep

GRID = [1, 200, 400, 600, 800]


def _line(seed, variant="ns5", escape=600, **extra):
    return {
        "params": {
            "arm": "mlstm",
            "seed": seed,
            "lr": 0.003,
            "task": {"name": "mad_recall", "vocab_size": 80},
            "tag.variant": variant,
        },
        "trace": [
            {
                "step": s,
                "acc": 0.95 if escape and s >= escape else 0.02,
                "loss": 1.5,
                "train_loss": 1.4,
                "elapsed_s": s / 10,
                "c_erank": 3.5,
            }
            for s in GRID
        ],
        **extra,
    }


def _write(path, objs):
    path.write_text("\n".join(o if isinstance(o, str) else json.dumps(o) for o in objs) + "\n")
    return path


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_import_round_trip_and_idempotent_reimport(db_url, tmp_path, capsys):
    f = _write(
        tmp_path / "pub.jsonl", [_line(0), "", _line(1, escape=None), _line(2, variant="baseline", status="diverged")]
    )
    code, out, err = _run(capsys, "import", str(f), "--sweep", "published", "--db", db_url, "--json")
    assert code == 0, err
    res = json.loads(out)
    assert (res["trials"], res["new_trials"], res["evals"]) == (3, 3, 15)
    trials, evals = oa.load_sweep(db_url, "published", statuses=["completed", "diverged"])
    assert sorted(trials["seed"]) == [0, 1, 2]
    assert trials.set_index("seed").loc[2, "status"] == "diverged"
    assert set(trials["task.vocab_size"]) == {80} and "vocab_size" in trials.columns
    one = evals[evals.trial_id == trials.set_index("seed").loc[0, "trial_id"]]
    assert one["step"].tolist() == GRID
    assert one["acc"].tolist() == [0.02, 0.02, 0.02, 0.95, 0.95]
    (row,) = query(
        db_url,
        "SELECT e.metrics, e.train_loss, t.final_acc, t.best_acc, t.key FROM evals e "
        "JOIN trials t ON t.id = e.trial_id WHERE t.seed = 0 AND e.step = 800",
    )
    metrics = row[0] if isinstance(row[0], dict) else json.loads(row[0])
    assert metrics == {"c_erank": 3.5} and row[1] == 1.4
    assert (row[2], row[3]) == (0.95, 0.95) and len(row[4]) >= 16
    # The analyses read imported trials like any other.
    lr = oa.logrank(db_url, "published", by="variant", statuses="all").to_dict()
    assert lr["groups"]["ns5"]["escapes"] == 1 and lr["groups"]["baseline"]["escapes"] == 1
    code, out, _ = _run(capsys, "import", str(f), "--sweep", "published", "--db", db_url, "--json")
    again = json.loads(out)
    assert code == 0 and (again["new_trials"], again["evals"]) == (0, 15)
    assert query(db_url, "SELECT (SELECT COUNT(*) FROM evals), (SELECT COUNT(*) FROM trials)") == [(15, 3)]


def test_malformed_lines_are_reported_by_number_and_nothing_is_imported(db_url, tmp_path, capsys):
    engine, _ = open_store_engine(db_url)
    bad_acc = _line(3)
    bad_acc["trace"][1]["acc"] = 1.7
    dup_step = _line(4)
    dup_step["trace"][2]["step"] = 1
    f = _write(
        tmp_path / "bad.jsonl",
        [
            _line(0),
            "{not json",
            _line(1),
            bad_acc,
            {"params": {"seed": 5}},
            dup_step,
            _line(6, extra_key=1),
            [1, 2],
            _line(7, escape=None) | {"status": "running"},
        ],
    )
    code, out, err = _run(capsys, "import", str(f), "--sweep", "pub", "--db", db_url)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "7 malformed line(s), nothing imported" in err
    for n, what in ((2, "invalid JSON"), (4, "trace[1].acc"), (5, "trace"), (6, "twice"), (7, "extra_key")):
        assert f"line {n}: " in err and what in err, (n, what, err)
    assert "(and 2 more)" in err  # lines 8 (an array) and 9 (status running)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM sweeps")).scalar_one() == 0
        assert conn.execute(sa.text("SELECT COUNT(*) FROM trials")).scalar_one() == 0
    # Identical params on two lines would merge two traces: refused, nothing written.
    f2 = _write(tmp_path / "dup.jsonl", [_line(0), _line(1), _line(0)])
    code, _, err = _run(capsys, "import", str(f2), "--sweep", "pub", "--db", db_url)
    assert code == 2 and "line 3 has the same params as line 1" in err
    code, _, err = _run(capsys, "import", str(tmp_path / "absent.jsonl"), "--sweep", "pub", "--db", db_url)
    assert code == 2 and "cannot read" in err
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM trials")).scalar_one() == 0


def test_import_never_writes_into_a_submitted_sweep(db_url, tmp_path, capsys):
    engine, _ = open_store_engine(db_url)
    with engine.begin() as conn:
        upsert_sweep(conn, "basin", "name: basin\n", "abc")
    f = _write(tmp_path / "more.jsonl", [_line(10), _line(11)])
    code, _, err = _run(capsys, "import", str(f), "--sweep", "basin", "--db", db_url)
    assert code == 2 and "created by `orchestrator submit`" in err
    assert len(err.strip().splitlines()) == 1
    with engine.connect() as conn:
        spec, h = conn.execute(sa.text("SELECT spec_text, spec_hash FROM sweeps WHERE name = 'basin'")).one()
        n = conn.execute(sa.text("SELECT COUNT(*) FROM trials")).scalar_one()
    assert (spec, h, n) == ("name: basin\n", "abc", 0)


@pytest.mark.parametrize(
    "bad",
    [
        '{"params": {"a": 1}, "trace": [{"step": 1.5, "acc": 0.1}]}',
        '{"params": {"a": 1}, "trace": [{"step": 1, "acc": "0.5"}]}',
        '{"params": {}, "trace": [{"step": 1, "acc": 0.1}]}',
        '{"params": {"a": 1}, "trace": []}',
    ],
)
def test_each_malformed_shape_is_rejected(tmp_path, bad):
    from orchestrator.store.import_jsonl import parse_file
    from orchestrator.errors import UserError

    f = tmp_path / "one.jsonl"
    f.write_text(bad + "\n")
    with pytest.raises(UserError, match="line 1: "):
        parse_file(f)


def test_every_finite_measurement_is_stored(db_url, tmp_path, capsys):
    """A point with a finite accuracy and a NaN/inf loss keeps its row (loss NULL, the point
    marked non-finite); a non-finite metric is stored as null and named (PostgreSQL's json
    refuses the NaN token); a completed trace has no marks."""
    nan, inf = float("nan"), float("inf")
    diverging = _line(0)
    for p, loss in zip(diverging["trace"][2:], (nan, inf, nan)):
        p["loss"] = loss
    diverging["trace"][3]["c_erank"] = nan
    diverging["trace"][4]["train_loss"] = -inf
    f = _write(tmp_path / "nan.jsonl", [diverging, _line(1)])
    code, out, err = _run(capsys, "import", str(f), "--sweep", "nan", "--db", db_url, "--json")
    assert code == 0, err
    res = json.loads(out)
    assert (res["trials"], res["evals"], res["diverged"]) == (2, 10, 1)
    rows = query(
        db_url,
        "SELECT t.seed, t.status, e.step, e.acc, e.loss, e.train_loss, e.metrics, e.nonfinite "
        "FROM evals e JOIN trials t ON t.id = e.trial_id ORDER BY t.seed, e.step",
    )
    got = [
        (r[0], r[1], r[2], r[3], r[4], r[5], r[6] if isinstance(r[6], dict) else json.loads(r[6]), r[7]) for r in rows
    ]
    assert got[:5] == [
        (0, "diverged", 1, 0.02, 1.5, 1.4, {"c_erank": 3.5}, None),
        (0, "diverged", 200, 0.02, 1.5, 1.4, {"c_erank": 3.5}, None),
        (0, "diverged", 400, 0.02, None, 1.4, {"c_erank": 3.5}, "loss=nan"),
        (0, "diverged", 600, 0.95, None, 1.4, {"c_erank": None}, "loss=inf,metrics.c_erank=nan"),
        (0, "diverged", 800, 0.95, None, None, {"c_erank": 3.5}, "loss=nan,train_loss=-inf"),
    ]
    assert all(r[1] == "completed" and r[4] == 1.5 and r[7] is None for r in got[5:]) and len(got) == 10
    # The trace view shows the mark; the analysis reads every point with its accuracy.
    (view,) = query(db_url, "SELECT step, acc, loss, nonfinite FROM trial_trace WHERE seed = 0 AND step = 600")
    assert tuple(view) == (600, 0.95, None, "loss=inf,metrics.c_erank=nan")
    _, evals = oa.load_sweep(db_url, "nan", statuses=["completed", "diverged"])
    assert evals["acc"].notna().all() and evals["nonfinite"].sum() == 3
