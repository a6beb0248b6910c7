"""Triton scan kernels against independent references: outputs, final state, every gradient.

Without CUDA the kernels run under Triton's interpreter on CPU tensors. Triton reads
``TRITON_INTERPRET`` when ``@triton.jit`` decorates a function (its own ``tl.*`` helpers are
decorated when triton is first imported) and again at run time, so:

* the variable is set only while this module imports triton and the kernels
  (``kernels.triton_scan``, the operators' forms ``kernels.<op>.triton``), and again while
  each of its tests runs (``isolated``), never while other modules' tests run, and never in
  the environment of processes they start;
* at the end of the module the kernels are reloaded without it, so later modules see
  ordinary (uninterpreted) kernels, exactly as if this module had not run;
* if triton was already imported uninterpreted by an earlier module, the interpreter cannot
  run in this process; each test then runs in a fresh ``python`` subprocess instead (this
  file doubles as that worker: ``python tests/test_triton_kernels.py TEST JSON_KWARGS``).

A side effect that stays: if this module is the first to import triton, triton's own
``tl.*`` helpers remain interpreter-built for the rest of the process. Without CUDA nothing
can compile Triton kernels anyway, so nothing downstream notices.

With CUDA the same cases run on the GPU (plus bigger ones), uninterpreted.
References: a float64 loop written here (``_ref_*``), and the operators' ``naive`` form
(``kernels.delta_rule``/``kernels.dplr_scan``) whenever those exist.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if ON_CUDA else "cpu"
REPO = Path(__file__).resolve().parents[1]


@contextmanager
def _interpret_env(on: bool):
    prev = os.environ.get("TRITON_INTERPRET")
    if on:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if on:
            if prev is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = prev


def _stdlib_interpreted() -> bool:
    """Whether triton's own ``tl.*`` helpers were built by the interpreter (decided at import)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.zeros, InterpretedFunction)


def _reload_kernels() -> None:
    """Re-decorate the kernels (under the current TRITON_INTERPRET), then the forms using them."""
    global triton_scan, delta_form, dplr_form
    triton_scan = importlib.reload(triton_scan)
    delta_form = importlib.reload(delta_form)
    dplr_form = importlib.reload(dplr_form)


_ENV_GIVEN = os.environ.get("TRITON_INTERPRET") == "1"  # the caller asked for the interpreter
with _interpret_env(not ON_CUDA):
    import triton  # noqa: F401  (the first import in a process fixes how tl.* helpers are built)

    triton_scan = importlib.import_module("kernels.triton_scan")
    delta_form = importlib.import_module("kernels.delta_rule.triton")
    dplr_form = importlib.import_module("kernels.dplr.triton")
    if not ON_CUDA and _stdlib_interpreted() and not triton_scan.INTERPRETED:
        _reload_kernels()
IN_PROCESS = ON_CUDA or (triton_scan.INTERPRETED and _stdlib_interpreted())

# ---------------------------------------------------------------------------------------
# Independent references (float64, one step per iteration, full matrices)


def _ref_delta(q, k, v, beta, alpha, s0):
    B, H, T, DK = q.shape
    S = s0 if s0 is not None else q.new_zeros(B, H, v.shape[-1], DK)
    eye = torch.eye(DK, dtype=q.dtype, device=q.device)
    outs = []
    for t in range(T):
        kt = k[:, :, t]
        a = alpha[:, :, t, None, None] if alpha is not None else 1.0
        b = beta[:, :, t, None, None]
        S = a * S @ (eye - b * kt[..., :, None] * kt[..., None, :]) + b * v[:, :, t, :, None] * kt[..., None, :]
        outs.append((S @ q[:, :, t, :, None])[..., 0])
    return torch.stack(outs, 2), S


def _ref_dplr(r, k, v, w, kappa, a, s0):
    B, H, T, DK = r.shape
    S = s0 if s0 is not None else r.new_zeros(B, H, v.shape[-1], DK)
    outs = []
    for t in range(T):
        A = torch.diag_embed(w[:, :, t]) - (a[:, :, t] * kappa[:, :, t])[..., :, None] * kappa[:, :, t, None, :]
        S = S @ A + v[:, :, t, :, None] * k[:, :, t, None, :]
        outs.append((S @ r[:, :, t, :, None])[..., 0])
    return torch.stack(outs, 2), S


