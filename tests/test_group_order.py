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


def test_labels_per_row_equal_formatting_every_row_for_typed_and_object_columns():
    """``groups.labels`` formats each distinct value once (a typed column through its codes,
    an object column through a cache by value and type); every row's label equals
    ``format_value`` of that row, for the dtypes a trials frame holds."""
    pool = [True, False, 1, 0, 1.0, 0.0, 2.5, None, np.nan, "x", "1", np.int64(3), 3, 1e-3, [1, 2], {"k": 1}]
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(0, 40)
        df = pd.DataFrame(
            {
                "obj": pd.Series([rng.choice(pool) for _ in range(n)], dtype=object),
                "f": pd.Series([rng.choice([0.1, 1.0, 3000.0, 1e-5, np.nan, 2.5e20]) for _ in range(n)], dtype=float),
                "i": pd.Series([rng.choice([0, 7, -3, 2**40]) for _ in range(n)], dtype=np.int64),
                "b": pd.Series([rng.choice([True, False]) for _ in range(n)], dtype=bool),
                "I": pd.Series([rng.choice([1, None, 5]) for _ in range(n)], dtype="Int64"),
            }
        )
        for by in (["obj"], ["f"], ["i"], ["b"], ["I"], ["f", "obj", "b"]):
            # Each row's value through format_value, as Series.map hands it over (a nullable
            # integer's missing value arrives as NaN: "NA").
            cols = [df[b].map(groups.format_value).tolist() for b in by]
            want = ["/".join(parts) for parts in zip(*cols)]
            got = groups.labels(df, by)
            assert list(got) == want and got.index.equals(df.index), (df.to_dict("list"), by)
