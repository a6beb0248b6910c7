"""Helpers of the ``orchestrator sql`` tests: a store holding a few imported runs to query."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orchestrator.store.engine import open_store_engine
from orchestrator.store.import_jsonl import write_records


def write_runs(url: str, point: Callable[[int], dict]) -> None:
    """Three runs of mlstm on mad_recall (seeds 0, 1, 2) imported into sweep ``w``, each with
    an eval at steps 1, 2 and 3 holding ``point(seed)``."""
    recs = [
        {
            "params": {"arm": "mlstm", "seed": s, "task": "mad_recall"},
            "trace": [{"step": t, **point(s)} for t in (1, 2, 3)],
        }
        for s in range(3)
    ]
    engine, _ = open_store_engine(url)
    write_records(engine, "w", recs, source="t")
    engine.dispose()  # closes the writer (a late close would checkpoint the WAL mid-test)


def filled_fixture(fill: Callable[[str], None]):
    """A fixture ``filled``: the test's ``db_url`` once ``fill`` has written into it."""

    @pytest.fixture
    def filled(db_url):
        fill(db_url)
        return db_url

    return filled
