"""One trial's training loop: build model and data from the registries, train with AdamW,
evaluate on a fixed held-out set, yield eval points. Checkpointable at any eval point.

Knows nothing of Ray or SQL. Determinism: the model is initialised under ``seed``; training
data come from ``tasks.train_generator(data_seed)``; the held-out set from ``eval_seed`` on a
stream the tasks module keeps disjoint from training. A checkpoint holds every piece of state
(model, optimizer, data generator, RNG, curriculum, anneal) but the trace, which the stored
eval rows already hold: a resumed trial is given those rows back (``load_state_dict``'s
``trace``) and continues bit for bit on the same device.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

import cells
import tasks
from orchestrator.evals import MEASURES, EvalPoint, measure
from orchestrator.events import escape_run
from orchestrator.keys import identity
from orchestrator.params import TrialParams, resolve, split
from orchestrator.status import Status
from orchestrator.train import device as devices
from orchestrator.train.schedule import lr_multiplier

# 2: the trace is left out (``Trainer.checkpoint``); 1 carried it. Both load.
CHECKPOINT_VERSION = 2
LOADABLE_VERSIONS = (1, 2)


def is_numeric_error(exc: BaseException) -> bool:
    """An arithmetic failure that the same state repeats on every retry: Python's
    ArithmeticError, or torch's scalar overflow (a RuntimeError "value cannot be converted
    to type float without overflow", e.g. AdamW's step at a learning rate of 1e300)."""
    return isinstance(exc, ArithmeticError) or (isinstance(exc, RuntimeError) and "overflow" in str(exc))


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def is_eval_step(step: int, p: TrialParams) -> bool:
    return step == 1 or step % p.eval_every == 0 or step == p.steps


@torch.no_grad()
def score(model: torch.nn.Module, batches, bf16: bool, device: torch.device) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) over the scored positions (targets != IGNORE)."""
    correct = 0
    total = 0
    loss_sum = 0.0
    for inputs, targets in batches:
        with devices.autocast(device, bf16):
            logits = model(inputs)
        mask = targets != tasks.IGNORE
        lg = logits[mask].float()
        tg = targets[mask]
        loss_sum += F.cross_entropy(lg, tg, reduction="sum").item()
        correct += int((lg.argmax(-1) == tg).sum().item())
        total += tg.numel()
    if total == 0:
        raise ValueError("eval set has no scored positions")
    return correct / total, loss_sum / total


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    device: torch.device,
    bf16: bool,
    grad_clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer update on one batch: mean cross-entropy over the scored positions
    (targets != IGNORE), optional global-norm clipping. Returns (loss, scored logits, scored
    targets). The lone trial's step, and what ``orchestrator bench tasks`` times."""
    with devices.autocast(device, bf16):
        logits = model(inputs)
    mask = targets != tasks.IGNORE
    lg = logits[mask].float()
    tg = targets[mask]
    loss = F.cross_entropy(lg, tg)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss, lg, tg


