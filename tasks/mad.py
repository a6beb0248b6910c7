"""MAD noisy in-context recall (seed 003; the MAD benchmark's definition), our own generator.

Vocabulary of ``vocab_size`` tokens: ``noise_vocab_size`` noise tokens and one ``PROBE``
token are special; the remaining ``vocab_size - 1 - noise_vocab_size`` are split into keys
(first half, rounded down) and values (the rest). Token order: keys, values, noise, PROBE.

A stream of ``seq_len + 1`` tokens: ``(seq_len - 2) / 2`` two-token slots, each a noise pair
(two iid noise tokens) with probability ``frac_noise`` and otherwise a key-value pair; one
uniformly chosen slot is forced to be a pair so that some key is seen. Keys are uniform over
the key range and each key's value is fixed within the sequence (drawn uniformly on the key's
first use). Then ``PROBE k v``, with ``k`` uniform over the distinct keys seen.

``inputs = stream[:-1]``. Training targets are ``stream[1:]`` at *every* position (next-token
on noise, keys, values and the probe alike); eval scores only the final position, whose
target is the probe key's value.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from tasks import floors as fl
from tasks.base import IGNORE, Task
from tasks.config import TaskConfig
from tasks.derangement import derange_component
from tasks.sampling import interleave, rand, randint


class MADConfig(TaskConfig):
    """MAD's own parameter names; published settings: vocab 80/88/96, seq 512/768/1024."""

    vocab_size: int = Field(80, ge=8)
    seq_len: int = Field(512, ge=6)
    noise_vocab_size: int = Field(16, ge=1)
    frac_noise: float = Field(0.8, ge=0.0, lt=1.0)

    def check(self, task: str) -> None:
        if self.seq_len % 2:
            raise ValueError(f"parameter 'seq_len' for task {task!r} expects an even int, got {self.seq_len}")
        if self.vocab_size - 1 - self.noise_vocab_size < 4:
            raise ValueError(
                f"parameter 'vocab_size' for task {task!r} expects int >= "
                f"noise_vocab_size + 5 ({self.noise_vocab_size + 5}), got {self.vocab_size}"
            )


class MADRecall(Task):
    """MAD noisy in-context recall: next-token on every position, final recall scored."""

    name = "mad_recall"
    Config = MADConfig
    cfg: MADConfig
    supervision = "every position (next-token)"
    scoring = "the final position only (the probe key's value)"
    small = {"seq_len": 96}

    def __init__(self, cfg: MADConfig) -> None:
        super().__init__(cfg)
        plain = cfg.vocab_size - 1 - cfg.noise_vocab_size
        self.n_keys = plain // 2
        self.n_values = plain - self.n_keys
        self.value_offset = self.n_keys
        self.noise_offset = plain
        self.probe_token = cfg.vocab_size - 1
        self.vocab_size = cfg.vocab_size
        self.value_range = (self.value_offset, self.noise_offset)
        self.seq_len = cfg.seq_len
        self.n_slots = (cfg.seq_len - 2) // 2

    def _sample(self, batch: int, gen: torch.Generator, layout: Any) -> dict[str, Any]:
        n = self.n_slots
        is_pair = rand((batch, n), gen) >= self.cfg.frac_noise
        forced = randint(n, (batch, 1), gen)
        is_pair.scatter_(1, forced, True)
        slot_keys = randint(self.n_keys, (batch, n), gen)
        table = randint(self.n_values, (batch, self.n_keys), gen)
        noise = randint(self.cfg.noise_vocab_size, (batch, n, 2), gen) + self.noise_offset
        seen = torch.zeros((batch, self.n_keys + 1), dtype=torch.bool, device=is_pair.device)
        seen.scatter_(1, torch.where(is_pair, slot_keys, self.n_keys), True)
        seen = seen[:, : self.n_keys]
        # Uniform over the seen keys: the largest of iid uniforms restricted to them.
        score = torch.where(seen, rand((batch, self.n_keys), gen), -1.0)
        probe = score.argmax(dim=1)
        return {
            "is_pair": is_pair,
            "slot_keys": slot_keys,
            "table": table,
            "noise": noise,
            "seen": seen,
            "probe": probe,
        }

    def _assemble(self, comp: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        is_pair, keys, table, noise = comp["is_pair"], comp["slot_keys"], comp["table"], comp["noise"]
        probe = comp["probe"]
        b = keys.shape[0]
        first = torch.where(is_pair, keys, noise[:, :, 0])
        second = torch.where(is_pair, table.gather(1, keys) + self.value_offset, noise[:, :, 1])
        answer = table.gather(1, probe.unsqueeze(1)) + self.value_offset
        tail = torch.cat((torch.full_like(answer, self.probe_token), probe.unsqueeze(1), answer), 1)
        stream = torch.cat((interleave(first, second), tail), dim=1)
        inputs, train = stream[:, :-1], stream[:, 1:].clone()
        scored = torch.full_like(inputs, IGNORE)
        scored[:, -1] = answer.squeeze(1)
        assert inputs.shape == (b, self.seq_len)
        return inputs, train, scored

    def _derange(self, comp: dict[str, Any], gen: torch.Generator):
        return derange_component(comp, "table", gen, self.n_values, valid=comp["seen"])

    def _d_args(self) -> tuple[int, float, int]:
        return self.n_slots, 1.0 - self.cfg.frac_noise, self.n_keys

    def floors(self) -> dict[str, float]:
        nv = self.n_values
        return {
            "value_marginal": fl.value_marginal(nv),
            "no_binding": fl.expected_over_distinct_keys(*self._d_args(), lambda d: fl.random_table_value(d, nv)),
            "table": fl.expected_over_distinct_keys(*self._d_args(), fl.table),
        }

    def _decode(self, seq: list[int]) -> dict[int, int]:
        """The final input is the probe key; its answer is the value every earlier pair binds it to."""
        probe = seq[-1]
        assert seq[-2] == self.probe_token
        seen = {seq[t + 1] for t in range(0, len(seq) - 2, 2) if seq[t] == probe}
        if len(seen) != 1:
            raise AssertionError(f"probe key {probe} bound to {sorted(seen)} in one sequence")
        return {len(seq) - 1: seen.pop()}

    def _table_values(self, seq: list[int]) -> list[int]:
        first: dict[int, int] = {}
        for t in range(0, len(seq) - 2, 2):
            if seq[t] < self.n_keys:
                first.setdefault(seq[t], seq[t + 1])
        return list(first.values())
