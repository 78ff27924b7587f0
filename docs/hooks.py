"""MkDocs hooks: what the site builds from the code itself, so that it cannot go stale.

* ``reference/cli.md``: the marker below is replaced by the help of every ``pm-vector`` command,
  rendered from the typer application (``pm_vector.cli.app``) by typer's own Markdown writer.
* ``figures/*.png``: the plots the benchmarks write under ``pm_vector/bench/figures/`` are served
  from there (no copy in ``docs/`` to fall behind).
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

CLI_MARKER = "<!-- cli-reference -->"
ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "pm_vector" / "bench" / "figures"


def cli_markdown() -> str:
    """Every command's help as Markdown, headings below the page's title."""
    import click
    import typer
    import typer.cli

    from pm_vector.cli import app

    command = typer.main.get_command(app)
    ctx = click.Context(command, info_name="pm-vector")
    text = typer.cli.get_docs_for_click(obj=command, ctx=ctx, name="pm-vector", title="pm-vector")
    # one level down: the page has its own title
    text = re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", text, flags=re.M)
    return _escape_brackets(text)


def _escape_brackets(text: str) -> str:
    """Help text is prose, not Markdown: ``settings['a']['b']`` must not read as a reference link.
    Brackets outside code spans and fenced blocks are escaped."""
    out, fence = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            parts = line.split("`")
            parts[::2] = [p.replace("[", "\\[").replace("]", "\\]") for p in parts[::2]]
            line = "`".join(parts)
        out.append(line)
    return "\n".join(out)


def on_files(files, config):
    for png in sorted(FIGURES.glob("*.png")):
        files.append(File.generated(config, f"figures/{png.name}", abs_src_path=str(png)))
    return files


def on_page_markdown(markdown, page, config, files):
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_markdown())
    return markdown
