"""The sweep page of a big sweep (issue 34 item 5): past ``BAND_TRIALS`` trials the traces plot
shows quantile bands per colour group, computed by the server, and the grid cell and the
overlay fetch just their trials' traces (``ids=``). The bands equal a pandas computation
from the same rows; the caches stay bounded and build once under concurrent requests; in
headless Chromium (slow) a big sweep whose colour values are markup draws the bands with
that markup as text, and a clicked grid cell draws its trials.

Real parts: a real SQLite file (the ``bench ui`` fixture written in bulk, or ``orchestrator
import``), the real app in-process (ui_support.asgi_call) or a real `orchestrator ui` process."""

from __future__ import annotations

import json
import shutil
import threading
import time

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

from orchestrator.bench.ui import SWEEP, build_db_fast
from orchestrator.store import reader
from orchestrator.store.engine import make_engine
from orchestrator.store.reader import open_reader_engine
from orchestrator.ui import db as q
from orchestrator.ui.app import create_app
from ui_support import IMG, PLOT, SCRIPT, asgi_call, chromium, ui_server, wait_for

N_TRIALS, N_EVALS = 300, 12


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('bands') / 'bands.db'}"
    build_db_fast(url, N_TRIALS, N_EVALS)
    return url


@pytest.fixture(scope="module")
def engine(big):
    e, _ = open_reader_engine(big)
    yield e
    e.dispose()


@pytest.fixture(scope="module")
def app(engine, big):
    return create_app(engine, big)


def _json(app, path: str, **kw) -> tuple[int, dict]:
    code, _h, body = asgi_call(app, path, **kw)
    return code, json.loads(body)


def _expected(engine, by: str, facet: str | None, where: str | None) -> pd.DataFrame:
    """The quantiles straight from pandas: every trace row of the view's trials, each
    trial's values of ``by`` and ``facet`` as strings, ``groupby(...).quantile``."""
    table = q.trials(engine, SWEEP, where=where)
    label = {r["trial_id"]: (str(r["params"].get(facet)), str(r["params"][by])) for r in table.rows}
    with engine.connect() as conn:
        rows = reader.trace_rows(conn, SWEEP, ("trial_id", "step", "acc", "loss"), None)
    df = pd.DataFrame(rows, columns=["trial_id", "step", "acc", "loss"])
    df = df[df["trial_id"].isin(label)]
    df["facet"] = [label[t][0] for t in df["trial_id"]]
    df["group"] = [label[t][1] for t in df["trial_id"]]
    out = df.groupby(["facet", "group", "step"])[["acc", "loss"]].quantile([0.1, 0.25, 0.5, 0.75, 0.9])
    return out.unstack()


@pytest.mark.parametrize(
    "by, facet, where",
    [("model.read", None, None), ("model.read", "lr", None), ("lr", None, "read = 'raw'")],
)
def test_bands_are_the_pandas_quantiles_of_the_same_rows(app, engine, by, facet, where):
    path = f"/api/sweeps/{SWEEP}/bands?by={by}" + (f"&facet={facet}" if facet else "")
    if where:
        path += "&where=" + where.replace(" ", "%20").replace("'", "%27")
    code, b = _json(app, path)
    assert code == 200, b
    want = _expected(engine, by, facet, where)
    assert b["by"] == by and b["facet"] == facet and b["quantiles"] == [0.1, 0.25, 0.5, 0.75, 0.9]
    n_view = len(q.trials(engine, SWEEP, where=where).rows)
    assert b["n_trials"] == n_view and (where is None) == (n_view == N_TRIALS)
    seen, trials = 0, 0
    for panel in b["panels"]:
        for g in panel["groups"]:
            key = (str(panel["value"]), str(g["value"]))
            exp = want.loc[key]
            assert g["step"] == [int(s) for s in exp.index]
            trials += g["trials"]
            for m in ("acc", "loss"):
                for p in (10, 25, 50, 75, 90):
                    got = np.array(g[f"{m}_q{p}"], dtype=float)
                    assert np.allclose(got, exp[(m, p / 100)].to_numpy(), atol=1e-5), (key, m, p)
            seen += 1
    assert seen == len(want.index.droplevel("step").unique()) and trials == n_view


