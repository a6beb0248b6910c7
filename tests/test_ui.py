"""`orchestrator ui` without a browser: a real server process against a real SQLite file and
the local PostgreSQL; the incremental trace cursor, 404s, a bad --where, a missing
database, and that serving never changes the database file."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import urllib.parse

import pytest

from orchestrator.cli import main
from orchestrator.keys import trial_key
from orchestrator.store import lease, repo
from orchestrator.store.engine import open_store_engine, sqlite_path

from ui_support import (
    QUICK,
    QUICK_SPEC,
    asgi_get,
    get,
    get_json,
    make_quick_db,
    post_json,
    quick_final,
    running_trials,
    ui_server,
)

SPEC = "name: live\ndescription: two trials written by hand\nanalysis: {by: [arm]}\n"


def _params(arm: str, seed: int) -> dict:
    return {"arm": arm, "task": "mqar", "seed": seed, "lr": 1e-3, "steps": 100, "eval_every": 10}


def _write_sweep(url: str) -> dict[str, int]:
    """Two trials with three eval points each, one finished and one still running."""
    engine, _ = open_store_engine(url)
    with engine.begin() as conn:
        keyed, ids = running_trials(conn, "live", SPEC, [_params("a", 0), _params("b", 0)])
        repo.upsert_evals(
            conn,
            [{"trial_id": ids[k], "step": s, "acc": 0.1 * s / 10, "loss": 1.0} for k, _ in keyed for s in (1, 10, 20)],
        )
        repo.finish_trial(conn, ids[keyed[0][0]], "completed")
    engine.dispose()
    return {"done": ids[keyed[0][0]], "running": ids[keyed[1][0]], "key_running": keyed[1][0]}


def _append(url: str, tid: int, steps) -> None:
    engine, _ = open_store_engine(url)
    with engine.begin() as conn:
        repo.upsert_evals(conn, [{"trial_id": tid, "step": s, "acc": 0.5, "loss": 0.5} for s in steps])
        lease.heartbeat(conn, [tid], reported=True)
    engine.dispose()


def _rows(answer: dict) -> list[tuple[int, int]]:
    c = answer["columns"]
    return list(zip(c["trial_id"], c["step"]))


def _digest(url: str) -> dict[str, str]:
    path = sqlite_path(url)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.parent.glob(path.name + "*"))}


def test_incremental_cursor_sends_only_new_rows(db_url):
    ids = _write_sweep(db_url)
    with ui_server(db_url) as base:
        code, first = get_json(base + "/api/sweeps/live/traces")
        assert code == 200
        assert sorted(_rows(first)) == sorted((i, s) for i in (ids["done"], ids["running"]) for s in (1, 10, 20))
        # Nothing written since: nothing sent.
        code, again = get_json(base + "/api/sweeps/live/traces?since=" + first["cursor"])
        assert code == 200 and again["n"] == 0 and _rows(again) == []
        _append(db_url, ids["running"], (30, 40))
        code, new = get_json(base + "/api/sweeps/live/traces?since=" + again["cursor"])
        assert _rows(new) == [(ids["running"], 30), (ids["running"], 40)]
        assert new["columns"]["acc"] == [0.5, 0.5]
        _append(db_url, ids["running"], (50,))
        code, newer = get_json(base + "/api/sweeps/live/traces?since=" + new["cursor"])
        assert _rows(newer) == [(ids["running"], 50)]
        # A stale cursor re-sends what came after it, never less.
        code, stale = get_json(base + "/api/sweeps/live/traces?since=" + first["cursor"])
        assert _rows(stale) == [(ids["running"], s) for s in (30, 40, 50)]
        # The trial filter and the full columns of the trial page.
        code, one = get_json(base + "/api/sweeps/live/traces?full=1&key=" + ids["key_running"])
        assert {r[0] for r in _rows(one)} == {ids["running"]}
        assert set(one["columns"]) >= {"train_loss", "step_lr", "metrics"}
        code, bad = get_json(base + "/api/sweeps/live/traces?since=garbage")
        assert code == 400 and "cursor" in bad["error"]

        code, sweeps = get_json(base + "/api/sweeps")
        (s,) = sweeps["sweeps"]
        assert s["name"] == "live" and s["description"] == "two trials written by hand"
        assert s["counts"]["completed"] == 1 and s["counts"]["running"] == 1
        code, trials = get_json(base + "/api/sweeps/live/trials")
        by_id = {t["trial_id"]: t for t in trials["trials"]}
        assert by_id[ids["running"]]["step"] == 50 and by_id[ids["done"]]["step"] == 20
        assert trials["varying"] == ["arm"]
        code, filtered = get_json(base + "/api/sweeps/live/trials?where=" + urllib.parse.quote("arm = 'b'"))
        assert [t["trial_id"] for t in filtered["trials"]] == [ids["running"]]
        code, km = get_json(base + "/api/sweeps/live/km?by=arm")
        assert code == 200 and set(km["groups"]) == {"a", "b"}
        assert km["groups"]["b"]["escapes"] == 0
        # A new eval row reaches the escape-time view (its prepared data is not reused).
        engine, _ = open_store_engine(db_url)
        with engine.begin() as conn:
            repo.upsert_evals(conn, [{"trial_id": ids["running"], "step": 60, "acc": 0.95}])
            repo.finish_trial(conn, ids["running"], "completed")
        engine.dispose()
        code, km = get_json(base + "/api/sweeps/live/km?by=arm")
        assert km["groups"]["b"]["escapes"] == 1 and km["groups"]["b"]["median"] == 60


def test_the_ui_engine_cannot_write(db_url):
    import sqlalchemy as sa

    from orchestrator.store.reader import open_reader_engine

    _write_sweep(db_url)
    engine, _ = open_reader_engine(db_url)
    try:
        for stmt in ("UPDATE trials SET status = 'failed'", "DELETE FROM evals", "CREATE TABLE x (i INTEGER)"):
            with pytest.raises(sa.exc.DBAPIError):
                with engine.begin() as conn:
                    conn.execute(sa.text(stmt))
    finally:
        engine.dispose()
    writer, _ = open_store_engine(db_url)
    with writer.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM evals")).scalar_one() == 6
        assert conn.execute(sa.text("SELECT COUNT(*) FROM trials WHERE status = 'failed'")).scalar_one() == 0
    writer.dispose()


def test_not_found_bad_where_and_read_only(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    _write_sweep(url)
    before = _digest(url)
    with ui_server(url) as base:
        assert get(base + "/")[0] == 200
        code, body = get(base + "/sweeps/nope")
        assert code == 404 and b"no sweep named &#39;nope&#39;" in body
        code, body = get(base + "/sweeps/live/trials/0000")
        assert code == 404 and b"has no trial" in body
        assert get(base + "/api/sweeps/nope/traces")[0] == 404
        assert get(base + "/no/such/page")[0] == 404
        for path in (
            "/sweeps/live",
            "/api/sweeps",
            "/api/sweeps/live/trials",
            "/api/sweeps/live/traces?full=1",
            "/api/sweeps/live/km?by=arm",
            "/static/plotly.min.js",
        ):
            assert get(base + path)[0] == 200, path
        cond = "bogus_param > 1"
        code, bad = get_json(base + "/api/sweeps/live/trials?where=" + urllib.parse.quote(cond))
    # Not a byte of the database changed. A WAL reader may create the -shm index and an
    # empty -wal next to it (SQLite does so for any reader, `orchestrator sql` too); the
    # log must hold nothing, i.e. no transaction was written.
    after = _digest(url)
    assert after["ui.db"] == before["ui.db"]
    wal = sqlite_path(url).with_name("ui.db-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    # The same one line `orchestrator analyze` prints for the same condition.
    assert main(["analyze", "live", "km", "--db", url, "--where", cond, "--status", "all"]) == 2
    cli_line = capsys.readouterr().err.strip()
    assert code == 400 and bad["error"] == cli_line


def test_taken_port_is_exit_2(tmp_path, capsys):
    import socket

    url = f"sqlite:///{tmp_path / 'ui.db'}"
    _write_sweep(url)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["ui", "--db", url, "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot listen on 127.0.0.1:{port}" in err[0]


def test_missing_database_is_exit_2(tmp_path, capsys):
    missing = tmp_path / "nothing.db"
    assert main(["ui", "--db", str(missing), "--port", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no database at" in err[0]
    assert not missing.exists()


# ---- the grid, CSV, compare, and the cursor in a POST body (issue 25) ---------------------------
def _app(url: str):
    from orchestrator.store.reader import open_reader_engine
    from orchestrator.ui.app import create_app

    engine, shown = open_reader_engine(url)
    return create_app(engine, shown), engine


def _json(app, path: str) -> tuple[int, dict]:
    code, _, body = asgi_get(app, path)
    return code, json.loads(body)


def test_grid_rates_are_the_cli_lockin_table(db_url, capsys):
    from lifelines import KaplanMeierFitter
    from statsmodels.stats.proportion import proportion_confint

    ids = make_quick_db(db_url)
    app, engine = _app(db_url)
    try:
        code, g = _json(app, f"/api/sweeps/{QUICK}/grid?x=lr&y=arm")
        assert code == 200 and g["x_values"] == ["0.001", "0.003"] and g["y_values"] == ["armed_gdn", "gated_deltanet"]
        cells = {(c["y"], c["x"]): c for c in g["panels"][0]["cells"]}
        # What `orchestrator analyze quickgrid lockin --by arm,lr` prints.
        assert main(["analyze", QUICK, "lockin", "--by", "arm,lr", "--db", db_url, "--json"]) == 0
        cli = {tuple(r["group"].split("/")): r for r in json.loads(capsys.readouterr().out)}
        assert set(cli) == set(cells) and len(cells) == 4
        trials = _trial_params(db_url, ids)
        for (arm, lr), c in cells.items():
            assert (c["k"], c["n"]) == (cli[arm, lr]["k"], cli[arm, lr]["n"])
            assert c["rate"] == pytest.approx(cli[arm, lr]["rate"]) and c["ci_low"] == pytest.approx(
                cli[arm, lr]["ci_low"]
            )
            assert c["ci_high"] == pytest.approx(cli[arm, lr]["ci_high"])
            # Independently: the design's own lock-in rule, and statsmodels' Clopper-Pearson.
            mine = [p for p in trials.values() if p["arm"] == arm and f"{p['lr']:g}" == lr]
            k = sum(quick_final(p["arm"], p["lr"], p["seed"]) >= 0.9 for p in mine)
            assert (c["k"], c["n"]) == (k, len(mine)) == (k, 5)
            lo, hi = proportion_confint(k, 5, alpha=0.05, method="beta")
            assert c["ci_low"] == pytest.approx(lo, abs=1e-9) and c["ci_high"] == pytest.approx(hi, abs=1e-9)
            assert sorted(c["trial_ids"]) == sorted(ids[key] for key, p in trials.items() if p in mine)
        assert [cells[c]["k"] for c in sorted(cells)] == [2, 4, 0, 1]  # the rates differ per cell

        # The median escape step per cell, against lifelines' own Kaplan-Meier median.
        code, m = _json(app, f"/api/sweeps/{QUICK}/grid?x=lr&y=arm&facet=seed&metric=escape_median")
        assert code == 200 and len(m["panels"]) == 5
        code, m = _json(app, f"/api/sweeps/{QUICK}/grid?x=lr&y=arm&metric=escape_median")
        for c in m["panels"][0]["cells"]:
            mine = [p for p in trials.values() if p["arm"] == c["y"] and f"{p['lr']:g}" == c["x"]]
            esc = [100 * (2 + p["seed"] % 3) for p in mine if quick_final(p["arm"], p["lr"], p["seed"]) > 0.9]
            kmf = KaplanMeierFitter().fit(
                esc + [600] * (len(mine) - len(esc)), [1] * len(esc) + [0] * (len(mine) - len(esc))
            )
            want = kmf.median_survival_time_
            assert c["k"] == len(esc)
            assert (c["median"] is None and want == float("inf")) or c["median"] == want
        assert {c["median"] for c in m["panels"][0]["cells"]} >= {300.0, None}

        # The grid's CSV is the same cells.
        code, headers, body = asgi_get(app, f"/api/sweeps/{QUICK}/csv/grid?x=lr&y=arm")
        assert code == 200 and headers["content-type"].startswith("text/csv")
        assert headers["content-disposition"] == f'attachment; filename="{QUICK}-grid.csv"'
        rows = list(csv.DictReader(io.StringIO(body.decode())))
        assert [(r["arm"], r["lr"], int(r["k"]), int(r["n"])) for r in rows] == [
            (y, x, cells[y, x]["k"], 5) for y, x in sorted(cells)
        ]

        # Bad input: 400 and one line naming what was wrong.
        for q, words in (
            ("x=lr&y=nope", "y 'nope': no such parameter"),
            ("x=nope&y=arm", "x 'nope': no such parameter"),
            ("x=lr&y=arm&facet=zzz", "facet 'zzz': no such parameter"),
            ("x=lr&y=lr", "pick different parameters"),
            ("x=lr", "grid needs two axes"),
            ("x=lr&y=arm&metric=mean", "metric 'mean'"),
            ("x=lr&y=arm&where=" + urllib.parse.quote("nope > 1"), "no such column: nope"),
        ):
            code, bad = _json(app, f"/api/sweeps/{QUICK}/grid?{q}")
            assert code == 400 and words in bad["error"] and "\n" not in bad["error"], (q, bad)
        assert _json(app, "/api/sweeps/nope/grid?x=lr&y=arm")[0] == 404
    finally:
        engine.dispose()


def _trial_params(url: str, ids: dict[str, int]) -> dict[str, dict]:
    from orchestrator import spec

    return {k: p for k, p in spec.load(text=QUICK_SPEC).trials if k in ids}


def test_compare_and_csv_of_every_view(tmp_path):
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    make_quick_db(url)
    _write_sweep(url)  # "live": a second sweep sharing arm, lr, seed
    engine, _ = open_store_engine(url)
    with engine.begin() as conn:  # a stored string a spreadsheet would run as a formula
        sid = repo.upsert_sweep(conn, "formula", "name: formula", "h")
        p = {"arm": '=HYPERLINK("http://x")', "seed": 0, "lr": 1e-3, "steps": 10}
        tid = repo.add_trials(conn, sid, [(trial_key(p), p)])[trial_key(p)]
        repo.upsert_evals(conn, [{"trial_id": tid, "step": 1, "acc": 0.5, "loss": 1.0}])
    engine.dispose()
    app, engine = _app(url)
    try:
        # split=none: pooled over the arms (the default keeps them apart: tests/test_ui_views.py).
        code, c = _json(app, f"/api/compare?a={QUICK}&b=live&by=lr&split=none")
        assert code == 200 and c["by"] == "lr" and "arm" in c["shared"] and c["split"] is None
        code, g = _json(app, f"/api/sweeps/{QUICK}/grid?x=lr&y=arm")
        per_lr = {}
        for cell in g["panels"][0]["cells"]:
            k, n = per_lr.get(cell["x"], (0, 0))
            per_lr[cell["x"]] = (k + cell["k"], n + cell["n"])
        assert {r["value"]: (r["k"], r["n"]) for r in c["a_cells"]} == per_lr
        assert [(r["value"], r["n"]) for r in c["b_cells"]] == [("0.001", 1)]  # only the finished trial
        code, bad = _json(app, f"/api/compare?a={QUICK}&b=live&by=task.K")
        assert code == 400 and bad["error"].startswith("error: by 'task.K': not a parameter of both sweeps")
        assert _json(app, f"/api/compare?a={QUICK}&b=nope")[0] == 404
        code, headers, body = asgi_get(app, f"/api/compare/csv?a={QUICK}&b=live&by=lr&split=none")
        assert code == 200 and body.decode().splitlines()[0] == "sweep,lr,n,k,rate,ci_low,ci_high,median"

        for view, first in (
            ("trials", "trial_id,key,status"),
            ("traces", "key,trial_id,step,acc"),
            ("km?by=arm", "group,step,not_escaped"),
            ("grid?x=lr&y=arm", "arm,lr,n,k"),
        ):
            code, headers, body = asgi_get(app, f"/api/sweeps/{QUICK}/csv/{view}")
            assert code == 200 and headers["content-type"] == "text/csv; charset=utf-8", view
            assert headers["x-content-type-options"] == "nosniff"
            assert body.decode().startswith(first), view
        code, _, body = asgi_get(app, f"/api/sweeps/{QUICK}/csv/traces")
        assert len(body.decode().splitlines()) == 1 + 20 * 7
        code, _, body = asgi_get(app, "/api/sweeps/formula/csv/trials")
        (row,) = csv.DictReader(io.StringIO(body.decode()))
        assert row["param.arm"] == '\'=HYPERLINK("http://x")'
        assert _json(app, f"/api/sweeps/{QUICK}/csv/nope")[0] == 400
    finally:
        engine.dispose()


def test_the_cursor_of_1500_running_trials_goes_in_a_post_body(tmp_path):
    """About 600 trials written at once made the cursor longer than 16 KiB, where a request
    line may be refused (uvicorn's h11 limit, when the request arrives in pieces): the page
    POSTs it, and a real server takes it."""
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    engine, _ = open_store_engine(url)
    params = [{"arm": "a", "task": "mqar", "seed": i, "lr": 1e-3, "steps": 5000} for i in range(1500)]
    with engine.begin() as conn:
        keyed, ids = running_trials(conn, "wide", "name: wide", params)
        repo.upsert_evals(conn, [{"trial_id": i, "step": 1000, "acc": 0.1, "loss": 1.0} for i in ids.values()])
    engine.dispose()
    with ui_server(url) as base:
        code, first = get_json(base + "/api/sweeps/wide/traces")
        assert code == 200 and first["n"] == 1500 and len(first["cursor"]) > 16 * 1024
        one = ids[keyed[7][0]]
        _append(url, one, (2000,))
        code, new = post_json(base + "/api/sweeps/wide/traces", {"since": first["cursor"]})
        assert code == 200 and _rows(new) == [(one, 2000)]
        code, none = post_json(base + "/api/sweeps/wide/traces", {"since": new["cursor"], "where": "seed < 10"})
        assert code == 200 and none["n"] == 0
        code, bad = post_json(base + "/api/sweeps/wide/traces", {"since": "garbage"})
        assert code == 400 and "not a cursor this server gave out" in bad["error"]
        code, bad = post_json(base + "/api/sweeps/wide/traces", ["not", "an", "object"])
        assert code == 400 and bad["error"] == "error: the body must be a JSON object of strings"


def test_the_trial_page_lists_its_attempts_as_text(db_url):
    """Every attempt of a trial, where and with which code it ran and from which step; a
    stored string (here a host name holding markup) is text on the page."""
    from orchestrator.store import attempts

    ids = _write_sweep(db_url)
    engine, _ = open_store_engine(db_url)
    env = {"host": "<b>h1</b>", "device": "cpu", "precision": "fp32", "code_version": "git:abc123"}
    with engine.begin() as conn:
        attempts.begin_attempt(conn, ids["running"], None, env, "drv:1")
        attempts.begin_attempt(conn, ids["running"], 10, {**env, "code_version": "git:def456"}, "drv:2")
    engine.dispose()
    app, engine = _app(db_url)
    try:
        code, _, body = asgi_get(app, f"/sweeps/live/trials/{ids['key_running']}")
    finally:
        engine.dispose()
    page = body.decode() if isinstance(body, bytes) else body
    assert code == 200 and 'id="attempts"' in page
    assert "git:abc123" in page and "git:def456" in page and "drv:2" in page and ">lost<" in page
    assert "<b>h1</b>" not in page and "&lt;b&gt;h1&lt;/b&gt;" in page
