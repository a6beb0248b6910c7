"""Identity vs budget: a trial's key covers what decides its trajectory, not how far it runs,
how it is executed or how it is labelled (orchestrator/keys.py).

Checked with the parts themselves: the key rule, a spec that lists one trial twice, the
training loop continued from a checkpoint at a larger budget against an uninterrupted run,
re-submitted sweeps through a real Ray runtime (extend, shrink refused, tags in place), and
migration 0005_identity on a database written by the previous key rule, on SQLite and
PostgreSQL, down to the checkpoint files it renames."""

from __future__ import annotations

import hashlib
import json

import pytest
import sqlalchemy as sa

from orchestrator.cli import main
from orchestrator.keys import budget_shapes_trajectory, canonical_json, identity, trial_key
from orchestrator.params import resolve
from orchestrator.spec import SpecError, load
from orchestrator.store.engine import make_engine
from orchestrator.store.import_jsonl import IMPORTED_PREFIX

from conftest import old_database, query, rows_of, two_arm_spec, upgrade_keeps_rows

BASE = resolve({"arm": "gated_deltanet", "task": "mqar", "task.K": 8, "seed": 0, "steps": 200, "eval_every": 20})


def _old_key(params) -> str:
    """The key rule before 0005_identity: every resolved parameter."""
    return hashlib.sha256(canonical_json(params).encode()).hexdigest()[:16]


# ---- the rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [{"steps": 400}, {"eval_every": 7}, {"threads": 2}, {"checkpoint_every_s": 0.0}, {"tag.group": "b"}],
)
def test_budget_execution_and_tags_leave_the_key(change):
    assert trial_key({**BASE, **change}) == trial_key(BASE)


@pytest.mark.parametrize("change", [{"lr": 3e-3}, {"seed": 1}, {"task.K": 16}, {"device": "cpu"}, {"fp32": True}])
def test_what_trains_changes_the_key(change):
    assert trial_key({**BASE, **change}) != trial_key(BASE)


@pytest.mark.parametrize(
    "shape, fixed",
    [
        ({"schedule": "cosine"}, {"schedule": "cosine", "cosine_steps": 300}),
        ({"anneal": "time", "arm": "mlstm"}, None),
        (
            {"task": "haystack", "task.curriculum": "ramp"},
            {"task": "haystack", "task.curriculum": "ramp", "task.ramp_steps": 50},
        ),
    ],
)
def test_steps_stay_in_the_key_where_the_budget_shapes_the_past(shape, fixed):
    shaped = {**BASE, **shape}
    assert budget_shapes_trajectory(shaped) is not None
    assert trial_key({**shaped, "steps": 400}) != trial_key(shaped)
    assert "steps" in identity(shaped)
    if fixed is not None:  # an explicit period makes the budget free again
        free = {**BASE, **fixed}
        assert budget_shapes_trajectory(free) is None
        assert trial_key({**free, "steps": 400}) == trial_key(free)


def test_a_spec_listing_one_trial_twice_is_refused():
    text = (
        "name: twice\nfixed: {arm: gated_deltanet, task: mqar, task.K: 8, seed: 0}\n"
        "axes:\n  tag.group: [a, b]\nbudget: {steps: 20, eval_every: 10}\n"
    )
    with pytest.raises(SpecError) as err:
        load("<twice>", text=text)
    msg = str(err.value)
    assert "\n" not in msg and "tag.group" in msg and "one trial" in msg
    # Identical duplicates (e.g. from two blocks) are still one trial, silently.
    text = (
        "name: dup\nfixed: {arm: gated_deltanet, task: mqar, task.K: 8}\nbudget: {steps: 20, eval_every: 10}\n"
        "blocks:\n  - axes: {seed: [0, 1]}\n  - axes: {seed: [1, 2]}\n"
    )
    assert len(load("<dup>", text=text).trials) == 3


# ---- the training loop ------------------------------------------------------------------------