class Trainer:
    """Train one trial. ``run()`` yields an :class:`EvalPoint` at step 1, every
    ``eval_every`` steps and at the last step; afterwards ``status`` is ``completed`` or
    ``diverged`` (non-finite loss: the trace so far is kept, with the eval point that
    went non-finite, and ``error`` says where)."""

    def __init__(
        self,
        params: Mapping[str, Any],
        *,
        device: str | torch.device | None = None,
        stop: Mapping[str, Any] | None = None,
    ):
        self.params = resolve(dict(params))
        top, knobs, task_params, _tags = split(self.params)
        self.p = p = TrialParams.model_validate(top)
        self.device = torch.device(device) if device is not None else devices.pick_device(p.device)
        self.bf16 = devices.use_bf16(self.device, p.fp32)
        self.task = tasks.build(p.task, **task_params)
        torch.manual_seed(p.seed)
        self.model = cells.build(
            p.arm, vocab_size=self.task.vocab_size, d_model=p.d_model, n_layers=p.n_layers, **knobs
        ).to(self.device)
        if hasattr(self.model, "param_groups"):
            groups = self.model.param_groups(p.lr, p.weight_decay)
        else:
            groups = [{"params": [q for q in self.model.parameters() if q.requires_grad]}]
        for g in groups:
            g.setdefault("lr", p.lr)
            g["base_lr"] = g["lr"]
        self.optimizer = torch.optim.AdamW(groups, lr=p.lr, betas=(p.beta1, p.beta2), weight_decay=p.weight_decay)
        self.generator = tasks.train_generator(p.data_seed if p.data_seed is not None else p.seed, self.device)
        self.eval_set = self.task.eval_batches(p.eval_seed, self.device)
        self.rebind_set = None
        if p.rebinding:
            self.rebind_set = self.task.rebinding_batches(p.eval_seed, self.device)
            if self.rebind_set is None:
                raise ValueError(f"task {p.task!r} has no rebinding control (rebinding: true)")
        self.curriculum = self.task.curriculum(total_steps=p.steps)
        if p.anneal != "none" and not hasattr(self.model, "set_read_blend"):
            raise ValueError(f"anneal {p.anneal!r} needs an arm with a read blend (mlstm), not {p.arm!r}")
        self.step = 0
        self.trace: list[EvalPoint] = []
        self.elapsed = 0.0
        self.anneal_start: int | None = None
        self._loss_sum = 0.0
        self._loss_n = 0
        self.status = Status.running
        self.error: str | None = None
        # The traceback of an exception that ended the trial (step_raised); not checkpointed.
        self.error_detail: str | None = None
        # The spec's stop rule ({after_escape_evals, escape_at}): end the trial once its own
        # trace shows an escape sustained for that many evals. Not a trial parameter: the
        # same trial stopped or not is the same run up to the stop (identical trace prefix).
        self.stop_after = int(stop["after_escape_evals"]) if stop else None
        self.stop_escape_at = float(stop["escape_at"]) if stop else None
        self.stopped_at: int | None = None
        self.stop_reason: str | None = None

    # ---- schedules -------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        p = self.p
        return p.lr * lr_multiplier(
            step,
            schedule=p.schedule,
            steps=p.steps,
            warmup_steps=p.warmup_steps,
            cosine_steps=p.cosine_steps,
            min_lr_ratio=p.min_lr_ratio,
        )

    def read_blend_at(self, step: int) -> float | None:
        """α of the read blend (1 = whitened, 0 = raw) for the anneals, else None."""
        p = self.p
        if p.anneal == "none":
            return None
        length = max(1, round(p.anneal_frac * p.steps))
        start = p.steps - length if p.anneal == "time" else self.anneal_start
        if start is None or step <= start:
            return 1.0
        return max(0.0, 1.0 - (step - start) / length)

    # ---- one step and one eval ---------------------------------------------------------
    def _train_step(self, step: int) -> tuple[float, float | None]:
        state = self.curriculum.state() if self.curriculum is not None else None
        inputs, targets = self.task.train_batch(self.p.batch_size, self.generator, state)
        mult = self.lr_at(step) / self.p.lr
        for g in self.optimizer.param_groups:
            g["lr"] = g["base_lr"] * mult
        self.model.train()
        loss, lg, tg = train_step(
            self.model, self.optimizer, inputs, targets, device=self.device, bf16=self.bf16, grad_clip=self.p.grad_clip
        )
        probe = None
        if self.curriculum is not None:
            probe = (lg.detach().argmax(-1) == tg).float().mean().item()
        return loss.item(), probe

    def _evaluate(self, step: int, lr: float) -> EvalPoint:
        self.model.eval()
        acc, loss = score(self.model, self.eval_set, self.bf16, self.device)
        metrics: dict[str, float] = {}
        if self.rebind_set is not None:
            metrics["rebind_acc"], metrics["rebind_loss"] = score(self.model, self.rebind_set, self.bf16, self.device)
        return self.eval_point(step, lr, acc, loss, metrics)

    # ---- the per-trial bookkeeping shared with seed packs (orchestrator.train.pack) ------
    # A pack computes losses and scores for all members at once, then hands each member's
    # numbers to these methods, so a lone trial and a pack member keep one set of rules.
    def record_train_step(self, step: int, loss: float, probe: float | None) -> bool:
        """Book one optimizer update's training loss; on a non-finite loss mark the trial
        diverged and return False."""
        self.step = step
        if not math.isfinite(loss):
            self.status, self.error = Status.diverged, f"non-finite training loss at step {step}"
            return False
        self._loss_sum += loss
        self._loss_n += 1
        if self.curriculum is not None:
            assert probe is not None, "a curriculum reads the training batch's accuracy"
            self.curriculum.observe(step, probe)
        return True

    def eval_point(
        self,
        step: int,
        step_lr: float,
        acc: float,
        loss: float,
        metrics: dict[str, float],
        params: Sequence[torch.Tensor] | None = None,
    ) -> EvalPoint:
        """The eval row at ``step`` from held-out scores (``metrics`` already holds the
        rebinding control's) and the numbers ``evals.MEASURES`` takes from the parameters
        (``params``: a pack member's own; by default the model's); drains the train-loss
        accumulator."""
        if self.curriculum is not None:
            metrics.update({k: float(v) for k, v in self.curriculum.metrics().items()})
        blend = self.read_blend_at(step)
        if blend is not None:
            metrics["read_blend"] = blend
        train_loss = self._loss_sum / self._loss_n if self._loss_n else None
        self._loss_sum, self._loss_n = 0.0, 0
        measured: dict[str, float] = {}
        if MEASURES:
            with torch.no_grad():
                measured = measure(list(self.model.parameters()) if params is None else params)
        return EvalPoint(
            step=step,
            acc=acc,
            loss=loss,
            train_loss=train_loss,
            step_lr=step_lr,
            elapsed_s=self.elapsed,
            metrics=metrics,
            **measured,
        )

    def accept_eval(self, point: EvalPoint) -> bool:
        """Append ``point`` to the trace; return whether the trial goes on. On a non-finite
        score the trial is diverged and ends here, but the point stays in the trace, to be
        reported like any other: its finite values (a finite accuracy beside a NaN loss) are
        measurements, and the store keeps them, writing the non-finite ones as NULL named
        in ``evals.nonfinite``."""
        p = self.p
        self.trace.append(point)
        if not (math.isfinite(point.loss) and math.isfinite(point.acc)):
            what = "loss" if not math.isfinite(point.loss) else "accuracy"
            self.status, self.error = Status.diverged, f"non-finite eval {what} at step {point.step}"
            return False
        if p.anneal == "escape" and self.anneal_start is None and point.acc >= p.anneal_escape_at:
            self.anneal_start = point.step
        self._check_stop()
        return True

    def _check_stop(self) -> None:
        """Stop after a sustained escape: the escape eval (an eval after the first with
        acc >= escape_at: ``orchestrator.events``, the analysis's own definition) and the
        ``stop_after`` evals following it all stay >= escape_at. The escape step stays in the
        trace, so escape-time statistics are exactly those of the full run."""
        if self.stop_after is None or self.stopped_at is not None:
            return
        assert self.stop_escape_at is not None
        run = escape_run(self.trace, self.stop_escape_at, acc=lambda point: point.acc)
        if run >= self.stop_after + 1 and self.step < self.p.steps:
            since = self.trace[-run].step
            self.stopped_at = self.step
            self.stop_reason = (
                f"escape at step {since} sustained {self.stop_after} evals (acc >= {self.stop_escape_at:g})"
            )

    def step_raised(self, step: int, exc: BaseException, params_finite: bool) -> bool:
        """Book an exception out of training step ``step`` (or its eval). Parameters gone
        non-finite: the trial ``diverged``, as the next loss would have said. A numeric error
        (:func:`is_numeric_error`) on finite parameters: ``failed``, since the same state
        fails the same way on every retry. Either way the
        trial ends here with its trace, ``error`` one line and ``error_detail`` the traceback,
        and this returns True; anything else (out of memory, a lost device) is left to the
        caller, which may retry it (False)."""
        if params_finite and not is_numeric_error(exc):
            return False
        msg = str(exc).strip().splitlines()
        line = f"{type(exc).__name__}: {msg[0] if msg else ''}".rstrip(": ")
        if params_finite:
            self.status, self.error = Status.failed, f"{line} (at step {step})"
        else:
            self.status, self.error = Status.diverged, f"non-finite parameters at step {step} ({line})"
        self.error_detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return True

    def finish(self) -> None:
        if self.status == Status.running:
            self.status = Status.completed

    def run(self) -> Iterator[EvalPoint]:
        p = self.p
        if self.step >= p.steps:
            self.finish()
        t_last = time.perf_counter()
        while self.step < p.steps and self.status == Status.running and self.stopped_at is None:
            step = self.step + 1
            blend = self.read_blend_at(step)
            if blend is not None:
                self.model.set_read_blend(blend)  # type: ignore[operator]  # blendable models only
            try:
                loss, probe = self._train_step(step)
            except Exception as exc:
                if self.step_raised(step, exc, all_finite(self.model.parameters())):
                    return
                raise
            if not self.record_train_step(step, loss, probe):
                return
            if is_eval_step(step, p):
                try:
                    point = self._evaluate(step, self.lr_at(step))
                except Exception as exc:
                    if self.step_raised(step, exc, all_finite(self.model.parameters())):
                        return
                    raise
                # Wall time of training and eval only: time the consumer spends while the
                # generator is suspended (reporting, checkpointing) is not counted.
                self.elapsed += time.perf_counter() - t_last
                point.elapsed_s = self.elapsed
                goes_on = self.accept_eval(point)
                yield point  # a diverged trial's last point too: its finite values are kept
                if not goes_on:
                    return
                t_last = time.perf_counter()
        self.finish()

    # ---- checkpoints ---------------------------------------------------------------------
    def checkpoint(self) -> dict[str, Any]:
        """What a stored checkpoint holds: everything a resumed trial needs but its trace,
        which the stored eval rows already hold (a second copy would grow with every eval);
        ``trace_len`` lets :meth:`load_state_dict` check that the rows it is given back are
        the trace it had. Taken at an eval point (the train-loss accumulator is empty there)."""
        state = {
            "version": CHECKPOINT_VERSION,
            "params": self.params,
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "curriculum": self.curriculum.state_dict() if self.curriculum is not None else None,
            "trace_len": len(self.trace),
            "elapsed": self.elapsed,
            "anneal_start": self.anneal_start,
            "loss_acc": (self._loss_sum, self._loss_n),
            "status": self.status.value,
            "error": self.error,
            "stopped_at": self.stopped_at,
            "stop_reason": self.stop_reason,
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def state_dict(self) -> dict[str, Any]:
        """:meth:`checkpoint` with the trace in it: a whole trial in one object, for a
        round trip without a database (the runner stores :meth:`checkpoint`)."""
        return {**self.checkpoint(), "trace": [e.to_dict() for e in self.trace]}

    def load_state_dict(
        self, state: Mapping[str, Any], trace: Sequence[Mapping[str, Any] | EvalPoint] | None = None
    ) -> None:
        """Resume from ``state``. A state without a trace (:meth:`checkpoint`) needs
        ``trace``: the trial's stored eval rows up to the checkpoint's step, as
        :meth:`EvalPoint.to_dict` mappings; a state that carries one (version 1, or
        :meth:`state_dict`) uses its own. Raises ValueError on a state of another trial,
        version or budget, or rows that are not the trace the checkpoint was taken with."""
        if state.get("version") not in LOADABLE_VERSIONS:
            raise ValueError(f"checkpoint version {state.get('version')} is not one of {LOADABLE_VERSIONS}")
        # Budget, execution settings and tags may change between runs of one trial (a longer
        # budget continues it); what decides the trajectory may not.
        if identity(state["params"]) != identity(self.params):
            raise ValueError("checkpoint belongs to a different trial config")
        if int(state["step"]) > self.p.steps:
            raise ValueError(f"checkpoint is at step {state['step']}, past this trial's budget of {self.p.steps} steps")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        if self.curriculum is not None and state["curriculum"] is not None:
            self.curriculum.load_state_dict(state["curriculum"])
        self.step = int(state["step"])
        self.trace = self._resumed_trace(state, trace)
        self.elapsed = float(state["elapsed"])
        self.anneal_start = state["anneal_start"]
        self._loss_sum, self._loss_n = state["loss_acc"]
        self.status = Status(state.get("status", Status.running.value))
        if self.status == Status.completed and self.step < self.p.steps and state.get("stopped_at") is None:
            self.status = Status.running  # completed at a smaller budget: extended
        self.error = state.get("error")
        self.stopped_at = state.get("stopped_at")
        self.stop_reason = state.get("stop_reason")
        blend = self.read_blend_at(self.step) if self.step else None
        if blend is not None:
            self.model.set_read_blend(blend)  # type: ignore[operator]  # blendable models only

    def _resumed_trace(
        self, state: Mapping[str, Any], rows: Sequence[Mapping[str, Any] | EvalPoint] | None
    ) -> list[EvalPoint]:
        if "trace" in state:
            return [EvalPoint.from_dict(e) for e in state["trace"]]
        step = int(state["step"])
        # Rows past the checkpoint belong to an attempt that did not get to checkpoint them;
        # its successor deletes and retrains them, so they are no part of this trace.
        points = [p if isinstance(p, EvalPoint) else EvalPoint.from_dict(p) for p in rows or ()]
        points = sorted((p for p in points if p.step <= step), key=lambda p: p.step)
        want = int(state.get("trace_len", 0))
        if len(points) != want:
            raise ValueError(
                f"checkpoint at step {step} was taken with {want} eval point(s); "
                f"{len(points)} stored eval row(s) reach that step"
            )
        return points
