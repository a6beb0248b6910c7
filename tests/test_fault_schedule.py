"""A seeded schedule of faults over a sweep run by three ``join`` drivers on four hosts
(tests/hosts.py: network namespaces, each host's database link through a proxy), on a
PostgreSQL server of the test's own (tests/pg_server.py: the schedule restarts it):

- h0 runs a two-node Ray cluster's head and a driver on that cluster (``join --address``,
  two trials at a time); h1 is the cluster's second node (a raylet, no driver);
- h2 and h3 each run a driver with a local Ray (one trial at a time).

The faults, drawn by a seeded generator and due by the sweep's progress:

- ``cut``: a driver host's database link cut for a while (some shorter than the claim TTL,
  some longer: its trials are taken over and it stops with exit 130), then healed;
- ``delay``: a driver host's link slowed for a while: 200 ms a packet with 5% loss by
  ``tc netem`` where the kernel has it, else every chunk of its database link held 200 ms;
- ``kill``: a driver SIGKILLed (on h2 or h3 with everything the host runs, its local Ray
  included: the machine went down; on h0 the driver alone, the cluster stays up);
- ``worker``: a trial's Ray worker process SIGKILLed (Tune retries the trial);
- ``raylet``: the cluster's second node's raylet SIGKILLed (its trials are lost to Ray; the
  node is started again after a pause);
- ``partition``: the second node cut from the head (its link down) for a while;
- ``pgrestart``: the PostgreSQL server restarted (every driver's writer rides it out).

A driver that ends while the sweep is unfinished is started again on its host (as a lab's
supervisor, or a requeued SLURM task, would), and so is the second node's raylet. At the end:
every trial completed once in effect; the final evals equal an uninterrupted run's; no trial
holds rows written twice or by two hosts; no claim, open attempt or ``running`` trial is left;
and no write for a trial came from a driver that no longer held it (an audit trigger names
the writer of every row by its connection). The test prints a summary: faults by kind,
takeovers, fault-to-running-again times, rows lost or twice.

Scale: ``ORCH_FAULT_SEED`` (default 20), ``ORCH_FAULT_COUNT`` faults (default 10: each kind at
least once) over ``ORCH_FAULT_TRIALS`` trials (default 12). The issue's count of faults
and trials is ``ORCH_FAULT_COUNT=20 ORCH_FAULT_TRIALS=24``; another seed is
``ORCH_FAULT_SEED=7``:

    ORCH_TEST_POSTGRES_URL=postgresql://127.0.0.1:5432/test ORCH_FAULT_SEED=7 \\
      ORCH_FAULT_COUNT=20 ORCH_FAULT_TRIALS=24 .venv/bin/pytest -s tests/test_fault_schedule.py
"""

from __future__ import annotations

import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import pytest

import pg_server
from conftest import OWN_RAY, TINY_FIXED, query, record_sweep, sweep_evals
from hosts import Host, Hosts, hosts, kill_group, leftovers, why_unavailable
from test_cluster import RAY
from test_join import _driver
from test_multihost import ORCH, TTL, _install_audit

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(pg_server.why_unavailable()), reason=f"{pg_server.why_unavailable()}"),
]

SEED = int(os.environ.get("ORCH_FAULT_SEED", "20"))
N_FAULTS = int(os.environ.get("ORCH_FAULT_COUNT", "10"))
N_TRIALS = int(os.environ.get("ORCH_FAULT_TRIALS", "12"))
# Trials long enough (360 steps, 13 eval rows at 10 faults) that a fault waiting for its target
# (a node restarting takes seconds) still finds the sweep running. More faults mean more time
# lost to them and a longer queue behind busy targets, so the trials grow with the count: at 20
# faults on a loaded machine, 360-step trials let the sweep end before the last one struck.
EVAL_EVERY = 30
STEPS = EVAL_EVERY * max(12, math.ceil(1.2 * N_FAULTS))
EVALS_A_TRIAL = STEPS // EVAL_EVERY + 1
STEP_MS = 12  # 4.3 s a 360-step trial, as the old spinning cells took on a loaded machine
DELAY_S = 0.2
HEAD, NODE = 0, 1  # the Ray cluster's hosts; h0 also runs a driver on it
DRIVER_HOSTS = (0, 2, 3)
# Which hosts each kind of fault may hit ("db": the PostgreSQL server).
TARGETS: dict[str, tuple] = {
    "cut": DRIVER_HOSTS,
    "delay": DRIVER_HOSTS,
    "kill": DRIVER_HOSTS,
    "worker": (0, 1, 2, 3),
    "raylet": (NODE,),
    "partition": (NODE,),
    "pgrestart": ("db",),
}
KINDS = tuple(TARGETS)


