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
    """Base class of every task, built-in or a plugin's (``tasks.register_task``).

    What a subclass defines (each is described where it is declared below):

    * required: ``name`` (unique), ``Config`` (its parameters), ``vocab_size`` and
      ``seq_len`` (set in ``__init__`` from the config), ``_sample`` and ``_assemble``
      (the generator), ``floors()``;
    * with the rebinding control (``has_rebinding = True``, the default): ``value_range``,
      ``_derange``, and ``_table_values`` for the self-test; set ``has_rebinding = False``
      to go without;
    * for the reference checks (``orchestrator tasks selftest``, ``tests/test_tasks.py``):
      ``_decode`` and ``small``;
    * optional: ``supervision``/``scoring`` (what ``orchestrator tasks`` prints),
      ``curriculum`` with ``_train_layout``, ``_eval_layout``, and ``Config.check``.

    The training loop calls only the public methods (``train_batch``, ``eval_batches``,
    ``rebinding_batches``, ``curriculum``), which this class implements from those hooks.
    ``examples/plugin/`` is a complete task written from this class alone.
    """

    #: The task's name in specs (``task: NAME``) and in ``orchestrator tasks``; unique.
    name: ClassVar[str] = ""
    #: Its parameters: a :class:`tasks.config.TaskConfig` subclass (pydantic, strict, unknown
    #: keys refused), whose fields are the spec's ``task.<param>`` keys; ``eval_size`` is
    #: inherited. ``Config.check(task)`` may add cross-field checks (one-line ValueError).
    Config: ClassVar[type[TaskConfig]] = TaskConfig
    #: Which positions carry training loss, in words (shown by ``orchestrator tasks``).
    supervision: ClassVar[str] = "answer positions only"
    #: Which eval positions are scored, in words (shown by ``orchestrator tasks``).
    scoring: ClassVar[str] = "answer positions"
    #: A small, representative setting (``{}``: the defaults) at which the test suite checks
    #: every registered task by decoding each sequence.
    small: ClassVar[dict[str, Any]] = {}

    #: Token ids are ``0 .. vocab_size - 1`` (the model's embedding and readout size); set in
    #: ``__init__`` from the config.
    vocab_size: int
    #: Tokens per sequence (every batch is ``(B, seq_len)``); set in ``__init__``.
    seq_len: int
    #: ``[lo, hi)`` of the value tokens (tasks with the rebinding control: the derangement
    #: permutes values within it).
    value_range: tuple[int, int]

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
        """Analytic floors for these parameters: ``{name: accuracy}``, names among
        ``value_marginal``, ``no_binding``, ``table``, ``positional`` (the accuracy a model
        reaches without binding, e.g. by always answering the commonest value); ``{}`` when
        none is known. Required: ``orchestrator tasks --floors`` prints it."""
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
    #: Whether the rebinding control applies (then ``value_range``, ``_derange`` and
    #: ``_table_values`` are needed); ``False``: ``rebinding_batches`` returns None.
    has_rebinding: ClassVar[bool] = True

    def _train_layout(self, curriculum_state: dict | None, gen: torch.Generator) -> Any:
        """Per-batch layout choice (e.g. the gap) handed to ``_sample``; tasks without one
        accept only ``None``. Override with ``curriculum``."""
        if curriculum_state is not None:
            raise ValueError(f"task {self.name!r} has no curriculum; got state {curriculum_state!r}")
        return None

    def _eval_layout(self) -> Any:
        """The layout handed to ``_sample`` for the eval set (default None)."""
        return None

    def _sample(self, batch: int, gen: torch.Generator, layout: Any) -> dict[str, Any]:
        """Required. ``batch`` sequences' *components* (keys, values, queries, ...: int64
        tensors with ``batch`` rows, drawn only from ``gen`` and on its device) as a dict
        that ``_assemble`` and ``_derange`` understand; ``layout``: see ``_train_layout``."""
        raise NotImplementedError

    def _assemble(self, comp: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Required. ``(inputs, train_targets, eval_targets)`` from components: int64
        ``(B, seq_len)`` each, tokens in ``[0, vocab_size)``, targets ``IGNORE`` where no
        loss is taken (train) or nothing is scored (eval); the target at ``t`` is what the
        logits at ``t`` must predict."""
        raise NotImplementedError

    def _derange(self, comp: dict[str, Any], gen: torch.Generator) -> tuple[dict[str, Any], torch.Tensor]:
        """With ``has_rebinding``: the components with every binding's value moved to another
        key (``tasks.derangement``), and a bool ``(B,)`` of the rows where that was possible."""
        raise NotImplementedError

    def _decode(self, seq: list[int]) -> dict[int, int]:
        """For the reference checks: ``{position: answer}`` at every scored position, worked
        out from the tokens of ``seq`` alone (no code shared with the generator)."""
        raise TypeError(f"no reference decoder for {type(self).__name__}")

    def _table_values(self, seq: list[int]) -> list[int]:
        """With ``has_rebinding``, for the self-test: the values of ``seq``'s bindings, in
        slot order."""
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
