"""The feed that hands a driver's Tune run its trials (runner/feed.py): after its share of
trials (``$ORCH_TRIALS_PER_TUNE_RUN``) a run claims no more, lets its trials end and ends, so
Tune's per-trial state lives no longer than one run; the next run takes the rest. The
unit test drives the feed as Tune does; the sweep runs five trials in three Tune runs on a
real Ray and stores each once."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from conftest import TINY_FIXED
from orchestrator.runner.feed import TRIALS_PER_TUNE_RUN, UnitFeed, trials_per_tune_run

FINISHED = UnitFeed.FINISHED


def _feed(batches: list, max_trials: int | None) -> UnitFeed:
    it = iter(batches)
    return UnitFeed(
        lambda: next(it),
        lambda batch: [{"members": [{"trial_id": tid, "key": key}]} for tid, key, _ in batch],
        stopped=lambda: False,
        max_trials=max_trials,
    )


def test_a_run_claims_no_more_after_its_share_and_ends_once_its_trials_end():
    f = _feed([[(1, "a", {}), (2, "b", {})], [(3, "c", {}), (4, "d", {})], [(5, "e", {})]], max_trials=3)
    got = [f.suggest(f"t{i}") for i in range(4)]
    assert [g["unit"]["members"][0]["trial_id"] for g in got] == [1, 2, 3, 4]  # a batch is never split
    assert f.taken == [1, 2, 3, 4]
    assert f.suggest("t4") is None and not f.idle  # its share taken: wait for its trials
    for i in range(3):
        f.on_trial_complete(f"t{i}")
    assert f.suggest("t4") is None
    f.on_trial_complete("t3")
    assert f.suggest("t4") == FINISHED and f.idle  # ended as idle: the caller starts the next run
    assert f.taken == [1, 2, 3, 4]  # batch 3 was not claimed by this run
    # Without a cap the same batches run in one Tune run.
    g = _feed([[(1, "a", {}), (2, "b", {})], [(3, "c", {})], None], max_trials=None)
    assert [g.suggest(f"t{i}")["unit"]["members"][0]["trial_id"] for i in range(3)] == [1, 2, 3]
    assert g.suggest("t3") == FINISHED and not g.idle


def test_the_share_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("ORCH_TRIALS_PER_TUNE_RUN", raising=False)
    assert trials_per_tune_run() == TRIALS_PER_TUNE_RUN
    monkeypatch.setenv("ORCH_TRIALS_PER_TUNE_RUN", "7")
    assert trials_per_tune_run() == 7
    for bad in ("0", "-3", "many", ""):
        monkeypatch.setenv("ORCH_TRIALS_PER_TUNE_RUN", bad)
        assert trials_per_tune_run() == (1 if bad == "0" else TRIALS_PER_TUNE_RUN)


SPEC = (
    "\nname: rotate\n"
    + TINY_FIXED
    + """  arm: gated_deltanet
axes:
  seed: 0..4
budget: {steps: 20, eval_every: 10}
resources: {cpu: 1}
max_concurrent: 2
"""
)


def _tune_trials_alive() -> int:
    import gc

    from ray.tune.experiment import Trial

    return sum(1 for o in gc.get_objects() if isinstance(o, Trial))


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")
def test_a_sweep_longer_than_a_runs_share_runs_in_several_tune_runs_each_trial_once(tmp_path, monkeypatch):
    from orchestrator.runner.sweep import RunOptions, submit
    from orchestrator.spec import load
    from orchestrator.store.engine import make_engine

    monkeypatch.setenv("ORCH_TRIALS_PER_TUNE_RUN", "2")
    db = f"sqlite:///{tmp_path / 'rot.db'}"
    tune_trials_before = _tune_trials_alive()
    run = submit(load(text=SPEC), RunOptions(db=db))
    assert run.tune_runs == 3  # 2 + 2 + 1 trials
    assert run.ran == 5 and run.outcomes == {"completed": 5}
    # Nothing of an ended run stays in the driver (what bounds its memory in a long sweep):
    # not Tune's trials, which its run's reference cycles held until a full collection,
    # and no key per trial in Ray's process-wide log-once set.
    assert _tune_trials_alive() <= tune_trials_before
    from ray.util import debug

    assert not [k for k in debug._logged if k.startswith("tune_func_encode:")]
    engine = make_engine(db)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT status, COUNT(*) FROM trials GROUP BY status")).all() == [
                ("completed", 5)
            ]
            per_trial = conn.execute(sa.text("SELECT trial_id, COUNT(*) FROM evals GROUP BY trial_id")).all()
            attempts = conn.execute(sa.text("SELECT COUNT(*) FROM attempts")).scalar_one()
    finally:
        engine.dispose()
    assert len(per_trial) == 5 and {n for _, n in per_trial} == {3}  # steps 1, 10, 20: none twice
    assert attempts == 5