def _spec(name: str) -> str:
    # The bench_sleep cell, its steps slept (STEP_MS each): a trial lasts the same on a loaded
    # machine as on an idle one, and waits rather than spins cores the suite shares.
    return (
        f"\nname: {name}\nplugins: [orchestrator.bench.fixed_duration]\n" + TINY_FIXED + "  checkpoint_every_s: 0\n"
        f"  arm: bench_sleep\n  model.step_ms: {STEP_MS}\n"
        f"axes:\n  seed: 0..{N_TRIALS - 1}\n"
        f"budget: {{steps: {STEPS}, eval_every: {EVAL_EVERY}}}\n"
        "resources: {cpu: 1}\nmax_concurrent: 1\nretries: 8\n"
    )


@dataclass
class Fault:
    at: float  # the share of the sweep's eval rows stored when it is due (0..1)
    kind: str
    host: int | str  # a host's index, or "db"
    length: float  # how long a cut, delay or partition lasts; a kill's or raylet's pause before the restart


# Faults are due by the sweep's progress, not by the clock: on a fast machine a clock schedule
# outlived the sweep (CI: 6 of 10 injected before the last trial ended). Spread over the first
# LAST_DUE of the rows, so the last one is due while two fifths of the work are left: a fault
# that waits for its target (a node restarting, a host busy with another fault) still strikes.
FIRST_DUE, LAST_DUE = 0.04, 0.6
MIN_GAP_S = 0.5  # between two injections, whatever progress says


def schedule(rng: random.Random, n: int) -> list[Fault]:
    """``n`` faults due at evenly spread (jittered) shares of the sweep's progress, kinds and
    hosts drawn by ``rng`` (the first of each kind in turn, so every kind comes once n >= 7); a
    cut lasts either under the TTL or well past it."""
    out = []
    step = (LAST_DUE - FIRST_DUE) / max(1, n - 1)
    for i in range(n):
        kind = KINDS[i % len(KINDS)] if i < len(KINDS) else rng.choice(KINDS)
        length = {
            "cut": rng.choice([TTL * 0.4, TTL * 2.0]),
            "delay": rng.uniform(2.0, 5.0),
            "kill": rng.uniform(0.5, 3.0),
            "worker": 0.0,
            "raylet": rng.uniform(0.5, 3.0),
            "partition": rng.uniform(2.0, 6.0),
            "pgrestart": 0.0,
        }[kind]
        due = FIRST_DUE + step * (i + rng.uniform(-0.3, 0.3) if 0 < i < n - 1 else i)
        out.append(Fault(round(due, 3), kind, rng.choice(TARGETS[kind]), round(length, 1)))
    return out


