"""Console entry point: ``orchestrator``."""
from __future__ import annotations

import importlib
import pkgutil
import sys

from orchestrator.cli.app import app
from orchestrator.cli.help import polish
from orchestrator.errors import UserError

# Every ``*_cmds`` module in this package registers its commands on import (one module per
# command family: run_cmds, cells_cmds, tasks_cmds, analysis_cmds, ...).
for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.endswith("_cmds")):
    importlib.import_module(f"orchestrator.cli.{_mod}")
polish(app)  # examples and shared option texts on every command (orchestrator.cli.help)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors become one line on stderr and exit code 2."""
    try:
        rv = app(args=argv, prog_name="orchestrator", standalone_mode=False)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except SystemExit as exc:  # typer/click exits (--help, usage errors)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return code
    except Exception as exc:  # click usage errors in standalone_mode=False
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            return 2
        if isinstance(exc, click.exceptions.Abort):
            return 1
        raise
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
