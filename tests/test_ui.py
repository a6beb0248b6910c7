"""`orchestrator ui` without a browser: a real server process against a real SQLite file and
the local PostgreSQL; the incremental trace cursor, 404s, a bad --where, a missing
database, and that serving never changes the database file."""

from __future__ import annotations

import hashlib
import urllib.parse

import pytest

from orchestrator.cli import main
from orchestrator.keys import trial_key
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine, sqlite_path

from ui_support import get, get_json, ui_server

SPEC = "name: live\ndescription: two trials written by hand\nanalysis: {by: [arm]}\n"


def _params(arm: str, seed: int) -> dict:
    return {"arm": arm, "task": "mqar", "seed": seed, "lr": 1e-3, "steps": 100, "eval_every": 10}


def _write_sweep(url: str) -> dict[str, int]:
    """Two trials with three eval points each, one finished and one still running."""
    engine, _ = open_store_engine(url)
    keyed = [(trial_key(p), p) for p in (_params("a", 0), _params("b", 0))]
    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, "live", SPEC, "h")
        ids = repo.add_trials(conn, sid, keyed)
        for k, _ in keyed:
            repo.mark_running(conn, ids[k])
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
        repo.touch(conn, [tid])
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
