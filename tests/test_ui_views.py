"""The sweep page's W&B-style views (issue 32 item 4) and the compare view mended: the
importance and outcomes endpoints and their CSV, the comparison kept apart per arm with a
``where``, the index's ETA (item 7); in headless Chromium (slow): the overlay of trials
picked in the table surviving a reload, bounded, hostile keys shown as text; the parallel
coordinates drawn as SVG in the colour outcome the URL names; the compare view's points,
whiskers and captions.

Real parts: a real SQLite file written through the store's writers, the real app in-process
(tests/ui_support.py's asgi_call) or a real `orchestrator ui` process."""

from __future__ import annotations

import csv
import io
import json
import shutil
import urllib.parse

import pytest

from orchestrator import spec
from orchestrator.analysis import importance as imp
from orchestrator.analysis import pipeline
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine
from orchestrator.store.reader import open_reader_engine
from orchestrator.ui.app import create_app
from ui_support import (
    IMG,
    QUICK,
    QUICK_SPEC,
    asgi_call,
    chromium,
    make_quick_db,
    open_page,
    quick_final,
    ui_server,
    wait_for,
)

browser = pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('views') / 'views.db'}"
    make_quick_db(url)
    make_quick_db(url, name="quick3", seeds=3)
    # A sweep with its trials recorded and none run: the index says it is not running.
    sweep = spec.load(text=QUICK_SPEC.replace(f"name: {QUICK}", "name: idle"))
    engine, _ = open_store_engine(url)
    with engine.begin() as conn:
        repo.add_trials(conn, repo.upsert_sweep(conn, sweep.name, sweep.text, sweep.hash), sweep.trials)
    engine.dispose()
    return url


@pytest.fixture(scope="module")
def app(db):
    engine, shown = open_reader_engine(db)
    yield create_app(engine, shown)
    engine.dispose()


def _json(app, path: str) -> tuple[int, dict]:
    code, _headers, body = asgi_call(app, path)
    return code, json.loads(body)


# ---- importance and outcomes ------------------------------------------------------------------
@pytest.mark.parametrize("outcome", ["final_acc", "lockin", "escape_step"])
def test_importance_endpoint_is_the_analysis_and_names_its_method(app, db, outcome):
    code, got = _json(app, f"/api/sweeps/{QUICK}/importance?outcome={outcome}")
    assert code == 200 and got["method"] == "fANOVA (optuna.importance, seed 0)"
    prep = pipeline.prepare(db, QUICK, lockin=0.9)  # the spec's analysis block: lockin 0.9
    want = imp.importance(prep.trials, prep.data.params, outcome)
    assert {p["param"]: p["importance"] for p in got["params"]} == pytest.approx(want.importances)
    assert got["n_trials"] == 20 and {p["param"] for p in got["params"]} == {"arm", "lr", "seed"}
    code, headers, body = asgi_call(app, f"/api/sweeps/{QUICK}/csv/importance?outcome={outcome}")
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert code == 200 and headers["content-type"].startswith("text/csv")
    assert {r["method"] for r in rows} == {"fANOVA (optuna.importance, seed 0)"} and len(rows) == 3


def test_importance_refuses_an_unknown_outcome_in_one_line(app):
    code, bad = _json(app, f"/api/sweeps/{QUICK}/importance?outcome=%3Cb%3E")
    assert code == 400 and bad["error"] == "error: outcome '<b>': expected one of lockin, final_acc, escape_step"
    assert _json(app, "/api/sweeps/nope/importance")[0] == 404


