"""Checkpoint retention (issue 34 item 3): a checkpoint without the trace, ``keep_checkpoints:
final | none``, ``orchestrator db prune`` and the stored size ``status`` prints.

- The checkpoint holds model, optimizer, RNG and loop state, not the trace: its size does not
  grow with the evals. A trial resumes from it with the stored eval rows up to its step, read
  by the real Loader from a real database in the same transaction (rows a lost attempt wrote
  past the step are left out, as the attempt that resumes deletes them), and continues as an
  uninterrupted run; a checkpoint of the old form (version 1, trace inside) still resumes.
- Real sweeps on Ray, SQLite and PostgreSQL: ``none`` leaves no checkpoint and every eval;
  ``final`` one per trial, which a longer budget continues from its final step, with the evals
  of an uninterrupted run of the longer budget (the ``none`` sweep extended: it has nothing to
  continue from and retrains from step 0); ``prune`` frees a finished sweep and refuses one
  with trials to run.
"""

from __future__ import annotations

import math

import pytest
import sqlalchemy as sa

from orchestrator.cli import main
from orchestrator.params import resolve
from orchestrator.runner import checkpoints
from orchestrator.runner.messages import EvalRow
from orchestrator.spec import SpecError, load
from orchestrator.status import Status
from orchestrator.store import attempts, claims, lease, repo, retention
from orchestrator.store.engine import open_store_engine
from orchestrator.train import Trainer
from orchestrator.train.loop import EvalPoint

from conftest import TINY_FIXED, query, sweep_evals

TINY = resolve(
    {
        "arm": "armed_gdn",
        "task": "mqar",
        "task.K": 8,
        "task.eval_size": 32,
        "d_model": 16,
        "n_layers": 1,
        "batch_size": 8,
        "rebinding": True,
        "seed": 0,
        "steps": 30,
        "eval_every": 5,
    }
)


def _points(trainer: Trainer, n: int | None = None) -> list[EvalPoint]:
    it = trainer.run()
    return list(it) if n is None else [next(it) for _ in range(n)]


def _values(points) -> list[tuple]:
    return [(p.step, p.acc, p.loss, p.train_loss, p.step_lr, p.metrics) for p in points]


# ---- the checkpoint without the trace ---------------------------------------------------------


def test_the_checkpoint_size_does_not_grow_with_the_evals():
    sizes = {}
    for steps in (10, 200):
        tr = Trainer({**TINY, "rebinding": False, "steps": steps, "eval_every": 1}, device="cpu")
        assert len(_points(tr)) == steps
        state = tr.checkpoint()
        assert "trace" not in state and state["trace_len"] == steps
        sizes[steps] = len(checkpoints.serialize(state))
    # Same model and optimizer; only the step counters' digits differ.
    assert abs(sizes[200] - sizes[10]) < 300, sizes
    # What a version-1 checkpoint carried on top: the trace, growing with every eval.
    assert len(checkpoints.serialize(tr.state_dict())) - sizes[200] > 200 * 50


def _trial(url: str, params) -> tuple[sa.engine.Engine, int, int]:
    engine, _ = open_store_engine(url)
    sid = repo.ensure_sweep(engine, "ret", "name: ret\n", "h")
    with engine.begin() as conn:
        tid = repo.add_trials(conn, sid, [("k", params)])["k"]
    return engine, sid, tid


def _store(engine, tid: int, points, state: dict | None) -> None:
    """What the writer does: the rows, then the checkpoint covering them, in one transaction."""
    with engine.begin() as conn:
        repo.upsert_evals(conn, [EvalRow(tid, p).store_row() for p in points])
        if state is not None:
            attempts.save_checkpoints(
                conn, [attempts.StoredCheckpoint(tid, int(state["step"]), checkpoints.serialize(state))]
            )


