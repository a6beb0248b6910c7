"""The one registry of tasks: name -> task class (whose ``Config`` holds its parameters)."""

from __future__ import annotations

from typing import Any

from tasks.base import Task
from tasks.config import field_names, validate_params
from tasks.haystack import Collision, Haystack
from tasks.mad import MADRecall
from tasks.mqar import MQAR
from tasks.s5 import S5
from tasks.scaling import ARScaling, MQARScaling

REGISTRY: dict[str, type[Task]] = {
    cls.name: cls for cls in (MQAR, Haystack, Collision, S5, MADRecall, ARScaling, MQARScaling)
}
NAMES: tuple[str, ...] = tuple(REGISTRY)
BUILTIN: frozenset[str] = frozenset(REGISTRY)


def register_task(cls: type[Task]) -> type[Task]:
    """Add a task class from outside this package (a plugin; usable as a class decorator).
    It needs a unique ``name`` and a pydantic ``Config`` (see :mod:`tasks.base`); it then
    validates, builds and lists like a built-in task. Re-registering a plugin's name
    replaces it (a re-imported module), never a built-in."""
    import sys

    global NAMES
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"register_task expects a tasks.Task subclass, got {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"task class {cls.__name__} has no name")
    if name in BUILTIN and REGISTRY[name] is not cls:
        raise ValueError(f"task {name!r} is built in; give the plugin's task its own name")
    REGISTRY[name] = cls
    NAMES = tuple(REGISTRY)
    pkg = sys.modules.get("tasks")
    if pkg is not None:
        pkg.NAMES = NAMES  # type: ignore[attr-defined]
    return cls


def task_class(name: str) -> type[Task]:
    if name not in REGISTRY:
        raise ValueError(f"unknown task {name!r} (known: {', '.join(NAMES)})")
    return REGISTRY[name]


def params(name: str) -> dict[str, Any]:
    """``{parameter: default}`` for task ``name``."""
    fields = task_class(name).Config.model_fields
    return {k: fields[k].default for k in field_names(task_class(name).Config)}


def validate(name: str, params: dict[str, Any]) -> None:
    """Raise ``ValueError`` (one line) unless ``params`` are valid for task ``name``; no data made."""
    validate_params(name, task_class(name).Config, dict(params))


def build(name: str, **params: Any) -> Task:
    """The task ``name`` with ``params`` (unknown or ill-typed parameters raise ``ValueError``)."""
    cls = task_class(name)
    return cls(validate_params(name, cls.Config, params))
