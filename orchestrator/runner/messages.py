"""What a unit of work (runner/trainable.py, in a Ray worker) tells the driver's writer
(runner/writer.py): one :class:`Report` per ``tune.report``.

Tune carries a report as a plain dict and may pass it through JSON on the way (which turns
int dict keys into strings), so the wire form has no keys but the envelope's: every message
is a short list, and per-trial entries carry their trial id inside. ``to_wire`` and
``from_wire`` are the only code that knows the layout; both sides see only these classes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from orchestrator.status import Status
from orchestrator.evals import FIELDS, EvalPoint
from orchestrator.train.sysmetrics import SAMPLE_FIELDS, SystemSample

Wire = list[Any]
_F = TypeVar("_F", bound="_Flat")


def _as_sent(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class _Flat:
    """A message whose wire form is its fields in declaration order, each field passed
    through its ``_read`` on the way back (JSON on the way may have turned a value's type)."""

    _read: ClassVar[tuple[Callable[[Any], Any], ...]] = ()

    def to_wire(self) -> Wire:
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_wire(cls: type[_F], w: Sequence[Any]) -> _F:
        return cls(*(read(v) for read, v in zip(cls._read, w, strict=True)))


@dataclass(frozen=True)
class EvalRow:
    """One eval point of one trial: the training loop's :class:`EvalPoint` and whose it is."""

    trial_id: int
    point: EvalPoint

    def store_row(self) -> dict[str, Any]:
        """The mapping ``store.repo.upsert_evals`` takes (the point's fields are the store's
        ``evals`` columns, its ``__dict__``). Shallow (``metrics`` is the point's own dict):
        the writer only reads it, and the deep copy of ``asdict`` cost more per row than the
        upsert itself."""
        return {"trial_id": self.trial_id, **vars(self.point)}

    def to_wire(self) -> Wire:
        # [trial_id, *the point's fields in order] (orchestrator/evals.FIELDS)
        return [self.trial_id, *(getattr(self.point, n) for n in FIELDS)]

    @classmethod
    def from_wire(cls, w: Sequence[Any]) -> EvalRow:
        tid, step, *values = w
        return cls(int(tid), EvalPoint(int(step), *values))


@dataclass(frozen=True)
class Placement(_Flat):
    """Where a unit runs (every member of a pack runs there)."""

    _read = (_as_sent, _as_sent, _as_sent)  # each may be None

    host: str | None
    node_id: str | None
    device: str | None


@dataclass(frozen=True)
class StopRecord(_Flat):
    """The spec's stop rule ended a trial at ``step`` of its ``budget`` (``trial_stops``)."""

    _read = (int, int, str)

    step: int
    budget: int
    reason: str


@dataclass(frozen=True)
class StepFailure(_Flat):
    """The traceback of an exception that ended a trial without a retry: a configuration
    error (``kind`` "config", before the first step) or one raised in a step ("runtime",
    Trainer.step_raised). It goes to ``trial_errors``; the console shows the one-line error."""

    _read = (str, str)

    kind: str
    traceback: str


@dataclass(frozen=True)
class TrialFinal:
    """How a trial of the unit ended (its last report)."""

    trial_id: int
    status: Status
    error: str | None = None
    stop: StopRecord | None = None
    failure: StepFailure | None = None

    def to_wire(self) -> Wire:
        return [
            self.trial_id,
            self.status.value,
            self.error,
            self.stop.to_wire() if self.stop is not None else None,
            self.failure.to_wire() if self.failure is not None else None,
        ]

    @classmethod
    def from_wire(cls, w: Sequence[Any]) -> TrialFinal:
        tid, status, error, stop, failure = w
        return cls(
            int(tid),
            Status(status),
            error,
            StopRecord.from_wire(stop) if stop is not None else None,
            StepFailure.from_wire(failure) if failure is not None else None,
        )


@dataclass(frozen=True)
class AttemptStart:
    """A unit's first report: the step each member starts from (None: from nothing) and the
    environment it runs in (``store.attempts.ENV_FIELDS``, from runner/provenance.py). The
    writer records one attempt per member and deletes its rows past that step."""

    from_steps: tuple[tuple[int, int | None], ...]
    env: Mapping[str, Any]

    def to_wire(self) -> Wire:
        return [[list(x) for x in self.from_steps], dict(self.env)]

    @classmethod
    def from_wire(cls, w: Sequence[Any]) -> AttemptStart:
        steps, env = w
        return cls(tuple((int(t), None if s is None else int(s)) for t, s in steps), dict(env))


@dataclass(frozen=True)
class Checkpoint(_Flat):
    """A member's checkpoint at eval ``step`` (``torch.save`` bytes of its state), reported
    after the eval rows it covers; the writer stores it with them."""

    _read = (int, int, bytes)

    trial_id: int
    step: int
    state: bytes


@dataclass(frozen=True)
class Report:
    """One ``tune.report`` of a unit: eval rows (possibly none), where it runs and from
    which steps (its first report), checkpoints, and at its end each member's
    :class:`TrialFinal`. A checkpoint travels in a report of its own or with the rows it
    covers, never with the finals (Tune keeps a trial's last report for the whole run)."""

    evals: tuple[EvalRow, ...] = ()
    placement: Placement | None = None
    finals: tuple[TrialFinal, ...] = ()
    attempt: AttemptStart | None = None
    checkpoints: tuple[Checkpoint, ...] = ()
    # The unit's console so far (the tail its members' attempts keep: runner/console.py),
    # sent when it changed, at most every few seconds, and before the unit ends or raises.
    log: str | None = None
    # What the unit's process was doing at the step of its eval rows (train/sysmetrics.py):
    # one sample per process, so every member of a pack gets the same one.
    system: SystemSample | None = None

    def to_wire(self) -> dict[str, Any]:
        # Tune adds its own keys to every result (done, trial_id, ...): ours never clash.
        out: dict[str, Any] = {"evals": [e.to_wire() for e in self.evals]}
        if self.placement is not None:
            out["placement"] = self.placement.to_wire()
        if self.finals:
            out["finals"] = [f.to_wire() for f in self.finals]
        if self.attempt is not None:
            out["attempt"] = self.attempt.to_wire()
        if self.checkpoints:
            out["checkpoints"] = [c.to_wire() for c in self.checkpoints]
        if self.log is not None:
            out["log"] = self.log
        if self.system is not None:
            # [step, elapsed_s, cpu_pct, rss_bytes, gpu_util_pct, gpu_mem_bytes, steps_per_s]
            out["system"] = [self.system.step, *(getattr(self.system, f) for f in SAMPLE_FIELDS)]
        return out

    @classmethod
    def from_wire(cls, result: Mapping[str, Any] | None) -> Report:
        """The report in a Tune result (an empty one for a result that holds none)."""
        result = result or {}
        placement = result.get("placement")
        attempt = result.get("attempt")
        system = result.get("system")
        return cls(
            evals=tuple(EvalRow.from_wire(w) for w in result.get("evals") or ()),
            placement=Placement.from_wire(placement) if placement is not None else None,
            finals=tuple(TrialFinal.from_wire(w) for w in result.get("finals") or ()),
            attempt=AttemptStart.from_wire(attempt) if attempt is not None else None,
            checkpoints=tuple(Checkpoint.from_wire(w) for w in result.get("checkpoints") or ()),
            log=result.get("log"),
            system=SystemSample(int(system[0]), *system[1:]) if system is not None else None,
        )

    @staticmethod
    def batch_to_wire(reports: Sequence[Report]) -> dict[str, Any]:
        """Several reports in one ``tune.report`` (a chain of short trials sends what it
        gathered every so often: runner/trainable.py), in the order they were made."""
        return {"batch": [r.to_wire() for r in reports]}

    @staticmethod
    def trim_wire(result: dict[str, Any]) -> None:
        """Drop from a Tune result, in place, all but its reports' finals, once the writer has
        taken them. Tune keeps each trial's last result until its run ends (and lets a
        callback change a result in place before it does): a chain's last batch holds its
        members' checkpoints, and Tune's trials of a long run would hold them all. The
        finals stay: a trial's end is read back from its last result when Tune stops it
        (runner/writer.on_trial_complete)."""
        batch = result.get("batch")
        if batch is not None:
            result["batch"] = [{"finals": w["finals"]} for w in batch if w.get("finals")]
            return
        for f in fields(Report):  # to_wire's keys are the fields' names
            if f.name != "finals":
                result.pop(f.name, None)

    @classmethod
    def all_from_wire(cls, result: Mapping[str, Any] | None) -> list[Report]:
        """The reports in a Tune result: those of a batch, in order, or its one report."""
        batch = (result or {}).get("batch")
        if batch is not None:
            return [cls.from_wire(w) for w in batch]
        return [cls.from_wire(result)]

    def system_rows(self) -> list[dict[str, Any]]:
        """The ``system_metrics`` rows of this report (``store.repo.upsert_system_metrics``):
        its sample for each trial with an eval row at the sample's step."""
        if self.system is None:
            return []
        values = {f: getattr(self.system, f) for f in SAMPLE_FIELDS}
        tids = dict.fromkeys(e.trial_id for e in self.evals if e.point.step == self.system.step)
        return [{"trial_id": t, "step": self.system.step, **values} for t in tids]
