"""Result objects of the statistical tests, shaped like lifelines' ``StatisticalResult``:
``p_value``, ``test_statistic``, a per-group ``groups`` mapping, and ``to_dict()`` for
``--json`` (``{"test", "p_value", "test_statistic", "groups", ...details}``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd


def jsonable(x: Any) -> Any:
    """Plain JSON values: numpy scalars unwrapped, NaN/inf as None, tuples as lists."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, pd.DataFrame):
        return [jsonable(r) for r in x.to_dict(orient="records")]
    if hasattr(x, "item") and not isinstance(x, str):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


@dataclass
class TestResult:
    """One test. ``details`` holds test-specific figures (alternative, counts, ...)."""

    __test__ = False  # not a pytest test class, whatever its name says

    test: str
    p_value: float
    test_statistic: float | None
    groups: dict[str, dict[str, Any]]
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> pd.DataFrame:
        """Per-group figures, one row per group."""
        return pd.DataFrame.from_dict(self.groups, orient="index")

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "test": self.test,
                "p_value": self.p_value,
                "test_statistic": self.test_statistic,
                "groups": self.groups,
                **self.details,
            }
        )


class TableResult:
    """A table-shaped analysis (``lockin``, ``outcomes``): ``.summary`` is the table,
    ``.to_dict()`` its rows; indexing and DataFrame attributes reach the table, so code that
    used the bare frame keeps working."""

    def __init__(self, analysis: str, table: pd.DataFrame):
        self.analysis = analysis
        self.table = table

    @property
    def summary(self) -> pd.DataFrame:
        return self.table

    def to_dict(self) -> dict[str, Any]:
        return jsonable({"analysis": self.analysis, "rows": self.table})

    def __getitem__(self, key: Any) -> Any:
        return self.table[key]

    def __len__(self) -> int:
        return len(self.table)

    def __getattr__(self, name: str) -> Any:
        if name == "table":  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self.table, name)

    def __repr__(self) -> str:
        return f"{self.analysis}:\n{self.table.to_string(index=False)}"
