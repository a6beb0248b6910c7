"""Training-speed benchmark of the arms: naive recurrence vs the default path, side by side.

For each arm two models are built from the same seed, one with ``impl="naive"`` (a Python
loop over time) and one with the arm's default ``impl`` ("auto"). A timed call is one
forward + backward of a cross-entropy loss on a fixed random batch (gradients zeroed in
between, no optimizer). Rounds interleave every (arm, impl) pair, so drift in machine load
hits all of them alike; each figure is the median over rounds, in tokens per second
(``batch * seq_len / seconds``). ``clock="cpu"`` times the thread's CPU seconds instead of
wall seconds (one torch thread only): on a machine other work shares, the ratios then measure
the work each path does rather than how often it was scheduled out.

Each row also times the *harness*: the default model with every mixer replaced by the
identity (embedding, norms, MLPs, readout and the loss, nothing recurrent). ``ceiling_vs_naive``
is the naive time over the harness time: the speedup a mixer that cost nothing would give,
an upper bound no mixer optimisation can pass on that machine.

An arm may carry knobs as ``ARM:key=value:key=value`` (values read as YAML scalars), e.g.
``mlstm:read=ns5:heads=2``, so one run can time several variants of one arm; the row's
``arm`` is that label.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from cells.harness import SequenceModel
from cells.registry import build, knobs


class _FreeMixer(torch.nn.Module):
    """Stands in for a mixer at zero cost: the block then computes everything but the recurrence."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def harness_of(model: SequenceModel) -> SequenceModel:
    """A copy of ``model`` whose every block's mixer is the identity."""
    import copy

    harness = copy.deepcopy(model)
    for block in harness.blocks:
        block.mixer = _FreeMixer()
    return harness


def bench_arms() -> tuple[str, ...]:
    """Arms with an ``impl`` knob (every arm whose mixer has a naive form)."""
    from cells.registry import ARMS

    return tuple(a for a in ARMS if "impl" in knobs(a))


def parse_variant(label: str) -> tuple[str, dict[str, Any]]:
    """``"mlstm:read=ns5:heads=2"`` -> ``("mlstm", {"read": "ns5", "heads": 2})``; ValueError if malformed."""
    import yaml

    arm, *pairs = label.split(":")
    knobs_: dict[str, Any] = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"arm variant {label!r}: expected ARM:key=value[:key=value...], got {pair!r}")
        if key.strip() == "impl":
            raise ValueError(f"arm variant {label!r}: impl is what the bench varies, not a variant knob")
        knobs_[key.strip()] = yaml.safe_load(raw)
    return arm.strip(), knobs_


CLOCKS = ("wall", "cpu")


def _clock(clock: str, device: torch.device):
    """``wall``: elapsed time. ``cpu``: this thread's CPU time, which other processes on a
    shared machine do not inflate; valid only for one torch thread on the CPU (work done by
    other threads would go uncounted), so it is refused otherwise."""
    if clock not in CLOCKS:
        raise ValueError(f"clock {clock!r}: expected one of {', '.join(CLOCKS)}")
    if clock == "wall":
        return time.perf_counter
    if device.type != "cpu" or torch.get_num_threads() != 1:
        raise ValueError("--clock cpu times one thread: use it with --device cpu --threads 1")
    return time.thread_time


def _step(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor, device: torch.device, now=None) -> float:
    now = now or time.perf_counter
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = now()
    logits = model(tokens)
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return now() - start


def run_bench(
    arms: Sequence[str],
    *,
    seq_len: int = 256,
    d_model: int = 32,
    n_layers: int = 1,
    batch: int = 8,
    vocab_size: int = 91,
    repeats: int = 5,
    warmup: int = 1,
    device: str | torch.device = "cpu",
    seed: int = 0,
    clock: str = "wall",
) -> list[dict[str, Any]]:
    """Rows ``{arm, naive_tok_s, default_tok_s, speedup_vs_naive, harness_tok_s, ceiling_vs_naive}``
    in the order of ``arms`` (tokens per second of the chosen ``clock``; see the module docstring)."""
    device = torch.device(device)
    now = _clock(clock, device)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (batch, seq_len), generator=gen).to(device)
    targets = torch.randint(0, vocab_size, (batch, seq_len), generator=gen).to(device)
    models: dict[tuple[str, str], SequenceModel] = {}
    variants = {arm: parse_variant(arm) for arm in arms}
    for arm, (base, extra) in variants.items():
        default_impl = knobs(base)["impl"]
        for label, impl in (("naive", "naive"), ("default", default_impl)):
            torch.manual_seed(seed)
            models[(arm, label)] = build(base, vocab_size, d_model=d_model, n_layers=n_layers, impl=impl, **extra).to(
                device
            )
        models[(arm, "harness")] = harness_of(models[(arm, "default")])
    for key, model in models.items():
        for _ in range(warmup):
            _step(model, tokens, targets, device)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in models}
    keys = list(models)
    for r in range(repeats):
        # Alternate the order each round so neither impl always runs right after the other.
        for key in keys if r % 2 == 0 else keys[::-1]:
            times[key].append(_step(models[key], tokens, targets, device, now))
    rows = []
    for arm in arms:
        naive, default, harness = (
            batch * seq_len / statistics.median(times[(arm, k)]) for k in ("naive", "default", "harness")
        )
        rows.append(
            {
                "arm": arm,
                "naive_tok_s": naive,
                "default_tok_s": default,
                "speedup_vs_naive": default / naive,
                "harness_tok_s": harness,
                "ceiling_vs_naive": harness / naive,
            }
        )
    return rows