def test_swept_parameters_from_distinct_values_equal_encoding_every_row():
    """``importance.swept`` encodes each distinct value (type kept apart) once; it names the
    parameters that encoding every trial's value names, lists, NaN and True/1/1.0 included."""
    import math

    import pandas as pd

    def reference(trials, params):
        return [
            p for p in params if p in trials and len({json.dumps(imp._choice(v), default=str) for v in trials[p]}) > 1
        ]

    cols = {
        "same": [1, 1, 1, 1],
        "int_float": [1, 1.0, 1, 1.0],  # one choice: json "1" and "1.0" differ, so swept
        "bool_int": [True, 1, True, 1],
        "nan_none": [math.nan, None, math.nan, None],
        "lists": [[1, 2], [1, 2], [2, 1], [1, 2]],
        "same_list": [[1], [1], [1], [1]],
        "strs": ["a", "a", "a", "b"],
    }
    trials = pd.DataFrame({c: pd.Series(v, dtype=object) for c, v in cols.items()})  # values as stored
    names = [*cols, "absent"]
    assert imp.swept(trials, names) == reference(trials, names)
    assert set(imp.swept(trials, names)) >= {"int_float", "bool_int", "lists", "strs"}
    assert not {"same", "same_list", "absent"} & set(imp.swept(trials, names))


def test_outcomes_rows_and_csv(app):
    code, o = _json(app, f"/api/sweeps/{QUICK}/outcomes?where=seed%20%3C%203")
    assert code == 200 and set(o["axes"]) == {"arm", "lr", "seed"} and len(o["rows"]) == 12
    for r in o["rows"]:
        p = r["params"]
        final = quick_final(p["arm"], p["lr"], p["seed"])
        assert r["final_acc"] == pytest.approx(final) and r["lockin"] == int(final >= 0.9)
        # make_quick_db: a locked trial escapes at 100 * (2 + seed % 3); the rest never, censored at 600.
        assert (r["escaped"], r["escape_step"]) == ((True, 100 * (2 + p["seed"] % 3)) if final > 0.9 else (False, 600))
    code, _, body = asgi_call(app, f"/api/sweeps/{QUICK}/csv/outcomes")
    lines = body.decode().splitlines()
    assert lines[0].startswith("trial_id,key,param.") and lines[0].endswith(",final_acc,lockin,escape_step,escaped")
    assert len(lines) == 21


# ---- compare ----------------------------------------------------------------------------------
def test_compare_by_lr_keeps_the_arms_apart(app):
    code, c = _json(app, f"/api/compare?a={QUICK}&b=quick3&by=lr")
    assert code == 200 and c["split"] == "arm"
    got = {(r["split"], r["value"]): (r["k"], r["n"]) for r in c["a_cells"]}
    want = {
        (arm, str(lr)): (sum(quick_final(arm, lr, s) >= 0.9 for s in range(5)), 5)
        for arm in ("armed_gdn", "gated_deltanet")
        for lr in (1e-3, 3e-3)
    }
    assert got == want
    pooled = _json(app, f"/api/compare?a={QUICK}&b=quick3&by=lr&split=none")[1]
    assert pooled["split"] is None and [r["n"] for r in pooled["a_cells"]] == [10, 10]
    # by arm: nothing to split by (the arm is the compared parameter).
    assert _json(app, f"/api/compare?a={QUICK}&b=quick3&by=arm")[1]["split"] is None
    code, bad = _json(app, f"/api/compare?a={QUICK}&b=quick3&by=lr&split=lr")
    assert code == 400 and bad["error"].startswith("error: split 'lr': expected none or a parameter")
    code, _, body = asgi_call(app, f"/api/compare/csv?a={QUICK}&b=quick3&by=lr")
    assert body.decode().splitlines()[0] == "sweep,arm,lr,n,k,rate,ci_low,ci_high,median"


def test_compare_where_filters_both_sweeps(app):
    code, c = _json(app, f"/api/compare?a={QUICK}&b=quick3&by=arm&where=" + urllib.parse.quote("seed = 0"))
    assert code == 200 and c["where"] == "seed = 0"
    assert [r["n"] for r in c["a_cells"]] == [2, 2] and [r["n"] for r in c["b_cells"]] == [2, 2]
    code, bad = _json(app, f"/api/compare?a={QUICK}&b=quick3&by=arm&where=" + urllib.parse.quote("nope = 1"))
    assert code == 400 and "nope" in bad["error"] and "\n" not in bad["error"]