def test_trainer_continues_a_completed_checkpoint_to_a_larger_budget():
    """Train 30 steps, then continue the checkpoint to 60 (evaluating every 10 instead of 15):
    the model's trajectory is that of an uninterrupted 60-step run evaluated every 10 steps —
    every common eval point equal in loss, accuracy and step LR exactly."""
    from orchestrator.train import Trainer

    cfg = {
        "arm": "gated_deltanet",
        "task": "mqar",
        "task.K": 4,
        "task.eval_size": 32,
        "d_model": 16,
        "n_layers": 1,
        "batch_size": 8,
        "seed": 3,
        "device": "cpu",
    }
    short = Trainer({**cfg, "steps": 30, "eval_every": 15})
    first = list(short.run())
    assert short.status.value == "completed" and [p.step for p in first] == [1, 15, 30]
    state = short.state_dict()

    longer = Trainer({**cfg, "steps": 60, "eval_every": 10})
    longer.load_state_dict(state)
    assert longer.status.value == "running"
    more = list(longer.run())
    assert longer.status.value == "completed" and [p.step for p in more] == [40, 50, 60]
    assert [p.step for p in longer.trace] == [1, 15, 30, 40, 50, 60]
    assert longer.trace[:3] == short.trace  # the past is kept as it was

    straight = Trainer({**cfg, "steps": 60, "eval_every": 10})
    ref = {p.step: p for p in straight.run()}
    for p in longer.trace:
        if p.step in ref:
            assert (p.loss, p.acc, p.step_lr) == (ref[p.step].loss, ref[p.step].acc, ref[p.step].step_lr), p.step
    # The train-loss mean covers the steps since the previous eval: equal once cadences agree.
    assert [p.train_loss for p in more[1:]] == [ref[50].train_loss, ref[60].train_loss]

    with pytest.raises(ValueError, match="past this trial's budget"):
        Trainer({**cfg, "steps": 20, "eval_every": 10}).load_state_dict(state)
    with pytest.raises(ValueError, match="different trial config"):
        Trainer({**cfg, "steps": 60, "seed": 4}).load_state_dict(state)


# ---- re-submitted sweeps (real Ray) --------------------------------------------------------------

SMALL = (
    two_arm_spec("ident")
    .replace("arm: [gated_deltanet, armed_gdn]", "arm: [gated_deltanet]")
    .replace("seed: 0..2", "seed: 0..1")
    .replace("steps: 240", "steps: 40")
)


def _q(url: str, q: str) -> list[tuple]:
    return [tuple(r) for r in query(url, q)]


def _evals(url: str):
    return _q(
        url,
        "SELECT t.key, e.step, e.acc, e.loss, e.train_loss, e.step_lr, e.elapsed_s, e.metrics "
        "FROM evals e JOIN trials t ON t.id = e.trial_id ORDER BY t.key, e.step",
    )


def _trials(url: str):
    return _q(url, "SELECT key, status, steps, eval_every, attempts, params FROM trials ORDER BY key")


def _one_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.slow
def test_resubmit_extends_refuses_a_smaller_budget_and_retags_in_place(tmp_path, capsys, shared_ray):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SMALL)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    args = ["submit", str(spec), "--db", url, "--quiet", "--checkpoint-dir", str(tmp_path / "ck")]
    assert main(args) == 0
    before = _evals(url)
    assert {r[1] for r in before} == {1, 20, 40}
    trials0 = _trials(url)

    # A larger budget, evaluated more often: the same trials, asked for --amend first.
    longer = SMALL.replace("steps: 40, eval_every: 20", "steps: 80, eval_every: 10")
    spec.write_text(longer)
    capsys.readouterr()
    assert main(["submit", str(spec), "--db", url, "--dry-run"]) == 0  # says what submit would do
    assert "against the stored sweep: 0 trial(s) added, 0 superseded, 2 budget(s) extended" in capsys.readouterr().out
    assert main(args) == 2
    line = _one_line(capsys)
    assert "0 trial(s) added, 0 superseded, 2 budget(s) extended" in line and "steps: 40 -> 80" in line
    assert _evals(url) == before and _trials(url) == trials0

    assert main(args + ["--amend"]) == 0
    after = _evals(url)
    keys = sorted({r[0] for r in before})
    assert sorted({r[0] for r in after}) == keys  # no new trials
    # Every row of the first 40 steps byte-identical, elapsed_s included: the trials
    # continued from their checkpoints, they did not train again.
    assert [r for r in after if r[1] <= 40] == before
    assert {r[1] for r in after} == {1, 20, 40, 50, 60, 70, 80}
    trials1 = _trials(url)
    assert [(k, s, n, e, a) for k, s, n, e, a, _ in trials1] == [(k, "completed", 80, 10, 2) for k in keys]

    # Against an uninterrupted 80-step run of the same trials: every common eval point equal.
    ref_spec = tmp_path / "ref.yaml"
    ref_spec.write_text(longer)
    ref = f"sqlite:///{tmp_path / 'ref.db'}"
    assert main(["submit", str(ref_spec), "--db", ref, "--quiet", "--checkpoint-dir", str(tmp_path / "ck2")]) == 0
    straight = {(r[0], r[1]): r for r in _evals(ref)}
    assert sorted({k for k, _ in straight}) == keys
    for r in after:
        s = straight.get((r[0], r[1]))
        if s is not None:
            assert (r[2], r[3], r[5], r[7]) == (s[2], s[3], s[5], s[7]), r[:2]
            if r[1] > 40:
                assert r[4] == s[4], r[:2]  # train-loss mean over the same steps

    # A smaller budget than the trials have run: one line, exit 2, nothing changes, --amend or not.
    spec.write_text(SMALL.replace("steps: 40, eval_every: 20", "steps: 60, eval_every: 20"))
    for extra in ([], ["--amend"]):
        capsys.readouterr()
        assert main(args + extra) == 2
        line = _one_line(capsys)
        assert "steps 60 is below the 80 step(s)" in line and "can only grow" in line
        assert _evals(url) == after and _trials(url) == trials1

    # New tags: the same trials, relabelled in place; nothing trains again.
    spec.write_text(longer.replace("  batch_size: 16\n", "  batch_size: 16\n  tag.group: g1\n"))
    capsys.readouterr()
    assert main(args) == 2
    assert "2 trial(s) with new settings or tags" in _one_line(capsys)
    assert main(args + ["--amend"]) == 0
    assert _evals(url) == after
    trials2 = _trials(url)
    assert [t[:5] for t in trials2] == [t[:5] for t in trials1]
    assert all(json.loads(t[5])["tag.group"] == "g1" for t in trials2)
    assert _q(url, "SELECT COUNT(*), MIN(value_text) FROM trial_params WHERE name = 'tag.group'") == [(2, "g1")]
    assert len(_q(url, "SELECT version FROM sweep_specs")) == 3


