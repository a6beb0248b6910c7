"""A PostgreSQL server of the test's own, for tests that stop or restart the database.

The suite's other PostgreSQL tests share the local server (each in a schema of its own), so
a test that restarts *that* server breaks whatever runs beside it (under pytest-xdist,
everything). :class:`PrivateServer` runs Debian's ``initdb`` and ``pg_ctl`` as the
``postgres`` user on a data folder of its own, listening on 127.0.0.1 on a free port with
trust auth: a real server the test may stop, start and restart at will. It needs the server
binaries and root (to run them as ``postgres``); :func:`why_unavailable` says why not.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from proc_support import free_port


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def why_unavailable() -> str | None:
    """Why a private server cannot be started here, or None when it can."""
    if _bindir() is None:
        return "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin)"
    if os.geteuid() != 0:
        return "a private PostgreSQL server runs as the postgres user: needs root"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user"
    return None


class PrivateServer:
    """``with PrivateServer() as pg:`` a started server; ``pg.url`` its superuser URL."""

    def __init__(self) -> None:
        bindir = _bindir()
        assert bindir is not None, why_unavailable()
        self._bin = bindir
        # Under /tmp directly: the postgres user cannot enter pytest's root-only tmp folders.
        self.root = Path(tempfile.mkdtemp(prefix="orch-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *argv: str, timeout: float = 120) -> None:
        res = subprocess.run(
            ["runuser", "-u", "postgres", "--", *argv], capture_output=True, text=True, timeout=timeout
        )
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])}: {res.stderr.strip() or res.stdout.strip()}")

    def _pg_ctl(self, action: str) -> None:
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        args = [str(self._bin / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "-l", str(self.root / "log")]
        if action in ("start", "restart"):
            args += ["-o", opts]
        if action in ("stop", "restart"):
            args += ["-m", "fast"]
        self._as_postgres(*args, action)

    def start(self) -> None:
        self._pg_ctl("start")

    def stop(self) -> None:
        self._pg_ctl("stop")

    def restart(self) -> None:
        self._pg_ctl("restart")

    def up(self) -> bool:
        return (
            subprocess.run([str(self._bin / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)]).returncode
            == 0
        )

    def __enter__(self) -> PrivateServer:
        shutil.chown(self.root, "postgres", "postgres")
        self._as_postgres(
            str(self._bin / "initdb"), "-D", str(self.data), "--auth=trust", "-U", "postgres", "--no-sync"
        )
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.up():
                self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
