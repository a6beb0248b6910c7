"""Benchmarks that no other test reaches run once on a tiny input, so a stale import or a
renamed helper inside them fails here rather than in a user's hands."""

from __future__ import annotations

import json

from orchestrator.cli import main


def test_bench_ui_runs_and_prints_its_figures(capsys):
    code = main(["bench", "ui", "--trials", "30", "--evals", "5", "--repeats", "1", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    got = json.loads(out)
    assert got["n_trials"] == 30 and got["eval_rows"] == 150
    assert any(path.endswith("/traces") for path in got["requests"])
    assert all(r["server_s"] > 0 and r["bytes"] > 0 for r in got["requests"].values())
