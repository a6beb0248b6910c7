"""The suite's CPU sampler (tests/cpu_by_process.py): what it calls each process, and that a
process's CPU is counted to its kind."""

from __future__ import annotations

import sys

import pytest

from cpu_by_process import kind, profile


def test_processes_are_named_by_what_ray_and_the_suite_call_them():
    assert kind("ray::ImplicitFunc.train") == "trial actor (ray::ImplicitFunc)"
    assert kind("ray::Loader") == "checkpoint loader (ray::Loader)"
    assert kind("/x/.venv/bin/python -m orchestrator.cli submit s.yaml") == "orchestrator CLI (drivers and commands)"
    assert kind("/x/.venv/bin/python /x/.venv/bin/orchestrator join s") == "orchestrator CLI (drivers and commands)"
    # A checkout named orchestrator is not a driver.
    assert kind("/home/u/orchestrator/.venv/bin/python -c import ray") == "other: python"
    assert kind("/x/ray/core/src/ray/raylet/raylet --node_manager_port=0") == "Ray raylet"
    assert kind("ray::SomethingElse") == "other Ray worker"


@pytest.mark.slow
def test_a_busy_child_is_counted_to_its_kind_within_the_machines_total():
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass"
    run = profile([sys.executable, "-c", burn], every=0.1)
    assert run.code == 0 and run.wall_s >= 1.5
    mine = run.by_kind["other: " + sys.executable.rsplit("/", 1)[-1]]
    # Its last moments may fall after the last look (the sampler sees it at most every 0.1 s).
    assert 1.0 <= mine <= run.machine_cpu_s + 0.2, (mine, run)
