"""The CLI's one exit door: usage errors print click's usage message and exit 2 (typer
vendors its own click, whose exceptions are not click's); bad input is one line and exit
2; an unexpected error is one line naming a log with the traceback, which --debug shows."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestrator.cli import main
from orchestrator.cli.app import app

USAGE = [
    (["submitt"], "No such command"),
    (["submit", "--bogus", "x.yaml"], "No such option"),
    (["sql"], "Missing argument"),
    (["ls", "--db"], "requires an argument"),
    (["analyze", "x", "lockin", "--seed", "abc"], "Invalid value for '--seed'"),
    (["submit", "x.yaml", "--max-concurrent", "0"], "Invalid value for '--max-concurrent'"),
    (["sql", "SELECT 1", "--timeout", "soon"], "Invalid value for '--timeout'"),
    (["db", "upgradee"], "No such command"),
    (["import", "f.jsonl"], "Missing option '--sweep'"),
    (["submit", "x.yaml", "--max-trials", "many"], "Invalid value for '--max-trials'"),
]


@pytest.mark.parametrize("argv,msg", USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors_print_usage_and_exit_2(argv, msg, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert msg in err and "Traceback" not in err
    assert "Usage:" in err or "requires an argument" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_usage_error_through_the_installed_entry_point(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "submit", "--nope"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2 and "No such option: --nope" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_main_module_imported_again_runs_nothing(tmp_path):
    # What a forkserver's preload of "__main__" or a spawned child does with `python -m
    # orchestrator.cli`: import the module under another name. It must not run the command
    # (a second dashboard, a second driver) nor exit.
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy; runpy.run_module('orchestrator.cli', run_name='__mp_main__'); print('ok')",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, "ok\n", "")


@pytest.fixture
def boom():
    @app.command("boom-test", hidden=True)
    def _boom() -> None:
        raise RuntimeError("kaboom\nsecond line")

    yield
    app.registered_commands[:] = [c for c in app.registered_commands if c.name != "boom-test"]


def test_unexpected_error_is_one_line_and_a_log(boom, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ORCH_LOG_DIR", str(tmp_path / "logs"))
    code = main(["boom-test"])
    err = capsys.readouterr().err
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "RuntimeError: kaboom" in lines[0] and "--debug" in lines[0]
    logs = list((tmp_path / "logs").iterdir())
    assert len(logs) == 1 and str(logs[0]) in lines[0]
    text = logs[0].read_text()
    assert "Traceback" in text and "kaboom" in text


def test_debug_shows_the_traceback(boom, monkeypatch):
    with pytest.raises(RuntimeError, match="kaboom"):
        main(["--debug", "boom-test"])
    monkeypatch.setenv("ORCH_DEBUG", "1")
    with pytest.raises(RuntimeError, match="kaboom"):
        main(["boom-test"])


@pytest.mark.parametrize(
    "argv",
    [
        ["resume", "x", "--db", "postgresql://127.0.0.1:1/nope"],
        ["ls", "--db", "postgresql://127.0.0.1:1/nope"],
        ["status", "--db", "mysql://h/db"],
        ["db", "upgrade", "--db", "postgresql://127.0.0.1:1/nope"],
        ["db", "upgrade", "--db", "/proc/orch-cannot-write-here.db"],
    ],
)
def test_unreachable_databases_are_one_line(argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
