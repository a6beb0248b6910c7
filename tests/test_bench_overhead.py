"""`orchestrator bench overhead`: a tiny run of the whole product path beside plain Ray Tune,
each on a Ray of its own (the command runs in a fresh interpreter, and its spec's plugin
module reaches the workers in each unit's config), with two drivers sharing the slots (the
submit and one `orchestrator join`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.bench.overhead import EVAL_EVERY, STEPS


@pytest.mark.slow
def test_a_tiny_overhead_run_reports_both_paths(tmp_path):
    slots = 2
    argv = [sys.executable, "-m", "orchestrator.cli", "bench", "overhead", "--trials", "4", "--trial-seconds", "0.2"]
    argv += ["--drivers", "2"]
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [*argv, "--slots", str(slots), "--json"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    assert r["tune_errors"] == 0 and r["drivers"] == 2 and r["joined_exit_codes"] == [0]
    # Every trial ran exactly once, whichever driver claimed it.
    assert sum(r["attempts_per_driver"]) == 4 and 1 <= len(r["attempts_per_driver"]) <= 2
    assert 1 <= r["tune_trials"] <= 4  # the first driver's (too few trials to chain)
    assert r["ideal_s"] == pytest.approx(4 * 0.2 / slots)
    # Each trial stores its eval points: steps 1, EVAL_EVERY, 2*EVAL_EVERY, ... and the last.
    per_trial = len({1, *range(EVAL_EVERY, STEPS + 1, EVAL_EVERY), STEPS})
    assert r["eval_rows"] == 4 * per_trial
    assert r["rows_per_s"] == pytest.approx(r["eval_rows"] / r["wall_s"])
    # The trials trained for (about) their fixed time; more on a loaded machine.
    assert r["trial_own_s"] >= 0.2 * 0.8
    assert r["wall_s"] > r["ideal_s"] and r["tune_wall_s"] > r["ideal_s"]
    # Plain Tune's wall, as the product's, ends once its Ray is shut down: after fit().
    assert r["ideal_s"] < r["tune_fit_s"] < r["tune_wall_s"]
    assert r["overhead"] == pytest.approx(r["wall_s"] / r["ideal_s"] - 1)
    assert r["vs_tune"] == pytest.approx(r["wall_s"] / r["tune_wall_s"] - 1)
    assert r["driver_peak_rss_mb"] > 50 and r["tune_driver_peak_rss_mb"] > 50
    # The RSS curve: one point per tenth of the trials ended, each a whole driver's memory.
    # (The peak is the largest of VmHWM and these points by definition, so no bound between
    # the two is asserted: it could not fail.)
    curve = r["driver_rss_by_tenth_mb"]
    assert len(curve) == 10 and any(m is not None for m in curve)
    assert all(m > 50 for m in curve if m is not None)


def test_a_run_of_trials_with_no_training_time_prints_no_overhead(capsys):
    """--trial-seconds 0 (the driver's own costs alone) has no ideal to divide by: the
    overhead is none and the text says so, where it used to end in ZeroDivisionError."""
    from orchestrator.cli.bench_cmds import _print_overhead

    r = {
        "trials": 3,
        "trial_seconds": 0.0,
        "slots": 2,
        "ideal_s": 0.0,
        "wall_s": 4.0,
        "overhead": None,
        "drivers": 1,
        "attempts_per_driver": [3],
        "tune_trials": 2,
        "driver_peak_rss_mb": 400.0,
        "rows_per_s": 2.0,
        "trial_own_s": 0.01,
        "driver_rss_by_tenth_mb": [350.0, None] + [360.0] * 8,
        "db_commits_per_trial": 1.5,
        "db_statements_per_trial": 20.0,
        "driver_cpu_ms_per_trial": 30.0,
        "load_before": 0.1,
        "load_after": 0.2,
        "tune_wall_s": 3.0,
        "tune_overhead": None,
        "vs_tune": 1 / 3,
    }
    _print_overhead(r)
    out = capsys.readouterr().out
    assert "overhead n/a (no training time)" in out and "+33.3% vs plain Tune" in out
    assert "at each tenth of the trials ended: 350 - 360" in out
    assert "in 2 Ray Tune trials" in out
