"""The distinct group labels in value order (``analysis.groups.ordered``, the grid's rows and
columns and every table's groups) come from each distinct combination of values, formatted
once; they equal a brute force that formats every trial's row."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd

from orchestrator.analysis import groups


def _brute(trials: pd.DataFrame, by: list[str]) -> list[str]:
    if not by:
        return ["all"] if len(trials) else []
    seen: dict[str, tuple] = {}
    for rec in trials[by].itertuples(index=False, name=None):
        lab = "/".join(groups.format_value(v) for v in rec)
        seen.setdefault(lab, tuple(groups._sort_key(v) for v in rec))
    return sorted(seen, key=lambda lab: seen[lab])


def test_ordered_labels_equal_formatting_every_row_with_types_kept_apart():
    # True, 1, 1.0 and np.int64(1) compare equal in pandas; their labels differ ("true", "1").
    pool = [True, False, 1, 0, 1.0, 0.0, 2.5, None, np.nan, "x", "1", np.int64(3), 3, 1e-3, 0.001]
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(0, 30)
        df = pd.DataFrame(
            {"a": [rng.choice(pool) for _ in range(n)], "b": [rng.choice(pool[:6]) for _ in range(n)]}, dtype=object
        )
        for by in (["a"], ["a", "b"], ["b", "a"], []):
            assert groups.ordered(df, by) == _brute(df, by), (df.to_dict("list"), by)


def test_unhashable_values_are_ordered_as_before():
    df = pd.DataFrame({"a": [[1, 2], [1, 2], [3], {"k": 1}], "b": [1, 1, 2, 2]})
    assert groups.ordered(df, ["a", "b"]) == _brute(df, ["a", "b"])
    assert list(groups.distinct_rows(df[["a"]])["a"]) == [[1, 2], [1, 2], [3], {"k": 1}]  # kept whole


def test_distinct_rows_keep_the_first_of_each_and_its_type():
    df = pd.DataFrame({"a": [1, True, 1.0, 1, True, None, np.nan, None]}, dtype=object)
    got = groups.distinct_rows(df)["a"].tolist()
    assert [type(v) for v in got] == [int, bool, float, type(None), float]
