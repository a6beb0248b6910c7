"""The sweep page's trial table a page at a time (orchestrator/ui/table.py): past
``PAGED_TRIALS`` trials ``/api/sweeps/NAME/trials`` answers one page sorted by the server, in
the order sweep.js sorts a whole table (checked against a brute-force comparison sort of
every column, None and mixed types included), the rows the page needs off its page by id or
key (GET or POST), and bad arguments are a one-line 400 naming the argument. In headless
Chromium (slow) a 5,100-trial sweep's page pages, sorts and overlays through the server.

Real parts: real SQLite files (``orchestrator import`` of mixed-type parameters, and the
``bench ui`` fixture in bulk), the real app in-process (ui_support.asgi_call) and a real
`orchestrator ui` process under Chromium."""

from __future__ import annotations

import functools
import gc
import json
import math
import shutil
import sqlite3
import urllib.parse
import weakref

import pytest

from orchestrator.bench.ui import SWEEP, build_db_fast
from orchestrator.cli import main
from orchestrator.errors import UserError
from orchestrator.store.reader import open_reader_engine
from orchestrator.ui import db as q
from orchestrator.ui import table as pages
from orchestrator.ui.app import create_app
from ui_support import asgi_call, chromium, get_json, ui_server, wait_for

N_BIG = 5100
MIXED = "mixed"
# A parameter of every kind: numbers (bools among them), strings (one past the BMP, one
# high in it: UTF-16 orders them apart from code points), lists, and missing.
VALUES = [3, 2.5, True, False, "b", "a", "\U0001f600", "\uff21", None, [1, 2], [1], -1, 0, "", "10", 2]


@pytest.fixture(scope="module")
def mixed_url(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("mixed")
    lines = []
    for i in range(40):
        p = {"arm": "a", "seed": i, "x": VALUES[i % len(VALUES)], "y": i % 4 if i % 3 else None}
        if i % 7 == 3:
            p.pop("y")
        trace = [{"step": s, "acc": (i * 7 % 11) / 10, "loss": 1.0} for s in (10, 20)]
        rec: dict = {"params": p, "trace": [{"step": 10, "acc": None, "loss": 1.0}] if i % 5 == 0 else trace}
        if i % 6 == 1:
            rec.update(status="failed", error=f"boom {i % 2}")
        lines.append(json.dumps(rec))
    src = d / "mixed.jsonl"
    src.write_text("\n".join(lines) + "\n")
    url = f"sqlite:///{d / 'mixed.db'}"
    assert main(["import", str(src), "--sweep", MIXED, "--db", url]) == 0
    return url


@pytest.fixture(scope="module")
def big_url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('paged') / 'paged.db'}"
    build_db_fast(url, N_BIG, 3)
    return url


@pytest.fixture(scope="module")
def engines(mixed_url, big_url):
    out = {}
    for name, url in (("mixed", mixed_url), ("big", big_url)):
        out[name] = open_reader_engine(url)
    yield out
    for e, _u in out.values():
        e.dispose()


@pytest.fixture(scope="module")
def apps(engines):
    return {name: create_app(e, u) for name, (e, u) in engines.items()}


def _json(app, path: str, **kw) -> tuple[int, dict]:
    code, _h, body = asgi_call(app, path, **kw)
    return code, json.loads(body)


def _post(app, path: str, obj) -> tuple[int, dict]:
    return _json(app, path, method="POST", body=json.dumps(obj).encode(), headers={"content-type": "application/json"})


# ---- the brute force: sweep.js's comparator, written out ------------------------------------
def _units(s: str) -> list[int]:
    """A string's UTF-16 code units (what JavaScript's < compares)."""
    out = []
    for c in s:
        n = ord(c)
        if n < 0x10000:
            out.append(n)
        else:
            n -= 0x10000
            out += [0xD800 + (n >> 10), 0xDC00 + (n & 0x3FF)]
    return out