# ---- migration 0005_identity ---------------------------------------------------------------------


def _downgrade(url: str, rev: str) -> None:
    from alembic import command

    from orchestrator.store.engine import _alembic_config

    eng = make_engine(url)
    with eng.begin() as conn:
        command.downgrade(_alembic_config(conn), rev)
    eng.dispose()


def test_identity_migration_rekeys_old_trials_and_keeps_data(db_url):
    """A database written by the previous key rule (0004): trials keyed by it get the new
    key (recorded in key_renames), one trial submitted at two budgets keeps the newer
    copy's key while the other becomes superseded under its old key, a trial keyed by hand
    is left alone, and every eval and parameter row survives; downgrading restores the old
    keys."""
    p40 = {**BASE, "steps": 40}
    p20 = {**BASE, "steps": 20}
    p1 = {**BASE, "seed": 1, "steps": 40}
    rows = [
        (_old_key(p40), p40, "completed", 2),
        (_old_key(p20), p20, "completed", 1),
        (_old_key(p1), p1, "pending", 2),
    ]
    rows.append(("by-hand", {**BASE, "seed": 9}, "completed", 1))
    eng = old_database(db_url, "0004_designs")
    with eng.begin() as conn:
        for i, (key, params, status, version) in enumerate(rows, start=1):
            conn.execute(
                sa.text(
                    "INSERT INTO trials (id, sweep_id, key, params, status, steps, spec_version) "
                    "VALUES (:i, 1, :k, :p, :s, :n, :v)"
                ),
                {"i": i, "k": key, "p": json.dumps(params), "s": status, "n": params["steps"], "v": version},
            )
            conn.execute(
                sa.text("INSERT INTO trial_params (trial_id, name, value_num) VALUES (:i, 'steps', :n)"),
                {"i": i, "n": params["steps"]},
            )
        conn.execute(
            sa.text(
                "INSERT INTO evals (trial_id, step, acc, step_lr) VALUES "
                "(1, 20, 0.5, 0.001), (1, 40, 0.75, 0.001), (2, 20, 0.25, 0.001), (4, 20, 0.125, 0.001)"
            )
        )
        # An imported sweep: its records stay keyed by every parameter.
        conn.execute(
            sa.text("INSERT INTO sweeps (name, spec_text, spec_hash) VALUES ('imp', :t, 'h')"),
            {"t": f"{IMPORTED_PREFIX}x.jsonl\n"},
        )
        conn.execute(
            sa.text("INSERT INTO trials (id, sweep_id, key, params, status) VALUES (5, 2, :k, :p, 'completed')"),
            {"k": _old_key(p40), "p": json.dumps(p40)},
        )

    queries = (
        "SELECT trial_id, step, acc, step_lr FROM evals ORDER BY trial_id, step",
        "SELECT trial_id, name, value_num FROM trial_params ORDER BY trial_id",
        "SELECT id, params, steps, spec_version FROM trials ORDER BY id",
    )
    before = upgrade_keeps_rows(eng, db_url, *queries)
    with eng.connect() as conn:
        got = conn.execute(sa.text("SELECT id, key, status FROM trials ORDER BY id")).all()
        renames = conn.execute(sa.text("SELECT old_key, new_key FROM key_renames ORDER BY old_key")).all()
    assert [tuple(r) for r in got] == [
        (1, trial_key(p40), "completed"),  # newer spec version: keeps the identity
        (2, _old_key(p20), "superseded"),  # the same trial at another budget
        (3, trial_key(p1), "pending"),
        (4, "by-hand", "completed"),
        (5, _old_key(p40), "completed"),
    ]
    assert sorted(tuple(r) for r in renames) == sorted([(_old_key(p40), trial_key(p40)), (_old_key(p1), trial_key(p1))])
    _downgrade(db_url, "0004_designs")
    with eng.connect() as conn:
        keys = conn.execute(sa.text("SELECT key FROM trials ORDER BY id")).scalars().all()
    assert keys == [r[0] for r in rows] + [_old_key(p40)]
    assert rows_of(eng, *queries) == before
    eng.dispose()


