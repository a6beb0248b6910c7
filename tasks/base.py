"""The task object the training loop talks to, and the pieces every task shares.

Conventions (all tasks):

* ``inputs`` and ``targets`` are int64 ``(B, T)``; ``targets`` is ``IGNORE`` (-100) at every
  position that carries no loss (training) or is not scored (eval). A target at position ``t``
  is what the model's logits at ``t`` must predict (no extra shift is applied by the loop).
* ``train_batch`` draws from the caller's generator on its device; eval and rebinding sets are
  generated on the CPU from their own seed streams (:mod:`tasks.seeding`) and then moved, so
  they are the same tensors on every device.
* A generator samples *components* (keys, values, ...), and ``_assemble`` lays them out as
  tokens. The rebinding control re-assembles the eval components with the table's values
  deranged (:mod:`tasks.derangement`), keeping the original values as targets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from tasks.config import EVAL_BATCH, TaskConfig
from tasks.curriculum import Curriculum
from tasks.seeding import make_generator

IGNORE = -100
Batch = tuple[torch.Tensor, torch.Tensor]


class Task:
    """Base class. Subclasses set ``name``, ``Config``, ``vocab_size``, ``seq_len`` and implement
    ``_sample`` / ``_assemble`` (and ``_derange`` when the rebinding control applies), and the
    reference decoder ``_decode`` (and ``_table_values`` with the rebinding control) that the
    tests and ``orchestrator tasks selftest`` check the generator against.

    ``supervision``: which positions carry training loss; ``scoring``: which eval positions are
    scored. Both are human-readable statements of the convention for this task. ``small``: a
    small, representative setting (``{}``: the defaults) at which the test suite checks every
    registered task by decoding each sequence.
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type[TaskConfig]] = TaskConfig
    supervision: ClassVar[str] = "answer positions only"
    scoring: ClassVar[str] = "answer positions"
    small: ClassVar[dict[str, Any]] = {}

    vocab_size: int
    seq_len: int
    value_range: tuple[int, int]  # [lo, hi) of the value tokens (tasks with a rebinding control)

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg

    # ---- interface used by the training loop -------------------------------------------------
    def params(self) -> dict[str, Any]:
        """The resolved parameters (defaults filled in)."""
        return self.cfg.model_dump()

    def train_batch(self, batch_size: int, generator: torch.Generator, curriculum_state: dict | None = None) -> Batch:
        """One training batch ``(inputs, targets)`` on ``generator.device``."""
        comp = self._sample(batch_size, generator, self._train_layout(curriculum_state, generator))
        inputs, targets, _ = self._assemble(comp)
        return inputs, targets

    def eval_batches(self, seed: int, device: str | torch.device = "cpu") -> list[Batch]:
        """The fixed held-out set for ``seed``: ``eval_size`` sequences in batches of <= 256;
        targets are ``IGNORE`` except at scored positions."""
        return [(x.to(device), y.to(device)) for x, y, _ in self._eval_parts(seed)]

    def rebinding_batches(self, seed: int, device: str | torch.device = "cpu") -> list[Batch] | None:
        """The eval set of ``seed`` with every table binding deranged; targets keep the ORIGINAL
        values (a genuine retriever scores ~0, a value-salience heuristic keeps its score).
        Rows whose table admits no value-changing derangement are left unscored.
        ``None`` when the control does not apply to this task."""
        if not self.has_rebinding:
            return None
        gen = make_generator("rebind", seed, "cpu")
        out = []
        for _, targets, comp in self._eval_parts(seed):
            rebound, feasible = self._derange(comp, gen)
            inputs, _, _ = self._assemble(rebound)
            targets = torch.where(feasible.unsqueeze(1), targets, torch.full_like(targets, IGNORE))
            out.append((inputs.to(device), targets.to(device)))
        return out

    def floors(self) -> dict[str, float]:
        """Analytic floors for these parameters (names among ``value_marginal``, ``no_binding``,
        ``table``, ``positional``)."""
        raise NotImplementedError

    def curriculum(self, total_steps: int) -> Curriculum | None:
        """A fresh curriculum state machine when the parameters ask for one, else None."""
        return None

    # ---- slow reference decoding (tests, ``orchestrator tasks selftest``) -----------------------
    def decode(self, seq: Sequence[int]) -> dict[int, int]:
        """``{position: answer}`` at every position the task scores at evaluation, computed
        from scratch from one token sequence (for MAD, training targets are the next token).

        The decoder sees only the tokens of that sequence and the task's documented token
        ranges and shares no code with the vectorised generator, so agreement between
        ``decode`` and the generator's targets checks the generator (and the rebinding control:
        a rebound sequence's answers must all differ from the original targets).
        """
        return self._decode(list(seq))

    def table_values(self, seq: Sequence[int]) -> list[int]:
        """The values of the table's bindings, in slot order (the rebinding control's multiset
        check); MAD: the value bound to each distinct key, in order of the key's first use."""
        return self._table_values(list(seq))

    # ---- subclass hooks ------------------------------------------------------------------------
    has_rebinding: ClassVar[bool] = True

    def _train_layout(self, curriculum_state: dict | None, gen: torch.Generator) -> Any:
        """Per-batch layout choice (e.g. the gap); tasks without one accept only ``None``."""
        if curriculum_state is not None:
            raise ValueError(f"task {self.name!r} has no curriculum; got state {curriculum_state!r}")
        return None

    def _eval_layout(self) -> Any:
        return None

    def _sample(self, batch: int, gen: torch.Generator, layout: Any) -> dict[str, Any]:
        raise NotImplementedError

    def _assemble(self, comp: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(inputs, train_targets, eval_targets)`` from components."""
        raise NotImplementedError

    def _derange(self, comp: dict[str, Any], gen: torch.Generator) -> tuple[dict[str, Any], torch.Tensor]:
        raise NotImplementedError

    def _decode(self, seq: list[int]) -> dict[int, int]:
        raise TypeError(f"no reference decoder for {type(self).__name__}")

    def _table_values(self, seq: list[int]) -> list[int]:
        raise TypeError(f"no table for {type(self).__name__}")

    # ---- shared machinery ----------------------------------------------------------------------
    def _eval_parts(self, seed: int) -> list[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]]:
        gen = make_generator("eval", seed, "cpu")
        layout = self._eval_layout()
        parts = []
        remaining = self.cfg.eval_size
        while remaining > 0:
            b = min(EVAL_BATCH, remaining)
            comp = self._sample(b, gen, layout)
            inputs, _, eval_targets = self._assemble(comp)
            parts.append((inputs, eval_targets, comp))
            remaining -= b
        return parts

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"
