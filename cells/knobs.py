"""Typed knob specifications: what each constructor argument of an arm accepts.

A sweep passes knobs as plain YAML values, so every value is checked strictly here (no
coercion: ``"4"`` is not an int, ``1`` is not a bool) and the error names the knob, the arm,
what was expected and what arrived, in one line. Nothing here builds a model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

READ_PATTERN = re.compile(r"^ns(\d+)$")
MAX_NS_STEPS = 64


@dataclass(frozen=True)
class Knob:
    """One knob: its default, its kind and bounds, and a one-line help text.

    ``kind`` is one of ``int``, ``float``, ``bool``, ``choice``, ``read`` (mlstm read names,
    ``raw | polar | rls | st_forward | st_backward | ns<k>``). ``nullable`` admits ``None``
    (meaning "derive from d_model"). ``fixed`` marks a knob whose value the arm's name
    states: only the default is accepted.
    """

    default: Any
    kind: str
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False
    fixed: bool = False

    def expects(self) -> str:
        """Human wording of the accepted values, used in error messages."""
        if self.kind in ("int", "float"):
            text = "int" if self.kind == "int" else "number"
            if self.minimum is not None and self.maximum is not None:
                text += f" in [{self.minimum:g}, {self.maximum:g}]"
            elif self.minimum is not None:
                text += f" >= {self.minimum:g}"
        elif self.kind == "bool":
            text = "true or false"
        elif self.kind == "choice":
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.kind == "read":
            text = f"one of 'raw', 'polar', 'rls', 'st_forward', 'st_backward', 'ns<k>' with k in 0..{MAX_NS_STEPS}"
        else:  # pragma: no cover - guarded by the registry's own tests
            raise AssertionError(self.kind)
        if self.nullable:
            text += " or null"
        return text

    def check(self, value: Any) -> Any:
        """Return the normalised value, or raise ValueError (message: what was expected)."""
        if value is None and self.nullable:
            return None
        ok = False
        if self.kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool) and self._in_bounds(value)
        elif self.kind == "float":
            ok = (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and value == value
                and self._in_bounds(value)
            )
            if ok:
                value = float(value)
        elif self.kind == "bool":
            ok = isinstance(value, bool)
        elif self.kind == "choice":
            ok = isinstance(value, str) and value in self.choices
        elif self.kind == "read":
            ok = isinstance(value, str) and (
                value in ("raw", "polar", "rls", "st_forward", "st_backward")
                or ((m := READ_PATTERN.match(value)) is not None and int(m.group(1)) <= MAX_NS_STEPS)
            )
        if not ok:
            raise ValueError(self.expects())
        if self.fixed and value != self.default:
            raise ValueError(f"the fixed value {self.default!r}")
        return value

    def _in_bounds(self, value: float) -> bool:
        if self.minimum is not None and value < self.minimum:
            return False
        if self.maximum is not None and value > self.maximum:
            return False
        return True


def with_default(knob: Knob, default: Any, *, fixed: bool = False) -> Knob:
    """A copy of ``knob`` with another default (and optionally fixed to it)."""
    return Knob(
        default=default,
        kind=knob.kind,
        help=knob.help,
        minimum=knob.minimum,
        maximum=knob.maximum,
        choices=knob.choices,
        nullable=knob.nullable,
        fixed=fixed,
    )


@dataclass(frozen=True)
class KnobSet:
    """The knobs one arm accepts, in display order."""

    knobs: dict[str, Knob] = field(default_factory=dict)

    def defaults(self) -> dict[str, Any]:
        return {name: k.default for name, k in self.knobs.items()}

    def resolve(self, arm: str, given: dict[str, Any]) -> dict[str, Any]:
        """Defaults overlaid with ``given``; raises ValueError naming the first bad knob."""
        unknown = sorted(set(given) - set(self.knobs))
        if unknown:
            known = ", ".join(sorted(self.knobs))
            raise ValueError(f"unknown knob {unknown[0]!r} for arm {arm!r} (known: {known})")
        out = self.defaults()
        for name, value in given.items():
            knob = self.knobs[name]
            try:
                out[name] = knob.check(value)
            except ValueError as exc:
                raise ValueError(f"knob {name!r} for arm {arm!r} expects {exc}, got {value!r}") from None
        return out


def read_ns_steps(read: str) -> int | None:
    """``k`` for a read named ``ns<k>``, else None."""
    m = READ_PATTERN.match(read)
    return int(m.group(1)) if m else None
