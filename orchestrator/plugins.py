"""A researcher's own cells and tasks, from their own package.

Two ways in, both ending in :func:`cells.register_cell` / :func:`tasks.register_task`:

- Python entry points in the groups ``orchestrator.cells`` and ``orchestrator.tasks`` (in the
  plugin's ``pyproject.toml``); each names a module (imported: its top level registers) or a
  function (called with no arguments). Loaded in every process that validates or builds.
- a spec's ``plugins: [my_pkg.cells, ...]``: modules imported on the driver before the spec
  is validated and on every Ray worker before a trial builds its model (the list travels in
  each unit of work's config, :func:`loaded`; ``$ORCH_PLUGINS``, which the driver sets too,
  makes ``ORCH_PLUGINS=my_pkg.cells orchestrator cells`` list them).

The plugin package must be importable everywhere a trial may run: installed, or on
``PYTHONPATH`` of every node.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable

from orchestrator.errors import UserError

GROUPS = ("orchestrator.cells", "orchestrator.tasks")
ENV = "ORCH_PLUGINS"
_loaded_entry_points = False
_modules: list[str] = []


def load_entry_points() -> None:
    """Load every installed plugin's entry points, once per process."""
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    from importlib.metadata import entry_points

    for group in GROUPS:
        for ep in entry_points(group=group):
            try:
                obj = ep.load()
                if callable(obj) and not isinstance(obj, type):
                    obj()
            except Exception as exc:
                raise UserError(
                    f"plugin entry point {ep.name!r} ({ep.value}, group {group}) failed: {type(exc).__name__}: {exc}"
                ) from None


def import_modules(modules: Iterable[str], where: str = "plugins") -> None:
    """Import the named plugin modules (their top level registers cells/tasks)."""
    for name in modules:
        if name in _modules:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise UserError(
                f"{where}: cannot import plugin module {name!r}: "
                f"{type(exc).__name__}: {exc} (is it installed or on PYTHONPATH?)"
            ) from None
        _modules.append(name)
    if _modules:
        # What this process and its children (orchestrator cells, a SLURM step) list.
        os.environ[ENV] = ",".join(_modules)


def loaded() -> list[str]:
    """The plugin modules this process imported by name (a spec's, $ORCH_PLUGINS'): what a
    unit of work carries to its Ray worker. Not through Ray's runtime_env: a job with one
    cannot use the workers Ray starts ahead (each trial actor would start a fresh process,
    about a second of its start), and a shared Ray's workers never see a later driver's."""
    return list(_modules)


def ensure(modules: Iterable[str] = (), where: str = "plugins") -> None:
    """The driver side: entry points, then the spec's ``plugins:`` modules."""
    load_entry_points()
    import_modules(modules, where)


def load_installed(modules: Iterable[str] = ()) -> None:
    """Entry points, the ``$ORCH_PLUGINS`` modules and ``modules`` (a unit's, from its
    driver): what a Ray worker and ``orchestrator cells`` / ``tasks`` load."""
    load_entry_points()
    names = [m for m in os.environ.get(ENV, "").split(",") if m]
    import_modules(names, f"${ENV}")
    import_modules(modules, "plugins")
