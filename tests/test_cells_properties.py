"""Structural properties of every arm: causality bit for bit, bidirectional reads, the conv
toggle, the default path against the naive one, and autocast."""

from __future__ import annotations

import pytest
import torch

import cells
from cells.conv import ShortConv, causal_conv_reference

VOCAB = 13
D = 16
# T crosses the kernels' default chunk (32), so a perturbation lands in a later chunk too.
T = 41

# Every causal configuration worth distinguishing (arm, knobs).
CAUSAL_CASES = [(arm, {}) for arm in cells.ARMS] + [
    ("attention", {"positions": "rotary"}),
    ("attention", {"impl": "naive", "conv": 3}),
    ("gated_deltanet", {"heads": 2}),
    ("armed_gdn", {"impl": "naive"}),
    ("mamba2_ref", {"heads": 2}),
    ("mlstm", {"impl": "naive"}),
    ("mlstm", {"read": "ns5"}),
    ("mlstm", {"read": "ns0"}),
    ("mlstm", {"read": "polar"}),
    ("mlstm", {"read": "rls"}),
    ("mlstm", {"read": "rls", "rls_form": "recursive"}),
    ("mlstm", {"read": "st_forward"}),
    ("mlstm", {"read": "st_backward"}),
    ("mlstm", {"read": "ns3", "read_blend": 0.5}),
    ("mlstm", {"write": "delta"}),
    ("mlstm", {"frozen_keys": True}),
    ("linear_mamba", {"heads": 2, "pattern": "mqa", "gate": True}),
    ("linear_mamba", {"heads": 2, "pattern": "mka"}),
    ("linear_mamba", {"heads": 2, "pattern": "mva"}),
    ("deltanet", {"n_layers": 2, "mlp": False}),
]

BIDIRECTIONAL_CASES = [
    ("armed_gdn", {"bidirectional": True}),
    ("deltanet", {"bidirectional": True}),
    ("dg_rank", {"bidirectional": True}),
    ("mamba2_ref", {"bidirectional": True}),
    ("mlstm", {"bidirectional": True}),
    ("linear_mamba", {"bidirectional": True}),
    ("attention", {"bidirectional": True}),
    ("attention", {"bidirectional": True, "positions": "rotary"}),
]


def _build(arm: str, knobs: dict, seed: int = 0) -> torch.nn.Module:
    knobs = dict(knobs)
    n_layers = knobs.pop("n_layers", None)
    torch.manual_seed(seed)
    return cells.build(arm, VOCAB, d_model=D, n_layers=n_layers, **knobs).eval()


@pytest.mark.parametrize("arm,knobs", CAUSAL_CASES, ids=lambda x: str(x))
def test_causal_arms_never_read_the_future(arm, knobs):
    model = _build(arm, knobs)
    assert model.causal
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, T), generator=gen)
    with torch.no_grad():
        base = model(tokens)
        for t in (0, 5, 30, 31, 32, T - 2):
            changed = tokens.clone()
            changed[:, t + 1] = (changed[:, t + 1] + 1 + torch.arange(2)) % VOCAB
            out = model(changed)
            assert torch.equal(out[:, : t + 1], base[:, : t + 1]), f"position <= {t} read token {t + 1}"
            assert not torch.equal(out[:, t + 1], base[:, t + 1]), "the perturbed position itself must change"


@pytest.mark.parametrize("arm,knobs", BIDIRECTIONAL_CASES, ids=lambda x: str(x))
def test_bidirectional_arms_read_the_future(arm, knobs):
    model = _build(arm, knobs)
    assert not model.causal
    tokens = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(2))
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB
    with torch.no_grad():
        base, out = model(tokens), model(changed)
    # The first position sees the last token only through the backward stream.
    assert (out[:, 0] - base[:, 0]).abs().max() > 1e-6


def test_bidirectional_is_forward_plus_flipped_backward():
    model = _build("armed_gdn", {"bidirectional": True})
    mixer = model.blocks[0].mixer
    x = torch.randn(2, T, D)
    with torch.no_grad():
        expected = mixer.fwd(x) + mixer.bwd(x.flip(1)).flip(1)
        assert torch.equal(mixer(x), expected)
        # The backward stream alone is anti-causal: its output at t ignores inputs before t.
        y = mixer.bwd(x.flip(1)).flip(1)
        x2 = x.clone()
        x2[:, 3] += 1.0
        y2 = mixer.bwd(x2.flip(1)).flip(1)
        assert torch.equal(y[:, 4:], y2[:, 4:])


