"""The Ray Tune function trainable: one unit of work in one worker, either a lone trial or a
seed pack (several trials trained as one vectorized model).

A unit asks the run's checkpoint loader (runner/checkpoints.py, beside the driver) for each
member's checkpoint and resumes from it when there is one. Its first report says where it
runs and from which step each member starts (the writer records the attempt and deletes the
member's rows past that step); a member resumed from a file checkpoint re-reports the trace
the file holds, since rows the database missed are back-filled from it (a database checkpoint
is stored with its rows, so there is nothing to back-fill). Then it reports eval points as
they come, each checkpoint with the rows it covers. Every report is a
:class:`~orchestrator.runner.messages.Report` (each row carries its trial id); the driver-side
callback (runner/writer.py) writes them.
"""

from __future__ import annotations

import socket
import time
import traceback
from dataclasses import replace
from typing import Any

import torch
from ray import tune

from orchestrator.runner import checkpoints, console, provenance
from orchestrator.runner.messages import (
    AttemptStart,
    Checkpoint,
    EvalRow,
    Placement,
    Report,
    StepFailure,
    StopRecord,
    TrialFinal,
)
from orchestrator.status import Status
from orchestrator.train import Trainer
from orchestrator.train.device import device_label
from orchestrator.train.sysmetrics import Sampler


# The running unit's console capture (runner/console.py); None outside run_unit.
_capture: console.Capture | None = None


def _report(report: Report) -> None:
    # A changed console tail rides along now and then, never with the finals (Tune keeps a
    # trial's last report for the whole run).
    if _capture is not None and not report.finals and report.log is None:
        log = _capture.due()
        if log is not None:
            report = replace(report, log=log)
    tune.report(report.to_wire())


def _send_log() -> None:
    """The console tail in a report of its own, if anything was written since it was sent:
    before a unit's finals, before it raises, before it stops."""
    if _capture is not None:
        log = _capture.now()
        if log is not None:
            tune.report(Report(log=log).to_wire())


def _placement(device: torch.device, bf16: bool) -> Placement:
    import ray

    try:
        node_id = ray.get_runtime_context().get_node_id()
    except Exception:  # pragma: no cover - outside Ray
        node_id = None
    return Placement(host=socket.gethostname(), node_id=node_id, device=device_label(device, bf16))


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
    _send_log()
    line = f"{type(cause).__name__}: {str(cause).strip().splitlines()[0] if str(cause).strip() else ''}"
    failure = StepFailure("config", "".join(traceback.format_exception(type(cause), cause, cause.__traceback__)))
    error = f"config error: {line}"[:300]
    _report(Report(finals=tuple(TrialFinal(t, Status.failed, error, failure=failure) for t in tids)))


def _final(tid: int, trainer: Trainer, stop: StopRecord | None = None) -> TrialFinal:
    """How a member ended; the traceback of an exception that ended it in its step
    (Trainer.step_raised) goes with it, for the writer's trial_errors."""
    failure = StepFailure("runtime", trainer.error_detail) if trainer.error_detail else None
    return TrialFinal(tid, trainer.status, trainer.error, stop=stop, failure=failure)


def run_unit(config: dict[str, Any]) -> None:
    from orchestrator.plugins import load_installed

    load_installed()  # the sweep's plugin cells/tasks, before anything is built
    unit = config["unit"]
    torch.set_num_threads(int(unit.get("threads") or 1))
    members = unit["members"]
    loader = unit.get("loader")
    global _capture
    with console.captured() as cap:
        _capture = cap
        try:
            if len(members) == 1:
                _run_lone(members[0], loader)
            else:
                _run_pack(members, loader)
        except ConfigError as exc:
            _report_config_error([m["trial_id"] for m in members], exc)
        except Exception:
            # Tune records the traceback (trial_errors); the console up to it goes first, if
            # the session still takes a report. The traceback joins the stored console only
            # (printed, Ray would forward it to the driver's terminal as noise). The unit's
            # own exception is what propagates.
            cap.tail.write(traceback.format_exc())
            try:
                _send_log()
            except BaseException:  # noqa: S110 - a stopped session refuses reports
                pass
            raise
        finally:
            _capture = None


def _checkpoint(tid: int, state: dict[str, Any]) -> Checkpoint:
    return Checkpoint(tid, int(state["step"]), checkpoints.serialize(state))


def _backfill(tid: int, found: checkpoints.Found | None, trace: list) -> tuple[EvalRow, ...]:
    # Only a file checkpoint may cover rows the database never got.
    if found is None or found.origin != checkpoints.FILE:
        return ()
    return tuple(EvalRow(tid, e) for e in trace)


