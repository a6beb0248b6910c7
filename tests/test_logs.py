"""A failing trial can be debugged from where one looks: a plugin cell that prints and then
raises mid-training, run through a real Ray (two attempts: retries 1). Each attempt's console
tail is stored with it (``attempts.log``); ``orchestrator logs`` prints every attempt's
console and traceback; ``status`` counts the trial failed with its error's first line; the
trial page shows the traceback and the console of each attempt, as text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from orchestrator.store.reader import open_reader_engine
from orchestrator.ui.app import create_app

from conftest import OWN_RAY, query
from test_ui_bounds import call

ORCH = [sys.executable, "-m", "orchestrator.cli"]

CELL = '''
"""A mixer that prints as it trains and raises at its 25th training forward."""
import torch.nn as nn

from cells import ArmSpec, Family, Knob, KnobSet, register_cell


class Boom(nn.Module):
    causal = True

    def __init__(self, d):
        super().__init__()
        self.lin, self.d, self.calls = nn.Linear(d, d), d, 0
        print("boom cell built, d =", d, "<b>not markup</b>")

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls % 10 == 0:
                print(f"training forward {self.calls}")
            if self.calls == 25:
                raise RuntimeError(f"boom at training forward {self.calls}")
        return self.lin(x)

    def state_elements(self):
        return self.d


FAMILY = Family("boom", lambda k, d: (lambda: Boom(d)), lambda arm, k, d: None)
ARM = ArmSpec("boom", "boom", "prints, then raises (test plugin)", KnobSet({
    "mlp": Knob(False, "bool", "pre-norm residual MLP"),
    "mlp_ratio": Knob(2, "int", "MLP width multiple", minimum=1),
    "norm": Knob(True, "bool", "RMSNorm"),
}), d_model=16)
register_cell(ARM, FAMILY)
'''

SPEC = """name: boomy
plugins: [boomplug.cells]
fixed: {arm: boom, task: mqar, task.K: 4, task.eval_size: 16, d_model: 16, n_layers: 1, batch_size: 8}
axes: {seed: [0]}
budget: {steps: 40, eval_every: 10}
retries: 1
"""


@pytest.mark.slow
def test_a_failing_plugin_cell_is_debuggable_from_logs_status_and_its_page(tmp_path):
    pkg = tmp_path / "plug" / "boomplug"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cells.py").write_text(textwrap.dedent(CELL))
    spec = tmp_path / "boom.yaml"
    spec.write_text(SPEC)
    db = f"sqlite:///{tmp_path / 'boom.db'}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "plug"), os.environ.get("PYTHONPATH")])),
        **OWN_RAY,  # its own Ray: the workers inherit PYTHONPATH
        "PYTHONUNBUFFERED": "1",
    }
    r = subprocess.run(ORCH + ["submit", str(spec), "--db", db, "--quiet"], env=env, capture_output=True, text=True)
    assert r.returncode == 1, r.stderr  # the sweep ran; its one trial failed
    ((key,),) = query(db, "SELECT key FROM trials")
    stored = query(db, "SELECT attempt, outcome, log FROM attempts ORDER BY attempt")
    assert [a for a, _, _ in stored] == [1, 2]
    for _, outcome, log in stored:
        assert outcome == "failed"
        assert "boom cell built, d = 16" in log and "training forward 20" in log, log
        assert "RuntimeError: boom at training forward 25" in log  # the traceback as printed

    got = subprocess.run(ORCH + ["logs", "boomy", "--trial", key, "--db", db], env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    text = got.stdout
    assert text.count("==> attempt") == 2 and "==> attempt 2: failed <==" in text
    assert text.count("training forward 20") >= 2
    assert "runtime error:" in text and "RuntimeError: boom at training forward 25" in text
    one = subprocess.run(
        ORCH + ["logs", "boomy", "--trial", key, "--attempt", "1", "--db", db, "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert one.returncode == 0, one.stderr
    (story,) = json.loads(one.stdout)
    assert story["attempt"] == 1 and story["errors"] and "boom" in story["errors"][0]["traceback"]
    assert "\x1b" not in story["errors"][0]["traceback"]  # Ray's colours are not stored
    bad = subprocess.run(
        ORCH + ["logs", "boomy", "--trial", key, "--attempt", "7", "--db", db], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "no attempt 7" in bad.stderr

    st = subprocess.run(ORCH + ["status", "boomy", "--db", db], env=env, capture_output=True, text=True)
    assert "failed 1" in st.stdout and "% of steps" in st.stdout and "100% of steps" not in st.stdout, st.stdout

    engine, shown = open_reader_engine(db)
    try:
        status, _, page = call(create_app(engine, shown), f"/sweeps/boomy/trials/{key}")
    finally:
        engine.dispose()
    html = page.decode()
    assert status == 200
    assert html.count('class="story"') == 2 and "boom at training forward 25" in html
    assert "&lt;b&gt;not markup&lt;/b&gt;" in html and "<b>not markup</b>" not in html  # text, never markup


# ---- the parts, without Ray --------------------------------------------------------------------


def test_console_tail_keeps_the_last_part_and_says_what_it_dropped():
    from orchestrator.runner.console import Capture, captured

    with captured(limit=100) as cap:
        for i in range(50):
            print(f"line {i:02d}")
    text = cap.now()
    assert text is not None and text.endswith("line 49\n") and "line 00" not in text
    assert text.startswith("[... ") and "earlier characters not kept]" in text
    assert len(text.split("]\n", 1)[1]) == 100
    assert cap.now() is None  # nothing new since
    assert isinstance(cap, Capture)


def test_logs_and_errors_are_stored_per_attempt(tmp_path):
    from conftest import fill_sweep
    from orchestrator.store import attempts, reader, repo
    from orchestrator.store.engine import open_store_engine

    engine, _ = open_store_engine(f"sqlite:///{tmp_path / 'a.db'}")
    _, ids = fill_sweep(engine, "s1", n_trials=1, n_steps=2)
    tid = ids["k0"]
    with engine.begin() as conn:
        repo.mark_running(conn, tid)  # as the writer does: the trial's attempt count, then the attempt
        attempts.begin_attempt(conn, tid, None, {}, "d1")
        attempts.save_logs(conn, {tid: "first\n"})
        repo.add_trial_error(conn, tid, "runtime", "RuntimeError: x", "Traceback ...\nRuntimeError: x")
        attempts.close_attempts(conn, [tid], "failed", "runtime")
        repo.mark_running(conn, tid)
        attempts.begin_attempt(conn, tid, 10, {}, "d1")
        attempts.save_logs(conn, {tid: "second, part 1\n"})
        attempts.save_logs(conn, {tid: "second, part 1\nand 2\n"})  # a newer tail replaces it
    with engine.connect() as conn:
        stories = reader.attempt_stories(conn, tid)
    engine.dispose()
    assert [(s.attempt, s.log) for s in stories] == [(1, "first\n"), (2, "second, part 1\nand 2\n")]
    assert stories[0].errors and stories[0].errors[0]["traceback"].endswith("RuntimeError: x")
    assert stories[1].from_step == 10 and stories[1].errors == []


def test_follow_prints_only_what_is_new_and_all_of_a_moved_tail():
    from orchestrator.cli.logs_cmds import _unprinted

    assert _unprinted("a\nb\n", "") == "a\nb\n"
    assert _unprinted("a\nb\nc\n", "a\nb\n") == "c\n"  # grew: only the new lines
    assert _unprinted("[... 4 earlier]\nc\n", "a\nb\n") == "[... 4 earlier]\nc\n"  # front dropped
    assert _unprinted(None, "") == ""
