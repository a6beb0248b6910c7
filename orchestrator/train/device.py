"""Device and precision choice: CUDA when present, bf16 autocast only where the GPU has it
(compute capability >= 8.0), fp32 on older cards (GTX 1070) or when ``fp32`` forces it."""

from __future__ import annotations

import contextlib

import torch


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
    return "cpu (fp32)"