def _run_lone(member: dict[str, Any], loader: str | None) -> None:
    tid = member["trial_id"]

    def build() -> tuple[Trainer, checkpoints.Found | None]:
        trainer = Trainer(member["params"], stop=member.get("stop"))
        found = checkpoints.fetch(loader, tid, member["key"])
        if found is not None:
            trainer.load_state_dict(checkpoints.deserialize(found.state), found.trace)
        return trainer, found

    trainer, found = _setup(build)
    _report(
        Report(
            attempt=AttemptStart(
                ((tid, found.step if found else None),), provenance.environment(trainer.device, trainer.bf16)
            ),
            placement=_placement(trainer.device, trainer.bf16),
            evals=_backfill(tid, found, trainer.trace),
        )
    )
    every = trainer.p.checkpoint_every_s
    last_save = time.monotonic()
    stopping = checkpoints.StopPoll(loader)
    sampler = Sampler(trainer.device, found.step if found else 0)
    for point in trainer.run():
        ckpt: tuple[Checkpoint, ...] = ()
        stop_here = point.step < trainer.p.steps and stopping()
        if point.step == trainer.p.steps or time.monotonic() - last_save >= every or stop_here:
            ckpt = (_checkpoint(tid, trainer.checkpoint()),)
            last_save = time.monotonic()
        _report(Report(evals=(EvalRow(tid, point),), checkpoints=ckpt, system=sampler.sample(point.step)))
        if stop_here:
            # The driver is stopping: this step's checkpoint is stored with its rows, and the
            # unit ends without a final (the writer marks the trial interrupted).
            _send_log()
            return
    # The final state (completed or diverged) is checkpointed too, so a driver that dies
    # before recording the outcome does not make the trial train again. A failed one keeps
    # its last good checkpoint: resume tries it again from there.
    if trainer.status != Status.failed:
        _report(Report(checkpoints=(_checkpoint(tid, trainer.checkpoint()),)))
    stop = (
        StopRecord(trainer.stopped_at, trainer.p.steps, trainer.stop_reason or "")
        if trainer.stopped_at is not None
        else None
    )
    _send_log()
    _report(Report(finals=(_final(tid, trainer, stop),)))


def _run_pack(members: list[dict[str, Any]], loader: str | None) -> None:
    from orchestrator.train.pack import PackTrainer

    tids = [m["trial_id"] for m in members]
    pack = _setup(lambda: PackTrainer([m["params"] for m in members]))
    found = _setup(lambda: [checkpoints.fetch(loader, m["trial_id"], m["key"]) for m in members])
    try:
        pack.load_member_states(
            [checkpoints.deserialize(f.state) if f else None for f in found], [f.trace if f else () for f in found]
        )
    except ValueError:
        # Members checkpointed at different steps (e.g. packed differently before): run them
        # one by one, each from its own checkpoint; correct, only slower.
        for m in members:
            _run_lone(m, loader)
        return
    _report(
        Report(
            attempt=AttemptStart(
                tuple((t, f.step if f else None) for t, f in zip(tids, found)),
                provenance.environment(pack.device, pack.bf16),
            ),
            placement=_placement(pack.device, pack.bf16),
            evals=tuple(e for t, f, m in zip(tids, found, pack.members) for e in _backfill(t, f, m.trace)),
        )
    )
    every = pack.p.checkpoint_every_s
    last_save = time.monotonic()

    def save_all() -> tuple[Checkpoint, ...]:
        pack.sync_members()
        # as for a lone trial: a failed member keeps its last good checkpoint
        return tuple(_checkpoint(t, m.checkpoint()) for t, m in zip(tids, pack.members) if m.status != Status.failed)

    stopping = checkpoints.StopPoll(loader)
    # One sampler for the pack's process: its members share each sample (train/sysmetrics.py).
    sampler = Sampler(pack.device, found[0].step if found[0] else 0)
    for group in pack.run():
        ckpts: tuple[Checkpoint, ...] = ()
        stop_here = group[0][1].step < pack.p.steps and stopping()
        if group[0][1].step == pack.p.steps or time.monotonic() - last_save >= every or stop_here:
            ckpts = save_all()
            last_save = time.monotonic()
        _report(
            Report(
                evals=tuple(EvalRow(tids[j], point) for j, point in group),
                checkpoints=ckpts,
                system=sampler.sample(group[0][1].step),
            )
        )
        if stop_here:
            _send_log()
            return  # as a lone trial: checkpointed here, no final
    _report(Report(checkpoints=save_all()))
    _send_log()
    _report(Report(finals=tuple(_final(t, m) for t, m in zip(tids, pack.members))))
