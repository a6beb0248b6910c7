"""Haystack retrieval and its collision-key variant (seed 001, §3.3, §5-7), with gap control.

Layout, length ``L`` (``P = n_pairs``, ``N = dense`` queries, ``g`` = gap in pairs)::

    PAD * (L - 2P - 2g - 2N) | k_1 v_1 ... k_P v_P | g distractor pairs | q_1 MASK ... q_N MASK

The maximum gap is ``G = (L - 2P - 2N) // 2``; evaluation is always at ``g = G`` (at most one
leading PAD). Training uses ``g = G`` too unless a fixed ``gap`` or a ``curriculum`` is set:
then ``g ~ U{0..cap}`` per batch, with ``cap`` from the curriculum state (the table slides
right and leading PADs fill the rest, so every sequence has length ``L``).

* ``haystack``: table keys from their own range; distractor keys from a disjoint range
  (lexically distinguishable), distractor values from the value range.
* ``collision``: each decoy pair reuses one of the table's own keys (uniformly) with a fresh
  value; the answer is the *first* (table) binding.

The ``N`` queries are distinct table keys (``dense = N``: dense supervision); every MASK is
supervised and scored. Values are iid uniform over ``n_values`` (chance ``1/54`` by default).

Tokens: table keys ``[0, n_keys)``, [haystack: distractor keys ``[n_keys, n_keys + n_distractor_keys)``],
values (next ``n_values``), ``PAD``, ``MASK``.
"""

from __future__ import annotations

import math
from typing import Any, Literal, cast

import torch
from pydantic import Field

from tasks import floors as fl
from tasks.base import IGNORE, Task
from tasks.config import TaskConfig
from tasks.curriculum import Curriculum, GatedGap, RampGap, UniformGap
from tasks.derangement import derange_component
from tasks.sampling import interleave, randint, random_permutation, sample_distinct


class GapConfig(TaskConfig):
    """Shared parameters of the gap tasks.

    ``L``: sequence length; ``n_pairs``: table bindings; ``dense``: queried pairs per sequence
    (all supervised); ``gap``: fixed training gap in pairs (None: maximum, or the curriculum's);
    ``curriculum``: 'none' | 'uniform' | 'ramp' | 'gated'; ``ramp_start``: the cap's starting
    value (ramp and gated); ``ramp_steps``: steps for the time-based ramp to reach the maximum
    (None: half of the trial's steps); ``gate_threshold``/``gate_every``/``gate_step``/
    ``gate_ema``: the gated ramp's threshold on its running accuracy estimate, steps between
    decisions, cap increment (None: ceil(max_gap / 20)) and the estimate's EMA decay.
    """

    L: int = Field(64, ge=4)
    n_pairs: int = Field(4, ge=1)
    n_keys: int = Field(32, ge=1)
    n_values: int = Field(54, ge=2)
    dense: int = Field(1, ge=1)
    gap: int | None = Field(None, ge=0)
    curriculum: Literal["none", "uniform", "ramp", "gated"] = "none"
    ramp_start: int = Field(0, ge=0)
    ramp_steps: int | None = Field(None, ge=0)
    gate_threshold: float = Field(0.6, gt=0.0, le=1.0)
    gate_every: int = Field(25, ge=1)
    gate_step: int | None = Field(None, ge=1)
    gate_ema: float = Field(0.9, ge=0.0, lt=1.0)

    def max_gap(self) -> int:
        return (self.L - 2 * self.n_pairs - 2 * self.dense) // 2

    def check(self, task: str) -> None:
        if self.n_pairs > self.n_keys:
            raise ValueError(
                f"parameter 'n_pairs' for task {task!r} expects int <= n_keys ({self.n_keys}), got {self.n_pairs}"
            )
        if self.dense > self.n_pairs:
            raise ValueError(
                f"parameter 'dense' for task {task!r} expects int <= n_pairs ({self.n_pairs}), got {self.dense}"
            )
        need = 2 * self.n_pairs + 2 * self.dense
        if self.L < need:
            raise ValueError(
                f"parameter 'L' for task {task!r} expects int >= 2*n_pairs + 2*dense ({need}), got {self.L}"
            )
        if self.gap is not None and self.gap > self.max_gap():
            raise ValueError(
                f"parameter 'gap' for task {task!r} expects int <= max gap {self.max_gap()} (pairs), got {self.gap}"
            )
        if self.gap is not None and self.curriculum != "none":
            raise ValueError(
                f"parameter 'gap' for task {task!r} expects None when curriculum is {self.curriculum!r}, got {self.gap}"
            )
        if self.ramp_start > self.max_gap():
            raise ValueError(
                f"parameter 'ramp_start' for task {task!r} expects int <= max gap "
                f"{self.max_gap()} (pairs), got {self.ramp_start}"
            )


class HaystackConfig(GapConfig):
    n_distractor_keys: int = Field(32, ge=1)


class CollisionConfig(GapConfig):
    pass


