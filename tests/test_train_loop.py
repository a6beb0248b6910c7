"""The training loop without Ray or SQL: eval grid, determinism, checkpoint round trips,
divergence, schedules."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import TINY_TRIAL
from orchestrator.train import Trainer
from orchestrator.train.schedule import lr_multiplier

BASE = {**TINY_TRIAL, "seed": 1}


def _trace(tr):
    return [(p.step, p.acc, p.loss, p.train_loss, p.step_lr, p.metrics) for p in tr.run()]


def test_eval_grid_and_fields():
    tr = Trainer({**BASE, "steps": 25})
    trace = list(tr.run())
    assert [p.step for p in trace] == [1, 10, 20, 25]
    assert tr.status == "completed"
    for p in trace:
        assert 0.0 <= p.acc <= 1.0 and math.isfinite(p.loss) and p.step_lr == pytest.approx(3e-3)
        assert p.elapsed_s >= 0
    assert trace[0].train_loss is not None and trace[-1].elapsed_s >= trace[0].elapsed_s


def test_same_seed_same_trace_and_other_seed_differs():
    a = _trace(Trainer(BASE))
    b = _trace(Trainer(BASE))
    c = _trace(Trainer({**BASE, "seed": 2}))
    assert a == b
    assert a != c


def test_checkpoint_round_trip_continues_bit_for_bit(tmp_path):
    full = _trace(Trainer(BASE))
    tr = Trainer(BASE)
    it = tr.run()
    first = [next(it), next(it)]  # steps 1 and 10
    path = tmp_path / "ck.pt"
    torch.save(tr.state_dict(), path)
    resumed = Trainer(BASE)
    resumed.load_state_dict(torch.load(path, weights_only=False))
    assert [p.step for p in resumed.trace] == [1, 10]
    rest = _trace(resumed)
    got = [(p.step, p.acc, p.loss, p.train_loss, p.step_lr, p.metrics) for p in first] + rest
    assert got == full


def test_checkpoint_from_before_the_step_lr_rename_loads(tmp_path):
    """Checkpoints written before ``EvalPoint.lr`` became ``step_lr`` hold trace points keyed
    ``lr``: they load, with the same values, and the trial goes on as if never stopped."""
    full = _trace(Trainer(BASE))
    tr = Trainer(BASE)
    it = tr.run()
    first = [next(it), next(it)]
    state = tr.state_dict()
    old = []
    for e in state["trace"]:
        e = dict(e)
        e["lr"] = e.pop("step_lr")
        old.append(e)
    path = tmp_path / "old.pt"
    torch.save({**state, "trace": old}, path)
    resumed = Trainer(BASE)
    resumed.load_state_dict(torch.load(path, weights_only=False))
    assert resumed.trace == first and [p.step_lr for p in resumed.trace] == pytest.approx([3e-3, 3e-3])
    got = [(p.step, p.acc, p.loss, p.train_loss, p.step_lr, p.metrics) for p in first] + _trace(resumed)
    assert got == full
    assert all("lr" not in e and "step_lr" in e for e in resumed.state_dict()["trace"])


def test_checkpoint_of_another_config_is_refused():
    tr = Trainer(BASE)
    state = tr.state_dict()
    other = Trainer({**BASE, "lr": 1e-3})
    with pytest.raises(ValueError, match="different trial config"):
        other.load_state_dict(state)


class PoisonedAtStep5(Trainer):
    """A real trial whose weights go NaN before step 5 (the spec refuses learning rates
    large enough to get there honestly: lr <= 10)."""

    def _train_step(self, step):
        if step == 5:
            with torch.no_grad():
                for p in self.model.parameters():
                    p.fill_(float("nan"))
        return super()._train_step(step)


def test_nan_loss_ends_as_diverged_with_trace_kept():
    tr = PoisonedAtStep5({**BASE, "grad_clip": None, "steps": 200, "eval_every": 1, "weight_decay": 0.0})
    trace = list(tr.run())
    assert tr.status == "diverged"
    assert "non-finite" in tr.error
    assert tr.step == 5 and [p.step for p in trace] == [1, 2, 3, 4]


def test_schedules():
    kw = dict(steps=100)
    assert lr_multiplier(1, schedule="constant", **kw) == 1.0
    assert lr_multiplier(5, schedule="constant", warmup_steps=10, **kw) == 0.5
    assert lr_multiplier(100, schedule="cosine", **kw) == pytest.approx(0.0, abs=1e-12)
    assert lr_multiplier(50, schedule="cosine", **kw) == pytest.approx(0.5)
    # A period longer than the budget stops partway down (the schedule confound).
    assert lr_multiplier(100, schedule="cosine", cosine_steps=200, **kw) == pytest.approx(0.5)
    assert lr_multiplier(300, schedule="cosine", cosine_steps=200, min_lr_ratio=0.1, **kw) == pytest.approx(0.1)
    tr = Trainer({**BASE, "schedule": "cosine", "warmup_steps": 5, "steps": 20})
    lrs = {p.step: p.step_lr for p in tr.run()}
    assert lrs[1] == pytest.approx(3e-3 / 5) and lrs[20] == pytest.approx(0.0, abs=1e-12)


def test_rebinding_metric_is_streamed():
    tr = Trainer({**BASE, "rebinding": True, "steps": 10})
    trace = list(tr.run())
    assert all("rebind_acc" in p.metrics for p in trace)
