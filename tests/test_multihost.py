"""Drivers on separate "hosts" (network namespaces, tests/hosts.py) that share one PostgreSQL
schema through a link the test can cut:

- the harness itself: hosts reach each other across the bridge and the database through
  their proxies, each has a private /tmp and hostname, a cut link fails at once and a healed
  one works again, and nothing of the harness (namespace, veth, bridge) is left afterwards;
- a partition: host A's database link is cut for longer than the claim TTL while host B takes
  A's trials over; then the link heals. A writes nothing more for a trial it lost (no eval
  row, no checkpoint, no heartbeat, no mark: an audit trigger names the host of every write by
  its connection's ``application_name``), says in one line why it stopped, and exits 130 (as
  docs/how-to/clusters.md documents); every trial completes once in effect and the final
  evals equal an uninterrupted run's.

Needs root and ``ip netns`` (skips otherwise) and ORCH_TEST_POSTGRES_URL.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from conftest import OWN_RAY, POSTGRES_URL, make_pg_schema_url, query, record_sweep, sweep_evals, two_arm_spec
from test_cluster import RAY
from test_cluster import SPEC as CLUSTER_SPEC
from hosts import Hosts, Unavailable, hosts, leftovers, why_unavailable
from test_join import _owners

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not POSTGRES_URL, reason="needs ORCH_TEST_POSTGRES_URL")]

ORCH = [sys.executable, "-m", "orchestrator.cli"]
TTL = 6


@pytest.fixture
def three_hosts(tmp_path):
    why = why_unavailable()
    if why:
        pytest.skip(why)
    try:
        with hosts(3, tmp_path / "hosts") as hs:
            yield hs
    except Unavailable as exc:
        pytest.skip(str(exc))
    assert leftovers(hs.hid) == []


PY_CONNECT = (
    "import socket, sys; s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); "
    "s.sendall(b'ping'); print(s.recv(16).decode())"
)

PY_OPEN = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()"


def test_hosts_are_separate_machines_on_one_network(three_hosts: Hosts):
    h0, h1, h2 = three_hosts.hosts
    # h1 serves, h0 connects across the bridge.
    srv = h1.popen(
        [
            sys.executable, "-c",
            "import socket; s = socket.create_server(('0.0.0.0', 7077)); c, a = s.accept(); "
            "c.recv(16); c.sendall(a[0].encode())",
        ]
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while True:
        r = h0.run([sys.executable, "-c", PY_CONNECT, h1.ip, "7077"])
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == h0.ip  # the server saw h0's own address
    srv.wait(timeout=10)

    # A private /tmp and hostname each; the root namespace's /tmp is not theirs.
    mark = f"orch-mark-{three_hosts.hid}"
    w = h0.run(["sh", "-c", f"echo x > /tmp/{mark} && ls /tmp && hostname"])
    # Only the shared test folder shows through (at its own path, when under /tmp).
    shared = [p.name for p in h0.share.parents if p.parent == Path("/tmp")]
    assert w.returncode == 0 and w.stdout.split() == sorted([mark, *shared]) + ["h0"], (w.stdout, w.stderr)
    assert h2.run(["sh", "-c", "ls /tmp; hostname"]).stdout.split() == [*shared, "h2"]
    assert not Path(f"/tmp/{mark}").exists()
    # The root namespace's PostgreSQL is not reachable directly, only through the proxy.
    assert h2.run([sys.executable, "-c", PY_CONNECT, "127.0.0.1", "5432"]).returncode != 0

    url, drop = make_pg_schema_url(reader=False)
    try:
        probe = [
            sys.executable, "-c",
            "import sys, sqlalchemy as sa; e = sa.create_engine(sys.argv[1]); c = e.connect(); "
            "print(c.execute(sa.text(\"SELECT current_setting('application_name')\")).scalar()); "
            "import time; time.sleep(float(sys.argv[2])); c.execute(sa.text('SELECT 1'))",
        ]  # fmt: skip
        ok = h2.run([*probe, h2.db_url(url), "0"])
        assert ok.returncode == 0 and ok.stdout.strip() == "h2", ok.stderr
        # A connection open across the cut dies; new ones are refused until the heal.
        held = h2.popen([*probe, h2.db_url(url), "3"])
        _wait(lambda: h2.proxy.accepted >= 2)
        h2.proxy.cut()
        assert held.wait(timeout=30) != 0
        t0 = time.monotonic()
        refused = h2.run([*probe, h2.db_url(url), "0"])
        assert refused.returncode != 0 and "OperationalError" in refused.stderr
        assert time.monotonic() - t0 < 20  # fails fast, not after a TCP timeout
        h2.proxy.heal()
        assert h2.run([*probe, h2.db_url(url), "0"]).returncode == 0
        # One host's cut is not another's.
        h2.proxy.cut()
        assert h1.run([*probe, h1.db_url(url), "0"]).returncode == 0
        # A slow link: netem where the kernel has it, else the proxy's delay.
        timed = [
            sys.executable, "-c",
            "import sys, time, sqlalchemy as sa; e = sa.create_engine(sys.argv[1]); t = time.monotonic(); "
            "c = e.connect(); c.execute(sa.text('SELECT 1')); print(time.monotonic() - t)",
            h1.db_url(url),
        ]  # fmt: skip
        fast = float(h1.run(timed).stdout)
        if not h1.netem(200, 0.0):
            h1.proxy.delay_s = 0.2
        slow = float(h1.run(timed).stdout)
        assert slow > fast + 0.4, (fast, slow)  # a connection's start crosses the link several times
    finally:
        drop()


def _wait(ready, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.1)


def test_a_ray_cluster_spans_hosts_and_a_sweep_runs_on_both(three_hosts: Hosts):
    """A token-auth Ray head in h0, a worker in h1 (each its own raylet, addresses on the
    bridge), the driver on the head's host with its database through h0's proxy: the trials
    ran on both hosts (their attempts name h0 and h1, the hostnames of their namespaces)."""
    h0, h1, _ = three_hosts.hosts
    token = h0.share / "token"  # what every host sees, as a shared home would be
    token.write_text(uuid.uuid4().hex)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    head = f"{h0.ip}:6379"
    node = [*RAY, "start", "--block", "--num-cpus=1", "--disable-usage-stats"]
    h0.popen([*node, "--head", "--port=6379", f"--node-ip-address={h0.ip}", "--include-dashboard=false"], env=auth)
    # The head's GCS port open from the worker's host, across the bridge.
    _wait(lambda: h1.run([sys.executable, "-c", PY_OPEN, h0.ip, "6379"]).returncode == 0)
    h1.popen([*node, f"--address={head}", f"--node-ip-address={h1.ip}"], env=auth)
    count = (
        "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False, logging_level='ERROR'); "
        "print(sum(x['Alive'] for x in ray.nodes()))"
    )
    _wait(lambda: h0.run([sys.executable, "-c", count, head], env=auth).stdout.strip().endswith("2"), timeout=180)
    url, drop = make_pg_schema_url(reader=False)
    try:
        spec = h0.share / "two_nodes.yaml"
        spec.write_text(CLUSTER_SPEC)
        r = h0.run(
            [*ORCH, "submit", str(spec), "--address", head, "--db", h0.db_url(url), "--quiet"], env=auth, timeout=400
        )
        assert r.returncode == 0, r.stderr[-3000:]
        rows = query(url, "SELECT t.status, a.host FROM trials t JOIN attempts a ON a.trial_id = t.id")
        assert [s for s, _ in rows] == ["completed"] * 4
        assert {h for _, h in rows} == {"h0", "h1"}, rows
    finally:
        drop()


# ---- a partition ---------------------------------------------------------------------------------

# Every write to the rows a driver keeps for a trial, with the host that made it (its
# connection's application_name) and the database clock when it happened.
AUDIT = """
CREATE TABLE audit (at timestamptz NOT NULL DEFAULT clock_timestamp(), tbl text NOT NULL,
    trial_id integer, step integer, what text, host text DEFAULT current_setting('application_name'));
