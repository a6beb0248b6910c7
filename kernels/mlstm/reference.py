"""The mLSTM's step-by-step forms (the references): one position per loop iteration.

``raw_read_loop`` is the stock read, ``memory_states`` materialises ``C~_t`` for every t (for
the whitened reads), ``rls_read`` / ``rls_read_recursive`` are the least-squares reads (the
recursive one has no other form: its Sherman-Morrison recursion is sequential). The
recurrence and its stabilisation are in :mod:`kernels.mlstm`. All run in float32 with
autocast off and return float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

EPS = 1e-6


def _fp32(*xs: torch.Tensor) -> list[torch.Tensor]:
    """16-bit inputs go up to float32; float32 and float64 stay as they are."""
    return [x.float() if x.dtype in (torch.float16, torch.bfloat16) else x for x in xs]


def _steps(k, v, i, f):
    """Yield ``(t, C~_t, n~_t, m_t)`` of the stabilised recurrence (float32 inputs)."""
    logf = F.logsigmoid(f)
    ks = k / math.sqrt(k.shape[-1])
    c = n = m = None
    for t in range(k.shape[-2]):
        kt, vt, it = ks[:, :, t], v[:, :, t], i[:, :, t]
        if t == 0:
            # m_0 = i_0: the first write enters with weight exp(i_0 - m_0) = 1.
            m = it
            c = vt.unsqueeze(-1) * kt.unsqueeze(-2)
            n = kt
        else:
            assert c is not None and n is not None and m is not None  # set at t == 0
            m_new = torch.maximum(logf[:, :, t] + m, it)
            fp = torch.exp(logf[:, :, t] + m - m_new)
            ip = torch.exp(it - m_new)
            c = fp[..., None, None] * c + ip[..., None, None] * (vt.unsqueeze(-1) * kt.unsqueeze(-2))
            n = fp[..., None] * n + ip[..., None] * kt
            m = m_new
        yield t, c, n, m


def raw_read_loop(q, k, v, i, f) -> torch.Tensor:
    """Stock mLSTM read, one step per iteration (reference for ``raw_read_parallel``)."""
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, i, f = _fp32(q, k, v, i, f)
        outs = []
        for t, c, n, m in _steps(k, v, i, f):
            qt = q[:, :, t]
            num = (c @ qt.unsqueeze(-1)).squeeze(-1)
            denom = torch.maximum((n * qt).sum(-1).abs(), torch.exp(-m)) + EPS
            outs.append(num / denom.unsqueeze(-1))
        return torch.stack(outs, dim=2)


def memory_states(k, v, i, f) -> torch.Tensor:
    """``C~_t`` for every step: ``(B, H, T, Dv, Dk)`` float32 (scaled by exp(-m_t))."""
    with torch.autocast(device_type=k.device.type, enabled=False):
        k, v, i, f = _fp32(k, v, i, f)
        return torch.stack([c for _, c, _, _ in _steps(k, v, i, f)], dim=2)


def rls_read(q, k, v, i, f, lam: float) -> torch.Tensor:
    """Least-squares read with a ridge relative to the strongest current write (default).

    At step t it returns ``W_t q_t`` with ``W_t = argmin_W sum_{s<=t} g_ts |v_s - W k_s|^2
    + lam * max_s(g_ts) * |W|_F^2``, ``g_ts = exp(F_t - F_s + i_s)`` the memory's own
    weights. In the stabilised frame the weights are ``g~_ts = g_ts exp(-m_t) <= 1`` with
    maximum exactly 1, so ``W_t = C~_t (K~_t + lam I)^{-1}`` with ``K~_t`` the stabilised key
    Gram matrix: its condition number is at most ``1 + t max|k|^2 / (d lam)`` whatever the
    gates do, and the read is invariant to a common shift of the input gates. Solved
    exactly for every step at once (batched Cholesky, O(D^3) per step).

    Why not the decaying-prior recursion (:func:`rls_read_recursive`): there the ridge
    decays with the forget gate, so once the gate closes the problem itself becomes
    ill-posed (condition numbers of 1e20 were seen within 30 steps of a toy task, and the
    least-squares solution, not just its arithmetic, blows up).
    """
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, i, f = _fp32(q, k, v, i, f)
        dk = k.shape[-1]
        states = memory_states(k, v, i, f)  # C~_t
        gram = memory_states(k, k / math.sqrt(dk), i, f)  # K~_t, same weights
        gram = gram + lam * torch.eye(dk, device=k.device, dtype=k.dtype)
        chol = torch.linalg.cholesky(gram)
        # W q = C~ (K~ + lam I)^{-1} q: one triangular pair per step, no explicit inverse.
        solved = torch.cholesky_solve(q.unsqueeze(-1), chol)
        return (states @ solved).squeeze(-1)


def rls_read_recursive(q, k, v, i, f, lam: float) -> torch.Tensor:
    """Recursive least-squares read (the Mesa layer's), kept exact by Sherman-Morrison.

    At step t it returns ``W_t q_t`` with ``W_t = argmin_W sum_{s<=t} g_ts |v_s - W k_s|^2
    + lam * G_t |W|_F^2``, where ``g_ts = exp(F_t - F_s + i_s)`` are the memory's own
    weights and ``G_t = exp(F_t)`` decays the prior like any old write. That is
    ``W_t = C_t R_t^{-1}`` with ``R_t = f_t R_{t-1} + exp(i_t) k_t k_t^T``, ``R_0 = lam I``:
    a rank-1 update, so ``P_t = R_t^{-1}`` follows from ``P_{t-1}`` without a solve. Both
    ``C`` and ``R`` carry the same stabiliser (here started at ``m = 0`` so that ``R_0`` is
    in the same frame), which cancels in ``C P``.
    """
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, i, f = _fp32(q, k, v, i, f)
        b, h, t_len, dk = k.shape
        dv = v.shape[-1]
        logf = F.logsigmoid(f)
        ks = k / math.sqrt(dk)
        m = q.new_zeros(b, h)
        c = q.new_zeros(b, h, dv, dk)
        p = torch.eye(dk, device=q.device, dtype=q.dtype).expand(b, h, dk, dk) / lam
        outs = []
        for t in range(t_len):
            kt, it = ks[:, :, t], i[:, :, t]
            m_new = torch.maximum(logf[:, :, t] + m, it)
            fp = torch.exp(logf[:, :, t] + m - m_new)[..., None, None]
            ip = torch.exp(it - m_new)[..., None, None]
            c = fp * c + ip * (v[:, :, t].unsqueeze(-1) * kt.unsqueeze(-2))
            pk = p @ kt.unsqueeze(-1)  # (B, H, Dk, 1)
            kpk = kt.unsqueeze(-2) @ pk  # (B, H, 1, 1)
            # (fp R + ip k k^T)^{-1} = (P - ip P k k^T P / (fp + ip k^T P k)) / fp, P symmetric.
            p = (p - ip * (pk @ pk.transpose(-1, -2)) / (fp + ip * kpk)) / fp
            m = m_new
            outs.append((c @ (p @ q[:, :, t].unsqueeze(-1))).squeeze(-1))
        return torch.stack(outs, dim=2)
