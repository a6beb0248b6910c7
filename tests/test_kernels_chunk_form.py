"""The chunk form of every recurrence operator (delta rule, DPLR scan, SSD scan), checked the
same way for each: against the naive reference in fp64 on odd shapes (T = 37, Dk = 6, Dv = 5,
chunk sizes that do not divide T) in output, final state and every input gradient, on both
of its paths (factorised decays and explicit segment products); one chunked pass equal to
two with the state carried; fp32 close to the fp64 reference; bf16 inputs close to fp32.

Each operator's own checks (its reference against an independent form, its special cases,
its shape errors) are in ``test_kernels.py`` (and the dispatcher), ``test_kernels_dplr.py``
and ``test_kernels_ssd.py``.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.chunking import factorable
from kernels.delta_rule import delta_rule_chunk, delta_rule_naive
from kernels.dplr import dplr_scan_chunk, dplr_scan_naive
from kernels.ssd import ssd_scan_chunk, ssd_scan_naive
from kernels.testing import ARG_NAMES, assert_matches_reference, make_inputs, max_abs_differences, run_with_grads

B, H, T, DK, DV = 2, 3, 37, 6, 5  # for the SSD scan, DK and DV are its N and P
TOL = 1e-8  # fp64 chunk form against the fp64 reference

# Each operator's reference and chunk form.
FORMS = {
    "delta_rule": (delta_rule_naive, delta_rule_chunk),
    "dplr_scan": (dplr_scan_naive, dplr_scan_chunk),
    "ssd_scan": (ssd_scan_naive, ssd_scan_chunk),
}
# The operators and their variants: the delta rule with and without its decay alpha.
VARIANTS = [
    pytest.param("delta_rule", False, id="delta_rule"),
    pytest.param("delta_rule", True, id="gated_delta_rule"),
    pytest.param("dplr_scan", True, id="dplr_scan"),
    pytest.param("ssd_scan", True, id="ssd_scan"),
]


@pytest.mark.parametrize("chunk_size", [1, 5, 8, 16, 64])
@pytest.mark.parametrize("op, gated", VARIANTS)
@pytest.mark.parametrize("with_state", [False, True])
def test_chunk_matches_naive_outputs_state_and_all_gradients(op, gated, with_state, chunk_size):
    """Output, final state and the gradient of every input given (the initial state too,
    when there is one) equal the reference's within ``TOL``."""
    x = make_inputs(op, B, H, T, DK, DV, gated=gated, with_state=with_state, seed=chunk_size)
    expected = {"out", "state"} | {f"grad_{n}" for n, t in x.items() if t is not None}
    naive, chunk = FORMS[op]
    assert_matches_reference(naive, chunk, op, x, expected, TOL, chunk_size=chunk_size)


@pytest.mark.parametrize("chunk_size", [4, 16])
@pytest.mark.parametrize(
    "op, decay, zero_at, tiny_at, seed",
    [
        # alpha = 0 (a full reset) and 1e-200 defeat the g_t / g_s factorisation.
        ("delta_rule", "alpha", (0, 1, 10), (1, 2, slice(3, 6)), 3),
        # w = 0 in one channel and 1e-200 in a whole step defeat the D0[t] / D0[s] factorisation.
        ("dplr_scan", "w", (0, 1, 10, 2), (1, 2, 3), 11),
        ("ssd_scan", "a", (0, 1, 10), (1, 2, slice(3, 6)), 21),
    ],
    ids=["delta_rule", "dplr_scan", "ssd_scan"],
)
def test_chunk_exact_when_decays_are_zero_or_tiny(op, decay, zero_at, tiny_at, seed, chunk_size):
    """The decay set to 0 at ``zero_at`` and to 1e-200 at ``tiny_at``: its cumulative
    products along time can no longer be factorised, and the chunk form's segment-product
    path must take over and match the reference in output, state and every gradient."""
    x = make_inputs(op, B, H, T, DK, DV, with_state=True, seed=seed)
    with torch.no_grad():
        x[decay][zero_at] = 0.0
        x[decay][tiny_at] = 1e-200
    assert not factorable(torch.cumprod(x[decay].detach(), dim=2))  # [B, H, T] or [B, H, T, D]
    naive, chunk = FORMS[op]
    ref = run_with_grads(naive, op, x)
    got = run_with_grads(chunk, op, x, chunk_size=chunk_size)
    diffs = max_abs_differences(got, ref)
    assert max(diffs.values()) <= TOL, diffs


