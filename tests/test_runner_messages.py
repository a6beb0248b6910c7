"""The messages from a unit of work to the driver's writer (runner/messages.py): each one
survives its wire form, also after a JSON round trip (where Tune would turn int dict keys
into strings), and the writer's eval rows are what the store takes."""

from __future__ import annotations

import json
import math

import pytest

from orchestrator.runner.messages import EvalRow, Placement, Report, StepFailure, StopRecord, TrialFinal
from orchestrator.status import Status
from orchestrator.store.repo import EVAL_COLUMNS
from orchestrator.train import EvalPoint

POINT = EvalPoint(
    step=20, acc=0.75, loss=0.5, train_loss=None, step_lr=1.5e-3, elapsed_s=3.25, metrics={"rebind_acc": 0.5}
)


def _json(wire):
    return json.loads(json.dumps(wire))


def _round_trip(msg):
    """``msg`` back from its wire form, directly and through JSON."""
    kind = type(msg)
    direct = kind.from_wire(msg.to_wire())
    via_json = kind.from_wire(_json(msg.to_wire()))
    assert repr(direct) == repr(via_json)  # (repr: NaN is not equal to itself)
    return direct


def test_eval_row_round_trips_and_is_what_the_store_takes():
    row = EvalRow(7, POINT)
    back = _round_trip(row)
    assert back == row and back.point is not POINT
    assert type(back.trial_id) is int and type(back.point.step) is int
    bare = EvalRow(7, EvalPoint(1, 0.0, 2.0, 2.5, 1e-3, 0.0))
    assert _round_trip(bare) == bare and _round_trip(bare).point.metrics == {}
    stored = row.store_row()
    assert set(stored) == {"trial_id", "step", *EVAL_COLUMNS} - {"nonfinite"}
    assert stored["step_lr"] == 1.5e-3 and stored["train_loss"] is None and stored["trial_id"] == 7
    assert len(row.to_wire()) == 8  # compact: no keys


def test_a_non_finite_eval_value_reaches_the_writer_as_such():
    # The store names it in evals.nonfinite; the message must not lose or coerce it.
    row = EvalRow(3, EvalPoint(10, 0.25, math.inf, math.nan, 1e-3, 1.0, {"rebind_loss": -math.inf}))
    back = _round_trip(row).point
    assert back.loss == math.inf and math.isnan(back.train_loss) and back.metrics["rebind_loss"] == -math.inf
    assert back.acc == 0.25


@pytest.mark.parametrize(
    "msg",
    [
        Placement("node-1", "abc123", "cpu"),
        Placement(None, None, None),
        StopRecord(step=40, budget=100, reason="escaped at step 30, sustained for 2 evals"),
        StepFailure("config", "Traceback (most recent call last):\n  ...\nValueError: no such arm\n"),
        TrialFinal(5, Status.completed),
        TrialFinal(5, Status.diverged, "non-finite training loss at step 9", failure=StepFailure("runtime", "tb")),
        TrialFinal(6, Status.completed, None, stop=StopRecord(40, 100, "escaped")),
        TrialFinal(8, Status.failed, "config error: ValueError: x", failure=StepFailure("config", "tb")),
    ],
    ids=repr,
)
def test_each_message_round_trips(msg):
    assert _round_trip(msg) == msg


def test_a_report_round_trips_with_int_trial_ids():
    report = Report(
        evals=(EvalRow(11, POINT), EvalRow(12, POINT)),
        placement=Placement("h", "n", "cuda:0 (bf16)"),
        finals=(
            TrialFinal(11, Status.completed),
            TrialFinal(12, Status.failed, "boom", failure=StepFailure("runtime", "tb")),
        ),
    )
    wire = report.to_wire()
    assert set(wire) == {"evals", "placement", "finals"}
    back = Report.from_wire(_json(wire))
    assert back == report
    finals = {f.trial_id: f for f in back.finals}
    assert list(finals) == [11, 12] and all(type(k) is int for k in finals)
    assert finals[12].status is Status.failed and finals[12].failure == StepFailure("runtime", "tb")


def test_a_report_in_a_tune_result_and_the_empty_report():
    # Tune adds its own keys to every result; a result without our keys is an empty report.
    tune_keys = {"done": True, "trial_id": "3f2a_00001", "training_iteration": 4, "time_this_iter_s": 0.1}
    report = Report(evals=(EvalRow(1, POINT),))
    assert Report.from_wire({**report.to_wire(), **tune_keys}) == report
    assert Report().to_wire() == {"evals": []}
    assert Report.from_wire(tune_keys) == Report() == Report.from_wire(None)
    assert Report.from_wire(None).finals == ()
