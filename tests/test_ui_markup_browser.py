"""Stored markup in headless Chromium: a real `orchestrator ui` process over a SQLite file whose
parameter names and values, tag labels, sweep description, trace metric name and trial
errors carry HTML that would run if a page parsed it (each payload sets window.__pwned).
Every page is rendered and polled by its scripts; nothing runs, the text shows as stored,
and the browser enforces the Content-Security-Policy the server sends."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest

from orchestrator.ui.app import SECURITY_HEADERS
from ui_support import (
    ERROR,
    IMG,
    IMPORTED,
    PLOT,
    SCRIPT,
    SPECCED,
    SVG,
    chromium,
    make_markup_db,
    texts,
    ui_server,
    wait_for,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed"),
]

SHOT = Path("/tmp/ui-markup.png")
LEGEND_JS = (
    "return Array.from(document.querySelectorAll(arguments[0] + ' .legendtext, ' + arguments[0] + "
    "' .legendtitletext, ' + arguments[0] + ' .gtitle')).map(e => e.textContent)"
)


def _safe(driver, what: str) -> None:
    """Nothing of the stored markup ran and no dialog is open."""
    from selenium.common.exceptions import NoAlertPresentException

    assert driver.execute_script("return typeof window.__pwned") == "undefined", what
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 (reading it is the check)


def _headers(url: str) -> dict[str, str]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return {k.lower(): v for k, v in r.headers.items()}


def test_stored_markup_is_text_in_the_browser(tmp_path):
    from selenium.webdriver.support.ui import Select

    url = f"sqlite:///{tmp_path / 'markup.db'}"
    failed = make_markup_db(url, tmp_path)
    pages = {
        "index": "/",
        "imported": f"/sweeps/{IMPORTED}",
        "specced": f"/sweeps/{SPECCED}",
        "imported trial": f"/sweeps/{IMPORTED}/trials/{failed[IMPORTED]}",
        "specced trial": f"/sweeps/{SPECCED}/trials/{failed[SPECCED]}",
    }
    with ui_server(url) as base:
        for what, path in pages.items():
            headers = _headers(base + path)
            for name, value in SECURITY_HEADERS.items():
                assert headers.get(name) == value, (what, name)
        driver = chromium(console_log=True)
        try:
            # The index: the server's rows, then the rows index.js rebuilds from /api/sweeps.
            driver.get(base + pages["index"])
            driver.execute_script("document.querySelector('#sweeps tbody tr').__fromServer = true")
            wait_for(
                lambda: not driver.execute_script("return document.querySelector('#sweeps tbody tr').__fromServer"),
                20,
                "index.js to redraw the sweep list",
            )
            row = driver.find_element("css selector", f"#sweeps tr[data-sweep='{SPECCED}']")
            assert row.find_elements("css selector", "td")[1].get_attribute("textContent") == SVG + " " + IMG
            # An unchanged list is not rebuilt: two more polls keep the same rows (a rebuild
            # would drop a reader's selection).
            driver.execute_script(
                "window.__polls = 0; const f = window.fetch;"
                "window.fetch = (u, ...a) => { if (String(u).startsWith('/api/sweeps')) window.__polls++;"
                " return f(u, ...a); };"
                "document.querySelector('#sweeps tbody tr').__kept = true"
            )
            wait_for(lambda: driver.execute_script("return window.__polls") >= 2, 20, "two more polls")
            assert driver.execute_script("return document.querySelector('#sweeps tbody tr').__kept") is True
            _safe(driver, "index")

            # The imported sweep: markup in a parameter's name and its values, and a tag label.
            driver.get(base + pages["imported"])
            wait_for(lambda: len(driver.find_elements("css selector", "#trials tbody tr")) == 3, 30, "the trial rows")
            heads = [th.text for th in driver.find_elements("css selector", "#trials thead th")]
            assert IMG in heads and "tag." + SVG in heads, heads
            cells = texts(driver, "#trials tbody td")
            assert {SCRIPT, SVG, PLOT, "ValueError: " + IMG + " " + SCRIPT} <= set(cells), cells
            # Colour and facet by the markup-named parameter: its name and values in the legend,
            # the facet titles, the escape-time legend and the hover text, as stored.
            Select(driver.find_element("id", "group")).select_by_value(IMG)
            Select(driver.find_element("id", "facet")).select_by_value(IMG)
            wait_for(lambda: len(driver.find_elements("css selector", "#plots .facet")) == 3, 20, "three facets")
            wait_for(lambda: SCRIPT + " (n 1, escapes 0)" in texts(driver, "#km .legendtext"), 20, "the KM legend")
            legend = driver.execute_script(LEGEND_JS, "#plots")
            assert {IMG, SCRIPT, SVG, PLOT} <= set(legend), legend
            assert {f"{IMG} = {v}" for v in (SCRIPT, SVG, PLOT)} <= set(legend), legend
            assert IMG in driver.execute_script(LEGEND_JS, "#km")
            driver.execute_script(
                "Plotly.Fx.hover(document.getElementById('facet-0'), [{curveNumber: 0, pointNumber: 1}])"
            )
            hover = wait_for(lambda: "".join(texts(driver, "#facet-0 .hoverlayer text")), 10, "the hover label")
            assert f" {IMG}=" in hover and "step 20" in hover, hover
            _safe(driver, "imported sweep")
            driver.save_screenshot(str(SHOT))
            # The page ran under the CSP with nothing refused (plotly.min.js included); then
            # an inline script put into the page is refused, so the policy is in force.
            logs = driver.get_log("browser")
            assert not [e for e in logs if e["level"] == "SEVERE" or "Content Security Policy" in e["message"]], logs
            ran = driver.execute_script(
                "const s = document.createElement('script'); s.textContent = 'window.__inline = 1';"
                "document.body.appendChild(s); return window.__inline"
            )
            assert ran is None
            assert any("Content Security Policy" in e["message"] for e in driver.get_log("browser"))

            # The spec's sweep: a tag label with markup in its name and its values.
            driver.get(base + pages["specced"])
            wait_for(lambda: len(driver.find_elements("css selector", "#trials tbody tr")) == 2, 30, "the trial rows")
            assert "tag." + IMG in texts(driver, "#trials thead th")
            assert {SCRIPT, PLOT} <= set(texts(driver, "#trials tbody td"))
            Select(driver.find_element("id", "group")).select_by_value("tag." + IMG)
            wait_for(lambda: {SCRIPT, PLOT} <= set(driver.execute_script(LEGEND_JS, "#plots")), 20, "the tag legend")
            _safe(driver, "spec sweep")

            # The trial pages: the whole error, parameter names and values, a metric's name.
            for what, name, value, metric in (
                ("imported trial", IMG, PLOT, SVG),
                ("specced trial", "tag." + IMG, PLOT, None),
            ):
                driver.get(base + pages[what])
                wait_for(
                    lambda: driver.execute_script("const d = document.getElementById('trace'); return d.data"),
                    20,
                    "the trial trace",
                )
                assert driver.find_element("id", "trial-error").get_attribute("textContent") == ERROR
                row = [r for r in driver.find_elements("css selector", "#params tr") if r.text.startswith(name)]
                assert len(row) == 1, what
                assert row[0].find_element("css selector", "th").get_attribute("textContent") == name
                assert row[0].find_element("css selector", "td").get_attribute("textContent") == value
                if metric:
                    assert metric in texts(driver, "#trace .legendtext")
                _safe(driver, what)
            assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]

            # A 404 naming a sweep with markup in its name shows the name as text.
            driver.get(base + "/sweeps/" + quote(SVG, safe=""))
            want = f"no sweep named {SVG!r} in this database (sweeps: {IMPORTED}, {SPECCED})"
            assert driver.find_element("id", "message").text == want
            _safe(driver, "404")
        finally:
            driver.quit()
    assert SHOT.exists() and SHOT.stat().st_size > 10_000