def _naive_operator(op: str):
    """The operators' own ``impl="naive"`` form, or None while that module does not exist."""
    fn = _naive_operator_fn(op)
    if fn is None:
        return None
    if op == "delta_rule":
        return lambda q, k, v, beta, alpha, s0: fn(q, k, v, beta, alpha, impl="naive", initial_state=s0)
    return lambda r, k, v, w, kappa, a, s0: fn(r, k, v, w, kappa, a, impl="naive", initial_state=s0)


def _naive_operator_fn(op: str):
    """``kernels.<op>`` (the public operator with ``impl=``), or None while it does not exist."""
    fn = None
    try:
        fn = getattr(importlib.import_module("kernels"), op, None)
        if not callable(fn):  # the package attribute may be the submodule of that name
            fn = getattr(importlib.import_module(f"kernels.{op}"), op, None)
    except ImportError:
        return None
    return fn if callable(fn) else None


# ---------------------------------------------------------------------------------------
# Cases: odd shapes (T = 37, Dk = 6, Dv = 5, B*H > 1), several row blocks and chunk lengths

CASES: dict[str, dict] = {
    "delta_alpha_s0": dict(op="delta_rule", B=2, H=2, T=37, DK=6, DV=5, alpha=True, s0=True),
    "delta_plain_rowblocks": dict(
        op="delta_rule", B=1, H=2, T=37, DK=6, DV=5, alpha=False, s0=False, block_v=2, chunk=5
    ),
    "delta_one_chunk_pow2": dict(op="delta_rule", B=3, H=1, T=16, DK=8, DV=8, alpha=True, s0=True, chunk=16),
    "dplr_s0": dict(op="dplr_scan", B=2, H=2, T=37, DK=6, DV=5, s0=True),
    "dplr_rowblocks_one_chunk": dict(op="dplr_scan", B=1, H=2, T=37, DK=5, DV=6, s0=False, block_v=4, chunk=37),
    "dplr_chunk1": dict(op="dplr_scan", B=1, H=1, T=9, DK=3, DV=7, s0=True, block_v=4, chunk=1),
}
if ON_CUDA:  # real-hardware sizes: the per-program tiles and default launch parameters
    CASES["delta_gpu_d64"] = dict(op="delta_rule", B=4, H=4, T=300, DK=64, DV=64, alpha=True, s0=True)
    CASES["delta_gpu_d128"] = dict(op="delta_rule", B=2, H=2, T=200, DK=128, DV=128, alpha=True, s0=True)
    CASES["dplr_gpu_d64"] = dict(op="dplr_scan", B=4, H=4, T=300, DK=64, DV=37, s0=True)
    CASES["dplr_gpu_d32"] = dict(op="dplr_scan", B=8, H=2, T=512, DK=32, DV=32, s0=False)

TOL = 1e-4  # relative, norm-wise; the kernels compute in fp32, the references in float64


def make_inputs(case: dict, seed: int = 0, device: str = "cpu") -> list[torch.Tensor | None]:
    """Inputs in the operator's argument order, float32, with well-conditioned gates."""
    g = torch.Generator().manual_seed(seed)
    B, H, T, DK, DV = case["B"], case["H"], case["T"], case["DK"], case["DV"]

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    def unit(*shape):
        return torch.nn.functional.normalize(rnd(*shape), dim=-1)

    def gate(*shape, lo=0.0):
        return lo + (1 - lo) * torch.rand(*shape, generator=g)

    s0 = rnd(B, H, DV, DK) if case["s0"] else None
    if case["op"] == "delta_rule":
        alpha = gate(B, H, T, lo=0.5) if case["alpha"] else None
        xs = [rnd(B, H, T, DK), unit(B, H, T, DK), rnd(B, H, T, DV), gate(B, H, T), alpha, s0]
    else:
        xs = [
            rnd(B, H, T, DK),
            rnd(B, H, T, DK) / DK**0.5,
            rnd(B, H, T, DV),
            gate(B, H, T, DK, lo=0.5),
            unit(B, H, T, DK),
            gate(B, H, T, DK),
            s0,
        ]
    return [None if x is None else x.to(device) for x in xs]


