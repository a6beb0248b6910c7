"""Stop at the event (``stop: {after_escape_evals: N}``) with real training steps: the loop
ends a trial N evals after a sustained escape, its trace up to the stop equals the full run's,
the runner records the stop, the analysis keeps escape times and refuses lock-in at budget
unless told how to impute it, and ``status`` shows the steps saved."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main
from conftest import query
from orchestrator.train import Trainer

# armed_gdn on masked MQAR K = 4 escapes within ~150 steps at lr 3e-3 (acc 0.92 at step 150).
PARAMS = {
    "arm": "armed_gdn",
    "task": "mqar",
    "task.K": 4,
    "task.eval_size": 256,
    "d_model": 32,
    "n_layers": 1,
    "batch_size": 32,
    "lr": 3e-3,
    "steps": 300,
    "eval_every": 50,
    "seed": 0,
}


RULE = {"after_escape_evals": 1, "escape_at": 0.8}


@pytest.fixture(scope="module")
def runs():
    """The full 300-step run and the same trial under the stop rule, each trained once for
    the tests below: (full trace, the stopped Trainer, its trace)."""
    full = Trainer(PARAMS)
    full_trace = [(p.step, p.acc) for p in full.run()]
    assert full.stopped_at is None and full_trace[-1][0] == 300
    stopped = Trainer(PARAMS, stop=RULE)
    return full_trace, stopped, [(p.step, p.acc) for p in stopped.run()]


def test_loop_stops_n_evals_after_a_sustained_escape_and_keeps_the_prefix(runs):
    full_trace, stopped, trace = runs
    # Independent reading of the rule on the full trace: the first eval (after the first)
    # from which acc >= 0.8 holds for this eval and the next one; stop at the next one.
    accs = full_trace
    expect = next(accs[i + 1][0] for i in range(1, len(accs) - 1) if accs[i][1] >= 0.8 and accs[i + 1][1] >= 0.8)
    assert stopped.stopped_at == expect < 300
    assert trace == full_trace[: len(trace)] and trace[-1][0] == expect
    assert str(stopped.status) == "completed" and "sustained 1 evals" in stopped.stop_reason
    # An escape that is not sustained does not stop: threshold above every eval but one.
    top = max(a for _, a in full_trace[1:])
    never = Trainer(PARAMS, stop={"after_escape_evals": 1, "escape_at": top})
    assert [p.step for p in never.run()][-1] == 300 and never.stopped_at is None


def test_stopped_state_survives_a_checkpoint_round_trip(runs):
    _, t, _ = runs
    state = t.state_dict()
    again = Trainer(PARAMS, stop=RULE)
    again.load_state_dict(state)
    assert again.stopped_at == t.stopped_at is not None and list(again.run()) == []


SPEC = """
name: stopper
fixed: {arm: armed_gdn, task: mqar, task.K: 4, task.eval_size: 256, d_model: 32, n_layers: 1,
        batch_size: 32, lr: 3.0e-3}
axes: {seed: [0, 1]}
budget: {steps: 300, eval_every: 50, schedule: constant}
resources: {cpu: 1}
max_concurrent: 2
stop: {after_escape_evals: 1}
analysis: {by: [seed], lockin: 0.9, escape_at: 0.8}
"""


@pytest.mark.slow
def test_sweep_with_stop_rule_records_refuses_and_imputes(tmp_path, capsys, shared_ray):
    spec = tmp_path / "stop.yaml"
    spec.write_text(SPEC)
    url = f"sqlite:///{tmp_path / 'stop.db'}"
    assert main(["submit", str(spec), "--db", url, "-q"]) == 0
    rows = query(
        url,
        "SELECT t.status, t.final_step, s.step, s.budget, s.reason FROM trials t "
        "JOIN trial_stops s ON s.trial_id = t.id ORDER BY t.seed",
    )
    assert len(rows) == 2
    for status, final_step, step, budget, reason in rows:
        assert status == "completed" and final_step == step < budget == 300 and "escape" in reason
    capsys.readouterr()
    # Escape times are analysed as usual...
    assert main(["analyze", "stopper", "km", "--db", url]) == 0
    # ... lock-in at budget is refused (one line, exit 2) unless the imputation is stated.
    assert main(["analyze", "stopper", "lockin", "--db", url]) == 2
    assert "--stopped-as solved" in capsys.readouterr().err
    assert main(["analyze", "stopper", "lockin", "--db", url, "--stopped-as", "solved", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert all(r["rate"] == 1.0 for r in table), table
    # status reports the steps the rule saved: the budget minus the stop step, per trial.
    assert main(["status", "stopper", "--db", url, "--json"]) == 0
    saved = json.loads(capsys.readouterr().out)["sweeps"][0]["saved"]
    assert saved["stopped_trials"] == 2
    assert saved["steps"] == sum(300 - r[2] for r in rows)
    # A sweep without a sequential block has no looks to show: one line, exit 2.
    assert main(["analyze", "stopper", "sequential", "--db", url]) == 2
    assert "no sequential looks" in capsys.readouterr().err
    # The report says which rule it used.
    assert main(["report", "stopper", "--db", url, "--out", str(tmp_path / "rep")]) == 0
    text = capsys.readouterr().out
    assert "left out of A, D, E, F" in text and "compute saved" in text