class GapTask(Task):
    """Shared generator of ``haystack`` and ``collision``."""

    collision: bool = False
    supervision = "MASK answer positions only (dense: all N)"
    scoring = "every MASK answer position, at the maximum gap"
    cfg: GapConfig

    def __init__(self, cfg: GapConfig) -> None:
        super().__init__(cfg)
        self.P, self.N = cfg.n_pairs, cfg.dense
        self.max_gap = cfg.max_gap()
        # The collision flag says which config this is: only haystack's has distractor keys.
        n_dk = 0 if self.collision else cast(HaystackConfig, cfg).n_distractor_keys
        self.distractor_offset = cfg.n_keys
        self.value_offset = cfg.n_keys + n_dk
        self.pad_token = self.value_offset + cfg.n_values
        self.mask_token = self.pad_token + 1
        self.vocab_size = self.mask_token + 1
        self.value_range = (self.value_offset, self.pad_token)
        self.seq_len = cfg.L

    # ---- layout ---------------------------------------------------------------------------------
    def _train_layout(self, curriculum_state: dict | None, gen: torch.Generator) -> int:
        if curriculum_state is None:
            return self.max_gap if self.cfg.gap is None else self.cfg.gap
        cap = int(curriculum_state["cap"])
        if not 0 <= cap <= self.max_gap:
            raise ValueError(f"curriculum cap {cap} outside [0, {self.max_gap}]")
        # One gap per batch (the seed protocol), drawn from the trial's own stream.
        return int(randint(cap + 1, (1,), gen).item())

    def _eval_layout(self) -> int:
        return self.max_gap

    def _sample(self, batch: int, gen: torch.Generator, gap: int) -> dict[str, Any]:
        keys = sample_distinct(batch, self.cfg.n_keys, self.P, gen)
        values = randint(self.cfg.n_values, (batch, self.P), gen)
        if self.collision:
            slot = randint(self.P, (batch, gap), gen)
            d_keys = keys.gather(1, slot)
        else:
            d_keys = (
                randint(cast(HaystackConfig, self.cfg).n_distractor_keys, (batch, gap), gen) + self.distractor_offset
            )
        d_values = randint(self.cfg.n_values, (batch, gap), gen)
        query = random_permutation(batch, self.P, gen)[:, : self.N]
        return {"keys": keys, "values": values, "d_keys": d_keys, "d_values": d_values, "query": query, "gap": gap}

    def _assemble(self, comp: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keys, values, query, gap = comp["keys"], comp["values"], comp["query"], comp["gap"]
        b = keys.shape[0]
        n_pad = self.seq_len - 2 * self.P - 2 * gap - 2 * self.N
        pad = torch.full((b, n_pad), self.pad_token, dtype=torch.long, device=keys.device)
        table = interleave(keys, values + self.value_offset)
        hay = interleave(comp["d_keys"], comp["d_values"] + self.value_offset)
        queries = interleave(keys.gather(1, query), torch.full_like(query, self.mask_token))
        inputs = torch.cat((pad, table, hay, queries), dim=1)
        targets = torch.full_like(inputs, IGNORE)
        targets[:, self.seq_len - 2 * self.N + 1 :: 2] = values.gather(1, query) + self.value_offset
        return inputs, targets, targets

    def _derange(self, comp: dict[str, Any], gen: torch.Generator):
        return derange_component(comp, "values", gen, self.cfg.n_values)

    # ---- floors, curricula --------------------------------------------------------------------
    def floors(self) -> dict[str, float]:
        out = {
            "value_marginal": fl.value_marginal(self.cfg.n_values),
            "no_binding": fl.random_table_value(self.P, self.cfg.n_values),
            "table": fl.table(self.P),
        }
        if self.collision:
            out["positional"] = fl.random_table_value(self.P, self.cfg.n_values)
        return out

    def curriculum(self, total_steps: int) -> Curriculum | None:
        c = self.cfg
        if c.curriculum == "uniform":
            return UniformGap(self.max_gap)
        if c.curriculum == "ramp":
            steps = c.ramp_steps if c.ramp_steps is not None else max(1, int(total_steps) // 2)
            return RampGap(self.max_gap, c.ramp_start, steps)
        if c.curriculum == "gated":
            step = c.gate_step if c.gate_step is not None else max(1, math.ceil(self.max_gap / 20))
            return GatedGap(
                self.max_gap, c.ramp_start, threshold=c.gate_threshold, every=c.gate_every, step=step, ema=c.gate_ema
            )
        return None

    def _decode(self, seq: list[int]) -> dict[int, int]:
        """The answer is the value after the key's FIRST occurrence (the table's binding)."""
        out = {}
        for t, tok in enumerate(seq):
            if tok == self.mask_token:
                key = seq[t - 1]
                first = next(i for i in range(t - 1) if seq[i] == key)
                out[t] = seq[first + 1]
        return out

    def _table_values(self, seq: list[int]) -> list[int]:
        start = next(i for i, tok in enumerate(seq) if tok != self.pad_token)
        return seq[start + 1 : start + 2 * self.P : 2]


class Haystack(GapTask):
    """Haystack: 4 pairs, a haystack of lexically distinct distractor pairs, the query at the end."""

    name = "haystack"
    Config = HaystackConfig
    collision = False
    small = {"L": 48, "dense": 2}


class Collision(GapTask):
    """Collision-key: decoy pairs reuse the table's own keys; the answer is the first binding."""

    name = "collision"
    Config = CollisionConfig
    collision = True
    small = {"L": 48}
