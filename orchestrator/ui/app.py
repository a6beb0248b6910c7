"""The Starlette application behind ``orchestrator ui``.

Pages are thin HTML shells rendered with Jinja2; the plots and tables are drawn in the
browser by Plotly.js (served from the ``plotly`` wheel, so no CDN) from the JSON endpoints,
which the pages poll for what is new. Every handler is a plain function: Starlette runs
them in its thread pool, so a slow query does not stall the event loop.

Stored strings (sweep and parameter names, values, errors) are text on every page: the
templates autoescape, the scripts build DOM with ``textContent`` and escape what they hand
to Plotly, and every response carries a Content-Security-Policy that allows no inline
script, so a string that slipped past all of that still could not run.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.errors import UserError
from orchestrator.status import Status
from orchestrator.store import deadline, reader
from orchestrator.store.dialect import describe
from orchestrator.store.reader import NotFound

from . import db as q
from . import offload
from . import table as pages
from .guard import Exposure, Guard, exposure_for
from .settings import REQUEST_TIMEOUT_S

POLL_MS = 2000
# A traces POST carries the cursor: a few bytes per trial still being written.
MAX_BODY = 8 * 1024 * 1024
# Worker threads (and reader connections: one each); more requests wait for one.
WORKERS = 8
# Requests computing an analysis (escape times, grid, compare, CSV) at once; past it a 429.
MAX_EXPENSIVE = 4
# Open connections uvicorn serves at once (past it a 503), and seconds a SIGTERM waits for
# the requests in flight (their database work is cancelled as it starts).
MAX_CONNECTIONS = 256
SHUTDOWN_GRACE_S = 3
_HERE = Path(__file__).resolve().parent

# Scripts and data only from this server; nothing inline but styles (Plotly.js sets style
# attributes and adds <style> rules as it draws, and no stored string reaches a style);
# images also from data:/blob: URLs (Plotly's "download plot as png" builds one).
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response (pages, JSON, static files, errors)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.raw = [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in self.raw if k not in have]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class _Dashboard(Starlette):
    """Starlette with :class:`SecurityHeaders` outside its whole stack (middleware added the
    usual way sits inside the server-error handler, so a 500 page would go out without them),
    and inside it the :class:`~orchestrator.ui.guard.Guard` of the Host names and token."""

    exposure: Exposure | None = None

    def build_middleware_stack(self) -> ASGIApp:
        inner = super().build_middleware_stack()
        return SecurityHeaders(inner if self.exposure is None else Guard(inner, self.exposure))


def plotly_js() -> Path:
    import plotly

    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    if not path.exists():
        raise UserError(f"plotly.js not found at {path}; reinstall the `plotly` package")
    return path


def templates_env() -> jinja2.Environment:
    """The pages' Jinja environment: autoescape on for every template, whatever its name."""
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(_HERE / "templates")), autoescape=True)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def _csv(filename: str, text: str) -> Response:
    """CSV as a download: ``text/csv`` (with nosniff, never rendered as a page) and a file
    name made of safe characters only (sweep names are stored strings)."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in filename)
    return Response(
        text,
        media_type="text/csv; charset=utf-8",
        headers={"content-disposition": f'attachment; filename="{safe}"'},
    )


class _JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":"), default=str, allow_nan=False).encode()


# The arguments of the traces and trials endpoints (GET query or POST body).
TRACES_ARGS = ("where", "key", "since", "full", "max_points", "ids")
TRIALS_ARGS = ("where", "page", "size", "sort", "dir", "ids", "keys")
# Trial ids one traces request names at most (a grid cell's trials, the overlay's).
MAX_IDS = 20_000


async def read_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or None once it is past ``limit`` bytes (read as it streams in:
    the rest is never read, and a Content-Length past it is refused before any)."""
    length = request.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and int(length) > limit:
        return None
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            return None
    return bytes(buf)


