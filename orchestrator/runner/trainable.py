"""The Ray Tune function trainable: one unit of work in one worker, either a lone trial or a
seed pack (several trials trained as one vectorized model).

A unit resumes each member from its own checkpoint file when there is one (first
re-reporting the trace the checkpoint holds, so eval rows the database missed are
back-filled), then reports eval points as they come. Every reported row carries its trial id;
the driver-side callback writes them.
"""

from __future__ import annotations

import socket
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from ray import tune

from orchestrator.runner import checkpoints
from orchestrator.status import Status
from orchestrator.train import Trainer
from orchestrator.train.device import device_label


def _placement(device: torch.device, bf16: bool) -> dict[str, Any]:
    import ray

    try:
        node_id = ray.get_runtime_context().get_node_id()
    except Exception:  # pragma: no cover - outside Ray
        node_id = None
    return {"host": socket.gethostname(), "node_id": node_id, "device": device_label(device, bf16)}


def _row(tid: int, point) -> dict[str, Any]:
    """An eval row for the store: the loop's ``lr`` (the step's learning rate) is the
    store's ``step_lr``."""
    row = {"trial_id": tid, **point.to_dict()}
    row["step_lr"] = row.pop("lr")
    return row


class ConfigError(Exception):
    """Raised while setting a unit up, before its first step: retrying cannot help."""


def _setup(build):
    """Run a unit's setup (model, task, device, checkpoint); a failure there is a
    configuration error."""
    try:
        return build()
    except Exception as exc:
        raise ConfigError(exc) from exc


def _report_config_error(tids: list[int], exc: ConfigError) -> None:
    # Reported as the unit's final result instead of raised, so Tune does not retry it.
    cause = exc.__cause__ or exc
    line = f"{type(cause).__name__}: {str(cause).strip().splitlines()[0] if str(cause).strip() else ''}"
    tb = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
    tune.report(
        {
            "evals": [],
            "final": {t: ["failed", f"config error: {line}"[:300]] for t in tids},
            "tracebacks": {t: tb for t in tids},
            "error_kinds": {t: "config" for t in tids},
        }
    )


def _raised(pairs) -> dict[str, Any]:
    """The tracebacks of members that an exception in their step ended (Trainer.step_raised),
    for the writer's trial_errors; the console shows only their one-line error."""
    tbs = {tid: t.error_detail for tid, t in pairs if t.error_detail}
    return {"tracebacks": tbs, "error_kinds": {tid: "runtime" for tid in tbs}} if tbs else {}


def run_unit(config: dict[str, Any]) -> None:
    from orchestrator.plugins import load_installed

    load_installed()  # the sweep's plugin cells/tasks, before anything is built
    unit = config["unit"]
    torch.set_num_threads(int(unit.get("threads") or 1))
    members = unit["members"]
    try:
        if len(members) == 1:
            _run_lone(members[0])
        else:
            _run_pack(members)
    except ConfigError as exc:
        _report_config_error([m["trial_id"] for m in members], exc)


def _run_lone(member: dict[str, Any]) -> None:
    tid = member["trial_id"]
    ckpt = Path(member["checkpoint"])

    def build() -> Trainer:
        trainer = Trainer(member["params"], stop=member.get("stop"))
        state = checkpoints.read_checkpoint(ckpt)
        if state is not None:
            trainer.load_state_dict(state)
        return trainer

    trainer = _setup(build)
    tune.report({"evals": [_row(tid, e) for e in trainer.trace], "placement": _placement(trainer.device, trainer.bf16)})
    every = trainer.p.checkpoint_every_s
    last_save = time.monotonic()
    for point in trainer.run():
        if point.step == trainer.p.steps or time.monotonic() - last_save >= every:
            checkpoints.save(ckpt, trainer.state_dict())
            last_save = time.monotonic()
        tune.report({"evals": [_row(tid, point)]})
    # The final state (completed or diverged) is checkpointed too, so a driver that dies
    # before recording the outcome does not make the trial train again. A failed one keeps
    # its last good checkpoint: resume tries it again from there.
    if trainer.status != Status.failed:
        checkpoints.save(ckpt, trainer.state_dict())
    stop = (
        {"step": trainer.stopped_at, "budget": trainer.p.steps, "reason": trainer.stop_reason}
        if trainer.stopped_at is not None
        else None
    )
    tune.report({"evals": [], "final": {tid: [trainer.status.value, trainer.error, stop]}, **_raised([(tid, trainer)])})


def _run_pack(members: list[dict[str, Any]]) -> None:
    from orchestrator.train.pack import PackTrainer

    tids = [m["trial_id"] for m in members]
    paths = [Path(m["checkpoint"]) for m in members]
    pack = _setup(lambda: PackTrainer([m["params"] for m in members]))
    states = _setup(lambda: [checkpoints.read_checkpoint(p) for p in paths])
    try:
        pack.load_member_states(states)
    except ValueError:
        # Members checkpointed at different steps (e.g. packed differently before): run them
        # one by one, each from its own checkpoint; correct, only slower.
        for m in members:
            _run_lone(m)
        return
    tune.report(
        {
            "evals": [_row(t, e) for t, m in zip(tids, pack.members) for e in m.trace],
            "placement": _placement(pack.device, pack.bf16),
        }
    )
    every = pack.p.checkpoint_every_s
    last_save = time.monotonic()

    def save_all() -> None:
        pack.sync_members()
        for m, path in zip(pack.members, paths):
            if m.status != Status.failed:  # as for a lone trial: resume retries from the last good one
                checkpoints.save(path, m.state_dict())

    for group in pack.run():
        if group[0][1].step == pack.p.steps or time.monotonic() - last_save >= every:
            save_all()
            last_save = time.monotonic()
        tune.report({"evals": [_row(tids[j], point) for j, point in group]})
    save_all()
    tune.report(
        {
            "evals": [],
            "final": {t: [m.status.value, m.error] for t, m in zip(tids, pack.members)},
            **_raised(zip(tids, pack.members)),
        }
    )
