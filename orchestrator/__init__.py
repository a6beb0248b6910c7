"""orchestrator: sweeps of tiny recurrent models on Ray Tune, traces in SQL, statistics off
the database. The Python API (see :mod:`orchestrator.api`)::

    from orchestrator import submit, resume, load, analyze, report, export, connect

    run = submit("sweeps/quickstart.yaml", db="runs/demo.db")
    trials, evals = load(run.name, db=run.db)
    analyze(run.name, "lockin", db=run.db, by="arm").summary

Each function takes the sweep first and the database as ``db=``, and the options of its
command under the same names; ``help(orchestrator.submit)`` says what it takes and returns.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "SweepRun",
    "analyze",
    "connect",
    "export",
    "join",
    "load",
    "register_cell",
    "register_task",
    "report",
    "resume",
    "submit",
]


def __getattr__(name: str) -> Any:
    # Lazy: ``import orchestrator`` (every CLI start, every Ray worker) must not pull in
    # Ray, pandas or the statistics.
    if name in __all__:
        from orchestrator import api

        return getattr(api, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The public API first of all (``dir(orchestrator)``, tab completion in a notebook),
    # although its names are only imported on first use.
    return sorted(set(__all__) | {n for n in globals() if n.startswith("__")})