def test_bands_refuse_a_bad_parameter_and_too_many_groups_in_one_line(app, monkeypatch):
    code, b = _json(app, f"/api/sweeps/{SWEEP}/bands?by=nope")
    assert code == 400 and b["error"] == "error: by='nope': the sweep has no parameter of that name"
    monkeypatch.setattr(q, "MAX_GROUPS", 10)  # the fixture's seed takes 17 values
    code, b = _json(app, f"/api/sweeps/{SWEEP}/bands?by=seed")
    assert code == 400 and b["error"] == (
        "error: by='seed': 17 values, more than the 10 groups the quantile bands draw; "
        "colour by a parameter with fewer values, or narrow with where="
    )
    code, b = _json(app, "/api/sweeps/nosuch/bands")
    assert code == 404


def test_the_default_colour_is_the_varying_parameter_with_fewest_values(app, engine):
    code, b = _json(app, f"/api/sweeps/{SWEEP}/bands")
    table = q.trials(engine, SWEEP)
    counts = {p: len({json.dumps(r["params"].get(p)) for r in table.rows}) for p in table.varying if p != "seed"}
    assert code == 200 and counts[b["by"]] == min(counts.values())


def test_traces_of_named_trial_ids_only(app, engine):
    ids = [r["trial_id"] for r in q.trials(engine, SWEEP).rows[:3]]
    code, t = _json(app, f"/api/sweeps/{SWEEP}/traces?ids={ids[0]},{ids[2]}")
    assert code == 200 and sorted(set(t["columns"]["trial_id"])) == [ids[0], ids[2]]
    assert t["n"] == 2 * N_EVALS
    body = json.dumps({"ids": str(ids[1])}).encode()
    code, t = _json(app, f"/api/sweeps/{SWEEP}/traces", method="POST", body=body)
    assert code == 200 and set(t["columns"]["trial_id"]) == {ids[1]}
    code, t = _json(app, f"/api/sweeps/{SWEEP}/traces?ids=1,x2")
    assert code == 400 and t["error"] == "error: ids: 'x2' is not a trial id; expected ids=1,2,3"


def test_the_band_cache_is_bounded(engine):
    q.BANDS.items.clear()
    for lr in ("0.001", "0.003", "0.01", "0.03", "0.1"):
        for read in ("raw", "ns5", "x", "y"):
            q.bands(engine, SWEEP, "model.read", None, f"lr >= {lr} AND read != '{read}'")
    assert len(q.BANDS.items) == q.BANDS.size == 16
    assert not q.BANDS.building