# ---- the index's ETA --------------------------------------------------------------------------
def test_index_eta_says_why_there_is_none(app):
    code, s = _json(app, "/api/sweeps")
    by = {x["name"]: x for x in s["sweeps"]}
    assert (by[QUICK]["eta_s"], by[QUICK]["eta_note"]) == (None, "done")
    assert (by["idle"]["eta_s"], by["idle"]["eta_note"]) == (None, "not running")
    code, _, body = asgi_call(app, "/")
    assert code == 200 and '<td class="eta">done</td>' in body.decode()


def test_eta_comes_from_the_rate_window(monkeypatch):
    """A driven sweep's ETA is RateWindow's (orchestrator/eta.py): none in the first readings,
    then the steps left at the fitted rate (the clock advanced by hand: 10 steps/s)."""
    import time

    from orchestrator.ui import db as q

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    st = {"sweep": "s", "progress": 0.0, "saved": {"of_steps": 1000}, "driver": "d"}
    engine = object()
    try:
        assert q._eta(engine, st) == (None, "estimating")
        for i in range(1, 8):
            now[0] += 10
            st["progress"] = 0.1 * i
            eta, note = q._eta(engine, st)
        assert note is None and eta == pytest.approx(30.0)
        st["progress"] = 1.0
        assert q._eta(engine, st) == (None, "done")
    finally:
        q._ETA_WINDOWS.clear()


# ---- in the browser ---------------------------------------------------------------------------
OVERLAY_JS = """
const picks = [...document.querySelectorAll('#trials input.overlay-pick')];
const ov = document.getElementById('overlay');
return {checked: picks.filter(b => b.checked).map(b => b.dataset.key), keys: ov.dataset.keys || '',
        traces: (ov.data || []).map(t => t.name), error: document.getElementById('overlay-error').textContent,
        note: document.getElementById('overlay-note').textContent, pwned: window.__pwned || null};
"""


@pytest.fixture(scope="module")
def server(db):
    with ui_server(db) as base:
        yield base


@pytest.fixture(scope="module")
def driver():
    d = chromium(console_log=True)
    yield d
    d.quit()


@pytest.mark.slow
@browser
def test_overlay_selection_survives_a_reload(server, driver):
    boxes = open_page(driver, f"{server}/sweeps/{QUICK}", "#trials input.overlay-pick", "the table")
    order = [b.get_attribute("data-key") for b in boxes]
    picked = [order[1], order[4]]
    for k in picked:  # found afresh: the table may have been redrawn since
        wait_for(lambda k=k: driver.find_element("css selector", f"#trials input[data-key='{k}']"), 10, k).click()
    wait_for(lambda: "overlay=" in driver.current_url and "%2C" in driver.current_url, 10, "the overlay in the URL")
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(driver.current_url).query)["overlay"] == [",".join(picked)]
    driver.refresh()
    st = wait_for(
        lambda: (lambda s: s if s["keys"] else None)(driver.execute_script(OVERLAY_JS)), 60, "the overlay redrawn"
    )
    assert st["checked"] == sorted(picked, key=order.index)
    assert st["keys"] == ",".join(picked)
    assert st["traces"] == picked * 2  # accuracy and loss, one line each
    assert driver.find_elements("css selector", "#overlay .scatterlayer .trace")
    driver.execute_script("document.getElementById('trials').scrollIntoView()")
    driver.save_screenshot("/tmp/screens/overlay.png")


