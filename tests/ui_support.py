"""Helpers of the dashboard tests: a real `orchestrator ui` process on a free port."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from proc_support import stop

ROOT = Path(__file__).resolve().parents[1]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str) -> tuple[int, dict]:
    code, body = get(url)
    return code, json.loads(body)


@contextmanager
def ui_process(db_url: str, *args: str) -> Iterator[tuple[str, subprocess.Popen, str]]:
    """``orchestrator ui --db URL --port 0 ARGS`` in a subprocess: (base URL, process, banner).
    Port 0 and the banner's URL, so no other process can take the port in between."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "ui", "--db", db_url, "--port", "0", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        banner = proc.stdout.readline()
        m = re.search(r"at http://127\.0\.0\.1:(\d+)/", banner)
        assert m, f"no URL in the banner: {banner!r} {proc.stdout.read() if proc.poll() is not None else ''}"
        yield f"http://127.0.0.1:{m.group(1)}", proc, banner
    finally:
        stop(proc, timeout=10)


@contextmanager
def ui_server(db_url: str) -> Iterator[str]:
    """:func:`ui_process` once it answers ``/api/sweeps``; yields its base URL."""
    with ui_process(db_url) as (base, proc, _banner):
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"orchestrator ui exited: {proc.stdout.read()}")
            try:
                if get(base + "/api/sweeps")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("orchestrator ui did not answer within 60 s")
            time.sleep(0.2)
        yield base


def asgi_call(
    app,
    target: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    host: str = "testserver",
) -> tuple[int, dict[str, str], bytes]:
    """One request through the ASGI app in this process (no socket): ``(status, headers,
    body)``. Starlette's TestClient needs httpx, which the project does not install."""
    import asyncio
    from urllib.parse import urlsplit

    parts = urlsplit(target)
    hdrs = {"host": host, **(headers or {})}
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": parts.path,
        "raw_path": parts.path.encode(),
        "query_string": parts.query.encode(),
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in hdrs.items()],
        "client": ("127.0.0.1", 1),
        "server": (host.partition(":")[0] or "testserver", int(host.partition(":")[2] or 80)),
    }
    sent: list[dict] = []

    async def run() -> None:
        done = asyncio.Event()
        requested = False

        async def receive() -> dict:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()  # the client "disconnects" once the response is complete
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        try:
            await app(scope, receive, send)
        except Exception:
            # Starlette re-raises a handler's exception after sending its 500 page: the page
            # is what a client gets, so return it; raise only when nothing was sent.
            if not any(m["type"] == "http.response.start" for m in sent):
                raise

    asyncio.run(run())
    start = next(m for m in sent if m["type"] == "http.response.start")
    out_headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    out_body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], out_headers, out_body


def asgi_get(app, target: str) -> tuple[int, dict[str, str], bytes]:
    """One GET through the ASGI app in this process."""
    return asgi_call(app, target)


def running_trials(conn, sweep: str, spec_text: str, params: list[dict]) -> tuple[list[tuple[str, dict]], dict]:
    """A sweep ``sweep`` of one trial per ``params`` (keyed as the runner keys them), each
    marked running: ``(keyed, {key: trial id})``, ``keyed`` in the order of ``params``."""
    from orchestrator.keys import trial_key
    from orchestrator.store import repo

    keyed = [(trial_key(p), p) for p in params]
    sid = repo.upsert_sweep(conn, sweep, spec_text, "h")
    ids = repo.add_trials(conn, sid, keyed)
    for k, _ in keyed:
        repo.mark_running(conn, ids[k])
    return keyed, ids


# Stored strings that would run if a page parsed them as HTML. Each sets window.__pwned, so a
# browser test can tell whether any ran; "%{x}" and "&amp;" check that Plotly shows text as
# stored (no template filling, no entity decoding).
IMG = '<img src=x onerror="window.__pwned=1">'
SCRIPT = "<script>window.__pwned=2</script>"
SVG = '"><svg onload=window.__pwned=3>'
PLOT = "<b>%{x}</b> &amp; <i>"
IMPORTED, SPECCED = "imported", "marked"
ERROR = "Traceback (most recent call last):\n  ...\nValueError: " + IMG + " " + SCRIPT
MARKUP_SPEC = f"""name: {SPECCED}
description: {json.dumps(SVG + " " + IMG)}
fixed: {{task: mqar, d_model: 16, n_layers: 1}}
axes:
  arm: [gated_deltanet]
  seed: [0, 1]
  {json.dumps("tag." + IMG)}: {json.dumps([SCRIPT, PLOT])}
zip: [[seed, {json.dumps("tag." + IMG)}]]
budget: {{steps: 20, eval_every: 10}}
"""