CREATE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'trials' THEN
        INSERT INTO audit (tbl, trial_id, what) VALUES ('trials', NEW.id, concat_ws(' ',
            CASE WHEN NEW.heartbeat_at IS DISTINCT FROM OLD.heartbeat_at THEN 'heartbeat' END,
            CASE WHEN NEW.status IS DISTINCT FROM OLD.status THEN 'status=' || NEW.status END,
            CASE WHEN NEW.claimed_by IS DISTINCT FROM OLD.claimed_by
                 THEN 'claim=' || coalesce(NEW.claimed_by, '-') END));
    ELSIF TG_TABLE_NAME = 'attempts' THEN
        INSERT INTO audit (tbl, trial_id, step, what) VALUES ('attempts', NEW.trial_id, NEW.attempt,
            coalesce(NEW.outcome, 'open'));
    ELSE
        INSERT INTO audit (tbl, trial_id, step) VALUES (TG_TABLE_NAME, NEW.trial_id, NEW.step);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER audit_evals AFTER INSERT OR UPDATE ON evals FOR EACH ROW EXECUTE FUNCTION audit_row();
CREATE TRIGGER audit_ck AFTER INSERT OR UPDATE ON trial_checkpoints FOR EACH ROW EXECUTE FUNCTION audit_row();
CREATE TRIGGER audit_attempts AFTER INSERT OR UPDATE ON attempts FOR EACH ROW EXECUTE FUNCTION audit_row();
CREATE TRIGGER audit_trials AFTER UPDATE ON trials FOR EACH ROW EXECUTE FUNCTION audit_row();
"""


def _install_audit(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(AUDIT)
    engine.dispose()


def _join(host, url: str, sweep: str, *extra: str) -> subprocess.Popen:
    env = {"ORCH_LEASE_TTL_S": str(TTL), **OWN_RAY}
    return host.popen([*ORCH, "join", sweep, "--db", host.db_url(url), "--quiet", *extra], env=env)


def _until(ready, procs, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ended = [p for p in procs if p.poll() is not None]
        if ended:
            raise AssertionError(f"a driver ended early: {[p.log.read_text()[-3000:] for p in ended]}")
        try:
            if ready():
                return
        except sa.exc.ProgrammingError:  # a table not made yet
            pass
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_a_partitioned_driver_writes_nothing_for_the_trials_it_lost(tmp_path, two_arm_reference_db):
    why = why_unavailable()
    if why:
        pytest.skip(why)
    url, drop = make_pg_schema_url(reader=False)
    try:
        with hosts(2, tmp_path / "hosts") as hs:
            ha, hb = hs.hosts
            record_sweep(url, two_arm_spec("partition", retries=2))
            _install_audit(url)
            a = _join(ha, url, "partition", "--max-concurrent", "1")
            b = _join(hb, url, "partition", "--max-concurrent", "1")
            # Both are up, and A runs a trial with a checkpoint past step 0.
            _until(
                lambda: (
                    len(_owners(url)) == 2
                    and query(
                        url,
                        "SELECT COUNT(*) FROM trials t JOIN drivers d ON d.owner = t.claimed_by JOIN trial_checkpoints "
                        "c ON c.trial_id = t.id WHERE d.host = 'h0' AND t.status = 'running' AND c.step >= 40",
                    )[0][0]
                ),
                [a, b],
            )
            owner_a, owner_b = (query(url, f"SELECT owner FROM drivers WHERE host = '{h}'")[0][0] for h in ("h0", "h1"))
            ha.proxy.cut()
            t_cut = time.monotonic()
            # A's running trial, claimed by B once A's claims lapse, and continued by B past its
            # first eval: A's pending rows for it are now stale.
            _until(
                lambda: query(
                    url,
                    "SELECT COUNT(*) FROM attempts a JOIN attempts b ON b.trial_id = a.trial_id AND "
                    f"b.attempt > a.attempt WHERE a.driver = '{owner_a}' AND b.driver = '{owner_b}' AND "
                    "EXISTS (SELECT 1 FROM audit x WHERE x.tbl = 'evals' AND x.host = 'h1' "
                    "AND x.trial_id = b.trial_id AND x.at > b.started_at)",
                )[0][0],
                [a, b],
            )
            # Longer than the claim TTL, whenever B's takeover came (A's claims lapse a TTL after
            # its last renewal, up to a quarter TTL before the cut).
            time.sleep(max(0.0, TTL + 2 - (time.monotonic() - t_cut)))
            cut_s = time.monotonic() - t_cut
            ha.proxy.heal()
            a.wait(timeout=180)
            b.wait(timeout=300)
            out_a, out_b = a.log.read_text(), b.log.read_text()
            assert b.returncode == 0, out_b[-3000:]
            assert a.returncode == 130, out_a[-3000:]

        # What A said: one line, why it stopped.
        said = [ln for ln in out_a.splitlines() if "partition" in ln or "lease lost" in ln]
        assert len(said) == 1, out_a[-3000:]
        assert "stopped (lease lost (" in said[0] and "taken over by another driver" in said[0], said

        # The trials A lost: each a 'lost' attempt of A's, then B's.
        lost = {
            r.trial_id
            for r in query(url, f"SELECT trial_id FROM attempts WHERE driver = '{owner_a}' AND outcome = 'lost'")
        }
        assert lost
        for tid in lost:
            # Lost from the moment B's claim landed: nothing of A's for the trial after it.
            taken = query(
                url,
                "SELECT MIN(at) FROM audit WHERE tbl = 'trials' AND trial_id = :t AND what LIKE :w",
                t=tid,
                w=f"%claim={owner_b}%",
            )[0][0]
            assert taken is not None
            late = query(
                url,
                "SELECT tbl, step, what, at FROM audit WHERE trial_id = :t AND host = 'h0' AND at > :taken ORDER BY at",
                t=tid,
                taken=taken,
            )
            story = query(url, "SELECT host, tbl, step, what, at FROM audit WHERE trial_id = :t ORDER BY at", t=tid)
            assert late == [], "\n".join(f"{r.at:%H:%M:%S.%f} {r.host} {r.tbl} {r.step} {r.what}" for r in story)
        # Every trial completed once in effect: one completed attempt each, and the evals of an
        # uninterrupted run.
        done = query(url, "SELECT trial_id, COUNT(*) FROM attempts WHERE outcome = 'completed' GROUP BY trial_id")
        assert len(done) == 6 and all(n == 1 for _, n in done)
        assert dict(query(url, "SELECT status, COUNT(*) FROM trials GROUP BY status")) == {"completed": 6}
        assert sweep_evals(url) == sweep_evals(two_arm_reference_db)
        assert leftovers(hs.hid) == []
        print(f"\npartition: cut {cut_s:.1f} s (TTL {TTL} s), A lost {len(lost)} trial(s); A: {said[0]}")
    finally:
        drop()
