"""Slow reference decoders: read one token sequence and compute its answers from scratch.

Each decoder sees only the tokens of one sequence and the task's documented token ranges; it
shares no code with the vectorised generators, so agreement between ``decode(task, seq)`` and
the generator's targets checks the generator (and the rebinding control: a rebound sequence's
answers must all differ from the original targets). Returns ``{position: answer_token}`` for
every position the task scores at evaluation (``scored``) -- for MAD training targets are
checked separately as the next token.
"""

from __future__ import annotations

from collections.abc import Sequence

from tasks.base import Task
from tasks.haystack import GapTask
from tasks.mad import MADRecall
from tasks.mqar import MQAR
from tasks.s5 import S5, elements
from tasks.scaling import ARScaling, MQARScaling


def _first_binding(seq: Sequence[int], end: int, is_key) -> dict[int, int]:
    """Map each key to the token after its first occurrence before ``end``."""
    table: dict[int, int] = {}
    for t in range(end - 1):
        if is_key(seq[t]) and seq[t] not in table:
            table[seq[t]] = seq[t + 1]
    return table


def decode_mqar(task: MQAR, seq: Sequence[int]) -> dict[int, int]:
    table = _first_binding(seq, 2 * task.K, lambda tok: tok < task.cfg.n_keys)
    return {t: table[seq[t - 1]] for t in range(2 * task.K, len(seq)) if seq[t] == task.mask_token}


def decode_gap(task: GapTask, seq: Sequence[int]) -> dict[int, int]:
    """Haystack and collision: the answer is the value after the key's FIRST occurrence."""
    out = {}
    for t, tok in enumerate(seq):
        if tok == task.mask_token:
            key = seq[t - 1]
            first = next(i for i in range(t - 1) if seq[i] == key)
            out[t] = seq[first + 1]
    return out


def decode_s5(task: S5, seq: Sequence[int]) -> dict[int, int]:
    els = elements()
    index = {p: i for i, p in enumerate(els)}
    prod = tuple(range(5))
    answers = {}
    depth = 0
    for t, tok in enumerate(seq):
        if tok == task.mask_token:
            depth += 1
            if task.cfg.score == "all" and depth >= 2 or t == len(seq) - 1:
                answers[t] = index[prod]
        else:
            g = els[tok]
            prod = tuple(prod[g[i]] for i in range(5))  # prod * g: apply g first
    return answers


def decode_mad(task: MADRecall, seq: Sequence[int]) -> dict[int, int]:
    """The final input is the probe key; its answer is the value every earlier pair binds it to."""
    probe = seq[-1]
    assert seq[-2] == task.probe_token
    seen = {seq[t + 1] for t in range(0, len(seq) - 2, 2) if seq[t] == probe}
    if len(seen) != 1:
        raise AssertionError(f"probe key {probe} bound to {sorted(seen)} in one sequence")
    return {len(seq) - 1: seen.pop()}


def decode_scaling(task: ARScaling | MQARScaling, seq: Sequence[int]) -> dict[int, int]:
    n_ctx = 2 * task.Nf
    table = {seq[t]: seq[t + 1] for t in range(0, n_ctx, 2)}
    return {t: table[seq[t]] for t in range(n_ctx, len(seq)) if seq[t] != 0}


def decode(task: Task, seq: Sequence[int]) -> dict[int, int]:
    """``{position: answer}`` at every scored position of one sequence of ``task``."""
    seq = list(seq)
    if isinstance(task, MQAR):
        return decode_mqar(task, seq)
    if isinstance(task, GapTask):
        return decode_gap(task, seq)
    if isinstance(task, S5):
        return decode_s5(task, seq)
    if isinstance(task, MADRecall):
        return decode_mad(task, seq)
    if isinstance(task, (ARScaling, MQARScaling)):
        return decode_scaling(task, seq)
    raise TypeError(f"no reference decoder for {type(task).__name__}")


def table_values(task: Task, seq: Sequence[int]) -> list[int]:
    """The values of the table's bindings, in slot order (for the multiset check); MAD: the
    value bound to each distinct key, in order of the key's first use."""
    seq = list(seq)
    if isinstance(task, MQAR):
        return seq[1 : 2 * task.K : 2]
    if isinstance(task, GapTask):
        start = next(i for i, tok in enumerate(seq) if tok != task.pad_token)
        return seq[start + 1 : start + 2 * task.P : 2]
    if isinstance(task, (ARScaling, MQARScaling)):
        return seq[1 : 2 * task.Nf : 2]
    if isinstance(task, MADRecall):
        first: dict[int, int] = {}
        for t in range(0, len(seq) - 2, 2):
            if seq[t] < task.n_keys:
                first.setdefault(seq[t], seq[t + 1])
        return list(first.values())
    raise TypeError(f"no table for {type(task).__name__}")