def _pids_running(host: Host, needle: str) -> list[int]:
    """Pids in ``host`` whose command line holds ``needle`` (lowest first)."""
    found = []
    for pid in sorted(host.pids()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if needle in fh.read().decode(errors="replace"):
                    found.append(pid)
        except OSError:
            continue
    return found


class Fleet:
    """The hosts' long-running processes: a join driver on each driver host, the Ray head and
    second node; each started again when it ends while the sweep is unfinished (a node or a
    killed host after its fault's pause)."""

    def __init__(self, hs: Hosts, url: str, sweep: str):
        self.hosts, self.url, self.sweep = hs.hosts, url, sweep
        self.procs: dict[int, subprocess.Popen | None] = {}
        self.nodes: dict[int, subprocess.Popen | None] = {}
        self.runs = 0
        self.node_starts = 0
        self.exits: Counter[int] = Counter()
        self.app_pid: dict[str, int] = {}  # a driver run's application_name -> its pid
        self.down_until: dict[int, float] = {}
        token = hs[HEAD].share / f"ray-token-{uuid.uuid4().hex[:6]}"  # what every host sees
        token.write_text(uuid.uuid4().hex)
        self.auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        self.head = f"{hs[HEAD].ip}:6379"

    # -- the Ray cluster --
    def start_node(self, i: int) -> None:
        host = self.hosts[i]
        host.kill_all()  # what the last node of this host left (workers of a killed raylet)
        self.node_starts += 1
        argv = [*RAY, "start", "--block", "--num-cpus=1", "--disable-usage-stats", f"--node-ip-address={host.ip}"]
        if i == HEAD:
            argv += ["--head", "--port=6379", "--include-dashboard=false"]
        else:
            argv += [f"--address={self.head}"]
        self.nodes[i] = host.popen(argv, env=self.auth, log=host.root / f"node{self.node_starts}.log")

    def cluster_up(self, timeout: float = 180) -> None:
        count = (
            "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False, logging_level='ERROR'); "
            "print(sum(x['Alive'] for x in ray.nodes()))"
        )
        deadline = time.monotonic() + timeout
        while True:
            r = self.hosts[HEAD].run([sys.executable, "-c", count, self.head], env=self.auth)
            if r.stdout.strip().endswith("2"):
                return
            assert time.monotonic() < deadline, f"the two-node Ray cluster did not come up: {r.stderr[-2000:]}"
            time.sleep(1)

    # -- the drivers --
    def start(self, i: int) -> None:
        self.runs += 1
        app = f"h{i}-{self.runs}"
        host = self.hosts[i]
        env = {"ORCH_LEASE_TTL_S": str(TTL), "ORCH_DB_OUTAGE_S": "120"}
        argv = [*ORCH, "join", self.sweep, "--db", host.db_url(self.url, app), "--quiet"]
        if i == HEAD:  # on the two-node cluster, a trial on each node
            env.update(self.auth)
            argv += ["--address", self.head, "--max-concurrent", "2"]
        else:
            env.update(OWN_RAY)
            argv += ["--max-concurrent", "1"]
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
        if i != HEAD:
            self.hosts[i].kill_all()  # its Ray's daemons too: the whole machine went down
        self.down_until[i] = time.monotonic() + pause

    def kill_raylet(self, i: int, pause: float) -> None:
        for pid in _pids_running(self.hosts[i], "raylet/raylet"):
            os.kill(pid, signal.SIGKILL)
        self.down_until[i] = time.monotonic() + pause

    def tend(self, unfinished: bool) -> None:
        now = time.monotonic()
        for i, p in list(self.nodes.items()):
            if p is not None and p.poll() is not None:
                self.nodes[i] = None
            if self.nodes[i] is None and unfinished and now >= self.down_until.get(i, 0):
                self.start_node(i)
        for i in DRIVER_HOSTS:
            p = self.procs.get(i)
            if p is not None and p.poll() is not None:
                self.exits[p.returncode] += 1
                self.procs[i] = None
                p = None
            if p is None and unfinished and now >= self.down_until.get(i, 0):
                self.start(i)

    def alive(self) -> list[subprocess.Popen]:
        return [p for p in self.procs.values() if p is not None and p.poll() is None]


def _progress(url: str) -> float:
    """The share of the sweep's eval rows stored."""
    return query(url, "SELECT COUNT(*) FROM evals")[0][0] / (EVALS_A_TRIAL * N_TRIALS)


def _unfinished(url: str) -> int:
    return query(url, "SELECT COUNT(*) FROM trials WHERE status <> 'completed'")[0][0]


def _link(host: Host, up: bool) -> None:
    """The host's link to the bridge up or down (its veth's root side)."""
    subprocess.run(["ip", "link", "set", host.veth, "up" if up else "down"], check=True)


class Injector:
    """Injects the schedule's faults, one at a time a target, and heals what lasts."""

    def __init__(self, hs: Hosts, fleet: Fleet, pg: pg_server.PrivateServer):
        self.hs, self.fleet, self.pg = hs, fleet, pg
        self.heal_at: dict[int | str, tuple[float, str]] = {}
        self.busy_until: dict[int | str, float] = {}
        self.netem = False
        self.workers_killed = 0  # Ray trial-actor processes a worker or raylet kill took down

    def candidates(self, f: Fault, now: float) -> list[int | str]:
        """The targets ``f`` may hit now: its own first, then the others of its kind (in a
        fixed order) that are not busy with a fault (and, for a worker or raylet kill, run
        one: a raylet is killed whether or not a trial runs on its node, a worker mid-trial)."""
        own = TARGETS[f.kind]
        order = [f.host] + [t for t in own if t != f.host]
        free = [t for t in order if now >= self.busy_until.get(t, 0) and t not in self.heal_at]
        alive = {"worker": "ImplicitFunc", "raylet": "raylet/raylet"}.get(f.kind)
        if alive:  # a trial's worker (or the node's raylet) to kill there now
            free = [t for t in free if _pids_running(self.hs[t], alive)]
        return free

    def inject(self, f: Fault, now: float) -> None:
        h = f.host
        self.busy_until[h] = now + max(f.length, 1.0)
        if f.kind == "cut":
            self.hs[h].proxy.cut()
            self.heal_at[h] = (now + f.length, "cut")
        elif f.kind == "delay":
            self.netem = self.hs[h].netem(int(DELAY_S * 1000), 5.0)
            if not self.netem:
                self.hs[h].proxy.delay_s = DELAY_S
            self.heal_at[h] = (now + f.length, "delay")
        elif f.kind == "kill":
            self.fleet.kill(h, f.length)
        elif f.kind == "worker":
            pids = _pids_running(self.hs[h], "ImplicitFunc")[:1]
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            self.workers_killed += len(pids)
        elif f.kind == "raylet":
            self.workers_killed += len(_pids_running(self.hs[h], "ImplicitFunc"))
            self.fleet.kill_raylet(h, f.length)
        elif f.kind == "partition":
            _link(self.hs[h], False)
            self.heal_at[h] = (now + f.length, "partition")
        else:
            self.pg.restart()

    def heal(self, h: int | str, kind: str) -> None:
        host = self.hs[h]
        if kind == "cut":
            host.proxy.heal()
        elif kind == "delay":
            subprocess.run(["tc", "qdisc", "del", "dev", host.veth, "root"], capture_output=True)
            host.proxy.delay_s = 0.0
        else:
            _link(host, True)
        del self.heal_at[h]

    def heal_due(self, now: float, everything: bool = False) -> None:
        for h, (when, kind) in list(self.heal_at.items()):
            if everything or now >= when:
                self.heal(h, kind)


def _apps_hit(f: Fault, fleet: Fleet) -> set[str]:
    """The driver runs whose trials a fault hit: the host's own; the cluster's driver for its
    second node; every driver for the database."""
    if f.host == "db":
        return set(fleet.app_pid)
    host = HEAD if f.host == NODE else f.host
    return {a for a in fleet.app_pid if a.startswith(f"h{host}-")}


def test_a_seeded_fault_schedule_over_three_drivers_and_a_two_node_ray_cluster(tmp_path):
    why = why_unavailable()
    if why:
        pytest.skip(why)
    assert N_TRIALS >= 2, f"ORCH_FAULT_TRIALS={N_TRIALS}: the schedule needs at least two trials"
    rng = random.Random(SEED)
    faults = schedule(rng, N_FAULTS)
    print(f"\nfault schedule (seed {SEED}): " + ", ".join(f"{f.at:.0%} {f.kind} h{f.host} {f.length}s" for f in faults))

    # The uninterrupted run to compare with: one driver of its own, on a SQLite file.
    ref = f"sqlite:///{tmp_path / 'ref.db'}"
    record_sweep(ref, _spec("schedule"))
    alone = _driver(["join", "schedule", "--max-concurrent", "2"], ref, tmp_path / "alone")
    with pg_server.PrivateServer() as pg:
        url = pg.url
        record_sweep(url, _spec("schedule"))
        _install_audit(url)
        _, err = alone.communicate(timeout=600)
        assert alone.returncode == 0, err[-3000:]

        injected: list[tuple[Fault, object]] = []  # each fault with its database time
        with hosts(4, tmp_path / "hosts", db=("127.0.0.1", pg.port)) as hs:
            fleet = Fleet(hs, url, "schedule")
            fleet.start_node(HEAD)
            fleet.start_node(NODE)
            fleet.cluster_up()
            for i in DRIVER_HOSTS:
                fleet.start(i)
            inj = Injector(hs, fleet, pg)
            deadline = time.monotonic() + 240
            while not query(url, "SELECT COUNT(*) FROM evals")[0][0]:
                assert time.monotonic() < deadline, "no eval row within 4 minutes"
                fleet.tend(True)
                time.sleep(0.2)
            t0 = time.monotonic()
            last_at = -MIN_GAP_S
            pending = list(faults)
            deadline = t0 + 900
            while True:
                now = time.monotonic() - t0
                unfinished = _unfinished(url)
                inj.heal_due(now)
                done = _progress(url)
                # The first due fault that can strike now. One fault at a time a target: a busy
                # one's fault goes to the next free target of its kind, or waits (while every
                # one is busy, or no trial runs where a worker or raylet kill must strike)
                # without holding up the faults due after it.
                due = [f for f in pending if done >= f.at] if unfinished and now - last_at >= MIN_GAP_S else []
                for f in due:
                    free = inj.candidates(f, now)
                    if free:
                        pending.remove(f)
                        f = Fault(f.at, f.kind, free[0], f.length)
                        injected.append((f, query(url, "SELECT clock_timestamp()")[0][0]))
                        last_at = now
                        inj.inject(f, now)
                        break
                if not unfinished and not inj.heal_at and not fleet.alive():
                    break
                if not unfinished and not pending:
                    inj.heal_due(now, everything=True)  # the sweep is done: wind down
                assert time.monotonic() < deadline, f"the sweep did not finish ({unfinished} trials left)"
                fleet.tend(unfinished > 0)
                time.sleep(0.2)
            fleet.tend(False)  # the last exits counted
            hid = hs.hid
        assert leftovers(hid) == []
        _check(url, ref, faults, injected, fleet, inj)


def _check(url: str, ref: str, faults: list[Fault], injected: list, fleet: Fleet, inj: Injector) -> None:
    # Every trial completed once in effect, its evals those of the uninterrupted run; nothing
    # left claimed, running or open.
    done = query(url, "SELECT trial_id, COUNT(*) FROM attempts WHERE outcome = 'completed' GROUP BY trial_id")
    assert len(done) == N_TRIALS and all(n == 1 for _, n in done), done
    assert dict(query(url, "SELECT status, COUNT(*) FROM trials GROUP BY status")) == {"completed": N_TRIALS}
    assert query(url, "SELECT COUNT(*) FROM trials WHERE claimed_by IS NOT NULL")[0][0] == 0
    assert query(url, "SELECT COUNT(*) FROM attempts WHERE outcome IS NULL")[0][0] == 0
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
    # driver) of each trial the drivers it hit held then, or to that trial's end.
    recovery = []
    for f, at in injected:
        if f.kind == "delay":
            continue
        apps = _apps_hit(f, fleet)
        held = {
            r.trial_id
            for r in query(url, "SELECT trial_id, host, what FROM audit WHERE tbl = 'attempts' AND at <= :at", at=at)
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
    # Each attempt that did not complete, by what came next: the same driver run started the
    # trial again (Tune's retry of a lost worker), or another driver run took it over.
    nexts = query(
        url,
        "SELECT a.driver = b.driver FROM attempts a JOIN attempts b ON b.trial_id = a.trial_id "
        "AND b.attempt = a.attempt + 1",
    )
    retries = sum(1 for (same,) in nexts if same)
    takeovers = len(nexts) - retries
    ends = dict(query(url, "SELECT outcome, COUNT(*) FROM attempts GROUP BY outcome"))
    kinds = Counter(f.kind for f, _ in injected)
    print(
        f"faults injected: {len(injected)} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}) over "
        f"{N_TRIALS} trials, 3 driver hosts and a two-node Ray cluster (delay by "
        f"{'tc netem, 5% loss' if inj.netem else 'the proxy'}); trial-actor processes killed {inj.workers_killed}; driver runs {fleet.runs}, their exits "
        f"{dict(sorted(fleet.exits.items()))}; Ray node starts {fleet.node_starts}; attempts by end {ends}; "
        f"Tune retries {retries}, takeovers {takeovers}; fault to running again: "
        f"median {statistics.median(recovery) if recovery else 0:.1f} s, worst {max(recovery, default=0):.1f} s; "
        f"rows lost {lost_rows}, rows twice {twice[0][0]}, rows rewritten by a later attempt {rewritten}; "
        f"stale writes {len(stale)}; final evals equal: {equal}"
    )
    assert len(injected) == len(faults), "the sweep ended before every fault was injected"
    assert lost_rows == 0 and twice[0][0] == 0 and equal
    # Tune's retries and the attempt records agree: every attempt but a trial's completed one
    # was followed by another of the trial, its driver's Tune starting it again from its
    # checkpoint (a worker lost) or another driver taking it over. (Not asserted against the
    # workers killed: with reuse_actors a killed worker may have been an idle cached actor.)
    assert retries + takeovers == sum(ends.values()) - N_TRIALS, (ends, retries, takeovers)
    assert stale == [], stale[:10]