def _raw(row: dict, column: str):
    v = row["params"].get(column[7:]) if column.startswith("params.") else row.get(column)
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _kind(v) -> int:
    return 0 if isinstance(v, (bool, int, float)) else 1 if isinstance(v, str) else 2


def _cmp(a, b) -> int:
    return (a > b) - (a < b)


def brute(rows: list[dict], column: str, direction: int) -> list[str]:
    """The keys in order: null last whichever way; numbers (booleans as 0/1) before strings
    (UTF-16) before lists (as JSON) ascending, all of it reversed descending; ties by key."""

    def compare(r1: dict, r2: dict) -> int:
        x, y = _raw(r1, column), _raw(r2, column)
        if x is None or y is None:
            c = (x is None) - (y is None)
        else:
            kx, ky = _kind(x), _kind(y)
            if kx != ky:
                c = _cmp(kx, ky)
            elif kx == 0:
                c = _cmp(float(x), float(y))
            elif kx == 1:
                c = _cmp(_units(x), _units(y))
            else:
                c = _cmp(_units(json.dumps(x, sort_keys=True)), _units(json.dumps(y, sort_keys=True)))
            c *= direction
        return c or _cmp(_units(r1["key"]), _units(r2["key"]))

    return [r["key"] for r in sorted(rows, key=functools.cmp_to_key(compare))]


def _all_pages(table, column: str, direction: int, size: int) -> list[str]:
    keys, n = [], 0
    while True:
        p = pages.page(table, n, size, column, direction)
        assert p["page"] == n and p["total"] == len(table.rows) and p["paged"] is True
        keys += [r["key"] for r in p["rows"]]
        if (n + 1) * size >= p["total"]:
            return keys
        assert len(p["rows"]) == size
        n += 1


def test_pages_are_a_brute_force_sort_of_every_column(engines):
    table = q.trials(engines["mixed"][0], MIXED)
    assert {type(r["params"].get("x")) for r in table.rows} >= {int, float, bool, str, list, type(None)}
    assert any(r["final_acc"] is None for r in table.rows) and any(r["error"] for r in table.rows)
    columns = [*pages.ROW_COLUMNS, *("params." + p for p in table.params)]
    for column in columns:
        for direction in (1, -1):
            want = brute(table.rows, column, direction)
            got = _all_pages(table, column, direction, 7)
            assert got == want, (column, direction)
            assert len(set(got)) == len(table.rows)  # no overlap, nothing skipped
    # Spot checks of the rules themselves (the brute force could share a mistake).
    up = brute(table.rows, "params.x", 1)
    xs = {r["key"]: r["params"].get("x") for r in table.rows}
    shown = [xs[k] for k in up]
    assert shown[-1] is None and shown[0] == -1 and shown[shown.index("") : shown.index("") + 1] == [""]
    assert shown.index("\uff21") > shown.index("\U0001f600")  # UTF-16: a surrogate (0xD83D) < 0xFF21
    assert max(i for i, v in enumerate(shown) if isinstance(v, str)) < min(
        i for i, v in enumerate(shown) if isinstance(v, list)
    )
    down = [xs[k] for k in brute(table.rows, "params.x", -1)]
    assert down[-1] is None and isinstance(down[0], list)
    accs = [r["final_acc"] for r in pages.page(table, 0, 1000, "final_acc", "-1")["rows"]]
    assert accs[0] == max(a for a in accs if a is not None) and accs[-1] is None


