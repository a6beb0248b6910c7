"""A big sweep's eval read in a child process (orchestrator.ui.offload, issue 34 item 5): the
frame it sends back equals the in-process read, an unknown sweep is the same 404 error, the
request's deadline kills the child, and the dashboard's bands, grid and curves are the same
answers whichever way the evals were read.

Real parts: a real SQLite file written as ``bench ui`` writes it, real child processes from a
real forkserver, the real app in-process (ui_support.asgi_call)."""

from __future__ import annotations

import json
import multiprocessing
import time

import pandas as pd
import pytest

from orchestrator.analysis.data import read_evals
from orchestrator.bench.ui import SWEEP, build_db_fast
from orchestrator.store import deadline
from orchestrator.store.reader import NotFound, open_reader_engine
from orchestrator.ui import db as q
from orchestrator.ui import offload
from orchestrator.ui.app import create_app
from ui_support import asgi_call

N_TRIALS, N_EVALS = 400, 15


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('offload') / 'offload.db'}"
    build_db_fast(url, N_TRIALS, N_EVALS)
    e, _ = open_reader_engine(url)
    yield e
    e.dispose()


def _url(engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def _no_children_left() -> bool:
    return not [p for p in multiprocessing.active_children() if p.name == offload.CHILD_NAME]


def test_the_child_read_equals_the_in_process_read_and_leaves_no_process(engine):
    got = offload.read_evals(_url(engine), SWEEP)
    want = read_evals(engine, SWEEP)
    pd.testing.assert_frame_equal(got, want)
    assert len(got) == N_TRIALS * N_EVALS and _no_children_left()


def test_ranges_of_trials_read_side_by_side_make_the_whole_read(engine):
    """The sweep's trials cut into ranges of about equal size (counted here from the trial
    ids), read by one child each: the frame equals the one read in-process, and so does each
    range read in-process, joined in order."""
    import sqlalchemy as sa

    from orchestrator.store.reader import sweep_id, trial_id_bounds

    want = read_evals(engine, SWEEP)
    with engine.connect() as c:
        sid = sweep_id(c, SWEEP)
        ids = [i for (i,) in c.execute(sa.text("SELECT id FROM trials WHERE sweep_id = :s"), {"s": sid})]
        cuts = {k: trial_id_bounds(c, sid, k) for k in (1, 2, 3, 7)}
    for k, bounds in cuts.items():
        assert len(bounds) == k and bounds[0][0] == min(ids) and bounds[-1][1] is None
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # consecutive
        sizes = [sum(lo <= i and (hi is None or i < hi) for i in ids) for lo, hi in bounds]
        assert sum(sizes) == N_TRIALS and max(sizes) - min(sizes) <= 1, (k, sizes)
        joined = pd.concat([read_evals(engine, SWEEP, b) for b in bounds], ignore_index=True)
        pd.testing.assert_frame_equal(joined, want)
    pd.testing.assert_frame_equal(offload.read_evals(_url(engine), SWEEP, cuts[3]), want)
    assert _no_children_left()


def test_an_unknown_sweep_is_the_same_not_found_error_through_the_child(engine):
    with pytest.raises(NotFound) as child:
        offload.read_evals(_url(engine), "no_such_sweep")
    with pytest.raises(NotFound) as here:
        read_evals(engine, "no_such_sweep")
    assert str(child.value) == str(here.value) and _no_children_left()


def test_a_passed_deadline_kills_the_child_and_raises_timeout(engine):
    t0 = time.monotonic()
    with deadline.within(0.0), pytest.raises(TimeoutError):
        offload.read_evals(_url(engine), SWEEP)
    assert time.monotonic() - t0 < 5 and _no_children_left()
    stop = deadline.Stop()
    stop.set()  # the server stopping counts as the deadline passed
    with deadline.within(None, stop), pytest.raises(TimeoutError):
        offload.read_evals(_url(engine), SWEEP)
    assert _no_children_left()


def test_the_pages_answers_are_the_same_with_the_evals_read_by_a_child(engine, monkeypatch):
    """The bands, the grid and the escape-time curves of the sweep, once with the evals read
    in-process and once (the threshold lowered under the sweep's size) by a child."""
    app = create_app(engine, _url(engine))
    paths = (
        f"/api/sweeps/{SWEEP}/bands?by=lr",
        f"/api/sweeps/{SWEEP}/grid?x=lr&y=model.read",
        f"/api/sweeps/{SWEEP}/km?by=model.read",
    )

    def answers() -> list[dict]:
        for cache in (q.EVALS, q.PREPARED, q.BANDS):
            monkeypatch.setattr(cache, "items", {})
        out = []
        for p in paths:
            code, _h, body = asgi_call(app, p)
            assert code == 200, (p, body[:300])
            out.append(json.loads(body))
        return out

    reads = []
    real = offload.read_evals
    monkeypatch.setattr(offload, "read_evals", lambda *a: reads.append(a) or real(*a))
    here = answers()
    assert not reads  # 400 trials: read in-process
    monkeypatch.setattr(offload, "OFFLOAD_TRIALS", N_TRIALS - 1)
    monkeypatch.setattr(offload, "PARTS", 3)
    child = answers()
    assert len(reads) == 1  # one read (three children) shared by the three views
    assert len(reads[0][2]) == 3
    assert child == here
    assert _no_children_left()


def test_the_child_reads_with_a_readers_rights_on_each_backend(db_url):
    """On SQLite and on PostgreSQL (through the schema's reader role, the URL the dashboard's
    engine holds) the child's frame equals the in-process read."""
    build_db_fast(db_url, 60, 7)
    engine, _ = open_reader_engine(db_url)
    try:
        url = _url(engine)
        if not db_url.startswith("sqlite"):
            assert "root" not in url.split("@")[0]  # the reader role's login, not the owner's
        pd.testing.assert_frame_equal(offload.read_evals(url, SWEEP), read_evals(engine, SWEEP))
        from orchestrator.store.reader import sweep_id, trial_id_bounds

        with engine.connect() as c:
            bounds = trial_id_bounds(c, sweep_id(c, SWEEP), 2)
        pd.testing.assert_frame_equal(offload.read_evals(url, SWEEP, bounds), read_evals(engine, SWEEP))
    finally:
        engine.dispose()
    assert _no_children_left()


def test_where_no_child_can_start_the_page_reads_the_evals_in_process(engine, monkeypatch):
    """A server whose children cannot start (``Unavailable``) still answers: the read falls
    back to the server's own process."""

    def refuse(*_a):
        raise offload.Unavailable("no processes here")

    monkeypatch.setattr(offload, "read_evals", refuse)
    monkeypatch.setattr(offload, "OFFLOAD_TRIALS", 0)
    monkeypatch.setattr(q.EVALS, "items", {})
    pd.testing.assert_frame_equal(q.sweep_evals(engine, SWEEP), read_evals(engine, SWEEP))
