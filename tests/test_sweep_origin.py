"""Who made a sweep is a stored fact (``sweeps.origin``, schema 0010), not a guess from its
spec text: ``import`` writes only into sweeps an import made, the runner runs only sweeps it
made; two writers creating one new sweep at once end cleanly; imported parameters are held
to a spec's bounds; a file name is echoed with its control characters escaped."""

from __future__ import annotations

import json
import threading
import time

import pytest
import sqlalchemy as sa

from conftest import migrate, old_database, two_arm_spec
from orchestrator.cli import main
from orchestrator.errors import UserError
from orchestrator.store import lease, reader, repo
from orchestrator.store.engine import make_engine, open_store_engine

RECORD = {"params": {"arm": "mlstm", "seed": 1, "lr": 0.003}, "trace": [{"step": 1, "acc": 0.5, "loss": 1.0}]}


def _file(path, *records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records or (RECORD,)))
    return path


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    got = capsys.readouterr()
    return code, got.out, got.err


def _snapshot(engine) -> tuple:
    with engine.connect() as c:
        return (
            c.execute(
                sa.text("SELECT id, name, spec_text, spec_hash, origin, lease_owner FROM sweeps ORDER BY id")
            ).all(),
            c.execute(sa.text("SELECT id, key, status, params, final_acc FROM trials ORDER BY id")).all(),
            c.execute(sa.text("SELECT trial_id, step, acc, loss FROM evals ORDER BY trial_id, step")).all(),
        )


SPECS_LIKE_IMPORTS = [
    "# imported from x\nname: basin\n",
    "# imported from x.jsonl\n# (a comment of our own)\nname: basin\n",
    "# imported from \n\n# imported from y\nname: basin\n",
]


@pytest.mark.parametrize("spec_text", SPECS_LIKE_IMPORTS)
def test_import_refuses_a_running_submitted_sweep_whose_spec_starts_like_an_import(db_url, tmp_path, capsys, spec_text):
    engine, _ = open_store_engine(db_url)
    # What `submit` does: the runner's ensure_sweep, trials, the lease, a finished trial.
    sid = repo.ensure_sweep(engine, "basin", spec_text, "abc")
    with engine.begin() as c:
        ids = repo.add_trials(c, sid, [("k0", {"arm": "mlstm", "seed": 1, "lr": 0.003}), ("k1", {"seed": 2})])
        assert lease.claim(c, sid, "driver-1", ttl=60)
        repo.upsert_evals(c, [{"trial_id": ids["k0"], "step": 1, "acc": 0.9, "loss": 0.1}])
        repo.finish_trial(c, ids["k0"], "completed")
        repo.mark_running(c, ids["k1"])
    with engine.connect() as c:
        assert reader.sweep_origin(c, "basin") == reader.ORIGIN_RUNNER
    before = _snapshot(engine)
    # The same params as the finished trial: an import would rewrite its evals and status.
    rec = {"params": {"arm": "mlstm", "seed": 1, "lr": 0.003}, "trace": [{"step": 1, "acc": 0.1}], "status": "failed"}
    code, out, err = _run(capsys, "import", _file(tmp_path / "x", rec), "--sweep", "basin", "--db", db_url)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "created by `orchestrator submit`" in err, err
    assert _snapshot(engine) == before
    engine.dispose()


def test_the_runner_refuses_an_imported_sweep(db_url, tmp_path, capsys):
    code, _, err = _run(capsys, "import", _file(tmp_path / "pub.jsonl"), "--sweep", "pub", "--db", db_url)
    assert code == 0, err
    engine, _ = open_store_engine(db_url)
    with engine.connect() as c:
        assert reader.sweep_origin(c, "pub") == reader.ORIGIN_IMPORT
    before = _snapshot(engine)
    with pytest.raises(UserError, match="made by `orchestrator import`"):
        repo.ensure_sweep(engine, "pub", "name: pub\n", "h")
    for cmd in ("resume", "join"):
        code, _, err = _run(capsys, cmd, "pub", "--db", db_url)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "made by `orchestrator import`" in err, err
    spec = tmp_path / "pub.yaml"
    spec.write_text(two_arm_spec("pub"))
    t0 = time.monotonic()
    code, _, err = _run(capsys, "submit", spec, "--db", db_url, "--quiet")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "made by `orchestrator import`" in err, err
    assert time.monotonic() - t0 < 20  # refused before Ray starts
    assert _snapshot(engine) == before
    # a second import into it is an import's own business
    code, _, err = _run(capsys, "import", _file(tmp_path / "more.jsonl"), "--sweep", "pub", "--db", db_url)
    assert code == 0, err
    engine.dispose()


