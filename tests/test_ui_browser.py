"""The dashboard in a real browser: headless Debian Chromium driven by Selenium against a
real `orchestrator ui` process while a real sweep (Ray, training steps) writes into the same
SQLite file or PostgreSQL schema. Skips only when no Chromium is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from conftest import POSTGRES_URL, TINY_FIXED, make_pg_schema_url
from ui_support import ROOT, chromium, get_json, texts, ui_server, wait_for as _wait

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed"),
]

SPEC = (
    "\nname: watched\ndescription: a sweep watched while it runs\n"
    + TINY_FIXED
    + """axes:
  arm: [gated_deltanet, armed_gdn]
  seed: 0..1
budget: {steps: 1000, eval_every: 50}
resources: {cpu: 1}
max_concurrent: 2
"""
)
N_TRIALS = 4
SHOT = Path("/tmp/orchestrator-ui-sweep.png")


# Acc traces are those whose uid starts with "acc-", one per colour group holding its trials'
# lines (meta.trials of them) split by gaps; the points are their x values but the gaps.
_COUNT_JS = """
let lines = 0, points = 0, legend = new Set();
document.querySelectorAll('#plots .facet').forEach(d => {
  (d.data || []).forEach(t => { if (String(t.uid).startsWith('acc-')) {
    lines += t.meta.trials; points += t.x.filter(x => x !== null && !Number.isNaN(x)).length; } });
  d.querySelectorAll('.legend .legendtext').forEach(e => legend.add(e.textContent));
});
return [lines, points, Array.from(legend).sort()];
"""


def _watch(db_url: str, tmp_path: Path, address: str) -> None:
    spec = tmp_path / "watched.yaml"
    spec.write_text(SPEC)
    log = open(tmp_path / "submit.log", "w")
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "submit",
            str(spec),
            "--db",
            db_url,
            "--quiet",
            "--checkpoint-dir",
            str(tmp_path / "ck"),
            "--address",  # the session's Ray: this test is about the page, not Ray's start-up
            address,
        ],
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )
    driver = None
    try:
        # The ui needs a schema to open: the submit creates it with the sweep's first write.
        def has_sweep():
            try:
                from orchestrator.store.engine import make_engine
                import sqlalchemy as sa

                eng = make_engine(db_url, create_dir=False)
                try:
                    with eng.connect() as c:
                        return c.execute(sa.text("SELECT COUNT(*) FROM sweeps")).scalar_one() > 0
                finally:
                    eng.dispose()
            except Exception:
                return False

        _wait(has_sweep, 180, "the sweep to be recorded", every=0.5)  # Ray start under load
        with ui_server(db_url) as base:
            driver = chromium()
            driver.get(base + "/")
            # The index re-renders its list on every poll: the names are read in one script.
            names = _wait(lambda: texts(driver, "a.sweep-link"), 20, "sweep list")
            driver.save_screenshot(str(SHOT.with_name("orchestrator-ui-index.png")))
            assert names == ["watched"]

            driver.get(base + "/sweeps/watched")
            first = _wait(
                lambda: (lambda r: r if r[0] == N_TRIALS else None)(driver.execute_script(_COUNT_JS)),
                60,
                "one line per trial",
            )
            # The growth below is only seen if the sweep is still writing now.
            assert sweep.poll() is None, "the sweep ended before the page loaded; lengthen it"
            # Points grow with no reload while the sweep runs.
            _wait(lambda: driver.execute_script(_COUNT_JS)[1] > first[1], 90, "the plotted points to grow")
            grown = driver.execute_script(_COUNT_JS)
            assert sweep.wait(timeout=180) == 0, (tmp_path / "submit.log").read_text()[-2000:]
            # Every eval row of the finished sweep ends up plotted, still without a reload.
            code, tr = get_json(base + "/api/sweeps/watched/traces")
            total = tr["n"]
            final = _wait(
                lambda: (lambda r: r if r[1] == total else None)(driver.execute_script(_COUNT_JS)),
                30,
                f"all {total} eval points to be plotted",
            )
            assert grown[1] > first[1] and final[1] == total == N_TRIALS * 21
            assert final[0] == N_TRIALS  # one line per trial
            assert final[2] == ["armed_gdn", "gated_deltanet"]  # the colour-by-arm legend
            rows = driver.find_elements("css selector", "#trials tbody tr")
            assert len(rows) == N_TRIALS
            _wait(lambda: "p =" in driver.find_element("id", "logrank").text, 30, "log-rank p")
            driver.save_screenshot(str(SHOT))

            # Facet by seed: one panel per seed, still one line per trial.
            from selenium.webdriver.support.ui import Select

            Select(driver.find_element("id", "facet")).select_by_value("seed")
            _wait(lambda: len(driver.find_elements("css selector", "#plots .facet")) == 2, 20, "two facet panels")
            assert driver.execute_script(_COUNT_JS)[0] == N_TRIALS
            Select(driver.find_element("id", "facet")).select_by_value("")

            # The table sorts by a clicked column (twice: descending).
            def head():
                return driver.find_element("css selector", "#trials th[data-col='final_acc']")

            head().click()
            head().click()
            accs = [
                float(r.find_elements("css selector", "td")[-3].text)
                for r in driver.find_elements("css selector", "#trials tbody tr")
            ]
            assert accs == sorted(accs, reverse=True)

            # A bad --where shows the CLI's one-line error on the page.
            box = driver.find_element("id", "where")
            box.send_keys("nope_param > 1")
            driver.find_element("id", "apply").click()
            msg = _wait(lambda: driver.find_element("id", "error").text, 20, "the where error")
            assert msg.startswith("error: --where 'nope_param > 1': no such column: nope_param")
            # A good one narrows the lines (facet by arm, two panels).
            box.clear()
            box.send_keys("arm = 'armed_gdn'")
            driver.find_element("id", "apply").click()
            _wait(lambda: driver.execute_script(_COUNT_JS)[0] == 2, 20, "the filtered lines")
            assert driver.find_element("id", "error").text == ""

            key = driver.find_element("css selector", "a.trial-link").text
            driver.get(base + "/sweeps/watched/trials/" + urllib.parse.quote(key))
            assert driver.find_element("id", "trial-key").text == key
            n = _wait(
                lambda: driver.execute_script(
                    "const d = document.getElementById('trace'); return d.data && d.data[0].x.length"
                ),
                20,
                "the trial trace",
            )
            assert n == 21
            driver.save_screenshot(str(SHOT.with_name("orchestrator-ui-trial.png")))
            driver.get(base + "/sweeps/watched/trials/ffff")
            assert "has no trial" in driver.find_element("id", "message").text
    finally:
        if driver is not None:
            driver.quit()
        if sweep.poll() is None:
            sweep.terminate()
            sweep.wait(timeout=30)
        log.close()


def test_dashboard_watches_a_running_sweep(tmp_path, shared_ray):
    # Once, on PostgreSQL where the suite has one (the server CI and clusters use), else on a
    # SQLite file: the page code is the same, and the store's reads are tested on both in test_ui.
    url, drop = make_pg_schema_url() if POSTGRES_URL else (f"sqlite:///{tmp_path / 'watch.db'}", lambda: None)
    try:
        _watch(url, tmp_path, shared_ray)
    finally:
        drop()
    assert SHOT.exists() and SHOT.stat().st_size > 10_000
