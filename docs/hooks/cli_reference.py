"""mkdocs hook: the command-line reference page is generated from the CLI when the site is
built (``orchestrator.cli.reference``), so it never falls behind ``--help``."""

from __future__ import annotations

import sys
from pathlib import Path

MARKER = "<!-- cli-reference -->"
PAGE = "reference/cli.md"


def on_config(config, **kwargs):
    # Document this checkout's CLI, whatever else is installed.
    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def on_page_markdown(markdown, page, config, files, **kwargs):
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE}: the marker {MARKER} is missing")
    from orchestrator.cli.reference import markdown as cli_markdown

    return markdown.replace(MARKER, cli_markdown())
