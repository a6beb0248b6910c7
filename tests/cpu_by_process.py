"""Where a command's CPU goes, by kind of process: run it, poll /proc while it runs, print
CPU-seconds per kind (trial actors, drivers, checkpoint loaders, Ray's own daemons, ...) and
the machine's total from /proc/stat beside them.

    python tests/cpu_by_process.py [--every S] -- .venv/bin/pytest -q -n 2

The suite is CPU-bound on its 2 cores, so this is what says which processes its minutes buy.
It is a sampler: a process is seen at most every ``--every`` seconds (default 0.5), so one
that lives less long is missed, and one's last half second may be; the sum of the kinds
falls short of the machine's total by that, and by what other processes on the machine ran.
A process's CPU counts from when it was first seen (one that was running before the command
counts only what it spent after). Linux only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter

_TICK = os.sysconf("SC_CLK_TCK")

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
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[4] + fields[5] + fields[6] + fields[7]) / _TICK


def _snapshot() -> dict[int, tuple[float, str]]:
    """Every process's CPU-seconds so far and its command line (unreadable ones skipped)."""
    seen: dict[int, tuple[float, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline") as f:
                cmd = f.read().replace("\0", " ").strip()
        except OSError:  # gone between the listing and the read
            continue
        after_name = stat[stat.rindex(")") + 2 :].split()
        seen[int(entry)] = ((int(after_name[11]) + int(after_name[12])) / _TICK, cmd)
    return seen


def profile(command: list[str], every: float = 0.5) -> tuple[int, float, float, Counter[str], Counter[str]]:
    """Run ``command``; its exit code, wall seconds, the machine's CPU-seconds, and CPU-seconds
    and process counts by kind."""
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
    by_kind: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for pid, (cpu, cmd) in latest.items():
        # Counted from the first look (a process that was running before the command).
        spent = cpu - start[pid][0] if pid in start else cpu
        if spent > 0:
            by_kind[kind(cmd)] += spent
            count[kind(cmd)] += 1
    return child.returncode, wall, total, by_kind, count


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=0.5, help="seconds between looks at /proc")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    code, wall, total, by_kind, count = profile(command, args.every)
    seen = sum(by_kind.values())
    print(f"\nwall {wall:.0f} s; machine CPU {total:.0f} s; seen in processes {seen:.0f} s", file=sys.stderr)
    print(f"{'CPU-s':>8} {'share':>6} {'procs':>6}  kind", file=sys.stderr)
    for name, cpu in by_kind.most_common():
        if cpu >= 0.5:
            print(f"{cpu:8.1f} {cpu / max(total, seen):6.1%} {count[name]:6d}  {name}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
