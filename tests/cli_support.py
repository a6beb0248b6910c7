"""Running the CLI in-process from a test: what the command returned and printed."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    """``main(argv)`` (each argument as text, so paths can be given as they are): the exit
    code, stdout and stderr, with the capture cleared for the next call."""
    code = main([str(a) for a in argv])
    got = capsys.readouterr()
    return code, got.out, got.err
