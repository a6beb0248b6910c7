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

REGISTRY: dict[str, type[Task]] = {cls.name: cls for cls in (
    MQAR, Haystack, Collision, S5, MADRecall, ARScaling, MQARScaling)}
NAMES: tuple[str, ...] = tuple(REGISTRY)


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