def test_origin_migration_fills_old_rows_from_the_spec_prefix(db_url, tmp_path, capsys):
    """0009 -> 0010: the placeholder text `import` wrote marks an imported sweep (compared
    exactly: SQLite's LIKE would also take another case); everything else is the runner's."""
    engine = old_database(db_url, "0009_drivers")  # sweep 's' (id 1), spec 't'
    rows = {
        "imp": "# imported from a.jsonl\n",
        "upper": "# IMPORTED FROM a.jsonl\n",
        "later": "name: later\n# imported from a.jsonl\n",
        "pct": "# imported_from%x\n",
    }
    with engine.begin() as c:
        for name, text in rows.items():
            c.execute(
                sa.text("INSERT INTO sweeps (name, spec_text, spec_hash) VALUES (:n, :t, 'h')"), {"n": name, "t": text}
            )
    with engine.connect() as c:
        before = c.execute(sa.text("SELECT id, name, spec_text, spec_hash FROM sweeps ORDER BY id")).all()
    assert main(["db", "upgrade", "--db", db_url]) == 0
    capsys.readouterr()
    with engine.connect() as c:
        after = c.execute(sa.text("SELECT id, name, spec_text, spec_hash, origin FROM sweeps ORDER BY id")).all()
    assert [tuple(r[:4]) for r in after] == [tuple(r) for r in before]
    assert {r.name: r.origin for r in after} == {
        "s": "runner",
        "imp": "import",
        "upper": "runner",
        "later": "runner",
        "pct": "runner",
    }
    code, _, err = _run(capsys, "import", _file(tmp_path / "a.jsonl"), "--sweep", "imp", "--db", db_url)
    assert code == 0, err
    code, _, err = _run(capsys, "import", _file(tmp_path / "a.jsonl"), "--sweep", "upper", "--db", db_url)
    assert code == 2 and "created by `orchestrator submit`" in err
    migrate(engine, "0009_drivers", down=True)
    assert "origin" not in {col["name"] for col in sa.inspect(engine).get_columns("sweeps")}
    engine.dispose()


def _hold_new_sweep(engine, origin: str):
    """An open transaction that has inserted the sweep ``race`` and not committed."""
    conn = engine.connect()
    tx = conn.begin()
    conn.execute(
        sa.text("INSERT INTO sweeps (name, spec_text, spec_hash, origin) VALUES ('race', :t, 'h', :o)"),
        {"t": "# imported from other.jsonl\n" if origin == "import" else "name: race\n", "o": origin},
    )
    return conn, tx


def _wait_until_blocked(engine, seconds: float = 1.5) -> None:
    """Until another session waits on a lock (PostgreSQL), or a moment (SQLite)."""
    if engine.dialect.name != "postgresql":
        time.sleep(seconds)
        return
    deadline = time.monotonic() + 20
    with engine.connect() as c:
        while time.monotonic() < deadline:
            if c.execute(sa.text("SELECT count(*) FROM pg_locks WHERE NOT granted")).scalar():
                return
            time.sleep(0.05)
    raise AssertionError("the import never waited for the other writer")


@pytest.mark.parametrize("origin", ["import", "runner"])
def test_an_import_racing_another_writer_for_a_new_sweep_ends_cleanly(db_url, tmp_path, capsys, origin):
    """The other writer inserts the new sweep first and commits while the import waits on it:
    an import's sweep is joined (exit 0), a submitted one refused in one line; never an
    IntegrityError traceback."""
    engine = make_engine(db_url)
    open_store_engine(db_url)[0].dispose()  # the schema
    f = _file(tmp_path / "mine.jsonl")
    conn, tx = _hold_new_sweep(engine, origin)
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(code=main(["import", str(f), "--sweep", "race", "--db", db_url])))
    try:
        t.start()
        _wait_until_blocked(engine)
        tx.commit()
    finally:
        conn.close()
    t.join(60)
    out, err = capsys.readouterr()
    with engine.connect() as c:
        n = c.execute(sa.text("SELECT count(*) FROM trials")).scalar_one()
        sweeps = c.execute(sa.text("SELECT name, origin FROM sweeps")).all()
    assert [tuple(r) for r in sweeps] == [("race", origin)]
    if origin == "import":
        assert got["code"] == 0 and "imported 1 trials" in out and err == "", err
        assert n == 1
    else:
        assert got["code"] == 2 and len(err.strip().splitlines()) == 1 and "orchestrator submit" in err, err
        assert n == 0
    engine.dispose()


@pytest.mark.parametrize(
    "params, named",
    [
        ({"arm": "mlstm", "seed": -5}, "seed -5"),
        ({"arm": "mlstm", "seed": 1, "lr": 9.2e18}, "lr 9.2e+18"),
        ({"arm": "mlstm", "seed": 1, "lr": 0}, "lr 0"),
        ({"arm": "mlstm", "seed": 1, "steps": 0}, "steps 0"),
        ({"arm": "mlstm", "seed": 1, "beta1": 1.5}, "beta1 1.5"),
    ],
)
def test_imported_params_are_held_to_the_bounds_of_specs(tmp_path, capsys, params, named):
    db = tmp_path / "b.db"
    good = {**RECORD, "params": {"arm": "mlstm", "seed": 7}}
    f = _file(tmp_path / "bad.jsonl", good, {**RECORD, "params": params})
    code, out, err = _run(capsys, "import", f, "--sweep", "b", "--db", db)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "line 2" in err and named in err and "nothing imported" in err, err
    if db.exists():
        engine = make_engine(f"sqlite:///{db}")
        with engine.connect() as c:
            assert c.execute(sa.text("SELECT count(*) FROM trials")).scalar_one() == 0
        engine.dispose()


def test_import_escapes_control_characters_of_the_file_name(tmp_path, capsys):
    name = "a\x1b[31mred\x07.jsonl"
    f = _file(tmp_path / name)
    code, out, err = _run(capsys, "import", f, "--sweep", "esc", "--db", tmp_path / "e.db")
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out and "a\\x1b[31mred\\x07.jsonl" in out, out
    code, out, err = _run(
        capsys, "import", tmp_path / ("gone\x1b]0;title\x07.jsonl"), "--sweep", "esc", "--db", tmp_path / "e.db"
    )
    assert code == 2 and "\x1b" not in err and "\x07" not in err and "gone\\x1b]0;title\\x07" in err, err
