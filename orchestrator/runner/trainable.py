"""The Ray Tune function trainable: one unit of work in one worker: a lone trial, a seed pack
(several trials trained as one vectorized model), or a chain (short lone trials one after
another, their reports sent in batches: :func:`_run_chain`).

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

# How long a chain's reports gather before they go to the driver together (seconds): half a
# chain's length (runner/feed.CHAIN_S), so a chain sends about twice. Longer would save a
# round trip a chain (~18 ms with its checkpoints) but hold a chain's rows back from the live
# page and lose more of them with a worker that dies.
CHAIN_REPORT_S = 5.0


class _Outbox:
    """A chain's reports, sent together (``Report.batch_to_wire``) once the oldest has waited
    ``every`` seconds, and whenever the chain ends, stops or raises. Each ``tune.report``
    holds the unit until the driver has taken it (a round trip through Tune's loop): a
    half-second trial made five of them, as much as Tune's own start of a trial costs. A
    report lost in the outbox with its worker is one a driver's crash could lose too: the
    rows past the last stored checkpoint are trained again, and a member whose end was not
    stored runs again (runner/writer.py)."""

    def __init__(self, every: float = CHAIN_REPORT_S) -> None:
        self.every = every
        self.pending: list[Report] = []
        self.since = 0.0

    def add(self, report: Report) -> None:
        if not self.pending:
            self.since = time.monotonic()
        self.pending.append(report)
        if time.monotonic() - self.since >= self.every:
            self.send()

    def send(self) -> None:
        if self.pending:
            batch, self.pending = self.pending, []
            tune.report(Report.batch_to_wire(batch))


# The running chain's outbox; None outside a chain (each report goes at once).
_outbox: _Outbox | None = None


def _report(report: Report) -> None:
    # A changed console tail rides along now and then, never with the finals (Tune keeps a
    # trial's last report for the whole run).
    if _capture is not None and not report.finals and report.log is None:
        log = _capture.due()
        if log is not None:
            report = replace(report, log=log)
    if _outbox is not None:
        _outbox.add(report)
    else:
        tune.report(report.to_wire())


def _send_log() -> None:
    """The console tail in a report of its own, if anything was written since it was sent:
    before a unit's finals, before it raises, before it stops."""
    if _capture is not None:
        log = _capture.now()
        if log is not None:
            _report(Report(log=log))


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

    unit = config["unit"]
    load_installed(unit.get("plugins", ()))  # the sweep's plugin cells/tasks, before anything is built
    torch.set_num_threads(int(unit.get("threads") or 1))
    members = unit["members"]
    loader = unit.get("loader")
    global _capture, _outbox
    with console.captured() as cap:
        _capture = cap
        _outbox = _Outbox() if unit.get("chain") else None
        try:
            if unit.get("chain"):
                _run_chain(members, loader, unit.get("owner"))
            elif len(members) == 1:
                _run_lone(members[0], loader)
            else:
                _run_pack(members, loader)
            if _outbox is not None:
                # Tune keeps each trial's last result until its run ends: the writer trims
                # what it took (the members' rows and checkpoints) from it in place.
                _outbox.send()
        except ConfigError as exc:
            _report_config_error([m["trial_id"] for m in members], exc)
            if _outbox is not None:
                _outbox.send()
        except Exception:
            # Tune records the traceback (trial_errors); the console up to it goes first, if
            # the session still takes a report (with what a chain gathered: the ends of its
            # members before this one are stored, and a retry skips them). The traceback
            # joins the stored console only (printed, Ray would forward it to the driver's
            # terminal as noise). The unit's own exception is what propagates.
            cap.tail.write(traceback.format_exc())
            try:
                _send_log()
                if _outbox is not None:
                    _outbox.send()
            except BaseException:  # noqa: S110 - a stopped session refuses reports
                pass
            raise
        finally:
            _capture = None
            _outbox = None


def _checkpoint(tid: int, state: dict[str, Any]) -> Checkpoint:
    return Checkpoint(tid, int(state["step"]), checkpoints.serialize(state))


def _backfill(tid: int, found: checkpoints.Found | None, trace: list) -> tuple[EvalRow, ...]:
    # Only a file checkpoint may cover rows the database never got.
    if found is None or found.origin != checkpoints.FILE:
        return ()
    return tuple(EvalRow(tid, e) for e in trace)


def _run_chain(members: list[dict[str, Any]], loader: str | None, owner: str | None) -> None:
    """A chain: short lone trials run one after another in this one Tune trial (the feed
    makes them when trials take less than a few seconds: runner/feed.ChainPolicy), so Tune's
    start of a trial is paid once per chain. Each member is a lone trial with its own
    attempt, checkpoint and end. Only the members the driver still holds run: a chain that
    Tune retries after its worker died skips those whose end was stored. A member that
    cannot be set up fails alone; a stop ends the chain at the running member's checkpoint
    (the rest were never started: the driver lets them go)."""
    # One round trip to the loader for the chain, not one per member (it cost a tenth of a
    # half-second trial's overhead on a loaded machine).
    held = checkpoints.fetch_chain(loader, owner, [(m["trial_id"], m["key"]) for m in members])
    stopping = checkpoints.StopPoll(loader, wait=False)
    for member in members:
        if member["trial_id"] not in held:
            continue
        if stopping():
            return
        try:
            if _run_lone(member, loader, stopping, held[member["trial_id"]]):
                return
        except ConfigError as exc:
            _report_config_error([member["trial_id"]], exc)


_ASK = object()  # _run_lone: ask the loader for the member's checkpoint


def _run_lone(
    member: dict[str, Any], loader: str | None, stopping: checkpoints.StopPoll | None = None, found: Any = _ASK
) -> bool:
    """One trial from its checkpoint (``found``: already fetched, a chain's) to its end;
    True when it stopped early because the driver is stopping (checkpointed where it was,
    no final)."""
    tid = member["trial_id"]
    given = found

    def build() -> tuple[Trainer, checkpoints.Found | None]:
        trainer = Trainer(member["params"], stop=member.get("stop"))
        found = checkpoints.fetch(loader, tid, member["key"]) if given is _ASK else given
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
    stopping = stopping or checkpoints.StopPoll(loader)
    sampler = Sampler(trainer.device, found.step if found else 0)
    last: Report = Report()
    for point in trainer.run():
        row = Report(evals=(EvalRow(tid, point),), system=sampler.sample(point.step))
        if point.step == trainer.p.steps:
            last = row  # the budget's last eval: it goes with the final checkpoint below
            continue
        stop_here = stopping()
        if time.monotonic() - last_save >= every or stop_here:
            row = replace(row, checkpoints=(_checkpoint(tid, trainer.checkpoint()),))
            last_save = time.monotonic()
        _report(row)
        if stop_here:
            # The driver is stopping: this step's checkpoint is stored with its rows, and the
            # unit ends without a final (the writer marks the trial interrupted).
            _send_log()
            return True
    # The final state (completed or diverged) is checkpointed too, so a driver that dies
    # before recording the outcome does not make the trial train again; the budget's last
    # eval row travels with it (the rows it covers, in one report). A failed one keeps its
    # last good checkpoint: resume tries it again from there.
    final = (_checkpoint(tid, trainer.checkpoint()),) if trainer.status != Status.failed else ()
    if final or last.evals:
        _report(replace(last, checkpoints=final))
    stop = (
        StopRecord(trainer.stopped_at, trainer.p.steps, trainer.stop_reason or "")
        if trainer.stopped_at is not None
        else None
    )
    _send_log()
    _report(Report(finals=(_final(tid, trainer, stop),)))
    return False


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
