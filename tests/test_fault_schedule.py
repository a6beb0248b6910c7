"""A seeded schedule of faults over a sweep run by three ``join`` drivers, each on a host of
its own (tests/hosts.py: network namespaces, a database link through a proxy), all on one
PostgreSQL schema:

- ``cut``: a host's database link cut for a while (some shorter than the claim TTL, some
  longer: its trials are taken over and it stops with exit 130), then healed;
- ``delay``: a host's database link slowed (every chunk held ``DELAY_S``) for a while;
- ``kill``: a host's driver SIGKILLed with everything it started (its local Ray included).

A driver that ends while the sweep is unfinished is started again on its host (as a lab's
supervisor, or a requeued SLURM task, would). At the end every trial completed once in effect,
the final evals equal an uninterrupted run's, and no write for a trial came from a driver that
no longer held it (an audit trigger names the writer of every row by its connection). The test
prints a summary: faults by kind, takeovers, fault-to-running-again times, rows lost or twice.

Scale: ``ORCH_FAULT_SEED`` (default 20), ``ORCH_FAULT_COUNT`` faults (default 10) over
``ORCH_FAULT_TRIALS`` trials (default 12; even). ``ORCH_FAULT_COUNT=20 ORCH_FAULT_TRIALS=24`` is
the issue's count of faults and trials; on a shared 2-core machine it takes about 5.5 minutes
(the default about 4), so the default is smaller. Every driver here has a local Ray: the
issue's two-node Ray cluster under the schedule is not part of it (a cluster across hosts is
tests/test_multihost.py's).
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from conftest import POSTGRES_URL, TINY_FIXED, make_pg_schema_url, query, record_sweep, sweep_evals
from hosts import Host, hosts, kill_group, leftovers, why_unavailable
from test_join import _driver
from test_multihost import ORCH, TTL, _install_audit

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not POSTGRES_URL, reason="needs ORCH_TEST_POSTGRES_URL")]

SEED = int(os.environ.get("ORCH_FAULT_SEED", "20"))
N_FAULTS = int(os.environ.get("ORCH_FAULT_COUNT", "10"))
N_TRIALS = int(os.environ.get("ORCH_FAULT_TRIALS", "12"))
DELAY_S = 0.2
KINDS = ("cut", "delay", "kill")


def _spec(name: str) -> str:
    return (
        f"\nname: {name}\n" + TINY_FIXED + "  checkpoint_every_s: 0\n"
        f"axes:\n  arm: [gated_deltanet, armed_gdn]\n  seed: 0..{N_TRIALS // 2 - 1}\n"
        "budget: {steps: 240, eval_every: 20}\nresources: {cpu: 1}\nmax_concurrent: 1\nretries: 8\n"
    )


@dataclass
class Fault:
    at: float  # the share of the sweep's eval rows stored when it is due (0..1)
    kind: str
    host: int
    length: float  # how long a cut or delay lasts (a kill: the pause before the restart)


# Faults are due by the sweep's progress, not by the clock: on a fast machine a clock schedule
# outlived the sweep (CI: 6 of 10 injected before the last trial ended). Spread over the first
# LAST_DUE of the rows, so the last one is due while a fifth of the work or more is left.
FIRST_DUE, LAST_DUE = 0.04, 0.75
MIN_GAP_S = 0.5  # between two injections, whatever progress says


def schedule(rng: random.Random, n: int, hosts_n: int) -> list[Fault]:
    """``n`` faults due at evenly spread (jittered) shares of the sweep's progress, kinds and
    hosts drawn by ``rng``; a cut lasts either under the TTL or well past it."""
    out = []
    step = (LAST_DUE - FIRST_DUE) / max(1, n - 1)
    for i in range(n):
        kind = KINDS[i % len(KINDS)] if i < len(KINDS) else rng.choice(KINDS)
        length = {
            "cut": rng.choice([TTL * 0.4, TTL * 2.0]),
            "delay": rng.uniform(2.0, 5.0),
            "kill": rng.uniform(0.5, 3.0),
        }[kind]
        due = FIRST_DUE + step * (i + rng.uniform(-0.3, 0.3) if 0 < i < n - 1 else i)
        out.append(Fault(round(due, 3), kind, rng.randrange(hosts_n), round(length, 1)))
    return out


class Fleet:
    """One join driver per host, started again when it ends while the sweep is unfinished."""

    def __init__(self, hs: list[Host], url: str, sweep: str):
        self.hosts, self.url, self.sweep = hs, url, sweep
        self.procs: dict[int, subprocess.Popen | None] = {}
        self.runs = 0
        self.exits: Counter[int] = Counter()
        self.app_pid: dict[str, int] = {}  # a driver run's application_name -> its pid
        self.down_until: dict[int, float] = {}

    def start(self, i: int) -> None:
        self.runs += 1
        app = f"h{i}-{self.runs}"
        host = self.hosts[i]
        env = {"ORCH_LEASE_TTL_S": str(TTL), "RAY_ADDRESS": "local", "ORCH_DB_OUTAGE_S": "120"}
        argv = [*ORCH, "join", self.sweep, "--db", host.db_url(self.url, app), "--quiet", "--max-concurrent", "1"]
        # The tree may be committed to while the test runs (a shared checkout): a restarted
        # driver would find another code version and refuse, which is not what is tested here.
        argv.append("--allow-code-change")
        p = host.popen(argv, env=env, log=host.root / f"{app}.log")
        self.procs[i] = p
        self.app_pid[app] = p.pid

    def kill(self, i: int, pause: float) -> None:
        p = self.procs.get(i)
        if p is not None and p.poll() is None:
            kill_group(p, signal.SIGKILL)
        self.hosts[i].kill_all()  # its Ray's daemons too: the whole machine went down
        self.down_until[i] = time.monotonic() + pause

    def tend(self, unfinished: bool) -> None:
        for i in range(len(self.hosts)):
            p = self.procs.get(i)
            if p is not None and p.poll() is not None:
                self.exits[p.returncode] += 1
                self.procs[i] = None
                p = None
            if p is None and unfinished and time.monotonic() >= self.down_until.get(i, 0):
                self.start(i)

    def alive(self) -> list[subprocess.Popen]:
        return [p for p in self.procs.values() if p is not None and p.poll() is None]


def _progress(url: str) -> float:
    """The share of the sweep's eval rows stored (each trial stores 13)."""
    return query(url, "SELECT COUNT(*) FROM evals")[0][0] / (13 * N_TRIALS)