def test_keys_past_ascii_sort_by_their_utf16_units(engines):
    """Keys are hex in the product and sort as they are; a table whose keys are not ASCII
    (one past the BMP, one high in it) sorts them by UTF-16 units as sweep.js does, by key
    and as the tie-break of another column."""
    rows = q.trials(engines["mixed"][0], MIXED).rows
    odd = ["\U0001f600", "\uff21", "b", "a\U0001f600", "a\uff21", "\u00e9", "A", "a"]
    renamed = [{**r, "key": odd[i % len(odd)] + str(i // len(odd))} for i, r in enumerate(rows)]
    t = q.TrialTable.of_rows(renamed, params=["x"], varying=["x"])
    for column, direction in (("key", 1), ("key", -1), ("status", 1), ("params.x", -1)):
        assert _all_pages(t, column, direction, 9) == brute(t.rows, column, direction), (column, direction)
    up = [r["key"] for r in pages.page(t, 0, 1000, "key", 1)["rows"]]
    assert up.index("\uff210") > up.index("\U0001f6000")  # a code-point sort would put it first


def test_pages_of_the_big_table_and_the_cached_orders(engines):
    table = q.trials(engines["big"][0], SWEEP)
    for column, direction in (("params.lr", -1), ("final_acc", 1), ("key", -1)):
        assert _all_pages(table, column, direction, 1000) == brute(table.rows, column, direction)
    # Paging through one order sorts once: the pages share the kept list.
    pages.page(table, 0, 100, "params.task.vocab_size", 1)
    before = pages.ORDERS.items[(id(table), "params.task.vocab_size", 1)][1]
    pages.page(table, 3, 100, "params.task.vocab_size", 1)
    assert pages.ORDERS.items[(id(table), "params.task.vocab_size", 1)][1] is before
    assert len(pages.ORDERS.items) <= pages.ORDERS_KEPT
    # Tables freed and made again (CPython hands the freed one's id to the next): each gets
    # its own order, never a dead table's.
    rows = q.trials(engines["mixed"][0], MIXED).rows
    for i in range(30):
        t = q.TrialTable.of_rows(rows[i % 5 :] if i % 2 else rows[: 40 - i], params=["x"], varying=["x"])
        assert [r["key"] for r in pages.page(t, 0, 1000, "params.x", 1)["rows"]] == brute(t.rows, "params.x", 1)
        freed = weakref.ref(t)
        del t
        if freed() is not None:  # held in a reference cycle: a full collection frees it
            gc.collect()  # (seconds in a test worker's large heap: only when needed)
        assert freed() is None
    assert len(pages.ORDERS.items) <= pages.ORDERS_KEPT


def test_bad_page_arguments_are_a_user_error_naming_them(engines):
    table = q.trials(engines["mixed"][0], MIXED)
    for kw, name in (
        ({"page": -1}, "page"),
        ({"page": "1.5"}, "page"),
        ({"size": 0}, "size"),
        ({"size": pages.MAX_PAGE_SIZE + 1}, "size"),
        ({"sort": "nope"}, "sort"),
        ({"sort": "params.nope"}, "sort"),
        ({"dir": "2"}, "dir"),
        ({"dir": "up"}, "dir"),
    ):
        with pytest.raises(UserError) as info:
            pages.page(table, **kw)
        assert str(info.value).startswith(name + "=") and "\n" not in str(info.value), kw
    # Past the last page: the last one.
    last = pages.page(table, 99, 7)
    assert last["page"] == 5 and len(last["rows"]) == 40 - 35
    with pytest.raises(UserError, match="^ids: 5,001 trials named"):
        pages.picked(table, ids=list(range(pages.MAX_PICKED + 1)))


def test_api_pages_past_paged_trials_and_whole_below(apps, engines):
    big, mixed = apps["big"], apps["mixed"]
    code, small = _json(mixed, f"/api/sweeps/{MIXED}/trials")
    assert code == 200 and small["paged"] is False and len(small["trials"]) == 40
    assert small["default_by"] == q.trials(engines["mixed"][0], MIXED).default_by and small["varying"]
    # The same small view asked for a page: a page.
    code, p = _json(mixed, f"/api/sweeps/{MIXED}/trials?page=1&size=10&sort=params.x&dir=-1")
    table = q.trials(engines["mixed"][0], MIXED)
    assert code == 200 and p["paged"] is True and p["total"] == 40
    assert [r["key"] for r in p["rows"]] == brute(table.rows, "params.x", -1)[10:20]

    # Past PAGED_TRIALS, no arguments: page 0 by key (an old client never gets the whole table).
    code, first = _json(big, f"/api/sweeps/{SWEEP}/trials")
    bt = q.trials(engines["big"][0], SWEEP)
    assert code == 200 and first["paged"] is True
    assert (first["total"], first["page"], first["size"], first["sort"], first["dir"]) == (N_BIG, 0, 100, "key", 1)
    assert [r["key"] for r in first["rows"]] == sorted(r["key"] for r in bt.rows)[:100]
    assert first["default_by"] == "model.read" and "lr" in first["varying"]
    code, p = _json(big, f"/api/sweeps/{SWEEP}/trials?page=2&size=50&sort=final_acc&dir=-1")
    assert code == 200 and [r["key"] for r in p["rows"]] == brute(bt.rows, "final_acc", -1)[100:150]

    # where narrows the total; a view of at most PAGED_TRIALS answers whole.
    where = urllib.parse.quote("read = 'raw'")
    n_raw = sum(r["params"]["model.read"] == "raw" for r in bt.rows)
    assert 0 < n_raw <= pages.PAGED_TRIALS
    code, p = _json(big, f"/api/sweeps/{SWEEP}/trials?where={where}&page=0")
    assert code == 200 and p["paged"] is True and p["total"] == n_raw
    assert all(r["params"]["model.read"] == "raw" for r in p["rows"])
    code, whole = _json(big, f"/api/sweeps/{SWEEP}/trials?where={where}")
    assert code == 200 and whole["paged"] is False and len(whole["trials"]) == n_raw


def test_api_ids_and_keys_return_exactly_those_rows(apps, engines):
    app = apps["big"]
    rows = q.trials(engines["big"][0], SWEEP).rows
    ids = [rows[i]["trial_id"] for i in (5, 4000, 17, 5099)]
    keys = [rows[i]["key"] for i in (7, 3001)]
    want_ids = sorted(ids)
    for path in (f"ids={','.join(map(str, ids))}", "ids=" + urllib.parse.quote(json.dumps(ids))):
        code, got = _json(app, f"/api/sweeps/{SWEEP}/trials?{path}")
        assert code == 200 and got["picked"] is True and [r["trial_id"] for r in got["trials"]] == want_ids, path
    code, got = _post(app, f"/api/sweeps/{SWEEP}/trials", {"ids": ids, "keys": keys + ["not-a-trial"]})
    assert code == 200 and sorted(r["key"] for r in got["trials"]) == sorted(
        [rows[i]["key"] for i in (5, 4000, 17, 5099)] + keys
    )
    code, got = _post(app, f"/api/sweeps/{SWEEP}/trials", {"keys": keys})
    assert (
        code == 200
        and [r["key"] for r in got["trials"]] == keys
        and got["trials"][0] == json.loads(json.dumps(q.trials(engines["big"][0], SWEEP).rows[7], default=str))
    )
    # where still applies: a trial outside the view is left out.
    where = "read = 'raw'"
    raw = next(r for r in rows if r["params"]["model.read"] == "raw")
    ns5 = next(r for r in rows if r["params"]["model.read"] == "ns5")
    code, got = _post(app, f"/api/sweeps/{SWEEP}/trials", {"where": where, "keys": [raw["key"], ns5["key"]]})
    assert code == 200 and [r["key"] for r in got["trials"]] == [raw["key"]]
    # A POST page: the same page as the GET.
    code, p = _post(app, f"/api/sweeps/{SWEEP}/trials", {"page": "1", "sort": "params.lr", "dir": "-1"})
    code2, p2 = _json(app, f"/api/sweeps/{SWEEP}/trials?page=1&sort=params.lr&dir=-1")
    assert code == code2 == 200 and p == p2 and len(p["rows"]) == 100


@pytest.mark.parametrize(
    "target, body, name",
    [
        ("page=-1", None, "page"),
        ("page=x", None, "page"),
        ("size=0", None, "size"),
        ("size=100000", None, "size"),
        ("sort=nope", None, "sort"),
        ("sort=params.nope", None, "sort"),
        ("dir=0", None, "dir"),
        ("ids=1,x", None, "ids"),
        ("ids=" + urllib.parse.quote("[1, -2]"), None, "ids"),
        ("keys=notjson", None, "keys"),
        ("ids=1&page=0", None, "page"),
        ("", {"ids": [True]}, "ids"),
        ("", {"keys": [1, 2]}, "keys"),
        ("", {"ids": list(range(pages.MAX_PICKED + 1))}, "ids"),
        ("", {"where": ["a"]}, "body"),
        ("", ["not", "an", "object"], "body"),
    ],
)
def test_bad_arguments_are_one_line_400s_naming_them(apps, target, body, name):
    path = f"/api/sweeps/{SWEEP}/trials" + (f"?{target}" if target else "")
    code, got = _json(apps["big"], path) if body is None else _post(apps["big"], path, body)
    msg = got["error"]
    assert code == 400 and "\n" not in msg, (target, body, got)
    assert msg.startswith(f"error: {name}") or (name == "body" and "the body must be a JSON object" in msg), msg


def test_a_body_past_the_limit_is_refused_unread(apps):
    from orchestrator.ui.app import MAX_BODY

    code, got = _json(apps["big"], f"/api/sweeps/{SWEEP}/trials", method="POST", body=b"{" + b" " * MAX_BODY + b"}")
    assert code == 413 and "a trials POST" in got["error"]


# ---- the page in Chromium ------------------------------------------------------------------
TABLE_JS = """
const rows = [...document.querySelectorAll('#trials tbody tr')];
const f0 = document.getElementById('facet-0'), ov = document.getElementById('overlay');
const colours = f0 && f0.data ? f0.data.filter(t => t.showlegend).map(t => t.line.color) : [];
return {rows: rows.length, first: rows.length ? rows[0].querySelector('a.trial-link').textContent : null,
  pager: document.getElementById('rows').textContent, page: document.getElementById('page').textContent,
  heads: [...document.querySelectorAll('#trials thead th')].map(th => th.textContent),
  colours: colours, overlay: ov.dataset.keys || '', overlayTraces: (ov.data || []).length,
  cell: document.getElementById('cell-caption').textContent,
  cellLines: (document.getElementById('cell-traces').data || []).reduce((n, t) => n + (String(t.uid).startsWith('acc-') ? t.meta.trials : 0), 0)};
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_a_5100_trial_page_pages_sorts_and_overlays_through_the_server(big_url):
    from selenium.webdriver.support.ui import Select

    with ui_server(big_url) as base:
        api = f"{base}/api/sweeps/{SWEEP}/trials"
        driver = chromium(console_log=True)
        try:
            driver.get(f"{base}/sweeps/{SWEEP}")
            state = lambda: driver.execute_script(TABLE_JS)  # noqa: E731
            st = wait_for(lambda: (lambda s: s if s["rows"] and s["colours"] else None)(state()), 60, "page 1")
            code, p0 = get_json(api)
            assert code == 200 and st["pager"] == f"rows 1–100 of {N_BIG:,}" and st["page"] == "page 1 of 51"
            assert st["rows"] == 100 and st["first"] == p0["rows"][0]["key"]
            # The bands' colour groups come from the bands (two values of model.read), not the page.
            assert len(st["colours"]) == 2 and len(set(st["colours"])) == 2, st["colours"]

            driver.find_element("id", "next").click()
            st = wait_for(
                lambda: (lambda s: s if s["pager"].startswith("rows 101–200") else None)(state()), 20, "page 2"
            )
            _, p1 = get_json(api + "?page=1")
            assert st["first"] == p1["rows"][0]["key"] and st["page"] == "page 2 of 51"

            # A header click: page 0 sorted by the server, which the first row shows.
            driver.find_element("css selector", "#trials thead th[data-col='final_acc']").click()
            st = wait_for(lambda: (lambda s: s if "final_acc ▲" in s["heads"] else None)(state()), 20, "the sort")
            _, ps = get_json(api + "?sort=final_acc&dir=1&page=0")
            assert st["first"] == ps["rows"][0]["key"] and st["pager"].startswith("rows 1–100")
            driver.find_element("css selector", "#trials thead th[data-col='lr']").click()
            st = wait_for(lambda: (lambda s: s if "lr ▲" in s["heads"] else None)(state()), 20, "the lr sort")
            _, pl = get_json(api + "?sort=params.lr&dir=1")
            assert st["first"] == pl["rows"][0]["key"] and "sort=lr" in driver.current_url
            # Coloured by lr, while the page holds one lr value only: each of the 3 a colour.
            assert len({r["params"]["lr"] for r in pl["rows"]}) == 1
            Select(driver.find_element("id", "group")).select_by_value("lr")
            st = wait_for(lambda: (lambda s: s if len(s["colours"]) == 3 else None)(state()), 30, "the lr bands")
            assert len(set(st["colours"])) == 3, st["colours"]

            # A ticked row shows in the overlay (its traces fetched by id).
            box = driver.find_elements("css selector", "#trials tbody input.overlay-pick")[2]
            key = box.get_attribute("data-key")
            box.click()
            st = wait_for(
                lambda: (lambda s: s if s["overlay"] and s["overlayTraces"] else None)(state()), 20, "overlay"
            )
            assert st["overlay"] == key and st["overlayTraces"] == 2

            # A reload keeps sort, page and overlay: the overlay's trial is off the page and
            # fetched by key; a grid cell's trials (none of them held) are fetched by id.
            driver.find_element("id", "next").click()
            wait_for(lambda: state()["pager"].startswith("rows 101–200"), 20, "page 2 by lr")
            driver.refresh()
            st = wait_for(
                lambda: (lambda s: s if s["rows"] and s["overlay"] and s["overlayTraces"] else None)(state()),
                60,
                "the reloaded page",
            )
            assert (
                st["pager"].startswith("rows 101–200")
                and st["first"] == get_json(api + "?sort=params.lr&page=1")[1]["rows"][0]["key"]
            )
            assert st["overlay"] == key
            wait_for(lambda: driver.execute_script("return Boolean(state.grid)"), 60, "the grid")
            cell = driver.execute_script(
                "const c = state.grid.panels[0].cells[0]; state.cell = {f: null, x: c.x, y: c.y}; drawCell(); return c.trial_ids.length"
            )
            st = wait_for(lambda: (lambda s: s if s["cellLines"] else None)(state()), 30, "the cell's traces")
            assert st["cellLines"] == cell and st["cell"].startswith("cell ")
            # The parallel coordinates draw one trial in k past PC_LINES (2,000) lines, the
            # counts still from every trial.
            note = wait_for(
                lambda: (lambda t: t if "lines drawn" in t else None)(driver.find_element("id", "pc-note").text),
                60,
                "the parallel coordinates",
            )
            _, out = get_json(f"{base}/api/sweeps/{SWEEP}/outcomes")
            counted = [r for r in out["rows"] if r["final_acc"] is not None]
            stride = -(-len(counted) // 2000)
            want = len(range(0, len(counted), stride))
            lines = driver.execute_script(
                "return document.getElementById('parcoords').data"
                ".filter(t => /^pc-(grey|[0-9]+)$/.test(t.uid) && t.x.length)"
                ".reduce((n, t) => n + t.x.filter(v => v === null).length + 1, 0)"
            )
            assert stride > 1 and lines == want
            assert f"({want} of its {len(counted)} lines drawn: one trial in {stride})" in note
            severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]]
            assert not severe, severe
        finally:
            driver.quit()


def test_a_big_sweeps_final_figures_from_its_eval_rows_equal_the_views(tmp_path, monkeypatch):
    """Past ``OFFLOAD_TRIALS`` trials the table's final step, accuracy, loss and best
    accuracy come from the sweep's eval rows (the bands' read) rather than the trial_final
    view: the same values, row for row, for a last eval with a missing or non-finite
    accuracy, a NaN loss beside a finite accuracy, every accuracy missing, trials without
    evals, a failed trial, unsorted traces, and another sweep's trials among the ids."""
    from orchestrator.ui import offload

    lines, other = [], []
    for i in range(30):
        steps = [30, 10, 20] if i % 4 == 0 else [10, 20, 30]
        trace = [{"step": s, "acc": ((i * 3 + s) % 10) / 10, "loss": s / 7} for s in steps]
        kind = i % 6
        if kind == 1:
            trace[-1]["acc"] = None  # the last eval's accuracy missing: diverged
        elif kind == 2:
            trace[-1]["loss"] = float("nan")  # a NaN loss, the accuracy kept
        elif kind == 3:
            trace = [{"step": s, "acc": None, "loss": 1.0} for s in (10, 20)]
        rec = {"params": {"seed": i, "lr": [1e-3, 3e-3][i % 2]}, "trace": trace}
        if i % 7 == 5:
            rec.update(status="failed", error="line one\nboom")
        lines.append(json.dumps(rec))
        other.append(json.dumps({"params": {"seed": i}, "trace": [{"step": 5, "acc": 0.5, "loss": 1.0}]}))
    url = f"sqlite:///{tmp_path / 'finals.db'}"
    for sweep, recs in (("other", other[:10]), ("finals", lines), ("later", other[10:])):
        src = tmp_path / f"{sweep}.jsonl"
        src.write_text("\n".join(recs) + "\n")
        assert main(["import", str(src), "--sweep", sweep, "--db", url]) == 0
    # Trials without evals (not yet run): an import needs a trace, so theirs go.
    with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
        db.execute(
            "DELETE FROM evals WHERE trial_id IN (SELECT t.id FROM trials t JOIN sweeps s ON s.id = t.sweep_id "
            "WHERE s.name = 'finals' AND t.id % 6 = 4)"
        )
    engine, _u = open_reader_engine(url)
    try:
        monkeypatch.setattr(offload, "OFFLOAD_TRIALS", 10**9)
        view = q._trials(engine, "finals", None, None)
        monkeypatch.setattr(offload, "OFFLOAD_TRIALS", 5)
        calls = []
        real = q.sweep_evals
        monkeypatch.setattr(q, "sweep_evals", lambda *a: calls.append(a) or real(*a))
        rows = q._trials(engine, "finals", None, None)
        assert calls  # the figures did come from the eval rows
        assert len(rows) == 30 and rows.columns == view.columns and rows.rows == view.rows
        figures = list(zip(*(view.columns[c] for c in ("step", "final_acc", "final_loss", "best_acc"))))
        assert (None, None, None, None) in figures  # a trial without evals
        assert any(s == 30 and a is None for s, a, _l, _b in figures)  # a missing last accuracy
        assert any(b is None and s == 20 for s, _a, _l, b in figures)  # no accuracy at all
        # where= and one trial's key read alike both ways
        for where in ("lr > 0.002", "seed < 4"):
            big = q._trials(engine, "finals", where, None)
            monkeypatch.setattr(offload, "OFFLOAD_TRIALS", 10**9)
            assert big.rows == q._trials(engine, "finals", where, None).rows and 0 < len(big) < 30
            monkeypatch.setattr(offload, "OFFLOAD_TRIALS", 5)
    finally:
        engine.dispose()
