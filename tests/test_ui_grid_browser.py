"""The sweep page's second day in headless Chromium, against a real `orchestrator ui` process
over a SQLite file: the view lives in the URL (a reload and a shared link reproduce it), a
rejected --where greys the view out, the grid heatmap shows the rates `orchestrator analyze
lockin` prints and a clicked cell shows its trials, /compare overlays two sweeps, and a
10,000-trial sweep's page is drawn (the time is printed; `orchestrator bench ui --browser`
is where the figure belongs)."""

from __future__ import annotations

import shutil
import urllib.parse
from pathlib import Path

import pytest

from orchestrator.cli import main
from ui_support import QUICK, chromium, make_quick_db, ui_server, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed"),
]

SHOTS = Path("/tmp")

# What the page shows: its controls, the trace plot's axes and line count, the grid's cells.
STATE_JS = """
const v = id => document.getElementById(id).value;
const f0 = document.getElementById('facet-0'), g0 = document.getElementById('grid-0');
let lines = 0;
document.querySelectorAll('#plots .facet').forEach(d => (d.data || []).forEach(t => {
  if (String(t.uid).startsWith('acc-')) lines += t.meta.trials; }));
const cell = document.getElementById('cell-traces');
let cellLines = 0;
(cell.data || []).forEach(t => { if (String(t.uid).startsWith('acc-')) cellLines += t.meta.trials; });
return {
  controls: [v('group'), v('facet'), v('where'), v('xscale'), v('lossscale'), v('smooth'), v('gx'), v('gy'), v('gm')],
  facets: document.querySelectorAll('#plots .facet').length, lines: lines,
  xtype: f0 && f0.layout ? f0.layout.xaxis.type : null, losstype: f0 && f0.layout ? f0.layout.yaxis2.type : null,
  grid: g0 && g0.data ? {x: g0.data[0].x, y: g0.data[0].y, z: g0.data[0].z, text: g0.data[0].text} : null,
  caption: document.getElementById('cell-caption').textContent, cellLines: cellLines,
  stale: document.getElementById('views').classList.contains('stale'),
  opacity: getComputedStyle(document.getElementById('views')).opacity,
  error: document.getElementById('error').textContent,
};
"""


