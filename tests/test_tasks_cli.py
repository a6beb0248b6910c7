"""``orchestrator tasks``, ``orchestrator tasks --floors``, ``bench tasks`` (``tasks selftest``:
tests/test_cli_smoke.py)."""

from __future__ import annotations

import json

import pytest

import tasks
from orchestrator.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_tasks_lists_every_task_with_parameters(capsys):
    code, out, _ = _run(capsys, "tasks", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r["task"] for r in rows] == list(tasks.NAMES)
    mqar = rows[0]
    assert mqar["params"] == {"K": 16, "n_keys": 64, "n_values": 26, "eval_size": 1024}
    assert mqar["param_types"]["K"] == "int >= 1" and mqar["vocab_size"] == 91
    assert {r["task"]: r["rebinding"] for r in rows}["s5"] is False
    code, out, _ = _run(capsys, "tasks")
    assert code == 0 and "gate_threshold" in out and "mad_recall" in out


def test_floors_json_at_published_settings(capsys):
    code, out, _ = _run(capsys, "tasks", "--floors", "--json")
    assert code == 0
    rows = json.loads(out)
    assert all(set(r) == {"task", "params", "floors"} for r in rows)
    mqar = {r["params"]["K"]: r["floors"] for r in rows if r["task"] == "mqar"}
    assert sorted(mqar) == [8, 16, 32]
    assert mqar[32]["no_binding"] == pytest.approx(0.0685, abs=5e-4)
    assert mqar[32]["value_marginal"] == pytest.approx(1 / 26)
    mad = sorted(
        r["params"]["vocab_size"] for r in rows if r["task"] == "mad_recall" and r["params"].get("seq_len") == 768
    )
    assert mad == [80, 88, 96]
    coll = next(r for r in rows if r["task"] == "collision")
    assert coll["floors"]["positional"] == pytest.approx(0.264, abs=1e-3)
    assert {r["task"] for r in rows} >= {"haystack", "s5"}
    for r in rows:
        assert r["floors"] == tasks.build(r["task"], **r["params"]).floors()


def test_bench_tasks_prints_figures(capsys):
    code, out, err = _run(capsys, "bench", "tasks", "--json", "--only", "s5", "--reps", "1", "--batch", "4")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["params"]["depth"] for r in rows] == [2, 4, 8, 16]
    for r in rows:
        assert r["gen_ms"] > 0 and r["step_ms"] > 0
        # (printed to 3 decimals: a share under 0.05 % is within rounding, not within 1 %)
        assert r["gen_pct_of_step"] == pytest.approx(100 * r["gen_ms"] / r["step_ms"], rel=0.01, abs=5e-4)


def test_bench_rejects_unknown_task(capsys):
    code, _, err = _run(capsys, "bench", "tasks", "--only", "mqr")
    assert code == 2 and "error: unknown task 'mqr'" in err
