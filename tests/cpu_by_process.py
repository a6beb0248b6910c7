"""Where a command's CPU goes, by kind of process: run it, look at every process (psutil)
while it runs, print CPU-seconds per kind (trial actors, drivers, checkpoint loaders, Ray's
own daemons, ...) and the machine's total beside them.

    .venv/bin/python tests/cpu_by_process.py [--every S] -- .venv/bin/pytest -q -n 2

The suite is CPU-bound on its 2 cores, so this is what says which processes its minutes buy.
It is a sampler: a process is seen at most every ``--every`` seconds (default 0.5), so one
that lives less long is missed, and one's last half second may be; the sum of the kinds
falls short of the machine's total by that, and by what other processes on the machine ran.
A process's CPU counts from when it was first seen (one that was running before the command
counts only what it spent after).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from typing import NamedTuple

import psutil

# A process's kind from its command line (Ray sets its workers' titles to ray::<what>), first
# match wins: more specific names before the ones they contain.
KINDS = [
    ("ray::ImplicitFunc", "trial actor (ray::ImplicitFunc)"),
    ("ray::Loader", "checkpoint loader (ray::Loader)"),
    ("ray::IDLE", "idle Ray worker (ray::IDLE)"),
    ("-c import sys;exec(eval(sys.stdin.readline()))", "pytest-xdist worker"),
    ("bin/pytest", "pytest (the main process)"),
    ("-m orchestrator.cli", "orchestrator CLI (drivers and commands)"),
    ("bin/orchestrator ", "orchestrator CLI (drivers and commands)"),
    ("log_monitor", "Ray log_monitor"),
    ("monitor.py", "Ray autoscaler monitor"),
    ("dashboard/agent.py", "Ray dashboard agent"),
    ("DashboardAgent", "Ray dashboard agent"),
    ("runtime_env/agent", "Ray runtime-env agent"),
    ("RuntimeEnvAgent", "Ray runtime-env agent"),
    ("gcs_server", "Ray gcs_server"),
    ("raylet", "Ray raylet"),
    ("ray::", "other Ray worker"),
    ("chrom", "Chromium"),
    ("multiprocessing", "multiprocessing child"),
    ("postgres", "PostgreSQL"),
    ("slurm", "SLURM"),
    ("munge", "SLURM"),
]


def kind(cmdline: str) -> str:
    for needle, name in KINDS:
        if needle in cmdline:
            return name
    return "other: " + (cmdline.split(" ", 1)[0].rsplit("/", 1)[-1] or "?")


def machine_cpu_s() -> float:
    """CPU-seconds the whole machine has spent (user, nice, system, irq, softirq, steal)."""
    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


def _snapshot() -> dict[int, tuple[float, str]]:
    """Every process's CPU-seconds so far and its command line (unreadable ones skipped)."""
    seen: dict[int, tuple[float, str]] = {}
    for p in psutil.process_iter(["cpu_times", "cmdline"]):
        times, cmdline = p.info["cpu_times"], p.info["cmdline"]
        if times is not None:  # None: gone or not ours to read
            seen[p.pid] = (times.user + times.system, " ".join(cmdline or []))
    return seen


class Profile(NamedTuple):
    code: int  # the command's exit code
    wall_s: float
    machine_cpu_s: float  # what the whole machine spent meanwhile
    by_kind: dict[str, float]  # CPU-seconds by kind of process
    processes: Counter[str]  # processes seen by kind


def profile(command: list[str], every: float = 0.5) -> Profile:
    """Run ``command``, looking at every process each ``every`` seconds until it ends."""
    start = _snapshot()
    latest: dict[int, tuple[float, str]] = {}
    t0, cpu0 = time.monotonic(), machine_cpu_s()
    child = subprocess.Popen(command)
    while True:
        done = child.poll() is not None
        for pid, (cpu, cmd) in _snapshot().items():
            if pid != os.getpid():
                # Ray renames its workers once they start: the last title seen names them.
                latest[pid] = (cpu, cmd or latest.get(pid, (0.0, ""))[1])
        if done:
            break
        time.sleep(every)
    wall, total = time.monotonic() - t0, machine_cpu_s() - cpu0
    by_kind: defaultdict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for pid, (cpu, cmd) in latest.items():
        # Counted from the first look (a process that was running before the command).
        spent = cpu - start[pid][0] if pid in start else cpu
        if spent > 0:
            by_kind[kind(cmd)] += spent
            count[kind(cmd)] += 1
    return Profile(child.returncode, wall, total, by_kind, count)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=0.5, help="seconds between looks at the processes")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    run = profile(command, args.every)
    seen = sum(run.by_kind.values())
    print(
        f"\nwall {run.wall_s:.0f} s; machine CPU {run.machine_cpu_s:.0f} s; seen in processes {seen:.0f} s",
        file=sys.stderr,
    )
    print(f"{'CPU-s':>8} {'share':>6} {'procs':>6}  kind", file=sys.stderr)
    for name, cpu in sorted(run.by_kind.items(), key=lambda kv: -kv[1]):
        if cpu >= 0.5:
            share = cpu / max(run.machine_cpu_s, seen)
            print(f"{cpu:8.1f} {share:6.1%} {run.processes[name]:6d}  {name}", file=sys.stderr)
    return run.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
