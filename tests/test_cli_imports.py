"""What every ``orchestrator`` command pays before it works: the CLI module is imported by
each of them (``status``, ``cancel``, ``sql``, ``--help``, a typo), so it must not import the
dashboard server, the analysis stack, torch or Ray; each command imports what it uses."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("orchestrator.ui.app", "orchestrator.ui.offload", "pandas", "numpy", "torch", "ray", "scipy")


def _loaded(code: str) -> list[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_cli_module_imports_no_server_and_no_analysis_stack():
    assert _loaded("import orchestrator.cli") == []


def test_the_ui_commands_timeout_is_the_servers():
    # The `ui` command shows the request timeout without importing the server; the server
    # serves with the same value when none is given.
    import inspect

    from orchestrator.cli import ui_cmds
    from orchestrator.ui import app

    assert inspect.signature(app.serve).parameters["request_timeout_s"].default == ui_cmds.REQUEST_TIMEOUT_S
    assert inspect.signature(app.create_app).parameters["request_timeout_s"].default == ui_cmds.REQUEST_TIMEOUT_S
    # The probe itself can fail: importing the server does load pandas.
    assert "pandas" in _loaded("import orchestrator.ui.app")
