"""The dashboard's hostile-request corpus: each request below, sent to the real app on a real
SQLite file, gets a 4xx or 503 with a one-line JSON error (never a 500, never a traceback),
and afterwards the app still answers a plain request. The app runs as ``orchestrator ui``
builds it (the Host check on, loopback only), with a short request deadline so a cartesian
``where`` is cancelled within the test."""

from __future__ import annotations

import json

import pytest

from orchestrator.store.engine import open_store_engine
from orchestrator.store.reader import open_reader_engine
from orchestrator.ui.app import create_app
from orchestrator.ui.guard import exposure_for

from conftest import fill_sweep
from test_ui_bounds import call

CARTESIAN = "(SELECT COUNT(*) FROM trials a, trials b, trials c, trials d, trials e, trials f, trials g) > 0"

# (name, method, path, headers, body, allowed statuses)
CORPUS: list[tuple[str, str, str, dict[str, str], bytes, set[int]]] = [
    ("foreign host", "GET", "/api/sweeps", {"host": "attacker.example"}, b"", {403, 421}),
    ("foreign host with port", "GET", "/api/sweeps/s1/trials", {"host": "attacker.example:8270"}, b"", {403, 421}),
    ("empty host", "GET", "/api/sweeps", {"host": ""}, b"", {400, 403, 421}),
    ("unknown sweep", "GET", "/api/sweeps/nope/trials", {}, b"", {404}),
    ("traversal", "GET", "/static/..%2f..%2fetc%2fpasswd", {}, b"", {404}),
    ("where: not SQL", "GET", "/api/sweeps/s1/trials?where=%29%29%29", {}, b"", {400}),
    ("where: a statement", "GET", "/api/sweeps/s1/trials?where=1%3B%20DROP%20TABLE%20trials", {}, b"", {400}),
    (
        "where: fts3_tokenizer",
        "GET",
        "/api/sweeps/s1/trials?where=fts3_tokenizer(%27simple%27)%20IS%20NULL",
        {},
        b"",
        {400},
    ),
    ("where: cartesian", "GET", "/api/sweeps/s1/trials?where=" + CARTESIAN.replace(" ", "%20"), {}, b"", {400, 503}),
    ("grid by seed x seed", "GET", "/api/sweeps/s1/grid?x=trial_id&y=key", {}, b"", {400}),
    ("km by a many-valued key", "GET", "/api/sweeps/s1/km?by=trial_id", {}, b"", {400}),
    ("bad cursor", "GET", "/api/sweeps/s1/traces?since=%FF%FE", {}, b"", {400}),
    ("traces POST: not JSON", "POST", "/api/sweeps/s1/traces", {"content-type": "application/json"}, b"{", {400}),
    ("traces POST: a list", "POST", "/api/sweeps/s1/traces", {"content-type": "application/json"}, b"[1, 2]", {400}),
    (
        "traces POST: a lone surrogate",
        "POST",
        "/api/sweeps/s1/traces",
        {"content-type": "application/json"},
        json.dumps({"where": "seed = '\udcff'"}).encode(),
        {400},
    ),
    (
        "traces POST: nested deep",
        "POST",
        "/api/sweeps/s1/traces",
        {"content-type": "application/json"},
        b"[" * 100_000 + b"]" * 100_000,
        {400, 413},
    ),
    ("csv of an unknown view", "GET", "/api/sweeps/s1/csv/nope", {}, b"", {400, 404}),
]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'ui.db'}"
    engine, _ = open_store_engine(url)
    fill_sweep(engine, "s1", n_trials=40, n_steps=4)
    engine.dispose()
    reader, shown = open_reader_engine(url)
    exposure = exposure_for("127.0.0.1", 8270, [], None)
    yield create_app(reader, shown, exposure=exposure, request_timeout_s=2.0)
    reader.dispose()


@pytest.mark.parametrize("name,method,path,headers,body,allowed", CORPUS, ids=[c[0] for c in CORPUS])
def test_hostile_request_is_a_one_line_refusal(app, name, method, path, headers, body, allowed):
    status, _, answer = call(app, path, method=method, headers=headers, body=body)
    assert status in allowed, (status, answer[:300])
    text = answer.decode("utf-8", "replace")
    assert "Traceback" not in text
    if answer.startswith(b"{"):
        err = json.loads(answer)["error"]
        assert "\n" not in err.strip(), err
    status, _, answer = call(app, "/api/sweeps")
    assert status == 200 and b"s1" in answer  # the app still serves
