"""Seed packs: a pack of N equals N lone trials (fp32 tolerance on CPU), members keep their
own status and checkpoints, and a diverging member does not stop the others."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY_TRIAL
from orchestrator.train import Trainer
from orchestrator.train.pack import PackTrainer, pack_signature

BASE = {**TINY_TRIAL, "rebinding": True}


_LONE: dict[tuple, list] = {}


def _lone(params):
    """The trace of a lone trial, trained once per module (a seed's lone run is the reference
    of several tests; traces are deterministic, test_train_loop checks it)."""
    key = tuple(sorted(params.items()))
    if key not in _LONE:
        _LONE[key] = [(p.step, p.acc, p.loss, p.train_loss, p.metrics["rebind_acc"]) for p in Trainer(params).run()]
    return _LONE[key]


def _packed(members):
    pt = PackTrainer(members)
    traces = [[] for _ in members]
    for group in pt.run():
        for j, p in group:
            traces[j].append((p.step, p.acc, p.loss, p.train_loss, p.metrics["rebind_acc"]))
    return pt, traces


def _close(a, b, tol=2e-4):
    assert [r[0] for r in a] == [r[0] for r in b]
    for ra, rb in zip(a, b):
        for x, y in zip(ra[1:], rb[1:]):
            assert x == pytest.approx(y, abs=tol), (ra, rb)


@pytest.mark.parametrize("arm", ["armed_gdn", "dg_rank", "mamba2_ref"])
def test_pack_of_three_equals_three_lone_trials(arm):
    members = [{**BASE, "arm": arm, "seed": s} for s in (0, 1, 2)]
    _, packed = _packed(members)
    for m, trace in zip(members, packed):
        _close(_lone(m), trace)
    # and the members really are different models
    assert packed[0] != packed[1]


def test_pack_with_grad_clip_and_cosine_and_data_seed():
    members = [{**BASE, "seed": s, "data_seed": 10 + s, "grad_clip": 0.05, "schedule": "cosine"} for s in (3, 4)]
    _, packed = _packed(members)
    for m, trace in zip(members, packed):
        _close(_lone(m), trace)


def test_member_checkpoint_is_a_lone_checkpoint(tmp_path):
    members = [{**BASE, "seed": s} for s in (0, 1)]
    pt = PackTrainer(members)
    it = pt.run()
    got = [next(it) for _ in range(2)]  # steps 1 and 10 for both members
    assert [[(j, p.step) for j, p in g] for g in got] == [[(0, 1), (1, 1)], [(0, 10), (1, 10)]]
    pt.sync_members()
    state = pt.members[1].state_dict()
    torch.save(state, tmp_path / "m1.pt")
    lone = Trainer(members[1])
    lone.load_state_dict(torch.load(tmp_path / "m1.pt", weights_only=False))
    rest = [(p.step, p.acc, p.loss, p.train_loss, p.metrics["rebind_acc"]) for p in lone.run()]
    full = _lone(members[1])
    _close(full[2:], rest)
    # A fresh pack resumed from both members' checkpoints continues like the lone runs.
    pt.sync_members()
    states = [m.state_dict() for m in pt.members]
    again = PackTrainer(members)
    again.load_member_states(states)
    cont = [[] for _ in members]
    for group in again.run():
        for j, p in group:
            cont[j].append((p.step, p.acc, p.loss, p.train_loss, p.metrics["rebind_acc"]))
    for m, c in zip(members, cont):
        _close(_lone(m)[2:], c)


def test_a_diverging_member_does_not_stop_the_others():
    members = [{**BASE, "seed": s} for s in (0, 1, 2)]
    pt = PackTrainer(members)
    it = pt.run()
    next(it)  # step 1 for every member
    with torch.no_grad():  # member 1's weights blow up, as a diverging run's do
        for p in pt.params.values():
            p[1].fill_(float("nan"))
    rest = [j for group in it for j, _ in group]
    assert pt.members[1].status == "diverged" and "non-finite" in pt.members[1].error
    assert set(rest) == {0, 2}
    for j in (0, 2):
        assert pt.members[j].status == "completed"
        _close(
            _lone(members[j]),
            [(p.step, p.acc, p.loss, p.train_loss, p.metrics["rebind_acc"]) for p in pt.members[j].trace],
        )


def test_only_seed_may_differ():
    with pytest.raises(ValueError, match="differ only in"):
        PackTrainer([BASE, {**BASE, "lr": 1e-2}])
    assert pack_signature({**BASE, "seed": 1}) == pack_signature({**BASE, "seed": 2})
