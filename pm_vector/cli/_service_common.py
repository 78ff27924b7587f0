"""What the service's commands share (``pm-vector serve | keys | query | demo | ingest`` and
``pm-vector bench load``): the error console, a clear failure (exit 2, no traceback), JSON
output of answers that hold numpy values, comma-separated epsilons, and a progress bar."""

from __future__ import annotations

import json

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

err = Console(stderr=True)


def fail(msg: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {escape(msg)}")  # a message (a server's, say) is text, not markup
    raise typer.Exit(code)


def _json_value(v):
    """What json cannot write itself: numpy arrays and scalars (a msgpack answer's) as lists and
    numbers, anything else as its str."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return str(v)


def echo_json(obj) -> None:
    typer.echo(json.dumps(obj, default=_json_value))


def parse_floats(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated numbers, e.g. 0.5,1,4; got {text!r}") from None
    if not vals or any(not v > 0 for v in vals):
        raise typer.BadParameter("epsilons must be positive numbers, e.g. 0.5,1,4")
    return vals


def progress_bar(disable: bool) -> Progress:
    return Progress(TextColumn("{task.description:<22}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=err, transient=True, disable=disable)
