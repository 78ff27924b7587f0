"""``pm-vector items delete|update``: delete items (their erasure reaches every run table) and change
an item's features, label or payload, by id or external id."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import PMVectorError
from ._service_common import _echo_json, _fail

items_app = typer.Typer(help="Delete or update items of a collection (erasure reaches every run table).",
                        no_args_is_help=True)


def _read_ids(path: Path, integers: bool) -> list:
    """One id a line (blank lines skipped): integers for --ids, strings for --external-ids."""
    if not path.is_file():
        _fail(f"{path}: no such file.")
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        _fail(f"{path}: not a readable UTF-8 text file ({e}); write one id a line.")
    vals = [ln for ln in lines if ln]
    if not vals:
        _fail(f"{path}: holds no id; write one id a line.")
    if integers:
        bad = [v for v in vals if not v.isdigit()]
        if bad:
            _fail(f"{path}: {len(bad)} line(s) are not item ids (positive integers), first {bad[0]!r}; "
                  "use --external-ids for your own ids.")
        return [int(v) for v in vals]
    return vals


@items_app.command("delete")
def delete(name: str = typer.Argument(..., help="The collection."),
           ids: Optional[Path] = typer.Option(None, "--ids", help="A text file of item ids, one a line."),
           external_ids: Optional[Path] = typer.Option(None, "--external-ids",
                                                       help="A text file of external ids, one a line."),
           missing_ok: bool = typer.Option(False, "--missing-ok", help="Delete the ids that exist, skip the others."),
           as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Delete items and every row derived from them (active run, kept runs, shards, KAHM scores), in
    one transaction. Raw KAHM models fit on them stop serving until refit.

    Example: pm-vector items delete docs --external-ids erase.txt
    """
    from ..db.store.erase import delete_items

    if (ids is None) == (external_ids is None):
        _fail("give exactly one of --ids FILE and --external-ids FILE.")
    try:
        if ids is not None:
            out = delete_items(name, item_ids=_read_ids(ids, True), missing_ok=missing_ok)
        else:
            out = delete_items(name, external_ids=_read_ids(external_ids, False), missing_ok=missing_ok)
    except PMVectorError as e:
        _fail(str(e))
    if as_json:
        _echo_json(out)
        return
    typer.echo(f"deleted {out['deleted']} item(s) of {name!r} in {out['seconds']} s; runs erased: "
               f"{out['runs'] or 'none'}" + (f"; raw KAHM models to refit: {out['kahm_refit_needed']}"
                                             if out["kahm_refit_needed"] else ""))