def _unfinished(url: str) -> int:
    return query(url, "SELECT COUNT(*) FROM trials WHERE status <> 'completed'")[0][0]


def test_a_seeded_fault_schedule_over_three_driver_hosts(tmp_path):
    why = why_unavailable()
    if why:
        pytest.skip(why)
    assert N_TRIALS % 2 == 0 and N_TRIALS >= 2
    rng = random.Random(SEED)
    faults = schedule(rng, N_FAULTS, 3)
    print(f"\nfault schedule (seed {SEED}): " + ", ".join(f"{f.at:.0%} {f.kind} h{f.host} {f.length}s" for f in faults))

    # The uninterrupted run to compare with: one driver of its own, on a SQLite file.
    ref = f"sqlite:///{tmp_path / 'ref.db'}"
    record_sweep(ref, _spec("schedule"))
    alone = _driver(["join", "schedule"], ref, tmp_path / "alone")
    url, drop = make_pg_schema_url(reader=False)
    try:
        record_sweep(url, _spec("schedule"))
        _install_audit(url)
        _, err = alone.communicate(timeout=600)
        assert alone.returncode == 0, err[-3000:]

        injected: list[tuple[Fault, object]] = []  # each fault with its database time
        with hosts(3, tmp_path / "hosts") as hs:
            fleet = Fleet(hs.hosts, url, "schedule")
            for i in range(3):
                fleet.start(i)
            deadline = time.monotonic() + 240
            while not query(url, "SELECT COUNT(*) FROM evals")[0][0]:
                assert time.monotonic() < deadline, "no eval row within 4 minutes"
                fleet.tend(True)
                time.sleep(0.2)
            t0 = time.monotonic()
            heal_at: dict[int, tuple[float, str]] = {}
            busy_until: dict[int, float] = {}  # a host's fault lasts until then
            last_at = -MIN_GAP_S
            pending = list(faults)
            deadline = t0 + 600
            while True:
                now = time.monotonic() - t0
                unfinished = _unfinished(url)
                for i, (when, kind) in list(heal_at.items()):
                    if now >= when:
                        if kind == "cut":
                            hs[i].proxy.heal()
                        else:
                            hs[i].proxy.delay_s = 0.0
                        del heal_at[i]
                done = _progress(url)
                if pending and done >= pending[0].at and unfinished and now - last_at >= MIN_GAP_S:
                    f = pending[0]
                    # One fault at a time a host: a busy one's fault goes to the next free host
                    # (in a fixed order), or waits while every host is busy.
                    free = [
                        h for h in ((f.host + k) % 3 for k in range(3)) if h not in busy_until or now >= busy_until[h]
                    ]
                    if free:
                        pending.pop(0)
                        f = Fault(f.at, f.kind, free[0], f.length)
                        injected.append((f, query(url, "SELECT clock_timestamp()")[0][0]))
                        last_at = now
                        busy_until[f.host] = now + f.length
                        if f.kind == "cut":
                            hs[f.host].proxy.cut()
                            heal_at[f.host] = (now + f.length, "cut")
                        elif f.kind == "delay":
                            hs[f.host].proxy.delay_s = DELAY_S
                            heal_at[f.host] = (now + f.length, "delay")
                        else:
                            fleet.kill(f.host, f.length)
                if not unfinished and not heal_at and not fleet.alive():
                    break
                if not unfinished and not pending:
                    for i in list(heal_at):  # the sweep is done: heal what is left and wind down
                        hs[i].proxy.heal()
                        hs[i].proxy.delay_s = 0.0
                        del heal_at[i]
                assert time.monotonic() < deadline, f"the sweep did not finish ({unfinished} trials left)"
                fleet.tend(unfinished > 0)
                time.sleep(0.2)
            fleet.tend(False)  # the last exits counted
            hid = hs.hid
        assert leftovers(hid) == []

        # Every trial completed once in effect, its evals those of the uninterrupted run.
        done = query(url, "SELECT trial_id, COUNT(*) FROM attempts WHERE outcome = 'completed' GROUP BY trial_id")
        assert len(done) == N_TRIALS and all(n == 1 for _, n in done), done
        assert dict(query(url, "SELECT status, COUNT(*) FROM trials GROUP BY status")) == {"completed": N_TRIALS}
        got, want = sweep_evals(url), sweep_evals(ref)
        lost_rows = len({r[:2] for r in want} - {r[:2] for r in got})
        twice = query(url, "SELECT COUNT(*) FROM (SELECT 1 FROM evals GROUP BY trial_id, step HAVING COUNT(*) > 1) x")
        rewritten = query(
            url,
            "SELECT COUNT(*) FROM (SELECT 1 FROM audit WHERE tbl = 'evals' GROUP BY trial_id, step "
            "HAVING COUNT(DISTINCT host) > 1) x",
        )[0][0]
        equal = got == want

        # No row, checkpoint or attempt written for a trial by a driver run that did not hold
        # it then: replay each trial's audit, the claim moves among the rest.
        owner_of = {r.pid: r.owner for r in query(url, "SELECT pid, owner FROM drivers")}
        app_owner = {app: owner_of.get(pid) for app, pid in fleet.app_pid.items()}
        stale, holder = [], {}
        for r in query(url, "SELECT at, host, tbl, trial_id, step, what FROM audit ORDER BY at"):
            if r.tbl == "trials" and r.what and "claim=" in r.what:
                holder[r.trial_id] = r.what.split("claim=")[1].split()[0]
                continue
            if r.tbl in ("evals", "trial_checkpoints") or (r.tbl == "attempts" and r.what == "open"):
                if holder.get(r.trial_id) != app_owner.get(r.host):
                    stale.append(tuple(r))

        # Fault to running again: from a fault to the first eval row stored after it (by any
        # driver) of each trial the faulted host held then, or to that trial's end.
        recovery = []
        for f, at in injected:
            if f.kind == "delay":
                continue
            apps = {a for a in fleet.app_pid if a.startswith(f"h{f.host}-")}
            held = {
                r.trial_id
                for r in query(
                    url, "SELECT trial_id, host, what FROM audit WHERE tbl = 'attempts' AND at <= :at", at=at
                )
                if r.host in apps
            }
            worst = 0.0
            for tid in held:
                nxt = query(
                    url,
                    "SELECT MIN(at) FROM audit WHERE trial_id = :t AND at > :at AND (tbl = 'evals' OR what LIKE "
                    "'%status=completed%')",
                    t=tid,
                    at=at,
                )[0][0]
                ended_before = query(
                    url, "SELECT COUNT(*) FROM audit WHERE trial_id = :t AND at <= :at AND what LIKE '%status=completed%'",
                    t=tid, at=at,
                )[0][0]  # fmt: skip
                if nxt is not None and not ended_before:
                    worst = max(worst, (nxt - at).total_seconds())
            recovery.append(worst)
        takeovers = query(url, "SELECT COUNT(*) FROM attempts WHERE outcome = 'lost'")[0][0]
        kinds = Counter(f.kind for f, _ in injected)
        print(
            f"faults injected: {len(injected)} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}) over "
            f"{N_TRIALS} trials, 3 driver hosts; driver runs {fleet.runs}, their exits "
            f"{dict(sorted(fleet.exits.items()))}; takeovers (lost attempts) {takeovers}; fault to running again: "
            f"median {statistics.median(recovery) if recovery else 0:.1f} s, worst {max(recovery, default=0):.1f} s; "
            f"rows lost {lost_rows}, rows twice {twice[0][0]}, rows rewritten by a later attempt {rewritten}; "
            f"stale writes {len(stale)}; final evals equal: {equal}"
        )
        assert len(injected) == N_FAULTS, "the sweep ended before every fault was injected"
        assert lost_rows == 0 and twice[0][0] == 0 and equal
        assert stale == [], stale[:10]
    finally:
        drop()
