"""Curriculum state machines: uniform, time-based ramp, success-gated ramp; checkpoint round trip."""

from __future__ import annotations

import io
import json
import math
import random

import pytest
import torch

import tasks
from tasks.curriculum import GatedGap, RampGap, UniformGap


def _drive(cur, accs, start=0):
    caps = []
    for i, a in enumerate(accs):
        caps.append(cur.state()["cap"])
        cur.observe(start + i, a)
    return caps


def test_task_builds_the_requested_curriculum():
    assert tasks.build("haystack").curriculum(1000) is None
    assert tasks.build("mqar").curriculum(1000) is None
    u = tasks.build("haystack", L=64, curriculum="uniform").curriculum(1000)
    assert isinstance(u, UniformGap) and u.state() == {"cap": 27}
    r = tasks.build("collision", L=64, curriculum="ramp", ramp_start=2).curriculum(1000)
    assert isinstance(r, RampGap) and r.ramp_steps == 500 and r.state() == {"cap": 2}
    g = tasks.build("collision", L=512, curriculum="gated").curriculum(1000)
    assert isinstance(g, GatedGap) and g.step == math.ceil(251 / 20) and g.threshold == 0.6
    assert g.metrics() == {"curriculum_cap": 0.0, "curriculum_estimate": 0.0}


def test_uniform_is_constant_at_max():
    cur = UniformGap(27)
    assert set(_drive(cur, [random.random() for _ in range(100)])) == {27}
    assert cur.metrics() == {"curriculum_cap": 27.0}


def test_ramp_follows_its_schedule_whatever_the_accuracy():
    cur = RampGap(max_gap=100, start=10, ramp_steps=300)
    caps = _drive(cur, [0.0] * 400)
    for t, cap in enumerate(caps):
        assert cap == 10 + math.floor(90 * min(1.0, t / 300))
    assert caps == sorted(caps) and caps[0] == 10 and caps[300] == 100 and caps[-1] == 100
    assert RampGap(50, 0, 0).state()["cap"] == 50  # zero-length ramp: the maximum at once


def _reference_gated(accs, max_gap, start, threshold, every, step, ema):
    """Independent restatement of the gate: EMA from 0, decide every ``every`` observations."""
    cap, est, caps = start, 0.0, []
    for i, a in enumerate(accs, start=1):
        caps.append(cap)
        est = ema * est + (1 - ema) * a
        if i % every == 0 and est >= threshold:
            cap = min(max_gap, cap + step)
    return caps


def test_gated_never_retreats_and_advances_only_above_threshold():
    rng = random.Random(0)
    for trial in range(50):
        accs = [min(1.0, max(0.0, rng.gauss(rng.uniform(0.3, 0.9), 0.2))) for _ in range(600)]
        cur = GatedGap(
            max_gap=40,
            start=rng.randrange(5),
            threshold=0.6,
            every=rng.choice([1, 10, 25]),
            step=rng.choice([1, 3]),
            ema=rng.choice([0.0, 0.9]),
        )
        caps, ests = [], []
        for i, a in enumerate(accs):
            caps.append(cur.state()["cap"])
            cur.observe(i, a)
            ests.append(cur.estimate)
        caps.append(cur.state()["cap"])
        assert caps == _reference_gated(accs, 40, caps[0], 0.6, cur.every, cur.step, cur.ema) + caps[-1:]
        for i in range(len(accs)):
            assert caps[i + 1] >= caps[i]  # never retreats
            if caps[i + 1] > caps[i]:  # advanced only where the estimate was >= threshold
                assert ests[i] >= 0.6
        assert max(caps) <= 40


def test_gated_holds_below_threshold_and_climbs_above():
    below = GatedGap(max_gap=30, start=0, threshold=0.6, every=5, step=2)
    assert set(_drive(below, [0.599] * 500)) == {0}
    above = GatedGap(max_gap=30, start=0, threshold=0.6, every=5, step=2, ema=0.0)
    caps = _drive(above, [1.0] * 100)
    assert caps[5] == 2 and caps[10] == 4 and caps[-1] == 30
    # A collapse after climbing stops the climb but never lowers the cap.
    held = _drive(above, [0.0] * 100, start=100)
    assert set(held) == {30}
    mid = GatedGap(max_gap=30, start=0, threshold=0.6, every=5, step=2)
    caps = _drive(mid, [1.0] * 40 + [0.0] * 200)
    assert caps[-1] == max(caps) and len(set(caps[60:])) == 1


@pytest.mark.parametrize(
    "make", [lambda: UniformGap(27), lambda: RampGap(60, 3, 200), lambda: GatedGap(60, 1, 0.6, 7, 4, 0.8)]
)
def test_state_survives_checkpoint_round_trip(make):
    rng = random.Random(1)
    accs = [rng.random() ** 0.3 for _ in range(400)]
    straight = make()
    caps_straight = _drive(straight, accs)

    first = make()
    caps = _drive(first, accs[:150])
    buf = io.BytesIO()
    torch.save({"curriculum": first.state_dict()}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)["curriculum"]
    via_json = json.loads(json.dumps(loaded))
    resumed = make()
    resumed.load_state_dict(via_json)
    assert resumed.state_dict() == first.state_dict()
    caps += _drive(resumed, accs[150:], start=150)
    assert caps == caps_straight
    assert resumed.metrics() == straight.metrics()


def test_load_rejects_another_kind():
    with pytest.raises(ValueError, match="curriculum state is for 'ramp'"):
        GatedGap(10, 0).load_state_dict(RampGap(10, 0, 5).state_dict())
    with pytest.raises(ValueError):
        RampGap(10, 0, 5).load_state_dict(RampGap(11, 0, 5).state_dict())


def test_training_loop_protocol_with_a_gap_task():
    """The loop's sequence (state -> batch -> observe) keeps every batch's gap within the cap."""
    task = tasks.build("haystack", L=96, curriculum="gated", gate_every=3, gate_ema=0.0)
    cur = task.curriculum(100)
    gen = tasks.train_generator(0)
    for step in range(60):
        state = cur.state()
        x, _ = task.train_batch(2, gen, state)
        pads = int((x[0] == task.pad_token).int().cumprod(0).sum())
        gap = (96 - 8 - 2 - pads) // 2
        assert 0 <= gap <= state["cap"]
        cur.observe(step, 1.0)
    assert cur.metrics()["curriculum_cap"] == min(task.max_gap, 20 * cur.step)


@pytest.mark.parametrize("make", [lambda: RampGap(60, 3, 200), lambda: GatedGap(60, 1, 0.6, 7, 4, 0.8)])
def test_step_numbering_base_does_not_matter(make):
    """The machines count observations: a loop numbering steps from 1 sees the same caps."""
    rng = random.Random(2)
    accs = [rng.random() ** 0.3 for _ in range(300)]
    assert _drive(make(), accs, start=0) == _drive(make(), accs, start=1)
