"""Reading a spec safely: its text bounded in size, its YAML strict (no duplicate keys, no tags)
and bounded in depth and size, its top level validated, its plugins imported, and a password
in a URL redacted before the text is stored."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from orchestrator.errors import UserError
from orchestrator.sources import MAX_SPEC_BYTES, read_text_file
from orchestrator.spec.schema import Fail, SpecError, SweepSpec, first_error
from orchestrator.yaml_load import DuplicateKeyError, TagError, load_strict

MAX_DEPTH = 32  # a spec is a few levels deep (blocks -> axes -> values)
MAX_NODES = 1_000_000  # values after alias expansion ("billion laughs" stops here)


def _shape(raw: Any) -> None:
    """Depth and size of the loaded YAML, walked iteratively (aliases count every time they
    are used, so an alias bomb is refused here and not expanded later)."""
    stack: list[tuple[Any, int]] = [(raw, 1)]
    nodes = 0
    while stack:
        obj, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ValueError(f"more than {MAX_NODES:,} values (an alias expanding too far?)")
        if depth > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(obj, dict):
            stack.extend((v, depth + 1) for v in obj.values())
            stack.extend((k, depth + 1) for k in obj if isinstance(k, (tuple, list, dict)))
        elif isinstance(obj, (list, tuple)):
            stack.extend((v, depth + 1) for v in obj)


_PASSWORD_IN_URL = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\"]*:)([^\s@'\"]+)(@)")


def redact(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` URL as ``***``."""
    return _PASSWORD_IN_URL.sub(lambda m: m.group(1) + "***" + m.group(3), text)


def read_source(path: str | Path | None, text: str | None, label: str) -> str:
    """The spec's text: as given, or read from ``path``; bounded in size, no NUL byte."""
    if text is None:
        if path is None:
            raise SpecError("<spec>: give a path or the spec's text")
        try:
            # A regular file only, its size checked before reading (a symlink to /dev/zero or
            # a FIFO would otherwise fill memory or hang).
            text = read_text_file(path, limit=MAX_SPEC_BYTES, label=label)
        except UserError as exc:
            raise SpecError(str(exc)) from None
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(f"{label}: above the {MAX_SPEC_BYTES:,}-byte (1 MiB) limit of a spec")
    if "\x00" in text:
        raise SpecError(f"{label}: contains a NUL byte (not a text file?)")
    return text


def parse_yaml(text: str, label: str) -> Any:
    """The YAML, strictly (no duplicate keys, no tags), bounded in depth and size."""
    try:
        raw = load_strict(text)
        _shape(raw)
    except RecursionError:
        raise SpecError(f"{label}: nested too deeply (more than {MAX_DEPTH} levels)") from None
    except ValueError as exc:
        raise SpecError(f"{label}: {exc}") from None
    except DuplicateKeyError as exc:
        line = exc.mark.line + 1 if exc.mark else "?"
        raise SpecError(f"{label}: line {line}: duplicate key {exc.key!r}") from None
    except TagError as exc:
        line = exc.mark.line + 1 if exc.mark else "?"
        raise SpecError(
            f"{label}: line {line}: YAML tag {exc.shown!r} is not allowed "
            "(a spec is plain values, lists and mappings; quote a value to make it a string)"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        pos = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{label}: malformed YAML at {pos}: {problem}") from None
    return raw


def validate_shape(raw: Any, label: str, fail: Fail) -> SweepSpec:
    """The top level: a mapping of the known keys with values of the right kinds."""
    if not isinstance(raw, dict):
        raise SpecError(f"{label}: (top level): expected a mapping with name, axes, fixed, ...")
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as exc:
        where, msg = first_error(exc)
        fail(where, msg)


def import_plugins(spec: SweepSpec, label: str) -> None:
    """The modules the spec's ``plugins:`` names, imported before its arms and tasks are checked."""
    from orchestrator import plugins

    plugins.ensure(spec.plugins, f"{label}: plugins")


def stored_text(text: str, warnings: list[str]) -> str:
    """The text stored with the sweep: a password in a URL never reaches the database."""
    stored = redact(text)
    if stored != text:
        warnings.append(
            "the spec holds a password in a URL; it is stored as *** — put it in "
            "PGPASSFILE (~/.pgpass) or the environment (PGPASSWORD, $ORCH_DB) instead"
        )
    return stored
