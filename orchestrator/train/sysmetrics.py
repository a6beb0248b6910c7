"""What the machine was doing at a unit's eval points: the ``system_metrics`` table
(migration 0012), sampled in the worker and carried to the driver with the eval rows.

One :class:`Sampler` per unit of work, made just before it trains. Its samples are per
*process*: a seed pack trains several trials in one process, so every member of a pack shares
the sample taken at their common eval step (its CPU %, RSS and steps/s are the pack's, not a
member's share of it).

- ``cpu_pct``: the process's CPU time since the previous sample over the wall time between
  them, in percent of one core (psutil; above 100 with several threads).
- ``rss_bytes``: the process's resident memory (psutil).
- ``gpu_util_pct``, ``gpu_mem_bytes``: on a CUDA device, the *device's* utilisation over
  NVML's last sample period and its used memory (nvidia-ml-py, imported as ``pynvml``, the
  ``gpu`` extra), shared by every process on that device. None on the CPU, and quietly None
  where NVML is not installed, finds no driver or fails: metrics never fail a trial.
- ``steps_per_s``: optimizer steps since the previous sample (the first: since the sampler
  started, at the step the unit resumed from) over the wall time between them.
- ``elapsed_s``: wall seconds since the sampler started (this attempt), beside the trial's
  training seconds in ``evals.elapsed_s``; their difference is the time spent outside steps.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import psutil
import torch

# The columns of system_metrics a sample fills, in wire order (after trial_id and step).
SAMPLE_FIELDS = ("elapsed_s", "cpu_pct", "rss_bytes", "gpu_util_pct", "gpu_mem_bytes", "steps_per_s")


@dataclass(frozen=True)
class SystemSample:
    """One sample, at eval ``step`` of the unit that took it (see the module docstring)."""

    step: int
    elapsed_s: float
    cpu_pct: float | None
    rss_bytes: int | None
    gpu_util_pct: float | None = None
    gpu_mem_bytes: int | None = None
    steps_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Nvml:
    """The NVML handle of one CUDA device; ``read`` gives (util %, used bytes), or Nones."""

    def __init__(self, handle: Any, nvml: Any):
        self.handle = handle
        self.nvml = nvml

    @classmethod
    def open(cls, device: torch.device) -> _Nvml | None:
        if device.type != "cuda":
            return None
        try:
            import pynvml  # the gpu extra; lazily, so a CPU install never needs it

            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
            # NVML numbers every device of the machine, CUDA only the visible ones: the UUID
            # names the same card to both.
            if uuid is not None:
                text = str(uuid)
                name = text if text.startswith("GPU-") else f"GPU-{text}"
                handle = pynvml.nvmlDeviceGetHandleByUUID(name.encode())  # bytes: every nvidia-ml-py takes them
            elif not os.environ.get("CUDA_VISIBLE_DEVICES"):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            else:  # a remapped index would name another card: better no figures than wrong ones
                return None
            return cls(handle, pynvml)
        except Exception:
            return None

    def read(self) -> tuple[float | None, int | None]:
        try:
            util = float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
        except Exception:
            util = None
        try:
            used = int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        except Exception:
            used = None
        return util, used


class Sampler:
    """Samples this process (and its CUDA device, if any) at each eval point of a unit."""

    def __init__(
        self, device: torch.device, start_step: int = 0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._proc: psutil.Process | None
        try:
            self._proc = psutil.Process()
            cpu = self._proc.cpu_times()
            self._cpu_s: float | None = cpu.user + cpu.system
        except Exception:
            self._proc, self._cpu_s = None, None
        self._gpu = _Nvml.open(device)
        self._t0 = self._last_t = clock()
        self._last_step = int(start_step)

    def sample(self, step: int) -> SystemSample:
        now = self._clock()
        dt = now - self._last_t
        cpu_pct: float | None = None
        rss: int | None = None
        if self._proc is not None:
            try:
                cpu = self._proc.cpu_times()
                cpu_s = cpu.user + cpu.system
                if self._cpu_s is not None and dt > 0:
                    cpu_pct = max(0.0, 100.0 * (cpu_s - self._cpu_s) / dt)
                self._cpu_s = cpu_s
                rss = int(self._proc.memory_info().rss)
            except Exception:
                pass
        steps = step - self._last_step
        rate = steps / dt if dt > 0 and steps > 0 else None
        util, used = self._gpu.read() if self._gpu is not None else (None, None)
        self._last_t, self._last_step = now, int(step)
        return SystemSample(int(step), now - self._t0, cpu_pct, rss, util, used, rate)
