"""The unit of work a Tune trial carries in its config (one trial, or a seed pack of several).

Its own module: the feed builds units and the Tune runner launches them, and neither imports
the other for it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


class Unit(Mapping[str, Any]):
    """One unit of work as it travels in a Tune trial's config: read-only, and copied by
    reference. Tune deep-copies the whole unresolved search space once per variant, grid
    included, so a grid of plain dicts costs O(units^2) copies of every member's params
    (seconds at 500 trials, minutes at 5,000); a leaf that copies as itself costs nothing.
    Its repr names its trials, which keeps Tune's per-trial tag short too."""

    __slots__ = ("_d",)

    def __init__(self, d: Mapping[str, Any]) -> None:
        self._d = dict(d)

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __copy__(self) -> Unit:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Unit:
        return self

    def __getstate__(self) -> dict[str, Any]:
        return self._d

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._d = state

    def __repr__(self) -> str:
        return "trials_" + "_".join(str(m["trial_id"]) for m in self._d["members"])