def create_app(
    engine,
    url: str,
    *,
    exposure: Exposure | None = None,
    request_timeout_s: float | None = REQUEST_TIMEOUT_S,
    max_expensive: int = MAX_EXPENSIVE,
    workers: int = WORKERS,
    stop: deadline.Stop | None = None,
) -> Starlette:
    """The dashboard over an engine that cannot write (see :func:`reader.open_reader_engine`).
    ``exposure``: the Host names served and the token needed (None: no check, for an app
    called in-process); ``request_timeout_s``: each request's database deadline;
    ``max_expensive``: analysis requests at once; ``workers``: handler threads; ``stop``: set
    when the server stops, which cancels the database work in flight."""
    # The escape-time view needs lifelines (with scipy, ~1.5 s to import): pay that at start
    # rather than on the first page load.
    import lifelines  # noqa: F401

    # And the analysis layer the grid, escape-time, outcomes and importance views run (a
    # second or more of imports): a big sweep's first page load should not wait for them.
    import orchestrator.analysis.grid
    import orchestrator.analysis.importance
    import orchestrator.analysis.pipeline
    import orchestrator.analysis.survival  # noqa: F401

    # The grid's intervals (scipy.stats, another second, which lifelines does not load).
    import scipy.stats  # noqa: F401

    templates = Jinja2Templates(env=templates_env())
    plotly_path = plotly_js()
    shown_url = describe(url)

    def page(request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        return templates.TemplateResponse(
            request, name, {"db": shown_url, "poll_ms": POLL_MS, **ctx}, status_code=status
        )

    def not_found(request: Request, msg: str) -> Response:
        if request.url.path.startswith("/api/"):
            return _JSON({"error": msg}, status_code=404)
        return page(request, "404.html", status=404, message=msg)

    expensive_slots = threading.BoundedSemaphore(max_expensive)

    def cancelled() -> Response:
        if stop is not None and stop.is_set():
            msg = "error: the server is stopping; this request's database work was cancelled"
        else:
            msg = (
                f"error: the request ran past its {request_timeout_s:g} s deadline and its database work "
                "was cancelled (narrow it with where=, or raise --request-timeout)"
            )
        return _JSON({"error": msg}, status_code=503)

    def guarded(fn, expensive: bool = False):
        def handler(request: Request) -> Response:
            if expensive and not expensive_slots.acquire(blocking=False):
                return _JSON(
                    {"error": f"error: {max_expensive} analysis views are being computed already; retry in a moment"},
                    status_code=429,
                    headers={"retry-after": "1"},
                )
            try:
                with deadline.within(request_timeout_s, stop):
                    try:
                        return fn(request)
                    except NotFound as exc:
                        return not_found(request, str(exc))
                    except UserError as exc:
                        return _JSON({"error": f"error: {exc}"}, status_code=400)
                    except Exception:
                        # SQLite's "interrupted", PostgreSQL's "canceling statement due to
                        # statement timeout", in whatever wrapper the caller put them.
                        if deadline.passed():
                            return cancelled()
                        raise
            finally:
                if expensive:
                    expensive_slots.release()

        return handler

    def heavy(fn):
        return guarded(fn, expensive=True)

    def arg(request: Request, name: str) -> str | None:
        v = request.query_params.get(name)
        return v if v not in (None, "") else None

    @guarded
    def index(request: Request) -> Response:
        return page(request, "index.html", sweeps=q.sweeps(engine))

    @guarded
    def sweep_page(request: Request) -> Response:
        # A shell: the controls are filled from the trials JSON the page fetches anyway.
        name = request.path_params["name"]
        with engine.connect() as conn:
            reader.sweep_id(conn, name)
        # How many trials: the page asks for quantile bands rather than every trace of a big
        # sweep at once, in parallel with the trial table (a page of it past PAGED_TRIALS).
        stamp = reader.write_stamp(engine, name)
        n = sum(c for _s, c, _t in stamp)
        # With no trial running the grid and the escape-time curves share one preparation of
        # the sweep (db._prepared): the page asks for both at once.
        running = sum(c for s, c, _t in stamp if s == Status.running.value)
        if n > offload.OFFLOAD_TRIALS:
            offload.warm()  # the page's first requests read the evals in a child process
        return page(request, "sweep.html", sweep=name, n_trials=n, n_running=running, paged_trials=pages.PAGED_TRIALS)

    @guarded
    def trial_page(request: Request) -> Response:
        name, key = request.path_params["name"], request.path_params["key"]
        t = q.trial(engine, name, key)
        return page(request, "trial.html", sweep=name, trial=t)

    @guarded
    def api_trial_system(request: Request) -> Response:
        return _JSON(_clean(q.trial_system(engine, request.path_params["name"], request.path_params["key"])))

    @guarded
    def api_sweeps(request: Request) -> Response:
        return _JSON({"sweeps": _clean(q.sweeps(engine))})

    def trials_answer(name: str, args: dict[str, Any]) -> Response:
        t = q.trials(engine, name, where=args.get("where"))
        paging = [k for k in ("page", "size", "sort", "dir") if args.get(k) is not None]
        ids, keys = pages.ids_arg(args.get("ids")), pages.keys_arg(args.get("keys"))
        if ids is not None or keys is not None:
            if paging:
                raise UserError(f"{paging[0]}: a page or the trials named by ids/keys, not both")
            rows = pages.picked(t, ids=ids, keys=keys)
            return _JSON(
                {
                    "trials": _clean(rows),
                    "picked": True,
                    "params": t.params,
                    "varying": t.varying,
                    "default_by": t.default_by,
                }
            )
        if not paging and len(t) <= pages.PAGED_TRIALS:
            return _JSON(
                {
                    "trials": _clean(t.rows),
                    "params": t.params,
                    "varying": t.varying,
                    "default_by": t.default_by,
                    "paged": False,
                }
            )
        # Past PAGED_TRIALS trials even a client that asks for no page gets the first one.
        answer = pages.page(t, args.get("page"), args.get("size"), args.get("sort"), args.get("dir"))
        answer["rows"] = _clean(answer["rows"])
        return _JSON(answer)

    async def api_trials(request: Request) -> Response:
        """The view's trial table: whole up to PAGED_TRIALS trials, past it (or with page=,
        size=, sort=, dir=) one sorted page; with ids= or keys= just those trials' rows. GET,
        or POST with the arguments as a JSON object (a page's ids or keys can pass a URL's
        limit)."""
        args = await request_args(
            request, TRIALS_ARGS, lists=("ids", "keys"), what=f"a trials POST names at most {pages.MAX_PICKED:,} trials"
        )
        if isinstance(args, Response):
            return args
        name = request.path_params["name"]
        return await run_in_threadpool(guarded(lambda _r: trials_answer(name, args)), request)

    def traces_answer(name: str, args: dict[str, str | None]) -> Response:
        where, key = args.get("where"), args.get("key")
        ids = None
        if where or key:
            ids = set(q.trials(engine, name, where=where, key=key).columns["trial_id"])
        if args.get("ids") is not None:
            # The trials a big sweep's page draws one line each for (a grid cell, the overlay).
            picked = set(pages.comma_ids(args["ids"] or "", MAX_IDS))
            ids = picked if ids is None else ids & picked
        mp = args.get("max_points") or "0"
        if not (mp.isascii() and mp.isdigit() and len(mp) < 10):
            raise UserError(f"max_points={mp[:20]!r}: expected a whole number")
        return _JSON(
            q.traces(
                engine, name, since=args.get("since"), trial_ids=ids, full=args.get("full") == "1", max_points=int(mp)
            )
        )

    async def request_args(
        request: Request, names: tuple[str, ...], *, what: str, lists: tuple[str, ...] = ()
    ) -> dict[str, Any] | Response:
        """A GET's arguments from its query, a POST's from its body (a JSON object of
        strings, and lists for the names in ``lists``): ``{name: value or None}``, or the
        response refusing the body."""
        if request.method == "GET":
            return {k: arg(request, k) for k in names}
        body = await read_body(request, MAX_BODY)
        if body is None:  # the rest is never read: the connection closes after the answer
            return _JSON(
                {"error": f"error: request body over {MAX_BODY:,} bytes; {what}"},
                status_code=413,
                headers={"connection": "close"},
            )
        try:
            data = json.loads(body or b"{}")
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict) or not all(
            isinstance(v, (str, type(None))) or (k in lists and isinstance(v, list)) for k, v in data.items()
        ):
            also = f" ({', '.join(lists)}: lists)" if lists else ""
            return _JSON({"error": f"error: the body must be a JSON object of strings{also}"}, status_code=400)
        return {k: (data.get(k) if isinstance(data.get(k), list) else data.get(k) or None) for k in names}

    async def api_traces(request: Request) -> Response:
        """GET with the arguments in the query; POST with them as a JSON object, which is how
        the pages send a cursor: it grows with the trials being written, and a request line
        past 16 KiB (about 600 running trials) never reaches the app."""
        args = await request_args(request, TRACES_ARGS, what="a traces POST carries only the cursor")
        if isinstance(args, Response):
            return args
        name = request.path_params["name"]
        return await run_in_threadpool(guarded(lambda _r: traces_answer(name, args)), request)

    @guarded
    def api_bands(request: Request) -> Response:
        name = request.path_params["name"]
        return _JSON(_clean(q.bands(engine, name, arg(request, "by"), arg(request, "facet"), arg(request, "where"))))

    @heavy
    def api_grid(request: Request) -> Response:
        g = q.grid(
            engine,
            request.path_params["name"],
            arg(request, "x"),
            arg(request, "y"),
            arg(request, "facet"),
            arg(request, "metric") or "lockin",
            arg(request, "where"),
        )
        return _JSON(_clean(g))

    @heavy
    def api_csv(request: Request) -> Response:
        args = {k: arg(request, k) for k in ("where", "by", "x", "y", "facet", "metric", "outcome")}
        fname, text = q.csv_view(engine, request.path_params["name"], request.path_params["view"], args)
        return _csv(fname, text)

    @guarded
    def compare_page(request: Request) -> Response:
        return page(request, "compare.html", a=arg(request, "a") or "", b=arg(request, "b") or "")

    def compare_args(request: Request) -> dict[str, Any]:
        return _clean(
            q.compare(
                engine,
                arg(request, "a") or "",
                arg(request, "b") or "",
                arg(request, "by"),
                arg(request, "metric") or "lockin",
                arg(request, "where"),
                arg(request, "split"),
            )
        )

    @heavy
    def api_compare(request: Request) -> Response:
        return _JSON(compare_args(request))

    @heavy
    def api_compare_csv(request: Request) -> Response:
        c = compare_args(request)
        lead = ["sweep"] + ([c["split"]] if c["split"] else []) + [c["by"]]
        cols = [*lead, "n", "k", "rate", "ci_low", "ci_high", "median"]
        rows = [
            {"sweep": c[s], **({c["split"]: r["split"]} if c["split"] else {}), c["by"]: r["value"], **r}
            for s in ("a", "b")
            for r in c[s + "_cells"]
        ]
        return _csv(f"compare-{c['a']}-{c['b']}.csv", q.to_csv(cols, rows))

    @heavy
    def api_km(request: Request) -> Response:
        return _JSON(
            _clean(q.escape_times(engine, request.path_params["name"], arg(request, "by"), arg(request, "where")))
        )

    @heavy
    def api_outcomes(request: Request) -> Response:
        return _JSON(_clean(q.outcomes(engine, request.path_params["name"], arg(request, "where"))))

    @heavy
    def api_importance(request: Request) -> Response:
        name, outcome = request.path_params["name"], arg(request, "outcome") or "final_acc"
        return _JSON(_clean(q.importance(engine, name, outcome, arg(request, "where"))))

    def plotly(_request: Request) -> Response:
        return FileResponse(plotly_path, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    async def missing(request: Request, exc) -> Response:
        return not_found(request, f"nothing at {request.url.path}")

    routes = [
        Route("/", index),
        Route("/sweeps/{name}", sweep_page),
        Route("/sweeps/{name}/trials/{key}", trial_page),
        Route("/api/sweeps", api_sweeps),
        Route("/api/sweeps/{name}/trials", api_trials, methods=["GET", "POST"]),
        Route("/api/sweeps/{name}/trials/{key}/system", api_trial_system),
        Route("/api/sweeps/{name}/traces", api_traces, methods=["GET", "POST"]),
        Route("/api/sweeps/{name}/km", api_km),
        Route("/api/sweeps/{name}/bands", api_bands),
        Route("/api/sweeps/{name}/grid", api_grid),
        Route("/api/sweeps/{name}/outcomes", api_outcomes),
        Route("/api/sweeps/{name}/importance", api_importance),
        Route("/api/sweeps/{name}/csv/{view}", api_csv),
        Route("/compare", compare_page),
        Route("/api/compare", api_compare),
        Route("/api/compare/csv", api_compare_csv),
        Route("/static/plotly.min.js", plotly),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        # The handlers' thread pool: as many threads as the engine has connections to hand out.
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = workers
        yield

    app = _Dashboard(routes=routes, exception_handlers={404: missing}, lifespan=lifespan)
    app.exposure = exposure
    app.state.expensive_slots = expensive_slots
    return app


def _listen(host: str, port: int):
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:  # a taken port is one line and exit 2, not uvicorn's log and exit 1
        return socket.create_server((host, port), family=family, backlog=MAX_CONNECTIONS)
    except (OSError, OverflowError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise UserError(f"cannot listen on {host}:{port}: {why}; pick another with --host/--port") from None


def serve(
    db: str | None,
    host: str,
    port: int,
    *,
    announce=print,
    token: str | None = None,
    allow_hosts: tuple[str, ...] = (),
    request_timeout_s: float = REQUEST_TIMEOUT_S,
) -> None:
    """Open the database read-only, print the URL, serve until Ctrl-C or SIGTERM. Off
    loopback a ``token`` is required (see :mod:`orchestrator.ui.guard`)."""
    import uvicorn

    if not request_timeout_s > 0:
        raise UserError(f"--request-timeout {request_timeout_s}: expected a number of seconds above 0")
    exposure = exposure_for(host, port, allow_hosts, token)
    engine, url = reader.open_reader_engine(db, pool_size=WORKERS)
    try:
        sock = _listen(host, port)
    except UserError:
        engine.dispose()
        raise
    bound_host, bound_port = sock.getsockname()[:2]
    exposure = exposure_for(host, bound_port, allow_hosts, token)
    stop = deadline.Stop()
    app = create_app(engine, url, exposure=exposure, request_timeout_s=request_timeout_s, stop=stop)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        limit_concurrency=MAX_CONNECTIONS,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            stop.set()  # the database work in flight is cancelled, so its requests end now
            await super().shutdown(sockets)

    server = _Server(config)
    name = f"[{bound_host}]" if ":" in bound_host else bound_host
    if host in ("", "0.0.0.0", "::"):
        where = f"on every interface ({name}:{bound_port})"
        import socket

        name = socket.gethostname()
    else:
        where = f"on {name}:{bound_port}"
    link = f"http://{name}:{bound_port}/" + (f"?token={token}" if token else "")
    announce(f"orchestrator ui: serving {describe(url)} read-only {where} at {link} (Ctrl-C stops)")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        engine.dispose()
