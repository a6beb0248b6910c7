"""The checks every recurrence operator's tests make the same way (delta rule, DPLR scan, SSD
scan): the chunk form exact where its decay factorisation fails, one chunked pass equal to two
with the state carried, fp32 close to the fp64 reference, bf16 inputs close to fp32."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kernels.chunking import factorable
from kernels.testing import assert_matches_reference, max_abs_differences, run_with_grads

TOL = 1e-8  # fp64 chunk form against the fp64 reference


def assert_chunk_matches_naive(
    op: str, naive: Callable, chunk: Callable, x: dict, grads: Sequence[str], chunk_size: int
) -> None:
    """Output, final state and the gradient of every input in ``grads`` (and of the initial
    state when ``x`` has one) of the chunk form equal the reference's within ``TOL``."""
    expected = {"out", "state"} | {f"grad_{n}" for n in grads}
    expected |= {"grad_initial_state"} if x.get("initial_state") is not None else set()
    assert_matches_reference(naive, chunk, op, x, expected, TOL, chunk_size=chunk_size)


def assert_exact_on_unfactorable_decays(
    op: str, naive: Callable, chunk: Callable, x: dict, decay: str, zero_at: tuple, tiny_at: tuple, chunk_size: int
) -> None:
    """Set ``x[decay]`` to 0 at ``zero_at`` and to 1e-200 at ``tiny_at``: its cumulative
    products along time can no longer be factorised, and the chunk form's segment-product
    path must match the reference in output, state and every gradient."""
    with torch.no_grad():
        x[decay][zero_at] = 0.0
        x[decay][tiny_at] = 1e-200
    assert not factorable(torch.cumprod(x[decay].detach(), dim=2))  # [B, H, T] or [B, H, T, D]
    ref = run_with_grads(naive, op, x)
    got = run_with_grads(chunk, op, x, chunk_size=chunk_size)
    diffs = max_abs_differences(got, ref)
    assert max(diffs.values()) <= TOL, diffs


def assert_state_carry_equals_one_pass(
    fn: Callable, args: Sequence[torch.Tensor | None], initial_state: torch.Tensor, split: int
) -> None:
    """``fn`` (chunk form) over the whole sequence equals two passes split at ``split``
    along time, the second starting from the first's final state."""

    def part(lo: int | None, hi: int | None) -> list[torch.Tensor | None]:
        return [None if a is None else a[:, :, lo:hi] for a in args]

    full_o, full_s = fn(*args, impl="chunk", initial_state=initial_state, chunk_size=8)
    o1, s1 = fn(*part(None, split), impl="chunk", initial_state=initial_state, chunk_size=8)
    o2, s2 = fn(*part(split, None), impl="chunk", initial_state=s1, chunk_size=8)
    torch.testing.assert_close(torch.cat([o1, o2], dim=2), full_o, rtol=0, atol=1e-12)
    torch.testing.assert_close(s2, full_s, rtol=0, atol=1e-12)


def assert_fp32_chunk_close_to_fp64(op: str, naive: Callable, fn: Callable, x64: dict, x32: dict) -> None:
    """The chunk form in fp32 within 2e-4 (relative to the magnitude) of the fp64 reference."""
    ref = run_with_grads(naive, op, x64)
    got = run_with_grads(fn, op, x32, impl="chunk")
    assert got["out"].dtype == torch.float32 and got["state"].dtype == torch.float32
    for key, diff in max_abs_differences(got, ref).items():
        assert diff <= 2e-4 * max(1.0, ref[key].abs().max().item()), (key, diff)


def assert_bf16_close_to_fp32(op: str, fn: Callable, x16: dict, impl: str) -> dict:
    """bf16 inputs run forward and backward within 2e-2 (relative) of the same inputs in fp32;
    the output stays bf16 and the carried state fp32 (the compute dtype). Returns the bf16 run."""
    x32 = {n: None if t is None else t.detach().float().requires_grad_() for n, t in x16.items()}
    got = run_with_grads(fn, op, x16, impl=impl, chunk_size=16)
    ref = run_with_grads(fn, op, x32, impl=impl, chunk_size=16)
    assert got["out"].dtype == torch.bfloat16 and got["state"].dtype == torch.float32
    for key in ref:
        scale = ref[key].abs().max().item()
        # Inputs are bf16 already, so only the output rounding and the bf16 gradients differ.
        assert (got[key].float() - ref[key]).abs().max().item() <= 2e-2 * max(scale, 1.0), key
    return got