def _cli_lockin(url: str, capsys) -> dict[tuple[str, str], tuple[int, int, float]]:
    """``orchestrator analyze QUICK lockin --by arm,lr`` as printed: {(arm, lr): (k, n, rate)}."""
    capsys.readouterr()
    assert main(["analyze", QUICK, "lockin", "--by", "arm,lr", "--db", url]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines.pop(0).startswith("lock-in: final eval accuracy >= "), lines  # the rule it read
    head = lines[0].split()
    assert head[:4] == ["group", "k", "n", "rate"], lines
    out = {}
    for line in lines[1:]:
        group, k, n, rate = line.split()[:4]
        arm, lr = group.split("/")
        out[arm, lr] = (int(k), int(n), float(rate))
    return out


def _click_cell(driver, div_id: str, col: int, row: int) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    x, y, w, h = driver.execute_script(
        "const gd = document.getElementById(arguments[0]), L = gd._fullLayout, r = gd.getBoundingClientRect();"
        "return [L.xaxis._offset + L.xaxis.l2p(arguments[1]), L.yaxis._offset + L.yaxis.l2p(arguments[2]), r.width, r.height]",
        div_id,
        col,
        row,
    )
    div = driver.find_element("id", div_id)
    ActionChains(driver).move_to_element_with_offset(div, int(x - w / 2), int(y - h / 2)).click().perform()


def test_url_state_stale_view_grid_and_compare(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'quick.db'}"
    make_quick_db(url)
    make_quick_db(url, name="quick3", seeds=3)
    cli = _cli_lockin(url, capsys)
    with ui_server(url) as base:
        driver = chromium(console_log=True)
        try:
            # A shared link: colour by lr, facet by arm, log step and loss axes, smoothing.
            link = f"{base}/sweeps/{QUICK}?color=lr&facet=arm&xscale=log&loss=log&smooth=0.5&gx=lr&gy=arm"
            driver.get(link)
            st = wait_for(
                lambda: (lambda s: s if s["grid"] and s["facets"] == 2 else None)(driver.execute_script(STATE_JS)),
                60,
                "the faceted traces and the grid",
            )
            assert st["controls"] == ["lr", "arm", "", "log", "log", "0.5", "lr", "arm", "lockin"]
            assert st["xtype"] == "log" and st["losstype"] == "log" and st["lines"] == 20

            # The heatmap's cells are what the CLI printed.
            g = st["grid"]
            assert g["x"] == ["0.001", "0.003"] and g["y"] == ["armed_gdn", "gated_deltanet"]
            for r, arm in enumerate(g["y"]):
                for c, lr in enumerate(g["x"]):
                    k, n, rate = cli[arm, lr]
                    assert g["z"][r][c] == pytest.approx(rate, abs=5e-4), (arm, lr)
                    assert g["text"][r][c].endswith(f"<br>{k}/{n}"), (arm, lr, g["text"][r][c])

            # Clicking a cell shows its trials' traces and puts the cell in the URL.
            _click_cell(driver, "grid-0", 1, 0)  # lr 0.003, armed_gdn
            st = wait_for(
                lambda: (lambda s: s if s["cellLines"] else None)(driver.execute_script(STATE_JS)), 20, "the cell"
            )
            k, n, _ = cli["armed_gdn", "0.003"]
            assert st["caption"].startswith(f"cell arm = armed_gdn, lr = 0.003: {k} of {n} (rate 0.800")
            assert st["cellLines"] == n
            shared = driver.current_url
            assert "cell=" in shared and "smooth=0.5" in shared
            driver.save_screenshot(str(SHOTS / "ui25-grid.png"))

            # A reload, and the link opened afresh, reproduce the view.
            for how in ("reload", "link"):
                if how == "reload":
                    driver.refresh()
                else:
                    driver.get(base + "/")
                    driver.get(shared)
                again = wait_for(
                    lambda: (lambda s: s if s["cellLines"] and s["facets"] == 2 else None)(
                        driver.execute_script(STATE_JS)
                    ),
                    60,
                    f"the view after a {how}",
                )
                assert again["controls"] == st["controls"] and again["caption"] == st["caption"], how
                assert (again["xtype"], again["losstype"], again["lines"]) == ("log", "log", 20), how

            # A rejected --where: the CLI's line, the view greyed out, the URL keeps the last good one.
            box = driver.find_element("id", "where")
            box.send_keys("nope_param > 1")
            driver.find_element("id", "apply").click()
            st = wait_for(
                lambda: (lambda s: s if s["stale"] else None)(driver.execute_script(STATE_JS)), 20, "the stale view"
            )
            assert st["error"].startswith("error: --where 'nope_param > 1': no such column: nope_param")
            assert float(st["opacity"]) < 0.5 and st["lines"] == 20
            assert "nope_param" not in urllib.parse.unquote(driver.current_url)
            driver.save_screenshot(str(SHOTS / "ui25-stale.png"))
            # A good one clears it and narrows everything, the grid too.
            box.clear()
            box.send_keys("seed < 2")
            driver.find_element("id", "apply").click()
            st = wait_for(
                lambda: (lambda s: s if not s["stale"] and s["lines"] == 8 else None)(driver.execute_script(STATE_JS)),
                20,
                "the filtered view",
            )
            assert st["error"] == "" and "where=seed+%3C+2" in driver.current_url
            wait_for(
                lambda: all(t.endswith("/2") for row in driver.execute_script(STATE_JS)["grid"]["text"] for t in row),
                20,
                "the filtered grid (2 seeds per cell)",
            )

            # Median escape step per cell (Kaplan-Meier): armed_gdn at lr 0.003 escapes at
            # steps 200, 300 of seeds 0, 1.
            from selenium.webdriver.support.ui import Select

            Select(driver.find_element("id", "gm")).select_by_value("escape_median")
            st = wait_for(
                lambda: (
                    lambda s: (
                        s
                        if s["grid"]
                        and "<br>" in s["grid"]["text"][0][1]
                        and not s["grid"]["text"][0][1].startswith("1.00")
                        else None
                    )
                )(driver.execute_script(STATE_JS)),
                20,
                "the median escape grid",
            )
            assert st["grid"]["z"][0][1] == 200 and st["grid"]["text"][0][1] == "200<br>2/2"
            assert "gm=escape_median" in driver.current_url

            # Two sweeps overlaid by lr, pooled over the arms (split=none; the default keeps
            # them apart: tests/test_ui_views.py).
            driver.get(f"{base}/compare?a={QUICK}&b=quick3&by=lr&split=none")
            rows = wait_for(lambda: driver.find_elements("css selector", "#cells tbody tr"), 30, "the compare table")
            cells = [[td.text for td in r.find_elements("css selector", "td")] for r in rows]
            assert all(c[1] == "" for c in cells)  # the split column, empty when pooled
            assert [c[:1] + c[2:5] for c in cells] == [
                [QUICK, "0.001", "2", "10"],
                [QUICK, "0.003", "5", "10"],
                ["quick3", "0.001", "2", "6"],
                ["quick3", "0.003", "4", "6"],
            ]
            assert len(driver.execute_script("return document.getElementById('compare').data")) == 2
            assert "metric" not in driver.current_url and "by=lr" in driver.current_url
            driver.save_screenshot(str(SHOTS / "ui25-compare.png"))
            # Nothing went wrong in the page but the refused --where (a 400, as it should be).
            severe = [
                e
                for e in driver.get_log("browser")
                if e["level"] == "SEVERE" and "favicon" not in e["message"] and "status of 400" not in e["message"]
            ]
            assert not severe, severe
        finally:
            driver.quit()


def test_ten_thousand_trials_page(tmp_path):
    from orchestrator.bench.ui import SWEEP, build_db_fast, page_times

    url = f"sqlite:///{tmp_path / 'big.db'}"
    build_s = build_db_fast(url, 10_000, 50)
    with ui_server(url) as base:
        driver = chromium(webgl=True, console_log=True)
        try:
            t = page_times(driver, f"{base}/sweeps/{SWEEP}", timeout=300)
            print(
                f"\n10,000 trials x 50 evals (built in {build_s:.1f} s): interactive {t['interactive_s']:.2f} s, "
                f"grid {t['grid_s']:.2f} s, escape-time curves {t['km_s']:.2f} s after navigation"
            )
            info = driver.execute_script(
                "const d = document.getElementById('facet-0');"
                "return [d.data.length, d.data.map(t => t.type), state.glFailed || 0, d.data.reduce((n, t) => n + (t.uid.startsWith('acc-') ? t.meta.trials : 0), 0),"
                " document.querySelectorAll('#trials tbody tr').length, document.getElementById('page').textContent]"
            )
            n_traces, types, gl_failed, lines, rows, pager = info
            # Past BAND_TRIALS trials: per colour group (model.read, 2 values) the acc and loss
            # medians and their two shaded bands each, as SVG (no WebGL to set up), standing
            # for every trial; and a page of the table.
            assert n_traces == 2 * 6 and set(types) == {"scatter"} and gl_failed == 0
            assert lines == 10_000
            # Past PAGED_TRIALS the table is the server's page: next asks it for the second.
            assert rows == 100 and pager == "page 1 of 100"
            assert driver.find_element("id", "rows").text == "rows 1–100 of 10,000"
            driver.find_element("id", "next").click()
            wait_for(lambda: driver.find_element("id", "page").text == "page 2 of 100", 20, "page 2")
            assert driver.find_element("id", "rows").text == "rows 101–200 of 10,000"
            driver.save_screenshot(str(SHOTS / "ui25-10k.png"))
        finally:
            driver.quit()
    assert t["interactive_s"] < 120  # generous: the figure is for `orchestrator bench ui --browser`
