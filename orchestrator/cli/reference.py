"""The command-line reference as Markdown, from the CLI itself: every command's purpose,
usage, arguments, options (with their help and defaults) and examples. The documentation
site generates its reference page from this when it is built (``docs/hooks/cli_reference.py``),
so the page is what ``--help`` prints and cannot fall behind it."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import typer.main

from orchestrator.cli import app


def _walk(cmd: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, cmd
    for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
        yield from _walk(sub, f"{path} {name}".strip())


def _cell(text: str) -> str:
    """Text inside a Markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _param_row(p: Any) -> str | None:
    if getattr(p, "hidden", False) or p.name == "help":
        return None
    if p.param_type_name == "argument":
        name = f"`{(p.metavar or p.name).upper()}`"
        default = ""
    else:
        name = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
        d = p.default
        shown = not (d is None or d is False or p.is_flag or callable(d) or d == () or d == [])
        default = f"`{d}`" if shown else ""
    help_text = getattr(p, "help", None) or ""
    if p.required:
        help_text = (help_text + " (required)").strip()
    return f"| {name} | {_cell(help_text)} | {default} |"


def markdown() -> str:
    """Every command of ``orchestrator``, in the order ``--help`` lists groups, as Markdown."""
    root = typer.main.get_command(app)
    out: list[str] = []
    for path, cmd in _walk(root, ""):
        title = f"orchestrator {path}".strip()
        out.append(f"## `{title}`\n")
        if cmd.help:
            out.append(inspect.cleandoc(cmd.help) + "\n")
        ctx = cmd.context_class(cmd, info_name=title)
        # typer names arguments {sweep} in usage pieces; --help shows them as SWEEP
        pieces = re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), " ".join(cmd.collect_usage_pieces(ctx)))
        out.append(f"```\n{title} {pieces}\n```\n")
        rows = [r for r in map(_param_row, cmd.params) if r is not None]
        if rows:
            out.append("| argument / option | meaning | default |\n|---|---|---|")
            out.extend(rows)
            out.append("")
        if cmd.epilog:
            examples = [ln.strip()[2:] for ln in cmd.epilog.splitlines() if ln.strip().startswith("$ ")]
            if examples:
                out.append("Examples:\n\n```bash\n" + "\n".join(examples) + "\n```\n")
    return "\n".join(out)