def _triton_fn(op: str):
    return delta_form.delta_rule_triton if op == "delta_rule" else dplr_form.dplr_scan_triton


def _run(fn, xs, go, gs, **kw):
    """Forward, then backward of <o, go> + <S_T, gs>; returns [o, S_T, grad of each input]."""
    leaves = [None if x is None else x.detach().clone().requires_grad_(True) for x in xs]
    o, sT = fn(*leaves, **kw)
    ((o * go.to(o.dtype)).sum() + (sT * gs.to(sT.dtype)).sum()).backward()
    return [o.detach(), sT.detach()] + [None if x is None else x.grad for x in leaves]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def compute_case(name: str) -> dict[str, dict[str, float | None]]:
    """Relative errors of the Triton result against each available reference, per quantity."""
    case = CASES[name]
    xs = make_inputs(case, device=DEVICE)
    kw = {k: case[k] for k in ("block_v", "chunk") if k in case}
    ref_local = _ref_delta if case["op"] == "delta_rule" else _ref_dplr
    refs = {"local_f64": ref_local}
    naive = _naive_operator(case["op"])
    if naive is not None:
        refs["naive_op"] = naive
    B, H, T, DV, DK = case["B"], case["H"], case["T"], case["DV"], case["DK"]
    g = torch.Generator().manual_seed(1)
    go = torch.randn(B, H, T, DV, generator=g, dtype=torch.float64).to(DEVICE)
    gs = torch.randn(B, H, DV, DK, generator=g, dtype=torch.float64).to(DEVICE)
    got = _run(_triton_fn(case["op"]), xs, go, gs, **kw)
    x64 = [None if x is None else x.double() for x in xs]
    names = ["o", "final_state"] + [f"d_{n}" for n in _arg_names(case["op"])]
    out = {}
    for ref_name, ref in refs.items():
        want = _run(ref, x64, go, gs)
        out[ref_name] = {n: (None if w is None else _rel(a, w)) for n, a, w in zip(names, got, want)}
        out[ref_name]["_missing"] = [n for n, a, w in zip(names, got, want) if (a is None) != (w is None)]
    return out


def _arg_names(op: str) -> list[str]:
    if op == "delta_rule":
        return ["q", "k", "v", "beta", "alpha", "initial_state"]
    return ["r", "k", "v", "w", "kappa", "a", "initial_state"]


