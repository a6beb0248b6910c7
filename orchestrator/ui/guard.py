"""Who may read the dashboard: the ``Host:`` a request names and, off loopback, its token.

A page on ``attacker.example`` whose DNS name is rebound to 127.0.0.1 reaches a dashboard on
loopback from the victim's browser, but its requests carry ``Host: attacker.example``: only
the names of the bound address (the loopback names on loopback) and ``--allow-host`` ones
are served. A dashboard bound to anything but loopback also needs a token on every request:
the ``Authorization: Bearer`` or ``X-Orchestrator-Token`` header, or the cookie a first
visit with ``?token=`` sets (that visit is redirected to the same page without it).
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.errors import UserError

TOKEN_ENV = "ORCH_UI_TOKEN"
MIN_TOKEN = 16
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("", "0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name in a ``Host:`` value, without its port, lower case (IPv6 without brackets)."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    if h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.rstrip(".")


@dataclass(frozen=True)
class Exposure:
    """The names served (``any_ip``: also any IP address written as one, which no DNS name
    can rebind) and the token every request needs (None: none)."""

    names: frozenset[str]
    any_ip: bool = False
    token: str | None = None
    port: int = 0

    @property
    def cookie(self) -> str:
        # Cookies ignore the port: two dashboards on one host keep a cookie each.
        return f"orch_ui_token_{self.port}"

    def host_ok(self, header: str) -> bool:
        name = host_name(header)
        return name in self.names or (self.any_ip and _ip_literal(name))


def exposure_for(bound: str, port: int, allow_hosts: Iterable[str], token: str | None) -> Exposure:
    """What a server bound to ``bound`` serves; a bind off loopback without a token is a
    UserError (anyone who can reach the port could read every result)."""
    extra = {host_name(h) for h in allow_hosts if h.strip()}
    if token is not None and not all(c.isascii() and (c.isalnum() or c in "-_.~") for c in token):
        raise UserError("--token: use letters, digits and -_.~ only (it goes in a URL and a cookie)")
    if token is not None and len(token) < MIN_TOKEN:
        raise UserError(
            f"--token: {len(token)} characters, fewer than {MIN_TOKEN}; make one with "
            "`python -c 'import secrets; print(secrets.token_urlsafe())'`"
        )
    if is_loopback(bound):
        return Exposure(frozenset({*LOOPBACK_NAMES, host_name(bound), *extra}), token=token, port=port)
    if not token:
        raise UserError(
            f"--host {bound or '0.0.0.0'}: serving off loopback needs a token (--token TOKEN or ${TOKEN_ENV}), "
            "or bind 127.0.0.1 and reach it through an SSH tunnel"
        )
    names = {*LOOPBACK_NAMES, *extra}
    if bound in WILDCARDS:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        return Exposure(frozenset(names), any_ip=True, token=token, port=port)
    return Exposure(frozenset(names | {host_name(bound)}), token=token, port=port)


async def _plain(send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware: refuses a request whose Host is not served (403) or that lacks the
    token (401), each with a one-line message."""

    def __init__(self, app: ASGIApp, exposure: Exposure) -> None:
        self.app, self.exposure = app, exposure

    def _token_in(self, scope: Scope) -> tuple[bool, str | None]:
        """(the request carries the token, the token given in its query if any)."""
        want = (self.exposure.token or "").encode()
        headers = dict((k.lower(), v) for k, v in scope.get("headers", []))
        auth = headers.get(b"authorization", b"")
        given = [auth[7:].strip()] if auth[:7].lower() == b"bearer " else []
        given.append(headers.get(b"x-orchestrator-token", b""))
        for part in headers.get(b"cookie", b"").split(b";"):
            k, _, v = part.strip().partition(b"=")
            if k == self.exposure.cookie.encode():
                given.append(v)
        if any(g and hmac.compare_digest(g, want) for g in given):
            return True, None
        q = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        t = q.get("token")
        if t and hmac.compare_digest(t.encode("latin-1", "replace"), want):
            return True, t
        return False, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == b"host"), "")
        if not self.exposure.host_ok(host):
            shown = host_name(host)[:80] or "(none)"
            await _plain(
                send,
                403,
                f"error: Host {shown!r} is not a name of this dashboard "
                f"(start `orchestrator ui` with --allow-host {shown} to serve it)",
            )
            return
        if self.exposure.token:
            ok, from_query = self._token_in(scope)
            if not ok:
                await _plain(
                    send,
                    401,
                    "error: this dashboard needs its token: open the URL `orchestrator ui` printed "
                    "(it ends in ?token=...) or send the header Authorization: Bearer TOKEN",
                    [(b"www-authenticate", b"Bearer")],
                )
                return
            if from_query is not None and scope.get("method") in ("GET", "HEAD"):
                rest = [(k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1")) if k != "token"]
                target = scope.get("path", "/") + (("?" + urlencode(rest)) if rest else "")
                cookie = f"{self.exposure.cookie}={from_query}; Path=/; HttpOnly; SameSite=Strict"
                await _plain(
                    send,
                    303,
                    f"see {target}",
                    [(b"location", target.encode("latin-1", "replace")), (b"set-cookie", cookie.encode("latin-1"))],
                )
                return
        await self.app(scope, receive, send)