@pytest.mark.parametrize(
    "op, gated, seed, split",
    [
        (op, gated, seed, split)
        for op, gated, seed, splits in [
            ("delta_rule", False, 5, (16, 19)),
            ("delta_rule", True, 5, (16, 19)),
            ("dplr_scan", True, 14, (16, 21)),
            ("ssd_scan", True, 23, (16, 23)),
        ]
        for split in splits
    ],
)
def test_chunk_state_carry_equals_one_pass(op, gated, seed, split):
    """The chunk form over the whole sequence equals two passes split at ``split`` along
    time, the second starting from the first's final state."""
    x = make_inputs(op, B, H, T, DK, DV, gated=gated, with_state=True, seed=seed, requires_grad=False)
    fn, args, state0 = getattr(kernels, op), [x[n] for n in ARG_NAMES[op]], x["initial_state"]

    def part(lo: int | None, hi: int | None) -> list[torch.Tensor | None]:
        return [None if a is None else a[:, :, lo:hi] for a in args]

    full_o, full_s = fn(*args, impl="chunk", initial_state=state0, chunk_size=8)
    o1, s1 = fn(*part(None, split), impl="chunk", initial_state=state0, chunk_size=8)
    o2, s2 = fn(*part(split, None), impl="chunk", initial_state=s1, chunk_size=8)
    torch.testing.assert_close(torch.cat([o1, o2], dim=2), full_o, rtol=0, atol=1e-12)
    torch.testing.assert_close(s2, full_s, rtol=0, atol=1e-12)


@pytest.mark.parametrize("op, seed", [("delta_rule", 6), ("dplr_scan", 15)])
def test_fp32_chunk_close_to_fp64_naive(op, seed):
    """The chunk form in fp32 within 2e-4 (relative to the magnitude) of the fp64 reference."""
    x64 = make_inputs(op, B, H, 64, 16, 16, with_state=True, seed=seed)
    x32 = make_inputs(op, B, H, 64, 16, 16, with_state=True, seed=seed, dtype=torch.float32)
    ref = run_with_grads(FORMS[op][0], op, x64)
    got = run_with_grads(getattr(kernels, op), op, x32, impl="chunk")
    assert got["out"].dtype == torch.float32 and got["state"].dtype == torch.float32
    for key, diff in max_abs_differences(got, ref).items():
        assert diff <= 2e-4 * max(1.0, ref[key].abs().max().item()), (key, diff)


@pytest.mark.parametrize("impl", ["naive", "chunk"])
@pytest.mark.parametrize("op, seed", [("delta_rule", 7), ("dplr_scan", 16), ("ssd_scan", 24)])
def test_bf16_inputs_run_forward_backward_close_to_fp32(op, seed, impl):
    """bf16 inputs run forward and backward within 2e-2 (relative) of the same inputs in fp32;
    the output stays bf16, the carried state fp32 (the compute dtype), and the gradient of the
    first input bf16."""
    fn = getattr(kernels, op)
    x16 = make_inputs(op, 2, 2, 40, 16, 16, with_state=True, seed=seed, dtype=torch.bfloat16)
    x32 = {n: None if t is None else t.detach().float().requires_grad_() for n, t in x16.items()}
    got = run_with_grads(fn, op, x16, impl=impl, chunk_size=16)
    ref = run_with_grads(fn, op, x32, impl=impl, chunk_size=16)
    assert got["out"].dtype == torch.bfloat16 and got["state"].dtype == torch.float32
    assert got[f"grad_{ARG_NAMES[op][0]}"].dtype == torch.bfloat16
    for key in ref:
        scale = ref[key].abs().max().item()
        # Inputs are bf16 already, so only the output rounding and the bf16 gradients differ.
        assert (got[key].float() - ref[key]).abs().max().item() <= 2e-2 * max(scale, 1.0), key