@pytest.mark.slow
def test_a_sweep_from_before_the_migration_extends_from_its_old_checkpoints(tmp_path, capsys, shared_ray):
    """A sweep run under the previous key rule (its trial keys and checkpoint file names the
    old ones), upgraded, then re-submitted with a larger budget: the runner finds each
    checkpoint under its old name and the trials continue from it (the first 40 steps' rows,
    elapsed_s included, unchanged)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SMALL)
    db = tmp_path / "a.db"
    url = f"sqlite:///{db}"
    ck = tmp_path / "ck"
    args = ["submit", str(spec), "--db", url, "--quiet", "--checkpoint-dir", str(ck)]
    assert main(args) == 0
    # Rewind to the world before 0005: schema at 0004, keys and checkpoint names by the old rule.
    _downgrade(url, "0004_designs")
    eng = make_engine(url)
    with eng.begin() as conn:
        for tid, key, params in conn.execute(sa.text("SELECT id, key, params FROM trials")).all():
            old = _old_key(json.loads(params))
            conn.execute(sa.text("UPDATE trials SET key = :k WHERE id = :i"), {"k": old, "i": tid})
            (ck / "ident" / f"{key}.pt").rename(ck / "ident" / f"{old}.pt")
    eng.dispose()
    before = _evals(url)
    assert main(["db", "upgrade", "--db", url]) == 0
    spec.write_text(SMALL.replace("steps: 40", "steps: 60"))
    assert main(args + ["--amend"]) == 0
    after = _evals(url)
    old_to_new = dict(_q(url, "SELECT old_key, new_key FROM key_renames"))
    assert len(old_to_new) == 2
    assert [r for r in after if r[1] <= 40] == sorted((old_to_new[r[0]], *r[1:]) for r in before)
    assert {r[1] for r in after} == {1, 20, 40, 60}
    assert sorted(p.name for p in (ck / "ident").glob("*.pt")) == sorted(f"{k}.pt" for k in old_to_new.values())
    assert {t[1:3] for t in _trials(url)} == {("completed", 60)}


@pytest.mark.slow
def test_seed_packs_extend_too(tmp_path, capsys, shared_ray):
    """Two seeds trained as one pack, extended from 40 to 60 steps with --amend: the pack
    resumes both members from their checkpoints (rows of the first 40 steps unchanged,
    elapsed_s included) and runs them to the new budget. On PostgreSQL where it is set up
    (the extension's SQL on the other backend; the SQLite path is the tests above)."""
    from conftest import POSTGRES_URL, make_pg_schema_url

    url, drop = make_pg_schema_url() if POSTGRES_URL else (f"sqlite:///{tmp_path / 'p.db'}", None)
    try:
        spec = tmp_path / "spec.yaml"
        spec.write_text(SMALL + "pack_seeds: 2\n")
        args = ["submit", str(spec), "--db", url, "--quiet", "--checkpoint-dir", str(tmp_path / "ck")]
        assert main(args) == 0
        before = _evals(url)
        spec.write_text(SMALL.replace("steps: 40", "steps: 60") + "pack_seeds: 2\n")
        assert main(args + ["--amend"]) == 0
        after = _evals(url)
        assert [r for r in after if r[1] <= 40] == before
        assert sorted({r[1] for r in after}) == [1, 20, 40, 60]
        assert {t[1:3] for t in _trials(url)} == {("completed", 60)}
    finally:
        if drop is not None:
            drop()
