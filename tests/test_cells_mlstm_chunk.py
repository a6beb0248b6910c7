"""The chunkwise mLSTM states and whitened reads against the per-position loop (float64).

Odd sizes throughout: T not a multiple of the chunk, odd head width, chunk sizes 1 (every
position its own chunk), 4, 8 and one chunk covering everything.
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

import cells
from kernels.mlstm import apply_read, chunked_read, memory_states, memory_states_chunked, rls_read, rls_read_chunked
from kernels.mlstm.reference import _steps
from kernels.mlstm.whitening import newton_schulz, newton_schulz_fused, polar

T, D = 37, 5


def _inputs(b=2, h=3, t=T, d=D, seed=0, gate_scale=1.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, d, generator=g, dtype=torch.float64) for _ in range(3))
    i = torch.randn(b, h, t, generator=g, dtype=torch.float64) * gate_scale
    f = torch.randn(b, h, t, generator=g, dtype=torch.float64) * gate_scale + 2.0
    return [x.to(dtype).requires_grad_(True) for x in (q, k, v, i, f)]


def _loop_all(k, v, i, f):
    cs, ns, ms = zip(*[(c, n, m) for _, c, n, m in _steps(k, v, i, f)])
    return torch.stack(cs, 2), torch.stack(ns, 2), torch.stack(ms, 2)


@pytest.mark.parametrize("chunk", [1, 4, 8, 64])
def test_chunked_states_normalisers_and_stabilisers_equal_the_loop(chunk):
    _, k, v, i, f = _inputs()
    c_ref, n_ref, m_ref = _loop_all(k, v, i, f)
    c, n, m = memory_states_chunked(k, v, i, f, chunk=chunk)
    torch.testing.assert_close(c, c_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(n, n_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(m, m_ref, rtol=1e-10, atol=1e-12)
    # Final states (what a continuation would carry) and every input's gradient.
    weights = [torch.randn_like(x) for x in (c[:, :, -1], n[:, :, -1], m[:, :, -1])]

    def final_loss(cc, nn_, mm):
        return sum((w * x[:, :, -1]).sum() for w, x in zip(weights, (cc, nn_, mm)))

    g_ref = torch.autograd.grad(final_loss(c_ref, n_ref, m_ref), (k, v, i, f))
    g = torch.autograd.grad(final_loss(c, n, m), (k, v, i, f))
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_chunked_states_stay_finite_with_large_gates_in_float32():
    # +-40 input gates overflow exp() without the per-chunk stabiliser.
    _, k, v, i, f = _inputs(gate_scale=40.0, dtype=torch.float32)
    c, n, m = memory_states_chunked(k, v, i, f, chunk=8)
    assert torch.isfinite(c).all() and torch.isfinite(n).all()
    torch.testing.assert_close(c, memory_states(k, v, i, f), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("steps", [0, 1, 5])
def test_fused_newton_schulz_equals_autograd_through_the_iterations(steps):
    g = torch.Generator().manual_seed(2)
    # Non-square too: the fused backward must not assume Dv == Dk.
    for shape in ((3, 4, 5, 5), (2, 7, 3)):
        c = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
        out, ref = newton_schulz_fused(c, steps), newton_schulz(c, steps)
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-13)
        w = torch.randn(out.shape, generator=g, dtype=torch.float64)
        (ga,) = torch.autograd.grad((w * out).sum(), c)
        (gb,) = torch.autograd.grad((w * ref).sum(), c)
        torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-12)


def _reference_read(whiten, q, k, v, i, f):
    return apply_read(whiten(memory_states(k, v, i, f)), q)


def _compare(fast, ref, inputs, start=0, rtol=1e-9, atol=1e-11):
    """Outputs from ``start`` on and every input's gradient of a random projection of them."""
    out, out_ref = fast(*inputs)[:, :, start:], ref(*inputs)[:, :, start:]
    torch.testing.assert_close(out, out_ref, rtol=rtol, atol=atol)
    w = torch.randn_like(out)
    g = torch.autograd.grad((w * out).sum(), inputs)
    g_ref = torch.autograd.grad((w * out_ref).sum(), inputs)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("checkpoint", [False, True])