@pytest.mark.parametrize("width", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("bias", [False, True])
def test_short_conv_matches_conv1d(width, bias):
    torch.manual_seed(width)
    conv = ShortConv(5, width, bias=bias).double()
    for t in (1, 4, 9):  # includes sequences shorter than the kernel
        x = torch.randn(3, t, 5, dtype=torch.float64, requires_grad=True)
        y = conv(x)
        ref = causal_conv_reference(x, conv.weight, conv.bias)
        torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
        g = torch.randn_like(y)
        params = (x, conv.weight) if conv.bias is None else (x, conv.weight, conv.bias)
        got = torch.autograd.grad(y, params, g)
        want = torch.autograd.grad(ref, params, g)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_short_conv_fused_node_matches_composite_form_under_vmap():
    """The one-node conv (plain calls) and the composite form (torch.func transforms) agree."""
    torch.manual_seed(1)
    conv = ShortConv(5, 4, bias=True).double()
    x = torch.randn(3, 2, 7, 5, dtype=torch.float64)
    params = {n: p.detach() for n, p in conv.named_parameters()}

    def loss(p, xi):
        return torch.func.functional_call(conv, p, (xi,)).square().sum()

    # vmap over a leading axis takes the composite path; a plain loop takes the fused node.
    got = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    for i in range(x.shape[0]):
        want = torch.autograd.grad(loss(dict(conv.named_parameters()), x[i]), list(conv.parameters()))
        for name, w in zip(dict(conv.named_parameters()), want):
            torch.testing.assert_close(got[name][i], w, rtol=1e-12, atol=1e-12)


def test_kernel_size_one_mixes_no_time_steps():
    conv = ShortConv(6, 1, bias=True)
    x = torch.randn(2, 10, 6)
    for t in range(10):
        x2 = x.clone()
        x2[:, t] += torch.randn(2, 6)
        diff = (conv(x2) - conv(x)).abs().amax(dim=(0, 2))
        assert torch.equal(diff.nonzero().flatten(), torch.tensor([t]))
    # And in the model: the noconv toggle's conv is that width-1 module.
    model = _build("mamba2_ref_noconv", {})
    assert model.blocks[0].mixer.conv.width == 1
    assert _build("mamba2_ref", {}).blocks[0].mixer.conv.width == 4


def test_width_w_conv_reaches_back_exactly_w_minus_1_steps():
    conv = ShortConv(4, 4, bias=False)
    x = torch.randn(1, 12, 4)
    x2 = x.clone()
    x2[:, 5] += 1.0
    touched = (conv(x2) - conv(x)).abs().amax(dim=(0, 2)).nonzero().flatten()
    assert touched.tolist() == [5, 6, 7, 8]


NAIVE_VS_DEFAULT = [
    ("deltanet", {}),
    ("gated_deltanet", {}),
    ("armed_gdn", {}),
    ("armed_gdn", {"bidirectional": True}),
    ("dg_rank", {}),
    ("armed_dg_diag", {}),
    ("mamba2_ref", {}),
    ("mamba2_ref_noconv", {"heads": 2}),
    ("linear_mamba", {"heads": 2, "pattern": "mqa"}),
    ("attention", {}),
    ("attention", {"positions": "rotary"}),
    ("mlstm", {}),
    ("mlstm", {"write": "delta"}),
    ("mlstm", {"read": "st_forward"}),
]


@pytest.mark.parametrize("arm,knobs", NAIVE_VS_DEFAULT, ids=lambda x: str(x))
def test_default_path_matches_naive(arm, knobs):
    """Same weights, impl naive vs auto: same logits and same gradients (float64)."""
    models = [_build(arm, {**knobs, "impl": impl}).double() for impl in ("naive", "auto")]
    tokens = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(3))
    outs, grads = [], []
    for m in models:
        out = m(tokens)
        out.pow(2).mean().backward()
        outs.append(out.detach())
        grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-8, atol=1e-9)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-7, atol=1e-9, msg=name)


@pytest.mark.parametrize(
    "arm,knobs",
    [(a, {}) for a in cells.ARMS]
    + [
        ("mlstm", {"read": "ns5"}),
        ("mlstm", {"read": "polar"}),
        ("mlstm", {"read": "rls"}),
        ("mlstm", {"write": "delta"}),
        ("armed_gdn", {"bidirectional": True}),
    ],
    ids=lambda x: str(x),
)
def test_runs_under_bf16_autocast_close_to_fp32(arm, knobs):
    model = _build(arm, knobs)
    tokens = torch.randint(0, VOCAB, (2, 19), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = model(tokens).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(tokens)
    out.float().pow(2).mean().backward()
    assert out.shape == (2, 19, VOCAB)
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    # bf16 keeps ~3 significant digits; the logits must still agree to a few percent of their scale.
    err = (out.float() - ref).abs().max() / ref.abs().max()
    assert err < 0.08, float(err)
