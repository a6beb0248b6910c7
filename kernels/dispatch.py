"""Choosing an implementation (``impl=``) and running the PyTorch forms in a safe dtype.

Implementation names:
    ``"naive"``  step-by-step reference (Python loop over time);
    ``"chunk"``  chunkwise-parallel PyTorch form, exact up to float rounding;
    ``"triton"`` the fused kernels (``kernels/<op>/triton.py``; delta rule and DPLR only);
    ``"auto"``   triton when the tensors are on CUDA and the triton module imports, else chunk.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from types import ModuleType

import torch

OPS: tuple[str, ...] = ("delta_rule", "dplr_scan", "ssd_scan")
BASE_IMPLS: tuple[str, ...] = ("naive", "chunk")
# The kernels every Triton form launches: when this does not import, no operator has one.
TRITON_MODULE = "kernels.triton_scan"
# op -> (its Triton form's module, entry point). ssd_scan has no fused form: its chunk form
# is already a handful of large matmuls.
TRITON_FORMS: dict[str, tuple[str, str]] = {
    "delta_rule": ("kernels.delta_rule.triton", "delta_rule_triton"),
    "dplr_scan": ("kernels.dplr.triton", "dplr_scan_triton"),
}


@functools.cache
def triton_module() -> tuple[ModuleType | None, str | None]:
    """Import ``kernels.triton_scan`` once; return ``(module, None)`` or ``(None, why it failed)``.

    Cached so that ``impl="auto"`` on CUDA does not retry a failing import on every call;
    ``triton_module.cache_clear()`` forgets the outcome.
    """
    return _import(TRITON_MODULE)


def _import(name: str) -> tuple[ModuleType | None, str | None]:
    try:
        return importlib.import_module(name), None
    except Exception as exc:  # a broken Triton install raises more than ImportError
        return None, f"{type(exc).__name__}: {exc}"


@functools.cache
def _form_module(name: str) -> tuple[ModuleType | None, str | None]:
    # Cached apart from triton_module, whose cache_clear() alone turns Triton off and on.
    return _import(name)


def triton_function(op: str) -> tuple[Callable | None, str | None]:
    """The Triton entry point for ``op``, or ``(None, reason)`` when there is none."""
    if op not in TRITON_FORMS:
        return None, f"{op} has no triton form"
    scan, error = triton_module()
    if scan is None:
        return None, f"{TRITON_MODULE} does not import ({error})"
    name, attr = TRITON_FORMS[op]
    module, error = _form_module(name)
    if module is None:
        return None, f"{name} does not import ({error})"
    fn = getattr(module, attr, None)
    if fn is None:
        return None, f"{name} has no {attr}"
    return fn, None


def available_impls(op: str) -> tuple[str, ...]:
    """Implementation names ``op`` accepts here: naive, chunk, triton (if it imports), auto."""
    if op not in OPS:
        raise ValueError(f"unknown operator {op!r}; expected one of {', '.join(OPS)}")
    names = list(BASE_IMPLS)
    if triton_function(op)[0] is not None:
        names.append("triton")
    names.append("auto")
    return tuple(names)


def resolve_impl(op: str, impl: str, device: torch.device, *, transformed: bool = False) -> str:
    """Map ``impl`` to the concrete form that will run for tensors on ``device``.

    ``transformed``: the inputs are torch.func wrappers (a seed pack's vmap); the Triton
    autograd functions have no batching rule, so ``"auto"`` takes the chunk form there.
    Raises ValueError for an unknown name, or for ``"triton"`` when it is unavailable.
    """
    allowed = BASE_IMPLS + ("triton", "auto") if op in TRITON_FORMS else BASE_IMPLS + ("auto",)
    if impl not in allowed:
        raise ValueError(f"unknown impl {impl!r} for {op}; expected one of {', '.join(allowed)}")
    if impl == "auto":
        if torch.device(device).type == "cuda" and not transformed and triton_function(op)[0] is not None:
            return "triton"
        return "chunk"
    if impl == "triton":
        fn, why = triton_function(op)
        if fn is None:
            raise ValueError(f'impl="triton" is unavailable for {op}: {why}; use "chunk" or "auto"')
    return impl


def check_chunk_size(chunk_size: int) -> int:
    """Validate the ``chunk_size`` keyword (a positive int)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    return chunk_size


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the PyTorch forms compute in: float32 for 16-bit inputs, else the input dtype."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def run_pytorch_form(
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    inputs: Sequence[torch.Tensor | None],
    initial_state: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Call a naive/chunk form with every input cast to the compute dtype, autocast off.

    Autocast is switched off inside so that a cell running under bf16 autocast still gets
    an fp32 recurrence (autocast would otherwise round every matmul back to bf16). The
    output is returned in the inputs' promoted dtype; the final state stays in the compute
    dtype (fp32 for bf16 inputs) because it is meant to be carried further.
    """
    present = [x for x in inputs if x is not None]
    in_dtype = functools.reduce(torch.promote_types, (x.dtype for x in present))
    if not in_dtype.is_floating_point:
        raise ValueError(f"inputs must be floating point, got {in_dtype}")
    work = compute_dtype(in_dtype)
    cast = [None if x is None else x.to(work) for x in inputs]
    state = None if initial_state is None else initial_state.to(work)
    with torch.autocast(device_type=present[0].device.type, enabled=False):
        out, final = fn(*cast, initial_state=state, **kwargs)
    return out.to(in_dtype), final


def empty_result(
    like: torch.Tensor, out_shape: tuple[int, ...], state_shape: tuple[int, ...], initial_state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The result of a zero-length sequence: an empty output and the unchanged state."""
    work = compute_dtype(like.dtype)
    state = like.new_zeros(state_shape, dtype=work) if initial_state is None else initial_state.to(work)
    return like.new_zeros(out_shape), state


Form = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def run_form(
    op: str,
    form: str,
    forms: tuple[Form, Form],
    inputs: Sequence[torch.Tensor | None],
    initial_state: torch.Tensor | None,
    chunk_size: int,
    like: torch.Tensor,
    state_shape: tuple[int, ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``op`` in the ``form`` :func:`resolve_impl` chose: its Triton function, or one of its
    PyTorch ``forms = (naive, chunk)`` through :func:`run_pytorch_form`.

    ``like`` is the input shaped like the output, ``(B, H, T, D)``; for a zero-length sequence
    (``T = 0``) the result is an empty output and the unchanged state of ``state_shape``.
    """
    if form == "triton":
        fn, _ = triton_function(op)
        assert fn is not None  # resolve_impl answers "triton" only when the function exists
        return fn(*inputs, initial_state)
    if like.shape[2] == 0:
        return empty_result(like, tuple(like.shape), state_shape, initial_state)
    naive, chunk = forms
    if form == "naive":
        return run_pytorch_form(naive, inputs, initial_state)
    return run_pytorch_form(chunk, inputs, initial_state, chunk_size=chunk_size)


def is_transformed(*tensors: torch.Tensor | None) -> bool:
    """True when any input is a torch.func wrapper (vmap / grad transforms)."""
    return any(t is not None and torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors)
