"""A task from the base class ``tasks.Task``: K key-value pairs, then one key; the answer is
its value. Every member a task defines is here (see the docstrings in tasks/base.py)."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from tasks import IGNORE, Task, register_task
from tasks.config import TaskConfig
from tasks.derangement import derange_component
from tasks.sampling import interleave, randint, sample_distinct


class SingleRecallConfig(TaskConfig):
    """The spec's task.K, task.n_keys, task.n_values (eval_size is inherited)."""

    K: int = Field(4, ge=1)
    n_keys: int = Field(16, ge=1)
    n_values: int = Field(8, ge=2)

    def check(self, task: str) -> None:
        if self.K > self.n_keys:
            raise ValueError(f"parameter 'K' for task {task!r} expects int <= n_keys ({self.n_keys}), got {self.K}")


@register_task
class SingleRecall(Task):
    """k1 v1 ... kK vK q: the value bound to key q, predicted at q's position."""

    name = "single_recall"
    Config = SingleRecallConfig
    cfg: SingleRecallConfig
    supervision = "the query position only"
    scoring = "the query position"
    small = {"K": 3}

    def __init__(self, cfg: SingleRecallConfig) -> None:
        super().__init__(cfg)
        self.K = cfg.K
        # Tokens: keys 0..n_keys-1, then values.
        self.vocab_size = cfg.n_keys + cfg.n_values
        self.seq_len = 2 * cfg.K + 1
        self.value_range = (cfg.n_keys, cfg.n_keys + cfg.n_values)

    def _sample(self, batch: int, gen: torch.Generator, layout: Any) -> dict[str, Any]:
        return {
            "keys": sample_distinct(batch, self.cfg.n_keys, self.K, gen),
            "values": randint(self.cfg.n_values, (batch, self.K), gen),
            "query": randint(self.K, (batch, 1), gen),  # which pair is asked for
        }

    def _assemble(self, comp: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keys, values, query = comp["keys"], comp["values"], comp["query"]
        inputs = torch.cat((interleave(keys, values + self.cfg.n_keys), keys.gather(1, query)), dim=1)
        targets = torch.full_like(inputs, IGNORE)
        targets[:, -1:] = values.gather(1, query) + self.cfg.n_keys
        return inputs, targets, targets  # trained and scored at the same position

    def _derange(self, comp: dict[str, Any], gen: torch.Generator) -> tuple[dict[str, Any], torch.Tensor]:
        return derange_component(comp, "values", gen, self.cfg.n_values)

    def floors(self) -> dict[str, float]:
        # Guessing a value: 1/n_values; a value seen in the table, at random: about 1/K.
        return {"value_marginal": 1 / self.cfg.n_values, "no_binding": 1 / min(self.K, self.cfg.n_values)}

    def _decode(self, seq: list[int]) -> dict[int, int]:
        table = {seq[t]: seq[t + 1] for t in range(0, 2 * self.K, 2)}
        return {2 * self.K: table[seq[2 * self.K]]}

    def _table_values(self, seq: list[int]) -> list[int]:
        return seq[1 : 2 * self.K : 2]
