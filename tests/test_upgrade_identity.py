"""A trial's identity survives an upgrade of the tool that adds a defaulted field.

A sweep is stored and its trials interrupted under the current code (a checkpoint at step 40
of 60 each); then a "release" adds a field with a default to ``TrialParams`` (a subclass put
where the product looks the model up, as an upgraded install would have it). Under it the
same spec names the same trials (0 added, 0 superseded, the stored keys unchanged), every
checkpoint is accepted, and the resumed traces equal an uninterrupted run's. A field set off
its default is another trial, and a checkpoint of another config is still refused. On SQLite
and PostgreSQL."""

from __future__ import annotations

import json
import os

import pytest
import torch
from pydantic import Field

import orchestrator.keys
import orchestrator.params
import orchestrator.train.loop
from orchestrator.keys import IDENTITY_V1, trial_key
from orchestrator.params import TrialParams
from orchestrator.spec import load
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine
from orchestrator.train.loop import Trainer

SPEC = """
name: upgrade
fixed: {arm: gated_deltanet, task: mqar, d_model: 16, n_layers: 1, steps: 60, eval_every: 20, batch_size: 8,
        task.K: 4, task.eval_size: 16}
axes: {lr: [0.001, 0.003], seed: [0, 1]}
"""


class Upgraded(TrialParams):
    """TrialParams as a later release might have it: one more field, with a default."""

    label_smoothing: float = Field(0.0, ge=0.0, le=1.0, description="added after identity schema 1")


@pytest.fixture
def upgraded(monkeypatch):
    def apply():
        for mod in (orchestrator.params, orchestrator.keys, orchestrator.train.loop):
            monkeypatch.setattr(mod, "TrialParams", Upgraded)

    return apply


def _trace(trainer: Trainer, upto: int | None = None) -> list[tuple[int, float, float]]:
    out = []
    for point in trainer.run():
        out.append((point.step, point.acc, point.loss))
        if upto is not None and point.step >= upto:
            break
    return out


def test_upgrade_keeps_keys_and_checkpoints(db_url, upgraded, tmp_path):
    assert "label_smoothing" not in IDENTITY_V1
    before = load(text=SPEC)
    engine, _ = open_store_engine(db_url)
    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, before.name, before.text, before.hash)
        repo.add_trials(conn, sid, before.trials)
    checkpoints, reference = {}, {}
    for key, params in before.trials:
        reference[key] = _trace(Trainer(params, device="cpu"))
        trainer = Trainer(params, device="cpu")
        head = _trace(trainer, upto=40)
        path = tmp_path / f"{key}.pt"
        torch.save(trainer.state_dict(), path)  # interrupted at step 40 under the old code
        checkpoints[key] = (path, head)

    upgraded()
    after = load(text=SPEC)
    assert all("label_smoothing" in p and p["label_smoothing"] == 0.0 for _, p in after.trials)
    assert [k for k, _ in after.trials] == [k for k, _ in before.trials]
    with engine.connect() as conn:
        diff = repo.design_diff(conn, sid, after.trials)
        stored = {t[1] for t in repo.sweep_trials(conn, sid)}
    assert diff.added == [] and diff.superseded == [] and diff.shrunk == []
    assert stored == {k for k, _ in after.trials}
    for key, params in after.trials:
        path, head = checkpoints[key]
        trainer = Trainer(params, device="cpu")
        trainer.load_state_dict(torch.load(path, weights_only=False))  # accepted: same trial
        assert trainer.step == 40
        rest = _trace(trainer)
        assert head + rest == reference[key], key

    # Off its default the new field makes another trial, and its checkpoint is refused.
    key, params = after.trials[0]
    other = {**params, "label_smoothing": 0.1}
    assert trial_key(other) != key
    with pytest.raises(ValueError, match="different trial config"):
        Trainer(other, device="cpu").load_state_dict(torch.load(checkpoints[key][0], weights_only=False))
    engine.dispose()


def test_identity_schema_1_is_frozen(upgraded):
    # Every field a key hashes whatever its value was there when the schema was frozen; a
    # field added since is hashed only off its default (the docstring of orchestrator.keys).
    assert IDENTITY_V1 <= set(TrialParams.model_fields)
    params = load(text=SPEC).trials[0][1]
    upgraded()
    assert trial_key(params) == trial_key({**params, "label_smoothing": 0.0})
    assert trial_key(params) != trial_key({**params, "seed": params["seed"] + 1})


# ---- through the product: an upgraded install continues a stored sweep -------------------------

SITECUSTOMIZE = """
# An upgraded install: TrialParams gains a defaulted field in every process of it (the driver,
# and the Ray workers that train, which inherit PYTHONPATH from the Ray this driver starts).
from pydantic import Field

import orchestrator.params as _p


class TrialParams(_p.TrialParams):
    label_smoothing: float = Field(0.0, ge=0.0, le=1.0)


_p.TrialParams = TrialParams
_p.TOP_LEVEL = tuple(TrialParams.model_fields)
"""


def _submit(spec, url: str, *extra: str, env=None, address: str | None = None):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "orchestrator.cli", "submit", str(spec), "--db", url, *extra]
    if address is not None:
        cmd += ["--address", address]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_an_upgraded_install_extends_every_trial_from_its_checkpoint(db_url, tmp_path):
    from conftest import query, shared_env, two_arm_spec

    small = (
        two_arm_spec("upgrade_e2e")
        .replace("arm: [gated_deltanet, armed_gdn]", "arm: [gated_deltanet]")
        .replace("seed: 0..2", "seed: 0..1")
        .replace("steps: 240", "steps: 40")
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(small)
    env = shared_env()
    from conftest import ensure_shared_ray

    old = _submit(spec, db_url, "--quiet", env=env, address=ensure_shared_ray())
    assert old.returncode == 0, old.stderr

    def evals():
        return [
            tuple(r)
            for r in query(
                db_url,
                "SELECT t.key, e.step, e.acc, e.loss, e.elapsed_s FROM evals e JOIN trials t ON t.id = e.trial_id "
                "ORDER BY t.key, e.step",
            )
        ]

    before = evals()
    keys = sorted({r[0] for r in before})
    assert len(keys) == 2 and {r[1] for r in before} == {1, 20, 40}

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    new_env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))}
    spec.write_text(small.replace("steps: 40", "steps: 60"))
    dry = _submit(spec, db_url, "--dry-run", env=new_env)
    assert dry.returncode == 0, dry.stderr
    assert "0 trial(s) added, 0 superseded, 2 budget(s) extended" in dry.stdout
    # The upgraded driver starts its own Ray, so the workers that train run the upgraded code;
    # an upgrade is a code change, and the user says so (it is recorded with the attempts).
    new = _submit(spec, db_url, "--quiet", "--amend", "--allow-code-change", env=new_env)
    assert new.returncode == 0, new.stderr
    after = evals()
    assert sorted({r[0] for r in after}) == keys  # the same trials
    # The first 40 steps' rows byte-identical, elapsed_s included: continued, not retrained.
    assert [r for r in after if r[1] <= 40] == before
    assert {r[1] for r in after} == {1, 20, 40, 60}
    starts = query(db_url, "SELECT t.key, a.from_step FROM attempts a JOIN trials t ON t.id = a.trial_id ORDER BY a.id")
    assert sorted(s for k, s in starts if s) == [40, 40]
    stored = query(db_url, "SELECT params FROM trials")
    assert all("label_smoothing" in (p if isinstance(p, dict) else json.loads(p)) for (p,) in stored)
