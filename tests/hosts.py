"""Many "hosts" on one machine, for tests of drivers that share only a database and a network.

Each host is a network namespace (``orch-<id>-hN``) joined by a veth pair to one bridge in the
root namespace (``orchbr-<id>``, a private 10.x.y.0/24 the harness picks; no route out, so no
traffic leaves the machine), with ``lo`` up and an address of its own, and a mount and UTS
namespace of its own (held by one idle process; every command enters all three): a private
tmpfs on /tmp (Ray's sockets and session files, a driver's TMPDIR), its own hostname, HOME and
working directory under the test's tmp_path, which every host sees (a shared home). Host to host traffic crosses the bridge, so a Ray head in one host is reachable from
workers and drivers in the others.

PostgreSQL stays in the root namespace on 127.0.0.1:5432. Hosts reach it through a
:class:`Proxy` per host, threads in the test process listening on the bridge's address, that
can :meth:`Proxy.cut` (drop the connections it carries and refuse, or blackhole, new ones),
:meth:`Proxy.heal` and delay traffic: a network partition between one host and the database,
while the test itself still reads the database directly.

``tc netem`` is used for link delay and loss where the kernel has it (:func:`netem_available`);
where it does not, :attr:`Proxy.delay_s` delays the database link.

Cleanup (also when the test fails): every process group the harness started is killed, then
every process still inside a namespace, the namespaces and the bridge are deleted (a veth goes
with its namespace, a tmpfs with its mount namespace); :func:`leftovers` lists what of a
harness remains, for the test to assert that nothing does.
"""

from __future__ import annotations

import os
import random
import select
import shlex
import signal
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa


class Unavailable(Exception):
    """Network namespaces cannot be made here (not root, no ``ip netns``): the test skips."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


def why_unavailable() -> str | None:
    """Why this machine cannot run the harness, or None when it can."""
    if os.geteuid() != 0:
        return "the multi-host harness needs root (network namespaces, mounts)"
    for tool in ("ip", "unshare"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
            return f"the multi-host harness needs `{tool}`"
    probe = f"orch-probe-{uuid.uuid4().hex[:6]}"
    res = _ip("netns", "add", probe, check=False)
    if res.returncode != 0:
        return f"`ip netns add` fails here: {res.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def netem_available() -> bool:
    """Whether ``tc qdisc ... netem`` works (the sch_netem module; absent in many containers)."""
    name = f"orchq{uuid.uuid4().hex[:6]}"
    if _ip("link", "add", name, "type", "dummy", check=False).returncode != 0:
        return False
    try:
        res = subprocess.run(["tc", "qdisc", "add", "dev", name, "root", "netem", "delay", "1ms"], capture_output=True)
        return res.returncode == 0
    finally:
        _ip("link", "del", name, check=False)


def leftovers(hid: str) -> list[str]:
    """Namespaces and links of harness ``hid`` that still exist."""
    tag = f"orch-{hid}-"
    spaces = [ln.split()[0] for ln in _ip("netns", "list").stdout.splitlines() if ln.startswith(tag)]
    links = [
        ln.split(":")[1].strip().split("@")[0]
        for ln in _ip("-o", "link", "show").stdout.splitlines()
        if f" {tag}" in ln or f" orchbr-{hid}" in ln
    ]
    return spaces + links


# ---- the database link ---------------------------------------------------------------------------


class Proxy:
    """A TCP forwarder from ``listen`` to ``target`` that can be cut, healed and delayed.

    ``cut()`` resets every connection it carries (the client sees its connection die, as
    when a link goes down under an open socket) and, until ``heal()``, refuses new ones
    (accepted and reset at once: fast failures) or, with ``blackhole=True``, accepts and
    holds them silent (a client without a timeout hangs, as behind a dead route)."""

    def __init__(self, listen_host: str, target: tuple[str, int], port: int = 0):
        self.target = target
        self.delay_s = 0.0
        self._cut = False
        self._blackhole = False
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._held: list[socket.socket] = []
        self._server = socket.create_server((listen_host, port), reuse_port=False)
        self._server.settimeout(0.2)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self._closed = threading.Event()
        self.accepted = 0
        self.refused = 0
        self._thread = threading.Thread(target=self._serve, name=f"proxy-{self.address}", daemon=True)
        self._thread.start()

    @property
    def is_cut(self) -> bool:
        return self._cut

    def cut(self, *, blackhole: bool = False) -> None:
        with self._lock:
            self._cut = True
            self._blackhole = blackhole
            conns = list(self._conns)
        for c in conns:
            # Wakes the pipe's select; the pipe then closes both ends with an RST.
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def heal(self) -> None:
        with self._lock:
            self._cut = False
            held, self._held = self._held, []
        for c in held:
            _reset(c)

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self.heal()
        self._server.close()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                if self._cut:
                    self.refused += 1
                    if self._blackhole:
                        self._held.append(client)
                    else:
                        _reset(client)
                    continue
                self.accepted += 1
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _reset(client)
            return
        with self._lock:
            if self._cut:  # cut while connecting
                _reset(client)
                _reset(upstream)
                return
            self._conns.update((client, upstream))
        peers = {client: upstream, upstream: client}
        try:
            while not self._closed.is_set():
                try:
                    ready, _, _ = select.select(list(peers), [], [], 0.2)
                except (OSError, ValueError):  # a socket reset by cut()
                    return
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    if self.delay_s:
                        time.sleep(self.delay_s)
                    peers[s].sendall(data)
        except OSError:
            return
        finally:
            with self._lock:
                self._conns.discard(client)
                self._conns.discard(upstream)
            _reset(client)
            _reset(upstream)


def _reset(s: socket.socket) -> None:
    """Close with an RST, not a FIN: the peer's next read or write fails at once."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


