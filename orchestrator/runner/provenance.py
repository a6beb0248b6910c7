"""What ran an attempt: the machine, the device, the package versions and the code.

The code fingerprint has two parts. ``code_hash`` is a SHA-256 over the Python sources of
``orchestrator``, ``cells``, ``tasks`` and ``kernels``: what the code-change guard compares (a commit that touches only documentation
changes nothing here). ``code_version`` is what a person reads: ``git:<commit>`` when run
from a clean checkout, ``git:<commit>+dirty`` with uncommitted changes in those folders,
``src:<hash>`` from an installed package.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

CODE_PACKAGES = ("orchestrator", "cells", "tasks", "kernels")


def _package_files(module_name: str) -> list[Path]:
    mod = sys.modules.get(module_name)
    if mod is None:
        try:
            mod = __import__(module_name)
        except ImportError:
            return []
    paths = getattr(mod, "__path__", None)
    if paths:  # a package: every .py under it
        return sorted(p for root in paths for p in Path(root).rglob("*.py") if "__pycache__" not in p.parts)
    file = getattr(mod, "__file__", None)
    return [Path(file)] if file and file.endswith(".py") else []


def source_hash(modules: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for name in modules:
        files = _package_files(name)
        base = files[0].parent if files else None
        for f in files:
            rel = f.relative_to(base) if base is not None and f.is_relative_to(base) else Path(f.name)
            h.update(f"{name}/{rel.as_posix()}\0".encode())
            h.update(f.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _checkout_version(root: Path) -> str | None:
    """``git:<commit>[+dirty]`` when ``root`` (the folder holding the orchestrator package) is
    a git checkout's top level, else None."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():
        return None
    commit = _git(root, "rev-parse", "--short=12", "HEAD")
    if not commit:
        return None
    dirty = _git(root, "status", "--porcelain", "--", *CODE_PACKAGES)
    return f"git:{commit}{'+dirty' if dirty else ''}"


@functools.lru_cache(maxsize=1)
def _fingerprint() -> tuple[str, str]:
    digest = source_hash(CODE_PACKAGES)
    root = Path(__file__).resolve().parents[2]  # the folder holding the orchestrator package
    return _checkout_version(root) or f"src:{digest[:12]}", digest


def code_fingerprint() -> tuple[str, str]:
    """(code_version, code_hash) of the code this process runs (cached). Plugin modules are
    left out: which ones a process has imported varies (a listing, an earlier sweep in the
    same process), so they would make two runs of the same code differ."""
    return _fingerprint()


@functools.cache
def _version(dist: str) -> str | None:
    # Cached: a lookup scans the installed distributions (milliseconds, once per attempt
    # before), and what this process runs does not change when a package is upgraded under it.
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_minor(version: str | None) -> str | None:
    """``2.13`` of ``2.13.0+cpu``: what the guard compares (a patch release changes no kernel)."""
    if not version:
        return None
    return ".".join(version.split("+")[0].split(".")[:2])


def environment(device: Any = None, bf16: bool = False) -> dict[str, Any]:
    """The attempt row's environment fields (``store.attempts.ENV_FIELDS``) for a unit
    training on ``device`` (a torch.device; None: the driver, which trains nothing)."""
    import torch

    code_version, code_hash = code_fingerprint()
    name, capability = None, None
    if device is not None:
        if device.type == "cuda":
            name = torch.cuda.get_device_name(device)
            major, minor = torch.cuda.get_device_capability(device)
            capability = f"{major}.{minor}"
        else:
            name = device.type
    try:
        import ray

        node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        ray_version: str | None = ray.__version__
    except Exception:  # pragma: no cover - outside Ray
        node_id, ray_version = None, _version("ray")
    return {
        "host": socket.gethostname(),
        "node_id": node_id,
        "device": name,
        "compute_capability": capability,
        "precision": None if device is None else ("bf16" if bf16 else "fp32"),
        "code_version": code_version,
        "code_hash": code_hash,
        "torch_version": torch.__version__,
        "triton_version": _version("triton"),
        "ray_version": ray_version,
        "python_version": platform.python_version(),
        "orchestrator_version": _version("orchestrator"),
    }