def make_markup_db(url: str, tmp: Path) -> dict[str, str]:
    """Two sweeps whose stored strings carry markup: ``imported`` through `orchestrator import`
    (parameter names and values, a trace metric's name, a failed trial's error) and
    ``marked`` from a validated spec (description, a tag label and its values) with the rows
    its runner writes (trials, evals, one failed with ``ERROR``). Returns the failed trials' keys."""
    import sqlalchemy as sa

    from orchestrator import spec
    from orchestrator.cli import main
    from orchestrator.store import repo
    from orchestrator.store.engine import open_store_engine

    def record(seed: int, value: str, **extra) -> dict:
        trace = [{"step": s, "acc": 0.1 * s / 10, "loss": 1.0, SVG: 0.5} for s in (10, 20, 30)]
        return {
            "params": {"arm": "mlstm", "seed": seed, "task": "mqar", IMG: value, "tag." + SVG: value},
            "trace": trace,
            **extra,
        }

    src = tmp / "markup.jsonl"
    src.write_text(
        "\n".join(
            json.dumps(r) for r in (record(0, SCRIPT), record(1, SVG), record(2, PLOT, status="failed", error=ERROR))
        )
        + "\n"
    )
    assert main(["import", str(src), "--sweep", IMPORTED, "--db", url]) == 0

    sweep = spec.load(text=MARKUP_SPEC)
    failed = sweep.trials[-1][0]
    engine, _ = open_store_engine(url)
    try:
        with engine.begin() as conn:
            sid = repo.upsert_sweep(conn, sweep.name, sweep.text, sweep.hash)
            ids = repo.add_trials(conn, sid, sweep.trials)
            for key, _ in sweep.trials:
                repo.mark_running(conn, ids[key])
            evals = [{"trial_id": i, "step": s, "acc": 0.2, "loss": 2.0} for i in ids.values() for s in (10, 20)]
            repo.upsert_evals(conn, evals)
            for key, _ in sweep.trials:
                bad = key == failed
                repo.finish_trial(conn, ids[key], "failed" if bad else "completed", error=ERROR if bad else None)
            imported_failed = conn.execute(
                sa.text(
                    "SELECT t.key FROM trials t JOIN sweeps s ON s.id = t.sweep_id "
                    "WHERE s.name = :n AND t.status = 'failed'"
                ),
                {"n": IMPORTED},
            ).scalar_one()
    finally:
        engine.dispose()
    return {IMPORTED: imported_failed, SPECCED: failed}


def chromium(*, console_log: bool = False, webgl: bool = False):
    """Headless Debian Chromium through Selenium (``console_log``: keep the page's console
    messages, CSP violations included, for ``driver.get_log("browser")``; ``webgl``: with
    software WebGL, for the pages that draw with scattergl)."""
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1800"):
        opts.add_argument(a)
    opts.add_argument("--enable-unsafe-swiftshader" if webgl else "--disable-gpu")
    if console_log:
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(service=Service(driver_path), options=opts)


def wait_for(fn, timeout: float, what: str, every: float = 0.25):
    """``fn()`` once it is truthy; an AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def texts(driver, css: str) -> list[str]:
    """The text of every element matching ``css``, read in one script: a page that re-renders
    on its poll (the index, a running sweep) can replace elements between a find and a read."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent)", css
    )


def open_page(driver, url: str, selector: str, what: str, timeout: float = 60) -> list:
    """Load ``url`` in ``driver`` and :func:`wait_for` the elements that the CSS ``selector``
    matches there: the elements."""
    driver.get(url)
    return wait_for(lambda: driver.find_elements("css selector", selector), timeout, what)


# The quickstart's design (armed vs unarmed Gated DeltaNet x lr) with five seeds, its traces
# written through the store's writers: which trials lock in (final acc >= the spec's 0.9) is
# set per trial below, so the cells' rates differ (and none is 0 or 1 everywhere).
QUICK = "quickgrid"
QUICK_SPEC = (ROOT / "sweeps" / "quickstart.yaml").read_text().replace("name: quickstart", f"name: {QUICK}")
QUICK_SPEC = QUICK_SPEC.replace("seed: 0..1", "seed: 0..4")


def quick_final(arm: str, lr: float, seed: int) -> float:
    """The final accuracy of one trial of the quickstart-like sweep."""
    if arm == "armed_gdn":
        locked = seed < (4 if lr > 2e-3 else 2)
    else:
        locked = lr > 2e-3 and seed == 0
    return 0.97 if locked else 0.15 + 0.01 * seed


def make_quick_db(url: str, name: str = QUICK, seeds: int = 5) -> dict[str, int]:
    """The quickstart-like sweep: 4 x ``seeds`` finished trials, eval every 100 steps to
    600; a locked trial escapes (acc >= 0.8) at step 100 * (2 + seed % 3). Returns key ->
    trial id."""
    from orchestrator import spec
    from orchestrator.store import repo
    from orchestrator.store.engine import open_store_engine

    text = QUICK_SPEC.replace(f"name: {QUICK}", f"name: {name}").replace("seed: 0..4", f"seed: 0..{seeds - 1}")
    sweep = spec.load(text=text)
    engine, _ = open_store_engine(url)
    try:
        with engine.begin() as conn:
            sid = repo.upsert_sweep(conn, sweep.name, sweep.text, sweep.hash)
            ids = repo.add_trials(conn, sid, sweep.trials)
            rows = []
            for key, p in sweep.trials:
                final = quick_final(p["arm"], p["lr"], p["seed"])
                escape = 100 * (2 + p["seed"] % 3) if final > 0.9 else None
                for s in (1, 100, 200, 300, 400, 500, 600):
                    acc = final if escape is not None and s >= escape else 0.1 + 0.0001 * s
                    rows.append({"trial_id": ids[key], "step": s, "acc": acc if s < 600 else final, "loss": 2.0 - acc})
                repo.mark_running(conn, ids[key])
            repo.upsert_evals(conn, rows)
            for key, _ in sweep.trials:
                repo.finish_trial(conn, ids[key], "completed")
    finally:
        engine.dispose()
    return ids


def post_json(url: str, obj) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(obj).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