# ---- hosts ---------------------------------------------------------------------------------------


@dataclass
class Host:
    """One namespace: ``ip`` its address on the bridge, ``root`` its folder (HOME is
    root/home, commands run in root/work), ``proxy`` its link to the database."""

    index: int
    ns: str
    veth: str
    ip: str
    root: Path
    proxy: Proxy
    share: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    anchor: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return f"h{self.index}"

    def db_url(self, url: str, app: str | None = None) -> str:
        """``url`` (a PostgreSQL URL on the root namespace's server) through this host's proxy,
        its connections named ``app`` (default: the host's name) by ``application_name``: the
        server's view of who wrote a row, as every host's traffic reaches it from the proxy."""
        host, port = self.proxy.address
        u = sa.engine.make_url(url)
        u = u.set(host=host, port=port, query={**u.query, "application_name": app or self.name})
        return u.render_as_string(hide_password=False)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        home = self.root / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "ORCH_TEST_"))}
        env.update(
            {
                "HOME": str(home),
                "TMPDIR": "/tmp",  # the host's private tmpfs
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(
                    [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
                ),
            }
        )
        env.update(extra or {})
        return env

    def boot(self) -> None:
        """Make the host's mount and UTS namespaces: a private tmpfs on /tmp and its hostname,
        held by one idle process (the anchor) that every command then enters, so that all
        the host's processes share one /tmp (Ray's session folder and sockets live there).

        The harness's shared folder (``share``, the test's tmp dir, often under /tmp itself)
        stays visible at its own path, bound back over the fresh tmpfs from a descriptor
        opened before it (``--no-canonicalize``: the path by name would be the tmpfs's)."""
        share = shlex.quote(str(self.share))
        ready = self.root / ".booted"
        setup = (
            f"exec 3<{share} && mount -t tmpfs tmpfs /tmp && mkdir -p {share} && "
            f'mount --no-canonicalize --bind "/proc/$$/fd/3" {share} && exec 3<&- && '
            f"hostname {self.name} && touch {shlex.quote(str(ready))} && exec sleep infinity"
        )
        self.anchor = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "unshare", "--mount", "--uts", "--propagation", "private",
             "sh", "-c", setup],
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not ready.exists():
            if self.anchor.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"host {self.name} did not boot: {self.anchor.stderr.read() if self.anchor.stderr else ''}"
                )
            time.sleep(0.05)

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside the host: its network, its /tmp and hostname, its cwd."""
        work = self.root / "work"
        work.mkdir(parents=True, exist_ok=True)
        return [
            "nsenter", "--target", str(self.anchor.pid), "--net", "--mount", "--uts", "--",
            "sh", "-c", f'cd {shlex.quote(str(work))} && exec "$@"', "sh", *argv,
        ]  # fmt: skip

    def popen(
        self, argv: Sequence[str], *, env: dict[str, str] | None = None, log: Path | None = None
    ) -> subprocess.Popen:
        """Start ``argv`` in the host, in a session (process group) of its own; its output
        goes to ``log`` (default root/<argv0>.<n>.log) so that a full pipe never blocks it."""
        log = log or self.root / f"proc{len(self.procs)}.log"
        with log.open("w") as out:
            p = subprocess.Popen(
                self.wrap(argv), env=self.env(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        p.log = log  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def run(
        self, argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        return subprocess.run(self.wrap(argv), env=self.env(env), capture_output=True, text=True, timeout=timeout)

    def netem(self, delay_ms: int = 200, loss_pct: float = 5.0) -> bool:
        """Delay and drop this host's packets on its link (``tc netem`` on the root side of
        its veth); False where the kernel has no netem (then :attr:`Proxy.delay_s` delays its
        database link instead)."""
        res = subprocess.run(
            ["tc", "qdisc", "replace", "dev", self.veth, "root", "netem",
             "delay", f"{delay_ms}ms", "loss", f"{loss_pct}%"],
            capture_output=True,
        )  # fmt: skip
        return res.returncode == 0

    def pids(self) -> list[int]:
        """Every process inside the namespace (``ip netns pids``)."""
        out = _ip("netns", "pids", self.ns, check=False).stdout
        return [int(x) for x in out.split()]

    def kill_all(self, *, anchor: bool = False) -> None:
        """Kill every process the host runs (the machine went down); with ``anchor`` its
        namespaces' holder too (the harness's cleanup: the host is gone)."""
        for p in self.procs:
            kill_group(p)
        keep = set() if anchor or self.anchor is None else {self.anchor.pid}
        for _ in range(3):  # whatever left its process group (Ray's daemons may)
            left = [p for p in self.pids() if p not in keep]
            if not left:
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)


def kill_group(p: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _free_subnet() -> int:
    """A /24 of 10.213-250.x not on any interface here."""
    used = _ip("-o", "-4", "addr", "show").stdout
    rng = random.Random()
    for _ in range(200):
        b, c = rng.randint(213, 250), rng.randint(0, 255)
        if f" 10.{b}.{c}." not in used:
            return b * 256 + c
    raise RuntimeError("no free 10.x.y.0/24 here")


@dataclass
class Hosts:
    hid: str
    bridge: str
    bridge_ip: str
    hosts: list[Host]

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __len__(self) -> int:
        return len(self.hosts)


@contextmanager
def hosts(n: int, base: Path, *, db: tuple[str, int] = ("127.0.0.1", 5432)) -> Iterator[Hosts]:
    """``n`` hosts on one bridge, each with a proxy to ``db``, their folders under ``base``
    (visible to every host, as a shared home would be); raises :class:`Unavailable` where
    namespaces cannot be made. Everything is torn down on exit."""
    why = why_unavailable()
    if why:
        raise Unavailable(why)
    hid = uuid.uuid4().hex[:4]
    base.mkdir(parents=True, exist_ok=True)
    net = _free_subnet()
    prefix = f"10.{net // 256}.{net % 256}"
    bridge = f"orchbr-{hid}"
    made: list[Host] = []
    bridge_made = False
    try:
        _ip("link", "add", bridge, "type", "bridge")
        bridge_made = True
        _ip("addr", "add", f"{prefix}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i in range(n):
            ns, veth = f"orch-{hid}-h{i}", f"orch-{hid}-h{i}"
            _ip("netns", "add", ns)
            root = base / f"h{i}"
            root.mkdir(parents=True, exist_ok=True)
            host = Host(i, ns, veth, f"{prefix}.{i + 2}", root, Proxy(f"{prefix}.1", db), base)
            made.append(host)
            _ip("link", "add", veth, "type", "veth", "peer", "name", f"orch-{hid}-p{i}", "netns", ns)
            _ip("link", "set", veth, "master", bridge, "up")
            _ip("-n", ns, "link", "set", f"orch-{hid}-p{i}", "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            host.boot()
        yield Hosts(hid, bridge, f"{prefix}.1", made)
    finally:
        for h in made:
            h.kill_all(anchor=True)
            if h.anchor is not None:
                h.anchor.wait(timeout=10)
            h.proxy.close()
        for h in made:
            _ip("netns", "del", h.ns, check=False)
            _ip("link", "del", h.veth, check=False)  # gone with the namespace, unless it never moved
        if bridge_made:
            _ip("link", "del", bridge, check=False)
