"""The mLSTM's memory, its reads, and its hooks, each against an independent computation."""

from __future__ import annotations

import math

import pytest
import torch

import cells
from kernels.mlstm import memory_states, raw_read_loop, raw_read_parallel, rls_read, rls_read_recursive
from kernels.mlstm.whitening import frobenius_normalize, newton_schulz, polar


def _inputs(b=2, h=2, t=9, d=5, seed=0, gate_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, d, generator=g, dtype=torch.float64) for _ in range(3))
    i = torch.randn(b, h, t, generator=g, dtype=torch.float64) * gate_scale
    f = torch.randn(b, h, t, generator=g, dtype=torch.float64) * gate_scale + 2.0
    return q, k, v, i, f


def _true_weights(i, f):
    """g[t, s] = exp(F_t - F_s + i_s) for s <= t (unstabilised), and G_t = exp(F_t)."""
    cum = torch.nn.functional.logsigmoid(f).cumsum(-1)
    t = i.shape[-1]
    w = torch.exp(cum[..., :, None] - cum[..., None, :] + i[..., None, :])
    return w * torch.ones(t, t, dtype=torch.bool).tril(), torch.exp(cum)


def test_raw_read_matches_the_unstabilised_definition():
    q, k, v, i, f = _inputs()
    ks = k / math.sqrt(k.shape[-1])
    g, _ = _true_weights(i, f)
    c = torch.einsum("bhts,bhsv,bhsk->bhtvk", g, v, ks)
    n = torch.einsum("bhts,bhsk->bhtk", g, ks)
    num = torch.einsum("bhtvk,bhtk->bhtv", c, q)
    # Stabilised denominator max(|n~ q|, exp(-m)) is exp(-m) * max(|n q|, 1) in the true frame.
    den = torch.maximum((n * q).sum(-1).abs(), torch.ones(()))
    expected = num / den.unsqueeze(-1)
    torch.testing.assert_close(raw_read_loop(q, k, v, i, f), expected, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(raw_read_parallel(q, k, v, i, f), expected, rtol=1e-5, atol=1e-8)


def test_parallel_and_loop_raw_reads_agree_with_large_gates():
    # Input-gate pre-activations of +-40 overflow exp() in float32 without the stabiliser.
    q, k, v, i, f = _inputs(t=23, gate_scale=40.0)
    q, k, v, i, f = (x.float() for x in (q, k, v, i, f))
    a, b = raw_read_parallel(q, k, v, i, f), raw_read_loop(q, k, v, i, f)
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_memory_states_are_the_scaled_memory():
    q, k, v, i, f = _inputs()
    states = memory_states(k, v, i, f)
    g, _ = _true_weights(i, f)
    c = torch.einsum("bhts,bhsv,bhsk->bhtvk", g, v, k / math.sqrt(k.shape[-1]))
    # Same matrices up to the per-step positive scale exp(-m_t).
    scale = (states * c).sum((-1, -2)) / (c * c).sum((-1, -2))
    assert (scale > 0).all()
    torch.testing.assert_close(states, c * scale[..., None, None], rtol=1e-9, atol=1e-12)


def test_newton_schulz_tends_to_polar():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(4, 6, 6, generator=g, dtype=torch.float64) + 3 * torch.eye(6, dtype=torch.float64)
    p = polar(a)
    errors = [(newton_schulz(a, k) - p).abs().max().item() for k in (0, 2, 5, 10, 20, 40)]
    # Strictly shrinking until it reaches machine precision.
    assert all(e1 > e2 or e2 < 1e-13 for e1, e2 in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-10
    # ns0 is plain Frobenius normalisation.
    torch.testing.assert_close(newton_schulz(a, 0), a / torch.linalg.matrix_norm(a, keepdim=True))
    # Rank-deficient memory (early steps): the iteration tends to the partial isometry polar
    # returns. (Only "tends": rounding noise in the null space, ~1e-16, grows 1.5x per step,
    # so after ~90 steps it would be whitened too; 30 steps converge the range and leave it.)
    low = torch.randn(5, 2, generator=g, dtype=torch.float64) @ torch.randn(2, 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(newton_schulz(low, 30), polar(low), rtol=0, atol=1e-9)


def test_polar_is_the_orthogonal_factor():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(3, 7, 7, generator=g, dtype=torch.float64)
    u = polar(a)
    eye = torch.eye(7, dtype=torch.float64)
    torch.testing.assert_close(u.transpose(-1, -2) @ u, eye.expand(3, 7, 7), rtol=0, atol=1e-10)
    hmat = u.transpose(-1, -2) @ a  # A = U H with H symmetric positive definite
    torch.testing.assert_close(hmat, hmat.transpose(-1, -2), rtol=0, atol=1e-10)
    assert (torch.linalg.eigvalsh(hmat) > 0).all()


def test_polar_gradient():
    g = torch.Generator().manual_seed(3)
    a = (torch.randn(2, 5, 5, generator=g, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(polar, (a,), eps=1e-6, atol=1e-6)
    # Against autograd through the SVD (fine here: distinct singular values).
    w = torch.randn(2, 5, 5, generator=g, dtype=torch.float64)
    (ga,) = torch.autograd.grad((polar(a) * w).sum(), a)
    u_, _, vh_ = torch.linalg.svd(a)
    (gb,) = torch.autograd.grad(((u_ @ vh_) * w).sum(), a)
    torch.testing.assert_close(ga, gb, rtol=1e-8, atol=1e-10)
    # Repeated singular values (where autograd through svd is undefined) stay finite.
    rep = torch.eye(4, dtype=torch.float64).requires_grad_()
    (gr,) = torch.autograd.grad((polar(rep) * torch.randn(4, 4, dtype=torch.float64)).sum(), rep)
    assert torch.isfinite(gr).all()


def _explicit_ls(q, k, v, i, f, ridge):
    """Per (b, h, t): W = argmin sum_s g_ts |v_s - W k_s|^2 + ridge(g_t, G_t) |W|^2, solved directly."""
    ks = k / math.sqrt(k.shape[-1])
    g, big_g = _true_weights(i, f)
    b, h, t, d = q.shape
    eye = torch.eye(d, dtype=torch.float64)
    out = torch.zeros_like(v)
    for bi in range(b):
        for hi in range(h):
            for ti in range(t):
                wts = g[bi, hi, ti, : ti + 1]
                kk, vv = ks[bi, hi, : ti + 1], v[bi, hi, : ti + 1]
                gram = (kk.T * wts) @ kk + ridge(wts, big_g[bi, hi, ti]) * eye
                cross = (vv.T * wts) @ kk
                wmat = torch.linalg.solve(gram, cross.T).T
                out[bi, hi, ti] = wmat @ q[bi, hi, ti]
    return out


@pytest.mark.parametrize("lam", [0.1, 1.0, 5.0])
def test_rls_read_equals_an_explicit_least_squares_solve(lam):
    """Default form: ridge lam * (largest write weight)."""
    q, k, v, i, f = _inputs(t=8, d=4, seed=4, gate_scale=3.0)
    expected = _explicit_ls(q, k, v, i, f, lambda wts, _: lam * wts.max())
    torch.testing.assert_close(rls_read(q, k, v, i, f, lam), expected, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("lam", [0.1, 1.0, 5.0])
def test_recursive_rls_read_equals_an_explicit_least_squares_solve(lam):
    """Sherman-Morrison form: ridge lam * prod(f), decaying like an old write."""
    q, k, v, i, f = _inputs(t=8, d=4, seed=4, gate_scale=0.7)
    expected = _explicit_ls(q, k, v, i, f, lambda _, big_g: lam * big_g)
    torch.testing.assert_close(rls_read_recursive(q, k, v, i, f, lam), expected, rtol=1e-7, atol=1e-9)


def test_relative_rls_is_invariant_to_a_common_input_gate_shift_and_stays_finite():
    q, k, v, i, f = _inputs(t=12, d=6, seed=5)
    base = rls_read(q, k, v, i, f, 1.0)
    torch.testing.assert_close(rls_read(q, k, v, i + 7.0, f, 1.0), base, rtol=1e-9, atol=1e-11)
    # Closing forget gates (f ~ -15) and large input gates in float32: still finite.
    f_closed = f.float() - 17.0
    out = rls_read(q.float(), k.float(), v.float(), i.float() * 10, f_closed, 1.0)
    assert torch.isfinite(out).all()


def _pair(read_a: dict, read_b: dict, seed: int = 0, d: int = 16):
    torch.manual_seed(seed)
    a = cells.build("mlstm", 11, d_model=d, **read_a).double()
    torch.manual_seed(seed)
    b = cells.build("mlstm", 11, d_model=d, **read_b).double()
    return a, b


def _forward_backward(model, tokens):
    out = model(tokens)
    out.pow(2).mean().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


TOKENS = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(5))


def test_straight_through_models_share_values_not_gradients():
    """Whole model: st_forward computes exactly the ns5 model's logits, with other gradients."""
    st, ns5 = _pair({"read": "st_forward"}, {"read": "ns5"})
    out_st, grad_st = _forward_backward(st, TOKENS)
    out_ns5, grad_ns5 = _forward_backward(ns5, TOKENS)
    torch.testing.assert_close(out_st, out_ns5, rtol=1e-12, atol=1e-12)
    name = "blocks.0.mixer.q_proj.weight"
    assert not torch.allclose(grad_st[name], grad_ns5[name])
    # And st_backward computes exactly the stock model's logits.
    stb, raw = _pair({"read": "st_backward"}, {"read": "raw"})
    torch.testing.assert_close(stb(TOKENS), raw(TOKENS), rtol=1e-12, atol=1e-12)


def _cell_grads(read: str, q, k, v, i, f, upstream):
    torch.manual_seed(0)
    mixer = cells.build("mlstm", 11, d_model=16, read=read).double().blocks[0].mixer
    leaves = [x.clone().requires_grad_() for x in (q, k, v, i, f)]
    out = mixer._cell(*leaves)
    grads = torch.autograd.grad((out * upstream).sum(), leaves)
    return out.detach(), grads


def test_straight_through_halves_at_the_read():
    q, k, v, i, f = _inputs(t=7, d=16, seed=6)
    upstream = torch.randn(2, 2, 7, 16, dtype=torch.float64)
    raw_out, raw_grads = _cell_grads("raw", q, k, v, i, f, upstream)
    ns_out, ns_grads = _cell_grads("ns5", q, k, v, i, f, upstream)
    fwd_out, fwd_grads = _cell_grads("st_forward", q, k, v, i, f, upstream)
    bwd_out, bwd_grads = _cell_grads("st_backward", q, k, v, i, f, upstream)
    torch.testing.assert_close(fwd_out, ns_out, rtol=1e-12, atol=1e-12)  # whitened value
    torch.testing.assert_close(bwd_out, raw_out, rtol=1e-12, atol=1e-12)  # raw value
    for got, want in zip(fwd_grads, raw_grads):  # raw gradient
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for got, want in zip(bwd_grads, ns_grads):  # whitened gradient
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(raw_grads[0], ns_grads[0])


def test_read_blend_interpolates_and_anneals_to_the_stock_model():
    q, k, v, i, f = _inputs(t=7, d=16, seed=7)
    torch.manual_seed(0)
    model = cells.build("mlstm", 11, d_model=16, read="ns3").double()
    mixer = model.blocks[0].mixer
    white = mixer._cell(q, k, v, i, f)
    model.set_read_blend(0.0)
    raw = mixer._cell(q, k, v, i, f)
    model.set_read_blend(0.3)
    torch.testing.assert_close(mixer._cell(q, k, v, i, f), 0.3 * white + 0.7 * raw)
    assert model.read_blend() == 0.3
    # At alpha = 0 the model is numerically a stock mLSTM with the same weights.
    model.set_read_blend(0.0)
    torch.manual_seed(0)
    stock = cells.build("mlstm", 11, d_model=16).double()
    torch.testing.assert_close(model(TOKENS), stock(TOKENS), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="read blend"):
        model.set_read_blend(1.5)
    # The knob sets the initial alpha.
    torch.manual_seed(0)
    half = cells.build("mlstm", 11, d_model=16, read="ns3", read_blend=0.3).double()
    model.set_read_blend(0.3)
    torch.testing.assert_close(half(TOKENS), model(TOKENS), rtol=1e-12, atol=1e-12)


def test_whitened_reads_use_the_matrix_function():
    """ns<k>/polar read = W(C~_t) q_t, recomputed from the materialised memory."""
    q, k, v, i, f = _inputs(t=6, d=16, seed=8)
    states = memory_states(k, v, i, f)
    for read, fn in (("ns4", lambda c: newton_schulz(c, 4)), ("polar", polar)):
        torch.manual_seed(0)
        mixer = cells.build("mlstm", 11, d_model=16, read=read).double().blocks[0].mixer
        expected = (fn(states) @ q.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(mixer._cell(q, k, v, i, f), expected, rtol=1e-10, atol=1e-12)
    assert torch.equal(frobenius_normalize(torch.zeros(2, 3, 3)), torch.zeros(2, 3, 3))


def test_delta_write_is_the_gated_delta_rule():
    q, k, v, i, f = _inputs(t=9, d=16, seed=9)
    torch.manual_seed(0)
    mixer = cells.build("mlstm", 11, d_model=16, write="delta").double().blocks[0].mixer
    got = mixer._cell(q, k, v, i, f)
    # Brute force: S_t = f_t S_{t-1}(I - b_t kk^T) + b_t v k^T, o_t = S_t q_t.
    kn = torch.nn.functional.normalize(k, dim=-1)
    beta, alpha = torch.sigmoid(i), torch.sigmoid(f)
    s = torch.zeros(2, 2, 16, 16, dtype=torch.float64)
    eye = torch.eye(16, dtype=torch.float64)
    for t in range(9):
        kt = kn[:, :, t]
        outer = kt.unsqueeze(-1) * kt.unsqueeze(-2)
        s = alpha[:, :, t, None, None] * s @ (eye - beta[:, :, t, None, None] * outer) + beta[:, :, t, None, None] * v[
            :, :, t
        ].unsqueeze(-1) * kt.unsqueeze(-2)
        torch.testing.assert_close(got[:, :, t], (s @ q[:, :, t].unsqueeze(-1)).squeeze(-1))
    assert mixer.state_elements() == 4 * 16 * 16  # d=16 -> inner 64, 4 heads of 16


def test_frozen_keys_are_fixed_orthogonal_and_untrained():
    torch.manual_seed(0)
    model = cells.build("mlstm", 11, d_model=16, frozen_keys=True)
    mixer = model.blocks[0].mixer
    assert mixer.k_proj is None
    names = [n for n, _ in model.named_parameters()]
    assert not any("k_proj" in n or "frozen_k" in n for n in names)
    fk = mixer.frozen_k.clone()
    eye = torch.eye(fk.shape[-1])
    torch.testing.assert_close(fk @ fk.transpose(-1, -2), eye.expand_as(fk), rtol=0, atol=1e-5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(TOKENS).pow(2).mean().backward()
    opt.step()
    assert torch.equal(mixer.frozen_k, fk)
    free = cells.describe("mlstm", 11, d_model=16)["params"]
    frozen = cells.describe("mlstm", 11, d_model=16, frozen_keys=True)["params"]
    assert free - frozen == 64 * 4  # 16 blocks of 4x4 in the key projection at inner width 64


def test_read_path_learning_rate_multiplier():
    torch.manual_seed(0)
    model = cells.build("mlstm", 11, d_model=16, read_lr_mult=4.0)
    groups = model.param_groups(1e-3, 0.01)
    assert [g["lr"] for g in groups] == [1e-3, 4e-3]
    mixer = model.blocks[0].mixer
    boosted = {id(p) for p in groups[1]["params"]}
    assert boosted == {id(mixer.q_proj.weight), id(mixer.k_proj.weight)}
    everything = [id(p) for g in groups for p in g["params"]]
    assert sorted(everything) == sorted(id(p) for p in model.parameters())
