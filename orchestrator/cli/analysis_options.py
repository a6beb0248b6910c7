"""The options of ``orchestrator analyze`` and ``orchestrator report``, generated from
:class:`~orchestrator.analysis_config.AnalysisConfig`: one option per field, under the
field's name (``collapse_below`` -> ``--collapse-below``), the field's description as its
help. An option left out keeps the value of the spec's ``analysis:`` block, so none has a
default of its own (the field's default is shown in the help).

The names the CLI used before the options were generated stay as hidden aliases:
``--groups`` (now ``--compare``), ``--status`` (``--statuses``), ``--seed``
(``--random-seed``), and ``--cells`` (``--strata``), which was deprecated already and says so
on stderr.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, Optional

import typer
from pydantic.fields import FieldInfo

from orchestrator.analysis_config import AnalysisConfig
from orchestrator.errors import UserError

# old option name -> the field it sets
OLD_FLAGS = {"cells": "strata", "groups": "compare", "status": "statuses", "seed": "random_seed"}
DEPRECATED = ("cells",)  # these say so on stderr when used


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _cli_type(field: FieldInfo) -> Any:
    """What the option parses: a float or an int where the field is a number, a list of
    strings (the option repeated) for a list of pairs, else a string that the model validates
    (``a,b`` lists, ``key=value`` mappings, the literals), so a bad value is the model's
    one-line error."""
    ann = field.annotation
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        ann = args[0] if len(args) == 1 else str
    if typing.get_origin(ann) is typing.Annotated:  # PositiveInt
        ann = typing.get_args(ann)[0]
    if ann in (int, float):
        return ann
    if ann == list[list[str]]:
        return list[str]
    return str


def _shown(value: Any) -> str | None:
    """A field default as the help shows it (None where there is nothing to show)."""
    if value is None or value == []:
        return None
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _help(field: FieldInfo) -> str:
    text = field.description or ""
    if _cli_type(field) is list[str]:
        text += "; repeat the option for more"
    default = _shown(field.get_default(call_default_factory=True))
    return f"{text} (default {default})" if default is not None else text


def _option(name: str, field: FieldInfo, *, old: str | None = None) -> inspect.Parameter:
    """The command parameter of one field (or of its old spelling ``old``, hidden)."""
    # A list of pairs is the option repeated, one A,B each.
    metavar = "A,B" if _cli_type(field) is list[str] else None
    if old is None:
        info = typer.Option(None, _flag(name), help=_help(field), metavar=metavar)
    else:
        info = typer.Option(None, _flag(old), hidden=True, help=f"old name of {_flag(name)}", metavar=metavar)
    return inspect.Parameter(
        old or name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=Optional[_cli_type(field)]
    )


def _given(values: dict[str, Any]) -> dict[str, Any]:
    """The options given, under the fields' names."""
    for old, new in OLD_FLAGS.items():
        if values.get(old) is None:
            continue
        if values.get(new) is not None:
            raise UserError(f"{_flag(old)} is the old name of {_flag(new)}: give one of them")
        if old in DEPRECATED:
            print(f"note: {_flag(old)} is deprecated, use {_flag(new)}", file=sys.stderr)
        values[new] = values[old]
    # A repeatable option left out arrives as an empty list or tuple: not given either.
    return {
        name: list(v) if isinstance(v, tuple) else v
        for name in AnalysisConfig.model_fields
        if (v := values[name]) is not None and not (isinstance(v, (list, tuple)) and not v)
    }


def analysis_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command one option per :class:`AnalysisConfig` field (after its own
    parameters); the command receives the ones given as ``options`` (a dict by field name,
    the values as typed, for :meth:`AnalysisConfig.with_overrides`)."""
    fields = AnalysisConfig.model_fields
    own = [p for p in inspect.signature(command).parameters.values() if p.name != "options"]
    added = [_option(name, f) for name, f in fields.items()]
    added += [_option(new, fields[new], old=old) for old, new in OLD_FLAGS.items()]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        values = {p.name: kwargs.pop(p.name) for p in added}
        command(**kwargs, options=_given(values))

    wrapper.__signature__ = inspect.Signature(own + added)  # type: ignore[attr-defined]
    return wrapper
