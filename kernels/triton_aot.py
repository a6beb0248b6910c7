"""Ahead-of-time compilation of the scan kernels for a chosen GPU architecture, no GPU needed.

Triton ships ``ptxas``, so ``triton.compile`` can lower a kernel all the way to a cubin for
any NVIDIA target from a CPU-only machine. That is how the tests prove the kernels build
for Pascal (sm_61): ``ptxas`` itself rejects what sm_61 lacks (``.acq_rel`` atomics, bf16
instructions), and the PTX is also scanned for atomics and bf16 directly.

Must run in a process where ``TRITON_INTERPRET`` was unset when triton was imported
(interpreted kernels cannot be compiled); the tests use a subprocess.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import triton_scan

_PTR = "*fp32"
_KERNEL_INTS = {
    "_forward_kernel": ("T",),
    "_state_grad_kernel": ("T", "CHUNK", "NC"),
    "_input_grad_kernel": ("T", "CHUNK", "NC", "BH"),
}


@dataclass
class Compiled:
    """One kernel specialisation lowered for one target."""

    kernel: str
    variant: str
    target: str
    cubin_bytes: int
    shared_bytes: int
    atomics: int
    bf16_mentions: int


def _signature(kernel) -> tuple[dict[str, str], list[str]]:
    names = list(kernel.arg_names)
    ints = _KERNEL_INTS[kernel.__name__]
    consts = [n for n, p in zip(names, kernel.params) if p.is_constexpr]
    sig = {n: ("constexpr" if n in consts else "i32" if n in ints else _PTR) for n in names}
    return sig, consts


def compile_kernels(capability: int = 61, dk: int = 64, dv: int = 64, block_v: int | None = None) -> list[Compiled]:
    """Compile every kernel in every variant (delta with/without alpha, DPLR) for ``sm_<capability>``.

    Raises whatever ``triton.compile`` raises (ptxas errors included) if a kernel does not build.
    """
    if triton_scan.INTERPRETED:
        raise RuntimeError("kernels were built by the interpreter; unset TRITON_INTERPRET and re-run")
    block_k, bv, _ = triton_scan._blocks(dk, dv, block_v)
    target = GPUTarget("cuda", capability, 32)
    variants = {"delta": (True, False), "delta_alpha": (True, True), "dplr": (False, False)}
    out = []
    for kernel in (triton_scan._forward_kernel, triton_scan._state_grad_kernel, triton_scan._input_grad_kernel):
        sig, consts = _signature(kernel)
        for variant, (delta, has_alpha) in variants.items():
            values = dict(DK=dk, DV=dv, BLOCK_K=block_k, BLOCK_V=bv, DELTA=delta, HAS_ALPHA=has_alpha, HAS_S0=True)
            src = ASTSource(fn=kernel, signature=sig, constexprs={n: values[n] for n in consts})
            compiled = triton.compile(
                src,
                target=target,
                options={"num_warps": triton_scan._num_warps(bv, block_k), "enable_fp_fusion": triton_scan.FP_FUSION},
            )
            ptx = compiled.asm["ptx"]
            out.append(
                Compiled(
                    kernel=kernel.__name__,
                    variant=variant,
                    target=f"sm_{capability}",
                    cubin_bytes=len(compiled.asm["cubin"]),
                    shared_bytes=int(compiled.metadata.shared),
                    atomics=_count_atomics(ptx),
                    bf16_mentions=len(re.findall(r"bf16", ptx)),
                )
            )
    return out


@triton.jit
def _atomic_probe_kernel(x_ptr):
    tl.atomic_add(x_ptr + tl.arange(0, 32), 1.0)


def probe_atomic_kernel() -> dict:
    """Show that the checks have teeth on a kernel with one ``tl.atomic_add``.

    Triton lowers it to ``atom...acq_rel``, which ptxas rejects for sm_61 (the failure the
    seed paper's default RWKV-7 backward hits on Pascal); for sm_70 it builds, and the PTX
    scan counts the atomic.
    """
    src = ASTSource(fn=_atomic_probe_kernel, signature={"x_ptr": _PTR})
    opts = {"enable_fp_fusion": triton_scan.FP_FUSION}
    try:
        triton.compile(src, target=GPUTarget("cuda", 61, 32), options=opts)
        sm61_error: str | None = None
    except Exception as exc:  # PTXASError; its message carries the ptxas diagnostics
        head = str(exc).splitlines()[0:6]
        sm61_error = " ".join(line for line in head if "error" in line) or str(exc)[:500]
    ptx = triton.compile(src, target=GPUTarget("cuda", 70, 32), options=opts).asm["ptx"]
    return {"sm61_error": sm61_error, "sm70_atomics": _count_atomics(ptx)}


def _count_atomics(ptx: str) -> int:
    return len(re.findall(r"\batom\.|\bred\.", ptx))


if __name__ == "__main__":
    cap = int(sys.argv[1]) if len(sys.argv) > 1 else 61
    dk = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    dv = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    print(json.dumps([asdict(c) for c in compile_kernels(cap, dk, dv)]))
