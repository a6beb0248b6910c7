"""The documentation: the command-line reference is generated from the CLI (every command,
argument and visible option, with its help), and the pages the README links to exist. The
site itself is built by `.ci/run` (`mkdocs build --strict`)."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from orchestrator.cli import app
from orchestrator.cli.reference import markdown

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_has_every_command_and_option():
    text = markdown()
    root = typer.main.get_command(app)

    def walk(cmd, path):
        yield path, cmd
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, f"{path} {name}".strip())

    for path, cmd in walk(root, ""):
        title = f"orchestrator {path}".strip()
        assert f"## `{title}`\n" in text, title
        section = text.split(f"## `{title}`\n", 1)[1].split("\n## `", 1)[0]
        for p in cmd.params:
            if p.param_type_name == "option" and not p.hidden and p.name != "help":
                row = next((ln for ln in section.splitlines() if ln.startswith(f"| `{p.opts[0]}`")), None)
                assert row is not None, (title, p.opts)
                assert " ".join((p.help or "").split()).replace("|", "\\|") in row, (title, p.opts)
    assert "`--max-concurrent`" in text.split("## `orchestrator submit`", 1)[1]


def test_readme_links_reach_the_docs():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(((?:docs/|ARCHITECTURE)[^)#]*)\)", readme)
    assert len(links) >= 10
    for link in links:
        assert (ROOT / link).is_file(), link
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").rglob("*.md"):
        assert str(page.relative_to(ROOT / "docs")) in nav, page  # every page is reachable
