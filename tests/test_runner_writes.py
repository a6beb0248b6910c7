"""Every write the runner makes goes through the driver session's one write path
(``DriverSession.write``: store.outage's retries through an outage, and the StorePin check
that a database deleted or replaced under the driver is never written again)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import orchestrator.runner
from orchestrator.runner.lifecycle import DriverSession
from orchestrator.runner.sequential import drive
from orchestrator.spec import load
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine
from orchestrator.store.outage import DatabaseGone
from orchestrator.store.sweep_store import SweepStore

SPEC = """
name: seqgone
fixed: {task: mqar, d_model: 16, n_layers: 1, steps: 20, eval_every: 10}
axes: {arm: [armed_gdn, gated_deltanet], seed: 0..7}
sequential:
  compare: {by: arm, groups: [armed_gdn, gated_deltanet]}
  test: fisher
  looks: [4, 8]
  alpha: 0.05
analysis: {lockin: 0.9}
"""


def test_a_look_is_never_recorded_in_a_deleted_database(tmp_path):
    """The sequential driver's look records and skips go through the session: the file
    deleted while a look's trials ran stops the driver at the look's record, with the one
    line, instead of writing the decision into the unlinked file."""
    db = tmp_path / "seq.db"
    sweep = load(text=SPEC)
    assert sweep.sequential is not None
    engine, _ = open_store_engine(str(db))
    sid = repo.ensure_sweep(engine, sweep.name, sweep.text, sweep.hash)
    looks: list[int] = []
    # A long lease: the renewal thread stays asleep, so the look's write is what finds it.
    session = DriverSession(SweepStore(engine), sid, sweep.name, handle_signals=False, ttl=600)

    def run(batch):
        def finish(conn) -> None:
            for tid, _, params in batch:
                acc = 0.99 if params["arm"] == "armed_gdn" else 0.1
                repo.upsert_evals(conn, [{"trial_id": tid, "step": s, "acc": a} for s, a in ((1, 0.0), (20, acc))])
                repo.finish_trial(conn, tid, "completed")

        session.write(finish)
        db.unlink()
        return {tid: "completed" for tid, _, _ in batch}

    with pytest.raises(DatabaseGone, match=r"seq\.db was deleted while the sweep ran"):
        with session:
            session.write(lambda conn: repo.add_trials(conn, sid, sweep.trials))
            drive(
                sweep.sequential,
                sweep.axes,
                sweep.analysis,
                sid,
                SweepStore(engine),
                run,
                looks.append,
                write=session.write,
            )
    assert looks == []  # no decision was taken as recorded
    assert session.fatal is not None and session.stop_reason == "database gone"
    with pytest.raises(DatabaseGone):
        session.write(lambda conn: None)  # and nothing is written again
    assert not db.exists()
    engine.dispose()


def test_the_runner_opens_no_transaction_of_its_own():
    """``engine.begin()`` nowhere in orchestrator/runner: writes take DriverSession.write."""
    found = []
    for path in sorted(Path(orchestrator.runner.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "begin":
                found.append(f"{path.name}:{node.lineno}")
    assert found == []
