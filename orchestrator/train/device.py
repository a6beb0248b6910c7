"""Device and precision choice: CUDA when present, bf16 autocast only where the GPU has it
(compute capability >= 8.0), fp32 on older cards (GTX 1070) or when ``fp32`` forces it.

Also what this process's GPU is (``gpu_card``: its name and memory), which ``resources: {gpu:
auto}`` divides by. ``$ORCH_FAKE_GPU`` (``"GTX 1070:8GiB"``) is a TEST SWITCH: the process
reports that card (the index Ray gave it from ``$CUDA_VISIBLE_DEVICES``) while it trains on
the CPU, so a simulated mixed fleet (``ray start --num-gpus ...`` on a machine without GPUs)
places and records trials as a real one would.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

import torch

FAKE_GPU_ENV = "ORCH_FAKE_GPU"
_FAKE = re.compile(r"^\s*(?P<name>[^:]+?)\s*:\s*(?P<size>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>GiB|MiB|GB|MB)\s*$")
_UNITS = {"GiB": 2**30, "MiB": 2**20, "GB": 10**9, "MB": 10**6}


@dataclass(frozen=True)
class GpuCard:
    name: str
    memory: int  # bytes
    fake: bool = False


def fake_gpu() -> GpuCard | None:
    """The card ``$ORCH_FAKE_GPU`` names, None when unset; ValueError when malformed."""
    raw = os.environ.get(FAKE_GPU_ENV, "")
    if not raw:
        return None
    m = _FAKE.match(raw)
    if m is None:
        raise ValueError(f"${FAKE_GPU_ENV}={raw!r}: expected NAME:SIZE, like 'GTX 1070:8GiB'")
    return GpuCard(m["name"], int(float(m["size"]) * _UNITS[m["unit"]]), fake=True)


def gpu_card() -> GpuCard | None:
    """This process's first visible GPU (the fake one under $ORCH_FAKE_GPU); None: no GPU."""
    fake = fake_gpu()
    if fake is not None:
        return fake
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return GpuCard(props.name, int(props.total_memory))


def _fake_index() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return visible.split(",")[0] or "0"


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but CUDA is not available")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def use_bf16(device: torch.device, fp32: bool) -> bool:
    if fp32 or device.type != "cuda":
        return False
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


def autocast(device: torch.device, bf16: bool):
    if bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def device_label(device: torch.device, bf16: bool) -> str:
    """What ``trials.device`` records: the device and its precision."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return f"cuda:{device.index} {name} ({'bf16' if bf16 else 'fp32'})"
    fake = fake_gpu()
    if fake is not None:
        return f"fake-gpu:{_fake_index()} {fake.name} (cpu, fp32)"[:64]
    return "cpu (fp32)"
