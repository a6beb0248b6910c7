"""The terminal view: steps-based ETA, the running-trials board from runner events and from
the database (`status --watch`), and submit printing the `orchestrator ui` command."""

from __future__ import annotations

import pytest

from orchestrator.cli import main
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine
from orchestrator.ui.live import TrialBoard, board_from_db, eta_seconds, fmt_eta

from ui_support import running_trials


def test_eta_is_steps_left_over_the_rate_so_far():
    # 100 of 400 steps in 10 s: 10 steps/s, 300 left -> 30 s.
    assert eta_seconds(100, 400, 10.0) == pytest.approx(30.0)
    assert eta_seconds(0, 400, 10.0) is None
    assert eta_seconds(400, 400, 10.0) == 0.0
    assert fmt_eta(3725.4) == "1:02:05" and fmt_eta(None) == "-:--:--"


def test_board_counts_steps_of_running_and_finished_trials():
    b = TrialBoard(total_steps=300)
    b.start("k1", {"arm": "a", "seed": 0, "steps": 100})
    b.start("k2", {"arm": "b", "seed": 1, "steps": 200})
    b.result("k1", 40, 0.3)
    b.result("k2", 20, 0.1)
    b.result("k1", 30, 0.2)  # an older step arriving late changes nothing
    assert b.done_steps == 60 and b.running["k1"].acc == 0.3
    b.finish("k1")
    assert b.done_steps == 120 and list(b.running) == ["k2"]
    assert b.eta() is not None  # moves before any trial of the sweep is complete


def test_board_and_watch_from_the_database(db_url, capsys):
    engine, _ = open_store_engine(db_url)
    ps = [{"arm": a, "seed": 0, "lr": 1e-3, "steps": 100, "eval_every": 10} for a in "ab"]
    with engine.begin() as conn:
        keyed, ids = running_trials(conn, "w", "name: w\n", ps)
        repo.upsert_evals(
            conn,
            [{"trial_id": ids[keyed[0][0]], "step": s, "acc": 0.9} for s in (1, 50, 100)]
            + [{"trial_id": ids[keyed[1][0]], "step": s, "acc": 0.25} for s in (1, 40)],
        )
        repo.finish_trial(conn, ids[keyed[0][0]], "completed")
    board, st = board_from_db(engine, "w")
    assert board.total_steps == 200 and board.done_steps == 100 + 40
    (run,) = board.running.values()
    assert run.step == 40 and run.acc == 0.25 and run.label.startswith(keyed[1][0][:8])
    assert st["counts"]["running"] == 1
    with engine.begin() as conn:
        repo.upsert_evals(conn, [{"trial_id": ids[keyed[1][0]], "step": 100, "acc": 0.5}])
        repo.finish_trial(conn, ids[keyed[1][0]], "completed")
    engine.dispose()
    # Nothing left to run: --watch draws once and returns, then prints the usual summary.
    assert main(["status", "w", "--watch", "--db", db_url]) == 0
    text = capsys.readouterr().out
    assert "200/200 steps" in text and "w: 2 trials: completed 2" in text
    assert main(["status", "--watch", "--db", db_url]) == 2


@pytest.mark.slow
def test_submit_prints_the_ui_command(tmp_path, capsys, shared_ray):
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "name: tiny\nfixed: {arm: gated_deltanet, task: mqar, task.K: 8, task.eval_size: 32, d_model: 8,"
        " n_layers: 1, batch_size: 8}\naxes: {seed: 0..1}\n"
        "budget: {steps: 20, eval_every: 10}\nresources: {cpu: 1}\n"
    )
    db = tmp_path / "t.db"
    assert main(["submit", str(spec), "--db", str(db), "--checkpoint-dir", str(tmp_path / "ck")]) == 0
    err = capsys.readouterr().err
    assert f"watch it live: orchestrator ui --db {db}" in err
    assert "40/40 steps" in err
    # --quiet: no bar, no notes, and still the one outcome line on stdout.
    assert main(["resume", "tiny", "--db", str(db), "--checkpoint-dir", str(tmp_path / "ck"), "-q"]) == 0
    got = capsys.readouterr()
    assert got.err == ""
    assert (
        got.out.startswith(
            "sweep tiny: nothing ran (the sweep: 2 completed; 2 trials); query it with `orchestrator sql"
        )
        and got.out.count("\n") == 1
    )


def test_shell_completion(monkeypatch, capsys):
    # What the shell runs on TAB once `orchestrator --install-completion` has put the hook in place.
    monkeypatch.setenv("_ORCHESTRATOR_COMPLETE", "complete_bash")
    monkeypatch.setenv("COMP_WORDS", "orchestrator submit --max")
    monkeypatch.setenv("COMP_CWORD", "2")
    assert main([]) == 0
    assert capsys.readouterr().out.split() == ["--max-concurrent", "--max-trials"]
    monkeypatch.delenv("_ORCHESTRATOR_COMPLETE")
    assert main(["--help"]) == 0
    assert "--install-completion" in capsys.readouterr().out