def test_concurrent_requests_build_a_prepared_view_once(engine):
    cache, builds = q._PrepCache(size=2), []

    def build():
        builds.append(1)
        time.sleep(0.3)  # long enough that every thread asks while it is being built
        return object()

    got: list = []
    threads = [threading.Thread(target=lambda: got.append(cache.get(engine, SWEEP, ("k",), build))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(got) == 4 and len({id(v) for v in got}) == 1
    for k in ("a", "b", "c"):
        cache.get(engine, SWEEP, (k,), object)
    assert list(cache.items) == [("b",), ("c",)] and not cache.building


def test_the_sweep_shell_carries_the_trial_count(app):
    code, _h, body = asgi_call(app, f"/sweeps/{SWEEP}")
    assert code == 200 and f'data-trials="{N_TRIALS}"'.encode() in body
    # None running: the page asks for the escape-time curves with the grid (one preparation).
    assert b'data-running="0"' in body


# ---- in headless Chromium ----------------------------------------------------------------------
MARKED = "marked_big"
ARMS = (IMG, SCRIPT, PLOT)


def _marked_db(url: str, tmp) -> None:
    """A 240-trial sweep through `orchestrator import` whose colour parameter's values are
    markup (``arm``: the varying parameter with the fewest values, so the default colour)."""
    from orchestrator.cli import main

    lines = []
    for i in range(240):
        arm = ARMS[i % 3]
        acc = [min(1.0, (0.2 + 0.1 * (i % 3)) * s / 40 + 0.001 * (i % 7)) for s in (10, 20, 30, 40)]
        lines.append(
            json.dumps(
                {
                    "params": {"arm": arm, "lr": [1e-3, 3e-3, 1e-2, 3e-2][i % 4], "seed": i, "task": "mqar"},
                    "trace": [{"step": s, "acc": a, "loss": 1 - a} for s, a in zip((10, 20, 30, 40), acc)],
                }
            )
        )
    src = tmp / "big.jsonl"
    src.write_text("\n".join(lines) + "\n")
    assert main(["import", str(src), "--sweep", MARKED, "--db", url]) == 0


BANDS_JS = """
const d = document.getElementById('facet-0');
if (!d || !d.data) return null;
const med = d.data.filter(t => String(t.uid).startsWith('acc-'));
return {uids: d.data.map(t => t.uid), types: d.data.map(t => t.type), fills: d.data.filter(t => t.fill === 'toself').length,
  trials: med.reduce((n, t) => n + t.meta.trials, 0), legend: Array.from(d.querySelectorAll('.legendtext')).map(e => e.textContent),
  note: document.getElementById('traces-note').textContent, title: d.layout.title.text,
  pwned: typeof window.__pwned, glCanvases: d.querySelectorAll('canvas').length};
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_a_big_sweep_page_draws_bands_with_stored_markup_as_text(tmp_path):
    url = f"sqlite:///{tmp_path / 'marked.db'}"
    _marked_db(url, tmp_path)
    with ui_server(url) as base:
        driver = chromium(console_log=True)
        try:
            driver.get(f"{base}/sweeps/{MARKED}")
            info = wait_for(lambda: driver.execute_script(BANDS_JS), 60, "the bands drawn")
            assert driver.find_element("id", "group").get_attribute("value") == "arm"
            # Per arm: two shaded bands for acc and two for loss, the acc and loss medians.
            assert info["fills"] == 3 * 4 and len(info["uids"]) == 3 * 6 and set(info["types"]) == {"scatter"}
            assert info["trials"] == 240 and info["glCanvases"] == 0
            assert sorted(info["legend"]) == sorted(f"{a} (80)" for a in ARMS)  # stored markup, as text
            assert info["note"].startswith("quantile bands of 240 trials in 3 group(s) by arm")
            assert "tick them in the table, or click a grid cell" in info["note"]
            assert info["title"].startswith("quantile bands of 240 trials") and info["pwned"] == "undefined"
            # The grid is drawn; a clicked cell fetches and draws a line per trial of it.
            wait_for(
                lambda: driver.execute_script("const g = document.getElementById('grid-0'); return g && g.data"),
                60,
                "grid",
            )
            driver.execute_script(
                "document.getElementById('gx').value = 'lr'; document.getElementById('gy').value = 'arm';"
            )
            driver.execute_script("document.getElementById('gx').dispatchEvent(new Event('change'))")
            wait_for(
                lambda: driver.execute_script(
                    "const g = document.getElementById('grid-0'); return g && g.data && g.data[0].y.length === 3"
                ),
                60,
                "the arm x lr grid",
            )
            driver.execute_script(
                "state.cell = {f: null, y: state.grid.y_values[0], x: state.grid.x_values[0]}; drawCell();"
            )
            lines = wait_for(
                lambda: driver.execute_script(
                    "const c = document.getElementById('cell-traces'); return c.data && c.data.length &&"
                    " c.data.filter(t => String(t.uid).startsWith('acc-')).reduce((n, t) => n + t.meta.trials, 0)"
                ),
                60,
                "the cell's traces",
            )
            assert lines == 20  # 240 trials over 3 arms x 4 learning rates
            # A trial ticked in the table is drawn in the overlay from its fetched trace.
            driver.find_element("css selector", "input.overlay-pick").click()
            keys = wait_for(
                lambda: driver.execute_script(
                    "const o = document.getElementById('overlay'); return o.data && o.data.length && o.dataset.keys"
                ),
                30,
                "the overlay",
            )
            n_points = driver.execute_script("return document.getElementById('overlay').data[0].x.length")
            assert keys and n_points == 4
            assert driver.execute_script("return typeof window.__pwned") == "undefined"
            severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]]
            assert not severe, severe
            # A link naming a colour the sweep lacks still draws (the default's bands), faceted
            # by lr: a panel per learning rate, each with its 60 trials.
            driver.get(f"{base}/sweeps/{MARKED}?color=nope&facet=lr")
            titles = wait_for(
                lambda: driver.execute_script(
                    "const ds = document.querySelectorAll('#plots .facet');"
                    "return ds.length === 4 && [...ds].every(d => d.data) && [...ds].map(d => d.layout.title.text)"
                ),
                60,
                "four lr panels",
            )
            assert [t.split(": ")[1] for t in titles] == [
                "quantile bands of 60 trials (median, 25-75 % and 10-90 %)"
            ] * 4
            assert driver.find_element("id", "error").text == ""
        finally:
            driver.quit()


def test_identical_trial_tables_in_flight_are_computed_once(big, tmp_path, monkeypatch):
    calls = []
    real = q._trials

    def counted(*a):
        calls.append(a)
        time.sleep(0.3)  # both requests arrive while the first is computed
        return real(*a)

    monkeypatch.setattr(q, "_trials", counted)
    # A copy of the module's sweep: this test writes to it.
    url = f"sqlite:///{tmp_path / 'copy.db'}"
    shutil.copy(big.removeprefix("sqlite:///"), tmp_path / "copy.db")
    engine, _ = open_reader_engine(url)
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(q.trials(engine, SWEEP))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 3 and got[0] is got[1] is got[2] and len(got[0].rows) == N_TRIALS
    assert not q._TRIALS.flight  # nothing is kept in flight once the call ends
    # The whole table is kept while the sweep is unchanged (q.TABLES) ...
    assert q.trials(engine, SWEEP) is got[0] and len(calls) == 1
    # ... and read again once a write moves the sweep's stamp.
    writer = make_engine(url)
    try:
        with writer.begin() as conn:
            conn.execute(
                sa.text("UPDATE trials SET updated_at = '2099-01-01 00:00:00' WHERE id = (SELECT MIN(id) FROM trials)")
            )
        again = q.trials(engine, SWEEP)
    finally:
        writer.dispose()
        engine.dispose()
    assert len(calls) == 2 and again is not got[0] and len(again.rows) == N_TRIALS


def test_a_group_label_is_the_values_own_json_cached_or_not():
    """The labels the bands group by (``_group_key``): scalars go through a cache keyed by
    their type, so True, 1 and 1.0 stay "true", "1" and "1" however often and in whatever
    order they are asked for; lists and dicts are sorted JSON, never cached."""
    values = [True, 1, 1.0, 2.5, None, "a", "1", [1, 2], {"b": 1, "a": 2}, False, 0, 0.0]
    want = ["true", "1", "1", "2.5", "null", '"a"', '"1"', "[1, 2]", '{"a": 2, "b": 1}', "false", "0", "0"]
    for order in (values, values[::-1], values * 3):
        got = {json.dumps(v, sort_keys=True) + type(v).__name__: q._group_key(v) for v in order}
        assert got == {json.dumps(v, sort_keys=True) + type(v).__name__: w for v, w in zip(values, want)}


def test_rows_to_a_frame_through_a_record_array_equal_from_records():
    """``analysis.data.tuples_frame`` (the grid's and the bands' eval frames) against
    pandas' own ``from_records`` and ``astype``: NULLs as NaN, ints, bools, no rows."""
    from orchestrator.analysis.data import tuples_frame

    dtypes = {"trial_id": np.int64, "step": np.int64, "acc": float, "loss": float, "nonfinite": bool}
    rows = [(1, 0, 0.5, None, 0), (1, 10, None, 2.0, 1), (2, 0, float("inf"), -1.5, False), (7, 30, 1.0, 0.0, True)]
    for got_rows in (rows, []):
        want = pd.DataFrame.from_records(got_rows, columns=list(dtypes)).astype(dtypes)
        pd.testing.assert_frame_equal(tuples_frame(got_rows, dtypes), want)


def test_the_pages_grid_curves_and_bands_share_one_eval_read(app, engine, monkeypatch):
    """The grid (analysis statuses), the escape-time curves (running trials too) and the
    bands group one read of the sweep's evals (``q.sweep_evals``), not three."""
    from orchestrator.analysis import data

    reads = []
    real = data.read_evals
    monkeypatch.setattr(data, "read_evals", lambda *a: reads.append(a) or real(*a))
    own = []  # reads of one status set's evals (the analysis' read when it has no frame)
    real_points = reader.eval_points
    monkeypatch.setattr(reader, "eval_points", lambda *a: own.append(a) or real_points(*a))
    for cache in (q.EVALS, q.PREPARED, q.BANDS):
        monkeypatch.setattr(cache, "items", {})
    for path in (
        f"/api/sweeps/{SWEEP}/bands?by=lr",
        f"/api/sweeps/{SWEEP}/grid?x=lr&y=model.read",
        f"/api/sweeps/{SWEEP}/km?by=model.read",
    ):
        code, b = _json(app, path)
        assert code == 200, (path, b)
    assert len(reads) == 1 and not own
    assert len(q.sweep_evals(engine, SWEEP)) == N_TRIALS * N_EVALS and len(reads) == 1


def test_stored_times_read_as_iso_alike_on_the_text_path_and_the_datetime_path():
    """``q._iso``: SQLite's naive time text goes straight to text; the answer equals the
    datetime path's (UTC, to the second) for every form a store hands back."""
    import datetime as dt

    def slow(t):
        a = reader.aware(t)
        return a.isoformat(timespec="seconds") if a else None

    for t in (
        "2026-12-05 22:57:47",
        "2026-12-05T22:57:47",
        "2026-12-05 22:57:47.999999",
        "2026-01-31 00:00:00.5",
        "2026-12-05 22:57:47+02:00",
        dt.datetime(2026, 12, 5, 22, 57, 47, 123456),
        dt.datetime(2026, 12, 5, 22, 57, 47, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
        None,
    ):
        assert q._iso(t) == slow(t), t
    assert q._iso("2026-12-05 22:57:47") == "2026-12-05T22:57:47+00:00"


def test_grid_and_curves_of_a_finished_sweep_share_one_preparation_and_a_running_trial_splits_them(
    big, tmp_path, monkeypatch
):
    """The grid prepares completed and diverged trials, the escape-time curves running ones
    too (``q._prepared``). With no trial running the two read the same trials, so one
    preparation serves both, each answer naming its own statuses, and the curves equal a
    preparation of their own. Once a trial runs they are prepared apart, and the curves
    count the running trial the grid leaves out."""
    from orchestrator.analysis import pipeline

    calls = []
    real = pipeline.prepare
    monkeypatch.setattr(pipeline, "prepare", lambda *a, **k: calls.append(a[2].statuses) or real(*a, **k))
    url = f"sqlite:///{tmp_path / 'copy.db'}"
    shutil.copy(big.removeprefix("sqlite:///"), tmp_path / "copy.db")
    engine, _ = open_reader_engine(url)
    writer = make_engine(url)
    try:
        for cache in (q.EVALS, q.PREPARED):
            monkeypatch.setattr(cache, "items", {})
        grid = q.grid(engine, SWEEP, "lr", "model.read")
        km = q.escape_times(engine, SWEEP, "model.read", None)
        outcomes = q.outcomes(engine, SWEEP)
        assert len(calls) == 1
        assert grid["statuses"] == outcomes["statuses"] == ["completed", "diverged"]
        assert q._grid_prepared(engine, SWEEP, None).cfg.statuses != q.ESCAPE_STATUSES
        # The shared preparation gives the curves a preparation of their own would give.
        monkeypatch.setattr(q.PREPARED, "items", {})
        alone = q.escape_times(engine, SWEEP, "model.read", None)
        assert len(calls) == 2 and alone == km
        total = sum(c["n"] for p in grid["panels"] for c in p["cells"])
        assert total == N_TRIALS
        with writer.begin() as conn:
            conn.execute(sa.text("UPDATE trials SET status = 'running' WHERE id = (SELECT MIN(id) FROM trials)"))
        # The page is told, and asks for the curves after the grid again (two passes).
        code, _h, body = asgi_call(create_app(engine, url), f"/sweeps/{SWEEP}")
        assert code == 200 and b'data-running="1"' in body
        grid2 = q.grid(engine, SWEEP, "lr", "model.read")
        km2 = q.escape_times(engine, SWEEP, "model.read", None)
        assert len(calls) == 4 and list(calls[2]) != list(calls[3])
        assert sum(c["n"] for p in grid2["panels"] for c in p["cells"]) == N_TRIALS - 1
        assert sum(g["n"] for g in km2["groups"].values()) == N_TRIALS == sum(g["n"] for g in km["groups"].values())
    finally:
        writer.dispose()
        engine.dispose()
