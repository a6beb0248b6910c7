"""Per-task parameter models and their one-line validation messages.

Every task's parameters are a pydantic model with ``extra="forbid"`` and ``strict=True``: a
misspelt knob or a float where an int belongs must fail the sweep at submit time, never be
silently coerced or dropped in a 500-trial sweep. :func:`validate_params` turns pydantic's
multi-line report into one line that names the parameter, what it expects and what it got.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

import annotated_types as at
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

EVAL_BATCH = 256  # eval sets are split into batches of at most this many sequences


class TaskConfig(BaseModel):
    """Base of every task's parameters. ``eval_size``: sequences in the fixed held-out set."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    eval_size: int = Field(1024, ge=1)

    def check(self, task: str) -> None:
        """Cross-field checks; raise ``ValueError`` with one line. Subclasses extend."""


def describe_field(info: FieldInfo) -> str:
    """``int >= 1``, ``float in [0, 1)``, ``one of 'none', 'ramp'``, ``int >= 0 or None``."""
    ann = info.annotation
    optional = False
    origin = typing.get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        optional = len(args) < len(typing.get_args(ann))
        ann = args[0] if len(args) == 1 else ann
    if typing.get_origin(ann) is Literal:
        desc = "one of " + ", ".join(repr(a) for a in typing.get_args(ann))
    else:
        desc = getattr(ann, "__name__", str(ann))
        lo = hi = None
        for m in info.metadata:
            if isinstance(m, at.Ge):
                lo = f">= {m.ge}"
            elif isinstance(m, at.Gt):
                lo = f"> {m.gt}"
            elif isinstance(m, at.Le):
                hi = f"<= {m.le}"
            elif isinstance(m, at.Lt):
                hi = f"< {m.lt}"
        if lo and hi:
            desc += f" {lo} and {hi}"
        elif lo or hi:
            desc += f" {lo or hi}"
    return desc + (" or None" if optional else "")


def field_names(model: type[TaskConfig]) -> list[str]:
    """The task's own parameters first, then the shared ones (``eval_size``)."""
    shared = list(TaskConfig.model_fields)
    return [n for n in model.model_fields if n not in shared] + shared


def validate_params(task: str, model: type[TaskConfig], params: dict[str, Any]) -> TaskConfig:
    """Build ``model(**params)``; on failure raise ``ValueError`` with one line."""
    known = ", ".join(field_names(model))
    for key in params:
        if key not in model.model_fields:
            raise ValueError(f"unknown parameter {key!r} for task {task!r} (known: {known})")
    try:
        cfg = model(**params)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "?"
        info = model.model_fields.get(name)
        expects = describe_field(info) if info is not None else err["msg"]
        raise ValueError(f"parameter {name!r} for task {task!r} expects {expects}, got {err.get('input')!r}") from None
    cfg.check(task)
    return cfg
