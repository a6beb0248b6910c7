"""Scaling-law AR and MQAR over a vocabulary of ``V`` tokens (seed 002, §2 and §5; Zoology format).

Tokens: ``PAD = 0``; keys ``[1, V // 2)``; values ``[V // 2, V)``. A context of ``n_facts``
bindings (distinct keys, values iid uniform over the value subset) is followed by a query
region filled with ``PAD`` in which query keys sit; the target *at a query key's own position*
is its value (next-token format, no MASK token), and only those positions carry loss and are
scored.

* ``ar_scaling`` -- one query, at the last position ``L - 1``: ``seq_len >= 2 * n_facts + 1``.
* ``mqar_scaling`` -- ``n_queries`` (default: all ``n_facts``) distinct table keys, each at a
  distinct uniformly random even offset of the query region (``2 * n_facts + 2j``), in random
  order: ``seq_len >= 2 * n_facts + 2 * n_queries``.

Built for ``V`` up to 50K and ``L`` up to 4K: keys are drawn without replacement by row-wise
rejection when ``n_facts**2 <= V/2`` (cost independent of ``V``), else by top-k of uniforms.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from tasks import floors as fl
from tasks.base import IGNORE, Task
from tasks.config import TaskConfig
from tasks.derangement import derange_component
from tasks.sampling import interleave, randint, sample_distinct


class ScalingConfig(TaskConfig):
    """``vocab_size`` V, ``n_facts`` Nf, ``seq_len`` L."""

    vocab_size: int = Field(8192, ge=5)
    n_facts: int = Field(32, ge=1)
    seq_len: int = Field(256, ge=3)

    def n_keys(self) -> int:
        return self.vocab_size // 2 - 1

    def n_values(self) -> int:
        return self.vocab_size - self.vocab_size // 2

    def n_queries_resolved(self) -> int:
        return 1

    def check(self, task: str) -> None:
        if self.n_facts > self.n_keys():
            raise ValueError(
                f"parameter 'n_facts' for task {task!r} expects int <= number of "
                f"keys V//2 - 1 ({self.n_keys()}), got {self.n_facts}"
            )
        need = 2 * self.n_facts + 2 * self.n_queries_resolved() - (1 if task == "ar_scaling" else 0)
        if self.seq_len < need:
            raise ValueError(
                f"parameter 'seq_len' for task {task!r} expects int >= {need} "
                f"for {self.n_facts} facts, got {self.seq_len}"
            )


class ARScalingConfig(ScalingConfig):
    pass


class MQARScalingConfig(ScalingConfig):
    """``n_queries``: queried facts per sequence (None: all ``n_facts``)."""

    n_queries: int | None = Field(None, ge=1)

    def n_queries_resolved(self) -> int:
        return self.n_facts if self.n_queries is None else self.n_queries

    def check(self, task: str) -> None:
        if self.n_queries is not None and self.n_queries > self.n_facts:
            raise ValueError(
                f"parameter 'n_queries' for task {task!r} expects int <= n_facts ({self.n_facts}), got {self.n_queries}"
            )
        super().check(task)


class _Scaling(Task):
    supervision = "query key positions only (target = its value)"
    scoring = "every query key position"

    def __init__(self, cfg: ScalingConfig) -> None:
        super().__init__(cfg)
        self.Nf = cfg.n_facts
        self.n_keys = cfg.n_keys()
        self.n_values = cfg.n_values()
        self.key_offset = 1
        self.value_offset = cfg.vocab_size // 2
        self.vocab_size = cfg.vocab_size
        self.value_range = (self.value_offset, cfg.vocab_size)
        self.seq_len = cfg.seq_len
        self.n_queries = cfg.n_queries_resolved()

    def _sample_table(self, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        keys = sample_distinct(batch, self.n_keys, self.Nf, gen)
        values = randint(self.n_values, (batch, self.Nf), gen)
        return keys, values

    def _table_tokens(self, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return interleave(keys + self.key_offset, values + self.value_offset)

    def _derange(self, comp: dict[str, Any], gen: torch.Generator):
        return derange_component(comp, "values", gen, self.n_values)

    def floors(self) -> dict[str, float]:
        return {
            "value_marginal": fl.value_marginal(self.n_values),
            "no_binding": fl.random_table_value(self.Nf, self.n_values),
            "table": fl.table(self.Nf),
        }

    def _decode(self, seq: list[int]) -> dict[int, int]:
        n_ctx = 2 * self.Nf
        table = {seq[t]: seq[t + 1] for t in range(0, n_ctx, 2)}
        return {t: table[seq[t]] for t in range(n_ctx, len(seq)) if seq[t] != 0}

    def _table_values(self, seq: list[int]) -> list[int]:
        return seq[1 : 2 * self.Nf : 2]


class ARScaling(_Scaling):
    """Scaling-law AR: Nf facts over vocabulary V, one query at the end of a length-L context."""

    name = "ar_scaling"
    Config = ARScalingConfig
    small = {"vocab_size": 512, "n_facts": 16, "seq_len": 64}

    def _sample(self, batch: int, gen: torch.Generator, layout: Any) -> dict[str, Any]:
        keys, values = self._sample_table(batch, gen)
        return {"keys": keys, "values": values, "query": randint(self.Nf, (batch, 1), gen)}

    def _assemble(self, comp: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keys, values, query = comp["keys"], comp["values"], comp["query"]
        b = keys.shape[0]
        inputs = torch.zeros((b, self.seq_len), dtype=torch.long, device=keys.device)
        inputs[:, : 2 * self.Nf] = self._table_tokens(keys, values)
        inputs[:, -1] = keys.gather(1, query).squeeze(1) + self.key_offset
        targets = torch.full_like(inputs, IGNORE)
        targets[:, -1] = values.gather(1, query).squeeze(1) + self.value_offset
        return inputs, targets, targets


class MQARScaling(_Scaling):
    """Scaling-law MQAR: Nf facts over vocabulary V, queries scattered over a length-L context."""

    name = "mqar_scaling"
    Config = MQARScalingConfig
    small = {"vocab_size": 512, "n_facts": 16, "seq_len": 96, "n_queries": 12}

    def _sample(self, batch: int, gen: torch.Generator, layout: Any) -> dict[str, Any]:
        keys, values = self._sample_table(batch, gen)
        n_slots = (self.seq_len - 2 * self.Nf) // 2
        slots = sample_distinct(batch, n_slots, self.n_queries, gen)
        if self.n_queries == self.Nf:
            # The slots are already in uniformly random order, so key i -> slot i is a uniform
            # assignment; this skips an O(Nf log Nf) shuffle per row.
            which = torch.arange(self.Nf, device=keys.device).expand(batch, self.Nf)
        else:
            which = sample_distinct(batch, self.Nf, self.n_queries, gen)
        return {"keys": keys, "values": values, "slots": slots, "which": which}

    def _assemble(self, comp: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keys, values, slots, which = comp["keys"], comp["values"], comp["slots"], comp["which"]
        b = keys.shape[0]
        inputs = torch.zeros((b, self.seq_len), dtype=torch.long, device=keys.device)
        inputs[:, : 2 * self.Nf] = self._table_tokens(keys, values)
        pos = 2 * self.Nf + 2 * slots
        inputs.scatter_(1, pos, keys.gather(1, which) + self.key_offset)
        targets = torch.full_like(inputs, IGNORE)
        targets.scatter_(1, pos, values.gather(1, which) + self.value_offset)
        return inputs, targets, targets