def test_a_trial_resumes_from_its_stored_rows_as_if_never_stopped(db_url):
    full = _values(_points(Trainer(TINY, device="cpu")))
    engine, _, tid = _trial(db_url, TINY)
    tr = Trainer(TINY, device="cpu")
    first = _points(tr, 3)  # steps 1, 5, 10
    first[1].metrics["rebind_loss"] = math.inf  # a non-finite value comes back as it went in
    _store(engine, tid, first, tr.checkpoint())
    # The attempt went on past its checkpoint and was lost: its row at 15 is no part of the trace.
    _store(engine, tid, _points(tr, 1), None)
    found = checkpoints.Loader(db_url, "ret", []).load(tid, "k")
    assert found is not None and found.origin == checkpoints.DATABASE and found.step == 10
    assert [p["step"] for p in found.trace] == [1, 5, 10]
    resumed = Trainer(TINY, device="cpu")
    resumed.load_state_dict(checkpoints.deserialize(found.state), found.trace)
    assert resumed.trace == first  # elapsed_s and the infinity included
    first[1].metrics["rebind_loss"] = full[1][5]["rebind_loss"]
    assert _values(first) + _values(_points(resumed)) == full
    engine.dispose()


def test_an_old_checkpoint_with_its_trace_still_resumes(db_url):
    """A database written before the change: its checkpoint is version 1, trace inside."""
    full = _values(_points(Trainer(TINY, device="cpu")))
    engine, _, tid = _trial(db_url, TINY)
    tr = Trainer(TINY, device="cpu")
    first = _points(tr, 2)
    old = {k: v for k, v in tr.state_dict().items() if k != "trace_len"}
    old["version"] = 1
    _store(engine, tid, first, old)
    found = checkpoints.Loader(db_url, "ret", []).load(tid, "k")
    assert found is not None and "trace" in checkpoints.deserialize(found.state)
    resumed = Trainer(TINY, device="cpu")
    resumed.load_state_dict(checkpoints.deserialize(found.state), found.trace)
    assert resumed.trace == first
    assert _values(first) + _values(_points(resumed)) == full
    engine.dispose()


def test_rows_that_are_not_the_checkpoints_trace_are_refused():
    tr = Trainer(TINY, device="cpu")
    first = _points(tr, 3)
    state = tr.checkpoint()
    with pytest.raises(ValueError, match="taken with 3 eval point"):
        Trainer(TINY, device="cpu").load_state_dict(state, [p.to_dict() for p in first[:2]])
    with pytest.raises(ValueError, match="taken with 3 eval point"):
        Trainer(TINY, device="cpu").load_state_dict(state)
    with pytest.raises(ValueError, match="checkpoint version 7"):
        Trainer(TINY, device="cpu").load_state_dict({**state, "version": 7}, first)


# ---- the spec key ------------------------------------------------------------------------------


def test_keep_checkpoints_defaults_to_final_and_refuses_anything_else(tmp_path, capsys):
    assert load("<s>", text=_spec("k")).spec.keep_checkpoints == "final"
    assert load("<s>", text=_spec("k", "none")).spec.keep_checkpoints == "none"
    with pytest.raises(SpecError, match=r"keep_checkpoints: Input should be 'final' or 'none', got 'all'"):
        load("<s>", text=_spec("k", "all"))
    path = tmp_path / "bad.yaml"
    path.write_text(_spec("k", "all"))
    assert main(["submit", str(path), "--db", str(tmp_path / "x.db"), "--dry-run"]) != 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "keep_checkpoints" in err[0]
    assert not (tmp_path / "x.db").exists()


# ---- stored size and prune (the store) ---------------------------------------------------------


def _statuses(engine, tids: dict[str, int], status: dict[str, str]) -> None:
    with engine.begin() as conn:
        for k, s in status.items():
            conn.execute(sa.text("UPDATE trials SET status = :s WHERE id = :i"), {"s": s, "i": tids[k]})


