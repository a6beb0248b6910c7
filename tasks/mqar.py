"""Masked multi-query associative recall (seed 001, §3.3).

Layout, ``T = 4K``::

    k_1 v_1 k_2 v_2 ... k_K v_K | q_1 MASK q_2 MASK ... q_K MASK

``K`` distinct keys from ``n_keys`` key tokens; values iid uniform over ``n_values`` value
tokens, drawn fresh per sequence (no key->value prior exists); the queries are the ``K`` table
keys in a uniformly random order; the target at each MASK is the value bound to the key just
before it. Loss and scoring only at the MASK positions.

Tokens: keys ``[0, n_keys)``, values ``[n_keys, n_keys + n_values)``, ``MASK`` last
(defaults: 64 + 26 + 1 = 91, the prototype's layout).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pydantic import Field

from tasks import floors as fl
from tasks.base import IGNORE, Task
from tasks.config import TaskConfig
from tasks.derangement import derange_component
from tasks.sampling import interleave, randint, random_permutation, sample_distinct


class MQARConfig(TaskConfig):
    """``K``: pairs in the table (and queries); ``n_keys``/``n_values``: token ranges."""

    K: int = Field(16, ge=1)
    n_keys: int = Field(64, ge=1)
    n_values: int = Field(26, ge=2)

    def check(self, task: str) -> None:
        if self.K > self.n_keys:
            raise ValueError(f"parameter 'K' for task {task!r} expects int <= n_keys ({self.n_keys}), got {self.K}")


class MQAR(Task):
    """Masked MQAR: K key-value pairs, then the K keys queried, each answer one MASK token."""

    name = "mqar"
    Config = MQARConfig
    cfg: MQARConfig
    supervision = "MASK answer positions only"
    scoring = "every MASK answer position"
    small = {"K": 8}

    def __init__(self, cfg: MQARConfig) -> None:
        super().__init__(cfg)
        self.K = cfg.K
        self.value_offset = cfg.n_keys
        self.mask_token = cfg.n_keys + cfg.n_values
        self.vocab_size = self.mask_token + 1
        self.value_range = (self.value_offset, self.value_offset + cfg.n_values)
        self.seq_len = 4 * cfg.K

    def _sample(self, batch: int, gen: torch.Generator, layout: Any) -> dict[str, Any]:
        keys = sample_distinct(batch, self.cfg.n_keys, self.K, gen)
        values = randint(self.cfg.n_values, (batch, self.K), gen)
        order = random_permutation(batch, self.K, gen)
        return {"keys": keys, "values": values, "order": order}

    def _assemble(self, comp: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keys, values, order = comp["keys"], comp["values"], comp["order"]
        b = keys.shape[0]
        table = interleave(keys, values + self.value_offset)
        queries = interleave(keys.gather(1, order), torch.full_like(order, self.mask_token))
        inputs = torch.cat((table, queries), dim=1)
        targets = torch.full_like(inputs, IGNORE)
        targets[:, 2 * self.K + 1 :: 2] = values.gather(1, order) + self.value_offset
        assert targets.shape == (b, self.seq_len)
        return inputs, targets, targets

    def _derange(self, comp: dict[str, Any], gen: torch.Generator):
        return derange_component(comp, "values", gen, self.cfg.n_values)

    def floors(self) -> dict[str, float]:
        return {
            "value_marginal": fl.value_marginal(self.cfg.n_values),
            "no_binding": fl.random_table_value(self.K, self.cfg.n_values),
            "table": fl.table(self.K),
        }

    def _decode(self, seq: list[int]) -> dict[int, int]:
        table = first_binding(seq, 2 * self.K, lambda tok: tok < self.cfg.n_keys)
        return {t: table[seq[t - 1]] for t in range(2 * self.K, len(seq)) if seq[t] == self.mask_token}

    def _table_values(self, seq: list[int]) -> list[int]:
        return seq[1 : 2 * self.K : 2]


def first_binding(seq: list[int], end: int, is_key: Callable[[int], bool]) -> dict[int, int]:
    """Map each key to the token after its first occurrence before ``end``."""
    table: dict[int, int] = {}
    for t in range(end - 1):
        if is_key(seq[t]) and seq[t] not in table:
            table[seq[t]] = seq[t + 1]
    return table
