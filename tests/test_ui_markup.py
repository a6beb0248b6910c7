"""Stored markup is text on every dashboard page, every response carries the security
headers, and a crafted ``since=`` cursor is a 400 with a one-line JSON error. Requests go
through the real Starlette app in this process, over a real SQLite file (and PostgreSQL
where the suite has one); the browser half is tests/test_ui_markup_browser.py."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest
from markupsafe import escape

from orchestrator.ui import app as ui_app
from orchestrator.store.reader import open_reader_engine

from ui_support import ERROR, IMG, IMPORTED, PLOT, SCRIPT, SPECCED, SVG, asgi_get, make_markup_db

STATIC = Path(ui_app.__file__).resolve().parent
RAW = (IMG, SCRIPT, SVG, PLOT)


def _app(url: str, tmp: Path):
    keys = make_markup_db(url, tmp)
    engine, url = open_reader_engine(url)
    return ui_app.create_app(engine, url), engine, keys


@pytest.fixture
def markup_app(tmp_path):
    app, engine, keys = _app(f"sqlite:///{tmp_path / 'markup.db'}", tmp_path)
    yield app, keys
    engine.dispose()


def _b64(data: bytes | str | object) -> str:
    if not isinstance(data, (bytes, str)):
        data = json.dumps(data)
    if isinstance(data, str):
        data = data.encode()
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _headers_ok(headers: dict[str, str], what: str) -> None:
    for name, value in ui_app.SECURITY_HEADERS.items():
        assert headers.get(name) == value, (what, name, headers)


def test_a_crafted_cursor_is_400_with_a_one_line_json_error(db_url, tmp_path):
    app, engine, _ = _app(db_url, tmp_path)
    try:
        traces = f"/api/sweeps/{IMPORTED}/traces"
        code, _, body = asgi_get(app, traces)
        assert code == 200
        good = json.loads(body)["cursor"]
        assert asgi_get(app, traces + "?" + urlencode({"since": good}))[0] == 200
        now = json.loads(base64.urlsafe_b64decode(good + "=" * (-len(good) % 4)))["t"]
        crafted = {
            "not base64": "!!!!",
            "not ASCII": "€uro",
            "base64 of bytes that are not UTF-8": _b64(b"\xff\xfe\x00"),
            "base64 of text that is not JSON": _b64("not json"),
            "JSON but a list": _b64([1, 2]),
            "an object without s": _b64({"t": now}),
            "an extra key": _b64({"t": now, "s": {}, "x": 1}),
            "t a number": _b64({"t": 5, "s": {}}),
            "t not a time": _b64({"t": "yesterday", "s": {}}),
            "t in year 1 (an OverflowError, a 500, before)": _b64({"t": "0001-01-01T00:00:00", "s": {}}),
            "t in year 1 east of UTC": _b64({"t": "0001-01-01T00:00:00+05:00", "s": {}}),
            "t at the end of time (a 500 before)": _b64({"t": "9999-12-31T23:59:59-05:00", "s": {}}),
            "t a year ahead of the database clock": _b64({"t": "2999-01-01T00:00:00+00:00", "s": {}}),
            "s a list": _b64({"t": now, "s": [1]}),
            "a step beyond 64 bits": _b64({"t": now, "s": {"1": 10**30}}),
            "a trial id beyond 64 bits": _b64({"t": now, "s": {str(10**30): 1}}),
            "a trial id that is not decimal": _b64({"t": now, "s": {"1e3": 1}}),
            "a negative trial id": _b64({"t": now, "s": {"-1": 1}}),
            "a boolean step": _b64({"t": now, "s": {"1": True}}),
            "a fractional step": _b64({"t": now, "s": {"1": 1.5}}),
            "a step as a string": _b64({"t": now, "s": {"1": "2"}}),
            "a NaN step": _b64(json.dumps({"t": now, "s": {"1": float("nan")}})),
            "nested past the recursion limit": _b64("[" * 40_000),
            "very long": "A" * 100_000,
        }
        for what, cursor in crafted.items():
            code, headers, body = asgi_get(app, traces + "?" + urlencode({"since": cursor}))
            assert code == 400, (what, code, body[:300])
            assert headers["content-type"] == "application/json", what
            answer = json.loads(body)
            assert list(answer) == ["error"], what
            line = answer["error"]
            assert "\n" not in line and len(line) < 200, (what, line)
            assert line.startswith("error: since=") and "not a cursor this server gave out" in line, (what, line)
            assert line.endswith("; drop it to start over"), (what, line)
            _headers_ok(headers, what)
    finally:
        engine.dispose()


def test_pages_show_stored_markup_as_text_with_security_headers(markup_app):
    app, keys = markup_app
    pages = {
        "/": [SVG + " " + IMG],  # the spec's description
        f"/sweeps/{IMPORTED}": [],
        f"/sweeps/{SPECCED}": [],
        f"/sweeps/{IMPORTED}/trials/{keys[IMPORTED]}": [IMG, "tag." + SVG, PLOT, ERROR],
        f"/sweeps/{SPECCED}/trials/{keys[SPECCED]}": ["tag." + IMG, PLOT, ERROR],
    }
    for path, shown in pages.items():
        code, headers, body = asgi_get(app, path)
        assert code == 200, path
        _headers_ok(headers, path)
        html = body.decode()
        # Autoescape is on: each stored string is in the page only as escaped text.
        for raw in RAW:
            assert raw not in html, (path, raw)
        for text in shown:
            assert str(escape(text)) in html, (path, text)
        # No inline script and no event-handler attribute anywhere (the CSP would refuse both).
        assert not re.search(r"<script(?![^>]*\bsrc=)", html), path
        assert not re.search(r"<[^>]*\son[a-z]+\s*=", html, re.I), path
    # JSON carries the strings as stored, for the scripts to show with textContent.
    code, headers, body = asgi_get(app, f"/api/sweeps/{IMPORTED}/trials")
    answer = json.loads(body)
    assert code == 200 and IMG in answer["varying"] and "tag." + SVG in answer["params"]
    assert {t["params"][IMG] for t in answer["trials"]} == {SCRIPT, SVG, PLOT}
    _headers_ok(headers, "trials JSON")
    # Every other kind of response carries the headers too: static files, both 404s, a 400.
    for path, status in (
        ("/static/sweep.js", 200),
        ("/static/plotly.min.js", 200),
        ("/static/style.css", 200),
        ("/no/such/page", 404),
        ("/api/sweeps/nope/trials", 404),
        (f"/sweeps/{quote(IMG)}", 404),
        (f"/api/sweeps/{IMPORTED}/trials?where=" + quote("nope > 1"), 400),
        (f"/api/sweeps/{IMPORTED}/km?by=" + quote(IMG), 200),
    ):
        code, headers, body = asgi_get(app, path)
        assert code == status, (path, code, body[:200])
        _headers_ok(headers, path)
        assert IMG not in body.decode() or headers["content-type"] == "application/json", path


def test_a_server_error_page_carries_the_headers(markup_app):
    from starlette.routing import Route

    app, _ = markup_app

    def boom(_request):
        raise RuntimeError("a bug")

    app.router.routes.insert(0, Route("/boom", boom))
    code, headers, _ = asgi_get(app, "/boom")
    assert code == 500
    _headers_ok(headers, "a 500")


def test_templates_autoescape_and_scripts_never_parse_html():
    env = ui_app.templates_env()
    assert env.autoescape is True
    # Each template renders a stored string escaped (the trial page has every kind of field).
    trial = {"key": IMG, "status": SVG, "attempts": 1, "error": ERROR, "params": {IMG: SCRIPT}}
    for name, ctx in (
        ("404.html", {"message": IMG}),
        (
            "index.html",
            {
                "sweeps": [
                    {
                        "name": SVG,
                        "description": IMG,
                        "total": 1,
                        "counts": {SCRIPT: 1},
                        "progress": None,
                        "eta_s": None,
                    }
                ]
            },
        ),
        ("sweep.html", {"sweep": SVG}),
        ("trial.html", {"sweep": SVG, "trial": trial}),
    ):
        html = env.get_template(name).render(db=SCRIPT, poll_ms=2000, **ctx)
        for raw in RAW:
            assert raw not in html, (name, raw)
        assert str(escape(IMG if name != "sweep.html" else SVG)) in html, name
    # No script builds HTML from strings, nor runs strings as code.
    for js in sorted((STATIC / "static").glob("*.js")):
        text = js.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in text, (js.name, sink)
    for tpl in sorted((STATIC / "templates").glob("*.html")):
        text = tpl.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), tpl.name
        assert not re.search(r"\son[a-z]+\s*=", text, re.I), tpl.name
        assert "|safe" not in text.replace(" ", "") and "autoescape false" not in text, tpl.name
