"""orchestrator: sweeps of tiny recurrent models on Ray Tune, traces in SQL, statistics off
the database. The Python API (see :mod:`orchestrator.api` and the README)::

    from orchestrator import submit, resume, load, analyze, report, connect
"""

from __future__ import annotations

from typing import Any

__all__ = ["analyze", "connect", "load", "register_cell", "register_task", "report", "resume", "submit"]


def __getattr__(name: str) -> Any:
    # Lazy: ``import orchestrator`` (every CLI start, every Ray worker) must not pull in
    # Ray, pandas or the statistics.
    if name in __all__:
        from orchestrator import api

        return getattr(api, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
