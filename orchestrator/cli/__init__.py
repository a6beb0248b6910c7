"""Console entry point: ``orchestrator``.

Every way a command can end is decided here, in :func:`main`: a user error (bad spec, flag,
query, file) is one line on stderr and exit 2; a usage error is click's own usage message
and exit 2; anything unexpected is one line naming a log file that holds the traceback
(the traceback itself only with ``--debug`` or ``ORCH_DEBUG=1``).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from orchestrator.cli.app import app
from orchestrator.cli.help import polish
from orchestrator.errors import UserError, printable

# Every ``*_cmds`` module in this package registers its commands on import (one module per
# command family: run_cmds, cells_cmds, tasks_cmds, analysis_cmds, ...).
for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.endswith("_cmds")):
    importlib.import_module(f"orchestrator.cli.{_mod}")
polish(app)  # examples and shared option texts on every command (orchestrator.cli.help)


def _click_exceptions() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(ClickException types, Abort types) of every click the installed typer may raise:
    typer >= 0.26 vendors its own copy (``typer._click``), whose classes are not click's."""
    usage: list[type] = []
    abort: list[type] = []
    for mod in ("typer._click.exceptions", "typer.exceptions", "click.exceptions"):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        if hasattr(m, "ClickException"):
            usage.append(m.ClickException)
        if hasattr(m, "Abort"):
            abort.append(m.Abort)
    return tuple(usage), tuple(abort)


_USAGE_ERRORS, _ABORTS = _click_exceptions()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _bad_input(exc: BaseException) -> str | None:
    """The one line for an exception that bad input causes, or None for a real bug."""
    if isinstance(exc, UnicodeDecodeError):
        return f"input is not UTF-8 text ({exc.reason} at byte {exc.start})"
    if isinstance(exc, RecursionError):
        return "input nested too deeply"
    if isinstance(exc, OverflowError):
        return f"number out of range ({_first_line(exc)})"
    if isinstance(exc, MemoryError):
        return "input too large to hold in memory"
    if isinstance(exc, OSError) and (exc.filename is not None or exc.strerror):
        where = f"{exc.filename}: " if exc.filename is not None else ""
        return f"{where}{exc.strerror or _first_line(exc)}"
    return None


def error_log_dir() -> Path:
    """Where tracebacks of unexpected errors go (``$ORCH_LOG_DIR``, else a temp folder)."""
    return Path(os.environ.get("ORCH_LOG_DIR") or Path(tempfile.gettempdir()) / "orchestrator-logs")


def _log_traceback(exc: BaseException, argv: list[str]) -> Path | None:
    try:
        d = error_log_dir()
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        text = "orchestrator " + " ".join(argv) + "\n\n" + "".join(traceback.format_exception(exc))
        # an argument may be a file name that is not UTF-8 (held as surrogate escapes)
        path.write_text(text, encoding="utf-8", errors="backslashreplace")
        return path
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    """Run the CLI: user errors become one line on stderr and exit code 2, usage errors
    click's usage message and exit 2, unexpected errors one line plus a log path, exit 1."""
    args = list(sys.argv[1:] if argv is None else argv)
    # `--debug` is accepted anywhere before a `--` separator: it shows the traceback.
    cut = args.index("--") if "--" in args else len(args)
    debug = "--debug" in args[:cut] or os.environ.get("ORCH_DEBUG", "") not in ("", "0")
    args = [a for i, a in enumerate(args) if not (a == "--debug" and i < cut)]
    # The runner reads it too: with --debug, Ray Tune's tracebacks of failed trials show.
    was = os.environ.get("ORCH_DEBUG")
    if debug:
        os.environ["ORCH_DEBUG"] = "1"
    try:
        return _run(args, debug)
    finally:
        if was is None:
            os.environ.pop("ORCH_DEBUG", None)
        else:
            os.environ["ORCH_DEBUG"] = was


def _run(args: list[str], debug: bool) -> int:
    try:
        rv = app(args=args, prog_name="orchestrator", standalone_mode=False)
    except UserError as exc:
        # a message may quote a file name or value holding terminal control characters
        print(f"error: {printable(_first_line(exc))}", file=sys.stderr)
        return exc.exit_code
    except SystemExit as exc:  # typer/click exits (--help)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # click usage errors arrive here in standalone_mode=False
        if _USAGE_ERRORS and isinstance(exc, _USAGE_ERRORS):
            exc.show()  # type: ignore[attr-defined]
            return getattr(exc, "exit_code", 2) or 2
        if _ABORTS and isinstance(exc, _ABORTS):
            print("aborted", file=sys.stderr)
            return 1
        if debug:
            raise
        line = _bad_input(exc)
        if line is not None:
            print(f"error: {line}", file=sys.stderr)
            return 2
        log = _log_traceback(exc, args)
        where = f"; traceback in {log}" if log else ""
        print(
            f"internal error: {type(exc).__name__}: {_first_line(exc)}{where} (rerun with --debug to see it)",
            file=sys.stderr,
        )
        return 1
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