@pytest.mark.parametrize("steps", [1, 5])
def test_chunked_newton_schulz_read_equals_the_loop(steps, checkpoint):
    whiten = partial(newton_schulz, steps=steps)
    fast = partial(chunked_read, lambda s, qc: apply_read(whiten(s), qc), chunk=8, checkpoint=checkpoint)
    _compare(fast, partial(_reference_read, whiten), _inputs())


@pytest.mark.parametrize("checkpoint", [False, True])
def test_chunked_polar_read_equals_the_loop(checkpoint):
    fast = partial(chunked_read, lambda s, qc: apply_read(polar(s), qc), chunk=8, checkpoint=checkpoint)
    # Before D writes the memory is rank-deficient and which ~1e-16 singular values polar
    # keeps is rounding noise in either form, so compare from position D on (those
    # positions' gradients still reach every earlier input).
    _compare(fast, partial(_reference_read, polar), _inputs(), start=D, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("checkpoint", [False, True])
@pytest.mark.parametrize("lam", [1.0, 0.01])
def test_chunked_rls_read_equals_the_loop(lam, checkpoint):
    fast = partial(rls_read_chunked, lam=lam, chunk=8, checkpoint=checkpoint)
    _compare(fast, partial(rls_read, lam=lam), _inputs(), rtol=1e-8, atol=1e-10)


# polar is left to the function-level test: at T < D every state is rank-deficient, and the
# gradient through the ~1e-16 singular values polar keeps or drops is rounding noise.
@pytest.mark.parametrize("read", ["ns5", "rls", "st_forward"])
def test_mlstm_model_default_path_equals_the_naive_loop(read):
    # Whole model, float64: default impl (chunked) vs naive (loop), outputs and every gradient.
    tokens = torch.randint(0, 11, (2, 19), generator=torch.Generator().manual_seed(3))
    models = {}
    for impl in ("auto", "naive"):
        torch.manual_seed(0)
        models[impl] = cells.build("mlstm", 11, d_model=12, heads=2, read=read, impl=impl).double()
    outs = {impl: m(tokens) for impl, m in models.items()}
    torch.testing.assert_close(outs["auto"], outs["naive"], rtol=1e-7, atol=1e-9)
    for impl, out in outs.items():
        out.square().sum().backward()
    for (name, a), (_, b) in zip(models["auto"].named_parameters(), models["naive"].named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-8, msg=name)


def test_chunk_size_is_validated():
    q, k, v, i, f = _inputs(t=4)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        memory_states_chunked(k, v, i, f, chunk=0)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        chunked_read(lambda s, qc: apply_read(s, qc), q, k, v, i, f, chunk=0)
    assert math.isfinite(float(chunked_read(lambda s, qc: apply_read(s, qc), q, k, v, i, f, chunk=3).sum().detach()))


def test_bench_cells_times_mlstm_read_variants(capsys):
    import json

    from orchestrator.cli import main

    labels = ["mlstm:heads=2", "mlstm:heads=2:read=ns5", "mlstm:heads=2:read=polar", "mlstm:heads=2:read=rls"]
    argv = ["bench", "cells", "--json", "--arms", ",".join(labels), *"--seq-len 9 --d-model 16 --batch 2".split()]
    assert main([*argv, "--repeats", "1"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["arm"] for r in rows] == labels
    for row in rows:
        assert row["naive_tok_s"] > 0 and row["default_tok_s"] > 0
        assert abs(row["speedup_vs_naive"] - row["default_tok_s"] / row["naive_tok_s"]) < 1e-9
        assert abs(row["ceiling_vs_naive"] - row["harness_tok_s"] / row["naive_tok_s"]) < 1e-9
    for bad, msg in (
        ("mlstm:read", "expected ARM:key=value"),
        ("mlstm:impl=naive", "impl is what the bench"),
        ("mlstm:read=bogus", "read"),
        ("nope:read=ns5", "unknown arm 'nope'"),
    ):
        assert main(["bench", "cells", "--arms", bad, "--seq-len", "4", "--batch", "1", "--repeats", "1"]) == 2
        assert msg in capsys.readouterr().err