def test_prune_refuses_an_unfinished_sweep_and_frees_a_finished_one(db_url, capsys):
    engine, _ = open_store_engine(db_url)
    sid = repo.ensure_sweep(engine, "pr", "name: pr\n", "h")
    keys = ["a", "b", "c", "d"]
    with engine.begin() as conn:
        tids = repo.add_trials(conn, sid, [(k, {**TINY, "seed": i}) for i, k in enumerate(keys)])
        for i, k in enumerate(keys):
            repo.upsert_evals(conn, [{"trial_id": tids[k], "step": s, "acc": 0.5, "loss": 1.0} for s in (1, 5)])
            blob = bytes(1000 * (i + 1))
            attempts.save_checkpoints(conn, [attempts.StoredCheckpoint(tids[k], 5, blob)])
    with engine.connect() as conn:
        size = retention.stored_size(conn, sid)
    assert size == {
        "eval_rows": 8,
        "eval_bytes": 8 * retention.ROW_FIXED_BYTES,
        "checkpoints": 4,
        "checkpoint_bytes": 10_000,
    }
    assert retention.size_line(size) == "stored: 8 eval rows (0.00 MB), 4 checkpoints (0.01 MB)"

    def ckpts() -> list[int]:
        return sorted(r[0] for r in query(db_url, "SELECT nbytes FROM trial_checkpoints"))

    for waiting in ("pending", "running"):
        _statuses(engine, tids, {"a": "completed", "b": "diverged", "c": "failed", "d": waiting})
        capsys.readouterr()
        assert main(["db", "prune", "pr", "--db", db_url]) != 0
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and f"1 {waiting} trial(s)" in err[0] and "nothing pruned" in err[0], err
        assert ckpts() == [1000, 2000, 3000, 4000]
    # Every trial ended, but a live driver holds the sweep: refused too.
    _statuses(engine, tids, {"d": "interrupted"})
    with engine.begin() as conn:
        claims.register(conn, sid, lease.new_owner(), command="join")
    assert main(["db", "prune", "pr", "--db", db_url]) != 0
    assert "is being run by" in capsys.readouterr().err and ckpts() == [1000, 2000, 3000, 4000]
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM drivers"))

    assert main(["db", "prune", "pr", "--db", db_url, "--dry-run"]) == 0
    assert "pr: would free 2 checkpoint(s), 0.00 MB (3,000 bytes)" in capsys.readouterr().out
    assert ckpts() == [1000, 2000, 3000, 4000]
    assert main(["db", "prune", "pr", "--db", db_url]) == 0
    assert "pr: freed 2 checkpoint(s), 0.00 MB (3,000 bytes)" in capsys.readouterr().out
    # The failed and the interrupted trial keep theirs: a resume continues from them.
    assert ckpts() == [3000, 4000]
    assert len(query(db_url, "SELECT 1 FROM evals")) == 8
    assert main(["db", "prune", "nosuch", "--db", db_url]) != 0
    engine.dispose()


def test_vacuum_shrinks_a_sqlite_file(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'v.db'}"
    engine, _ = open_store_engine(url)
    sid = repo.ensure_sweep(engine, "v", "name: v\n", "h")
    with engine.begin() as conn:
        tid = repo.add_trials(conn, sid, [("k", TINY)])["k"]
        attempts.save_checkpoints(conn, [attempts.StoredCheckpoint(tid, 5, bytes(2_000_000))])
        repo.finish_trial(conn, tid, Status.completed.value, None)
    engine.dispose()
    before = (tmp_path / "v.db").stat().st_size
    assert main(["db", "prune", "v", "--db", url, "--vacuum"]) == 0
    out = capsys.readouterr().out
    assert "freed 1 checkpoint(s), 2.00 MB" in out and "VACUUM: the database file shrank by" in out
    assert (tmp_path / "v.db").stat().st_size < before - 1_900_000


# ---- real sweeps --------------------------------------------------------------------------------