def isolated(test):
    """Run ``test`` in this process when it can run the kernels, else in a fresh one.

    The fresh process is this file run as a script (``python tests/test_triton_kernels.py
    TEST_NAME JSON_KWARGS``), where triton is first imported under the interpreter.
    """

    @functools.wraps(test)
    def wrapper(**kwargs):
        if IN_PROCESS:
            with _interpret_env(not ON_CUDA):
                return test(**kwargs)
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        proc = subprocess.run(
            [sys.executable, __file__, test.__name__, json.dumps(kwargs)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, f"{test.__name__} failed in a subprocess:\n{proc.stderr[-4000:]}"

    return wrapper


# ---------------------------------------------------------------------------------------
# Tests (all names contain "triton" so ``pytest -k triton`` selects them)


@pytest.fixture(scope="module", autouse=True)
def _restore_uninterpreted_kernels():
    # Later modules must see ordinary kernels (a clear "needs CUDA" error on CPU tensors).
    yield
    if not ON_CUDA and not _ENV_GIVEN and triton_scan.INTERPRETED:
        _reload_kernels()


@pytest.mark.parametrize("name", list(CASES))
@isolated
def test_triton_matches_references(name):
    errors = compute_case(name)
    assert "local_f64" in errors
    for ref_name, errs in errors.items():
        assert errs.pop("_missing") == [], f"{ref_name}: gradient present on one side only"
        bad = {k: v for k, v in errs.items() if v is not None and not v < TOL}
        assert not bad, f"{name} vs {ref_name}: relative errors above {TOL}: {bad}"
        # Every quantity was compared: o, final state and each input that was given.
        n_given = sum(1 for v in errs.values() if v is not None)
        want = 2 + len(_arg_names(CASES[name]["op"])) - (not CASES[name]["s0"])
        want -= CASES[name]["op"] == "delta_rule" and not CASES[name]["alpha"]
        assert n_given == want, errs


@isolated
def test_triton_kernels_were_interpreted_or_on_cuda():
    assert ON_CUDA or triton_scan.INTERPRETED


@isolated
def test_triton_is_deterministic():
    # Run-to-run differences can only come from a GPU's scheduling; under the CPU interpreter a
    # short sequence checks the same code path in a fraction of the time.
    case = CASES["delta_alpha_s0"] if ON_CUDA else dict(CASES["delta_alpha_s0"], T=9)
    xs = make_inputs(case, device=DEVICE)
    g = torch.Generator().manual_seed(3)
    go = torch.randn(case["B"], case["H"], case["T"], case["DV"], generator=g).to(DEVICE)
    gs = torch.randn(case["B"], case["H"], case["DV"], case["DK"], generator=g).to(DEVICE)
    first = _run(delta_form.delta_rule_triton, xs, go, gs, block_v=4)
    second = _run(delta_form.delta_rule_triton, xs, go, gs, block_v=4)
    for a, b in zip(first, second):
        if a is not None:
            assert torch.equal(a, b)


@isolated
def test_triton_bf16_inputs_keep_dtypes_and_match_fp32():
    """bf16 never reaches a kernel: o and grads come back bf16, the state fp32, values ~ fp32."""
    case = dict(CASES["dplr_s0"], T=12)
    xs32 = make_inputs(case, device=DEVICE)
    xs16 = [x.to(torch.bfloat16) for x in xs32]
    g = torch.Generator().manual_seed(4)
    go = torch.randn(case["B"], case["H"], case["T"], case["DV"], generator=g).to(DEVICE)
    gs = torch.randn(case["B"], case["H"], case["DV"], case["DK"], generator=g).to(DEVICE)
    got = _run(dplr_form.dplr_scan_triton, xs16, go, gs)
    want = _run(dplr_form.dplr_scan_triton, [x.to(torch.float32) for x in xs16], go, gs)
    assert got[0].dtype == torch.bfloat16 and got[1].dtype == torch.float32
    assert all(gr.dtype == torch.bfloat16 for gr in got[2:])
    for a, b in zip(got, want):
        assert _rel(a, b) < 1e-2  # bf16 rounding of the outputs only


@isolated
def test_triton_only_requested_gradients_and_unused_outputs():
    """Grad for v only; the final state unused (its gradient arrives as None)."""
    case = CASES["delta_alpha_s0"]
    xs = make_inputs(case, device=DEVICE)
    v = xs[2].clone().requires_grad_(True)
    o, _ = delta_form.delta_rule_triton(xs[0], xs[1], v, xs[3], xs[4], xs[5])
    o.square().sum().backward()
    x64 = [x.double() for x in xs]
    v64 = x64[2].clone().requires_grad_(True)
    o64, _ = _ref_delta(x64[0], x64[1], v64, x64[3], x64[4], x64[5])
    o64.square().sum().backward()
    assert _rel(v.grad, v64.grad) < TOL


@isolated
def test_triton_empty_sequence_returns_initial_state():
    """T = 0: the state passes through unchanged, forward and backward, for both operators."""
    for name in ("delta_alpha_s0", "dplr_s0"):
        case = dict(CASES[name], T=0)
        xs = [x.requires_grad_(True) for x in make_inputs(case, device=DEVICE)]
        o, sT = _triton_fn(case["op"])(*xs)
        assert o.shape == (2, 2, 0, 5)
        assert torch.equal(sT, xs[-1])
        gs = torch.randn_like(sT)
        (sT * gs).sum().backward()
        assert torch.equal(xs[-1].grad, gs)
        assert all(x.grad is not None and x.grad.shape == x.shape for x in xs)


def test_triton_rejects_mismatched_shapes():
    case = CASES["dplr_s0"]
    xs = make_inputs(case, device=DEVICE)
    xs[4] = xs[4][..., :-1]
    with pytest.raises(ValueError, match="kappa must have shape"):
        dplr_form.dplr_scan_triton(*xs)


@isolated
def test_triton_dispatcher_routes_to_these_kernels():
    """``kernels.delta_rule(..., impl="triton")`` (issue 3's operator) runs these kernels."""
    delta_rule, dplr_scan = _naive_operator_fn("delta_rule"), _naive_operator_fn("dplr_scan")
    if delta_rule is None or dplr_scan is None:
        pytest.fail("operators of issue 3 (kernels.delta_rule / kernels.dplr_scan) missing")
    for op, fn, direct in (
        ("delta_alpha_s0", delta_rule, delta_form.delta_rule_triton),
        ("dplr_s0", dplr_scan, dplr_form.dplr_scan_triton),
    ):
        xs = make_inputs(CASES[op], device=DEVICE)
        o1, s1 = fn(*xs[:-1], impl="triton", initial_state=xs[-1])
        o2, s2 = direct(*xs)
        assert torch.equal(o1, o2) and torch.equal(s1, s2)


_AOT_SCRIPT = """
import json, torch
from kernels import triton_aot
from kernels.delta_rule.triton import delta_rule_triton
out = {"kernels": [vars(c) for c in triton_aot.compile_kernels(61, 37, 6)]
                 + [vars(c) for c in triton_aot.compile_kernels(61, 128, 128)],
       "probe": triton_aot.probe_atomic_kernel()}
try:
    z = torch.zeros(1, 1, 2, 3)
    delta_rule_triton(z, z, z, torch.zeros(1, 1, 2))
    out["cpu_error"] = None
except RuntimeError as exc:
    out["cpu_error"] = str(exc)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_triton_kernels_compile_for_pascal_sm61_without_atomics_or_bf16():
    """Lower every kernel variant to a cubin for sm_61 (ptxas included), no GPU needed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _AOT_SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # The checks have teeth: an atomic kernel fails ptxas for sm_61, and the scan counts it.
    assert out["probe"]["sm70_atomics"] > 0
    assert out["probe"]["sm61_error"] and "acq_rel" in out["probe"]["sm61_error"]
    kernels = out["kernels"]
    assert len(kernels) == 18  # 3 kernels x 3 variants x 2 sizes
    for k in kernels:
        assert k["target"] == "sm_61" and k["cubin_bytes"] > 0, k
        assert k["atomics"] == 0 and k["bf16_mentions"] == 0, k
    if not ON_CUDA:
        assert out["cpu_error"] and "CUDA" in out["cpu_error"]


if __name__ == "__main__":  # the subprocess side of ``isolated``
    os.environ["TRITON_INTERPRET"] = "1"
    torch.set_num_threads(1)
    globals()[sys.argv[1]].__wrapped__(**json.loads(sys.argv[2]))


def test_triton_bench_kernels_command_json(capsys):
    """``orchestrator bench kernels --quick --json``: every (op, config, impl) row, n/a for triton on CPU."""
    from orchestrator.cli import main

    assert main(["bench", "kernels", "--quick", "--json", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"].startswith("cpu")
    rows = {(r["op"], r["config"], r["impl"]): r for r in out["rows"]}
    configs = {r["config"] for r in out["rows"]}
    assert len(configs) == 2 and len(rows) == 2 * 2 * 3
    for (op, config, impl), r in rows.items():
        if impl == "triton":
            assert r["tok_s"] is None and r["note"].startswith("n/a")
        else:
            assert r["tok_s"] > 0 and r["ms"] > 0
    for key, sp in out["speedup"].items():
        assert sp["chunk_vs_naive"] > 0 and sp["triton_vs_naive"] is None, key


def test_triton_bench_kernels_rejects_unknown_device(capsys):
    from orchestrator.cli import main

    assert main(["bench", "kernels", "--device", "tpu"]) == 2
    assert "--device must be cpu or cuda" in capsys.readouterr().err
