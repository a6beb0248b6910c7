"""S5 word problem: running products over the symmetric group (seed 001, §3.3, §8).

Elements are the 120 permutations of ``(0, 1, 2, 3, 4)`` in lexicographic order
(``itertools.permutations``); element ``e`` is token ``e``, ``MASK`` is token 120.
Composition convention: ``(a * b)[i] = a[b[i]]`` (apply ``b`` first), and the product slot
after generator ``g_t`` holds ``p_t = g_1 * g_2 * ... * g_t``.

Layout, ``T = 2 * depth``::

    g_1 MASK g_2 MASK ... g_depth MASK

Generators are uniform over the full group, so every ``p_t`` is uniform (answer marginal
exactly 1/120 at every depth). All product slots are MASK at once (one parallel fill): no
answer token is visible to any other. Training supervises every slot; eval scores the final
slot (``score='final'``) or every slot of depth >= 2 (``score='all'``; depth 1 is a copy of a
visible token, so it is never scored).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Literal

import torch
from pydantic import Field

from tasks import floors as fl
from tasks.base import IGNORE, Task
from tasks.config import TaskConfig
from tasks.sampling import interleave, randint

ORDER = 120


@functools.lru_cache(maxsize=1)
def elements() -> tuple[tuple[int, ...], ...]:
    """The group elements, index = token."""
    return tuple(itertools.permutations(range(5)))


@functools.lru_cache(maxsize=1)
def _table_cpu() -> torch.Tensor:
    els = elements()
    index = {p: i for i, p in enumerate(els)}
    flat = [index[tuple(a[b[i]] for i in range(5))] for a in els for b in els]
    return torch.tensor(flat, dtype=torch.long)


def multiplication_table(device: str | torch.device = "cpu") -> torch.Tensor:
    """Flat ``(120*120,)`` int64: entry ``a*120 + b`` is the token of ``a * b``."""
    return _table_cpu().to(device)


class S5Config(TaskConfig):
    """``depth``: generators per sequence; ``score``: 'final' | 'all' (eval positions)."""

    depth: int = Field(8, ge=2)
    score: Literal["final", "all"] = "final"


class S5(Task):
    """S5 word problem: running products of uniform generators, all product slots masked."""

    name = "s5"
    Config = S5Config
    cfg: S5Config
    supervision = "every product slot (MASK positions)"
    scoring = "the final product slot ('final') or every slot of depth >= 2 ('all')"
    has_rebinding = False
    small = {"depth": 6, "score": "all"}

    def __init__(self, cfg: S5Config) -> None:
        super().__init__(cfg)
        self.depth = cfg.depth
        self.mask_token = ORDER
        self.vocab_size = ORDER + 1
        self.seq_len = 2 * cfg.depth
        self._tables: dict[torch.device, torch.Tensor] = {}

    def _table(self, device: torch.device) -> torch.Tensor:
        if device not in self._tables:
            self._tables[device] = multiplication_table(device)
        return self._tables[device]

    def _sample(self, batch: int, gen: torch.Generator, layout: Any) -> dict[str, Any]:
        return {"gens": randint(ORDER, (batch, self.depth), gen)}

    def _assemble(self, comp: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gens = comp["gens"]
        mul = self._table(gens.device)
        prods = torch.empty_like(gens)
        p = gens[:, 0]
        prods[:, 0] = p
        for t in range(1, self.depth):  # a loop over depth, not over sequences
            p = mul[p * ORDER + gens[:, t]]
            prods[:, t] = p
        inputs = interleave(gens, torch.full_like(gens, self.mask_token))
        train = torch.full_like(inputs, IGNORE)
        train[:, 1::2] = prods
        scored = torch.full_like(inputs, IGNORE)
        if self.cfg.score == "final":
            scored[:, -1] = prods[:, -1]
        else:
            scored[:, 3::2] = prods[:, 1:]
        return inputs, train, scored

    def floors(self) -> dict[str, float]:
        return {"value_marginal": fl.value_marginal(ORDER)}

    def _decode(self, seq: list[int]) -> dict[int, int]:
        els = elements()
        index = {p: i for i, p in enumerate(els)}
        prod = tuple(range(5))
        answers = {}
        depth = 0
        for t, tok in enumerate(seq):
            if tok == self.mask_token:
                depth += 1
                if self.cfg.score == "all" and depth >= 2 or t == len(seq) - 1:
                    answers[t] = index[prod]
            else:
                g = els[tok]
                prod = tuple(prod[g[i]] for i in range(5))  # prod * g: apply g first
        return answers
