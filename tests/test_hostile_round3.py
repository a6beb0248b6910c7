"""Round three's smaller points, each on the real parts: ``--where`` with parameter names
that collide case-insensitively and with functions that reach outside its table, a lone
surrogate in a dashboard POST, and formula-like strings in every CSV the product writes
(``export --format csv`` and the dashboard's), leading blanks included."""

from __future__ import annotations

import csv
import json

import pandas as pd
import pytest

from orchestrator.analysis.where import filter_trial_ids
from orchestrator.cli import main
from orchestrator.errors import UserError
from orchestrator.store.export import csv_safe
from orchestrator.store.import_jsonl import write_records
from orchestrator.store.reader import open_reader_engine
from orchestrator.ui.app import create_app

from test_ui_bounds import call

FRAME = pd.DataFrame(
    {
        "trial_id": [1, 2],
        "key": ["a", "b"],
        "status": ["completed", "completed"],
        "task.K": [8, 16],
        "tag.k": ["x", "y"],
        "K": [8, 16],  # the short aliases, as params_frame adds them
        "k": ["x", "y"],
    }
)


def test_where_with_names_that_collide_case_insensitively():
    # The full names still work; the aliases, ambiguous to SQL, are not columns any more.
    assert filter_trial_ids(FRAME, '"task.K" = 8') == [1]
    assert filter_trial_ids(FRAME, "\"tag.k\" = 'y'") == [2]
    with pytest.raises(UserError, match="no such column: k"):
        filter_trial_ids(FRAME, "k = 'x'")
    twins = FRAME.assign(**{"tag.K": ["p", "q"]})
    with pytest.raises(UserError, match="differ only in case"):
        filter_trial_ids(twins, '"task.K" = 8')


@pytest.mark.parametrize("fn", ["fts3_tokenizer('simple')", "FTS3_TOKENIZER('porter')", "load_extension('x')"])
def test_where_refuses_functions_that_reach_outside_its_table(fn):
    with pytest.raises(UserError, match="not authorized"):
        filter_trial_ids(FRAME, f"{fn} IS NOT NULL")


def test_where_with_a_lone_surrogate_is_one_line():
    with pytest.raises(UserError, match="not valid UTF-8"):
        filter_trial_ids(FRAME, "arm = '\udcff'")


@pytest.mark.parametrize(
    "value, escaped",
    [
        ("=1+1", True),
        (" =1+1", True),
        ("\t=1", True),
        ("+cmd", True),
        ("-2+3", True),
        ("@SUM(A1)", True),
        ("plain", False),
        ("a=b", False),
        (-0.5, False),
    ],
)
def test_csv_safe(value, escaped):
    got = csv_safe(value)
    assert (got == "'" + value) if escaped else (got == value)


def _formula_sweep(db: str) -> None:
    records = [
        {"params": {"arm": "gated_deltanet", "seed": s, "tag.note": note}, "trace": [{"step": 1, "acc": 0.1}]}
        for s, note in enumerate(["=1+1", ' =HYPERLINK("x")', "@SUM(A1)", "fine"])
    ]
    write_records(db, "formulas", records)


def test_export_csv_escapes_formula_cells(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'f.db'}"
    _formula_sweep(db)
    out = tmp_path / "out"
    assert main(["export", "formulas", "--format", "csv", "--out", str(out), "--db", db]) == 0
    with open(out / "trials.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    col = next(c for c in rows[0] if c.endswith("note"))
    assert sorted(r[col] for r in rows) == sorted(["'=1+1", '\' =HYPERLINK("x")', "'@SUM(A1)", "fine"])
    with open(out / "evals.csv", newline="") as fh:
        assert all(not v.startswith("'") for r in csv.DictReader(fh) for v in r.values())  # numbers untouched


def test_dashboard_csv_escapes_a_leading_blank_formula_and_refuses_a_surrogate(tmp_path):
    db = f"sqlite:///{tmp_path / 'f.db'}"
    _formula_sweep(db)
    engine, shown = open_reader_engine(db)
    try:
        app = create_app(engine, shown)
        status, _, body = call(app, "/api/sweeps/formulas/csv/trials")
        assert status == 200, body
        cells = {v for row in csv.reader(body.decode().splitlines()) for v in row}
        assert '\' =HYPERLINK("x")' in cells and "'=1+1" in cells and ' =HYPERLINK("x")' not in cells
        payload = json.dumps({"where": "seed = '\udcff'"}).encode()  # JSON's \\udcff: a lone surrogate
        status, _, body = call(
            app,
            "/api/sweeps/formulas/traces",
            method="POST",
            body=payload,
            headers={"content-type": "application/json"},
        )
        assert status == 400 and b"not valid UTF-8" in body, (status, body)
    finally:
        engine.dispose()


def test_a_parameter_named_like_a_trial_column_is_kept_as_params_name(tmp_path, capsys):
    # An imported `status` parameter was dropped from the analysis frame, and `status` in
    # --where meant the trial's status without a word. It is kept as params.status now
    # (as load and export name it); `status` stays the trial's own.
    db = f"sqlite:///{tmp_path / 'st.db'}"
    records = [
        {
            "params": {"arm": "mlstm", "seed": s, "status": "odd" if s % 2 else "even"},
            "trace": [{"step": 1, "acc": 0.9}],
        }
        for s in range(4)
    ]
    write_records(db, "st", records)
    capsys.readouterr()
    assert main(["analyze", "st", "lockin", "--by", "params.status", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "even" in out and "odd" in out
    assert (
        main(["analyze", "st", "lockin", "--where", "\"params.status\" = 'odd' AND status = 'completed'", "--db", db])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split()[1:3] == ["2", "2"] for line in lines[2:]), lines  # k = n = 2: the odd seeds