def _spec(name: str, keep: str | None = None, steps: int = 40) -> str:
    return (
        f"name: {name}\n" + TINY_FIXED + "  arm: gated_deltanet\n  checkpoint_every_s: 0\n"
        "axes:\n  seed: 0..1\n"
        f"budget: {{steps: {steps}, eval_every: 10}}\nresources: {{cpu: 1}}\nmax_concurrent: 2\n"
        + (f"keep_checkpoints: {keep}\n" if keep else "")
    )


def _submit(tmp_path, url: str, text: str, *extra: str) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    assert main(["submit", str(spec), "--db", url, "--quiet", *extra]) == 0


def _ckpt_rows(url: str) -> list[tuple]:
    return sorted(
        tuple(r) for r in query(url, "SELECT t.key, c.step FROM trial_checkpoints c JOIN trials t ON t.id = c.trial_id")
    )


def _rows_with_elapsed(url: str) -> list[tuple]:
    q = "SELECT t.key, e.step, e.acc, e.loss, e.train_loss, e.elapsed_s FROM evals e JOIN trials t ON t.id = e.trial_id"
    return sorted(tuple(r) for r in query(url, q))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_none_keeps_no_checkpoint_final_keeps_one_and_extends_exactly(tmp_path, backend, capsys, shared_ray):
    from conftest import backend_url

    urls, drops = [], []
    for name in ("none", "final"):
        (tmp_path / name).mkdir()
        url, drop = backend_url(tmp_path / name, backend)
        urls.append(url)
        drops.append(drop)
    none_url, final_url = urls
    try:
        _submit(tmp_path, none_url, _spec("r", "none"))
        _submit(tmp_path, final_url, _spec("r"))
        assert _ckpt_rows(none_url) == []
        short = sweep_evals(none_url)
        assert len(short) == 2 * 5 and short == sweep_evals(final_url)  # every eval kept
        keys = sorted({r[0] for r in short})
        assert _ckpt_rows(final_url) == [(k, 40) for k in keys]
        capsys.readouterr()
        assert main(["status", "r", "--db", final_url]) == 0
        line = [ln.strip() for ln in capsys.readouterr().out.splitlines() if "stored:" in ln]
        mb = sum(r[0] for r in query(final_url, "SELECT nbytes FROM trial_checkpoints")) / 1e6
        assert line and line[0].startswith("stored: 10 eval rows (") and f"2 checkpoints ({mb:.2f} MB)" in line[0]

        # A longer budget: final continues from step 40; none has nothing and starts again.
        kept = _rows_with_elapsed(final_url)
        # (--allow-code-change: the working tree may change between the runs of a test.)
        _submit(tmp_path, final_url, _spec("r", steps=80), "--amend", "--allow-code-change")
        _submit(tmp_path, none_url, _spec("r", "none", steps=80), "--amend", "--allow-code-change")
        starts = (
            "SELECT t.key, a.from_step FROM trial_attempts a JOIN trials t ON t.id = a.trial_id WHERE a.attempt = 2"
        )
        assert sorted(tuple(r) for r in query(final_url, starts)) == [(k, 40) for k in keys]
        assert sorted(tuple(r) for r in query(none_url, starts)) == [(k, None) for k in keys]
        assert [r for r in _rows_with_elapsed(final_url) if r[1] <= 40] == kept  # not trained again
        longer = sweep_evals(final_url)
        assert [r[1] for r in longer[:9]] == [1, 10, 20, 30, 40, 50, 60, 70, 80]
        assert longer == sweep_evals(none_url)  # = an uninterrupted 80-step run
        assert _ckpt_rows(final_url) == [(k, 80) for k in keys] and _ckpt_rows(none_url) == []

        # Finished: prune frees the final checkpoints; a later extension retrains from step 0.
        capsys.readouterr()
        assert main(["db", "prune", "r", "--db", final_url]) == 0
        assert "r: freed 2 checkpoint(s)" in capsys.readouterr().out
        assert _ckpt_rows(final_url) == []
    finally:
        for drop in drops:
            drop()