@pytest.mark.slow
@browser
def test_overlay_is_bounded_and_hostile_keys_are_text(server, driver):
    keys = [IMG] + [f"k{i:03d}" for i in range(60)]
    driver.get(f"{server}/sweeps/{QUICK}?overlay=" + urllib.parse.quote(",".join(keys)))
    st = wait_for(
        lambda: (lambda s: s if "not among" in s["note"] else None)(driver.execute_script(OVERLAY_JS)), 60, "the note"
    )
    assert st["error"] == "the link names 61 trials; the overlay holds at most 50: the first 50 are kept"
    assert IMG in st["note"] and st["pwned"] is None and st["traces"] == []
    assert not driver.find_elements("css selector", "#overlay-note img")
    # Ticking one more than 50 is refused with a visible line.
    fifty = f"{server}/sweeps/{QUICK}?overlay=" + ",".join(f"k{i:03d}" for i in range(50))
    box = open_page(driver, fifty, "#trials input.overlay-pick", "the table")[0]
    box.click()
    st = driver.execute_script(OVERLAY_JS)
    assert st["error"] == "the overlay holds at most 50 trials: untick one first" and st["checked"] == []


@pytest.mark.slow
@browser
def test_parallel_coordinates_drawn_in_the_urls_outcome(server, driver):
    sel = urllib.parse.quote(json.dumps({"arm": ["armed_gdn"]}))
    open_page(
        driver, f"{server}/sweeps/{QUICK}?pc=lockin&pcsel={sel}", "#parcoords svg .scatterlayer .trace", "parcoords SVG"
    )
    st = driver.execute_script(
        "const d = document.getElementById('parcoords');"
        "return {outcome: d.dataset.outcome, select: document.getElementById('pc-outcome').value,"
        " note: document.getElementById('pc-note').textContent, gl: d.querySelectorAll('canvas.gl-canvas').length,"
        " bar: d.data.find(t => t.uid === 'pc-outcome').marker.colorbar.title.text,"
        " ticks: d.layout.annotations.map(a => a.text)}"
    )
    assert st["outcome"] == "lockin" and st["select"] == "lockin"
    assert st["bar"] == "lock-in" and "coloured by lock-in (final acc >= 0.9)" in st["note"]
    assert "kept: arm in {armed_gdn} (10 of 20, the rest grey)" in st["note"]
    assert {"arm", "lr", "seed", "lock-in", "armed_gdn", "gated_deltanet"} <= set(st["ticks"])
    imp_note = wait_for(lambda: driver.find_element("id", "imp-note").text, 60, "the importance caption")
    assert "fANOVA (optuna.importance, seed 0)" in imp_note and "lock-in (0/1)" in imp_note
    assert driver.find_elements("css selector", "#importance svg .barlayer .trace")
    assert "pc=lockin" in driver.current_url and "pcsel=" in driver.current_url


@pytest.mark.slow
@browser
def test_compare_points_whiskers_and_captions(server, driver):
    open_page(
        driver, f"{server}/compare?a={QUICK}&b=quick3&by=arm", "#compare .scatterlayer .trace", "the compare plot"
    )
    st = driver.execute_script(
        "const d = document.getElementById('compare');"
        "return {modes: d.data.map(t => t.mode), xs: d.data.map(t => t.x), whiskers: d.data.map(t => Boolean(t.error_y)),"
        " note: document.getElementById('note').textContent}"
    )
    assert st["modes"] == ["markers", "markers"] and all(st["whiskers"])
    assert st["xs"][0] != st["xs"][1]  # coinciding categories side by side, not on top
    assert "not joined" in st["note"] and "whiskers: the Clopper-Pearson" in st["note"] and "bars" not in st["note"]
    driver.get(f"{server}/compare?a={QUICK}&b=quick3&by=arm&metric=escape_median")
    note = wait_for(
        lambda: (lambda t: t if "median" in t else None)(driver.find_element("id", "note").text), 60, "note"
    )
    assert "no interval drawn" in note and "Clopper" not in note
    driver.get(f"{server}/compare?a={QUICK}&b=quick3&by=lr&where=" + urllib.parse.quote("seed = 0"))
    wait_for(lambda: "Only trials where seed = 0" in driver.find_element("id", "note").text, 60, "the where caption")
    n = driver.execute_script("return document.getElementById('compare').data.length")
    assert n == 4  # two sweeps x two arms
    assert driver.find_element("id", "where").get_attribute("value") == "seed = 0"
