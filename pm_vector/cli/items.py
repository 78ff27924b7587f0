"""``pm-vector items delete|update``: delete items (their erasure reaches every run table) and change
an item's features, label or payload, by id or external id; ``pm-vector attach``, ``sync`` and
``sync-status``: a table of yours as a collection, its queued changes applied, and how far behind."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import numpy as np
import psycopg
import typer

from ..errors import PMVectorError, InvalidInputError
from ._service_common import echo_json, fail
from ._text import printable
from ..db.store.attach import attach_table, sync_rejected, sync_status as _status
from ..db.store.deletes import delete_items
from ..db.store.resync import resync
from ..db.store.sync import sync as _sync
from ..db.store.update import UNSET, update_items
from .failures import describe
from .ingest import read_table_file

items_app = typer.Typer(help="Delete or update items of a collection (erasure reaches every run table).",
                        no_args_is_help=True)


def _read_ids(path: Path, integers: bool) -> list:
    """One id a line (blank lines skipped): integers for --ids, strings for --external-ids."""
    if not path.is_file():
        fail(f"{path}: no such file.")
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{path}: not a readable UTF-8 text file ({e}); write one id a line.")
    vals = [ln for ln in lines if ln]
    if not vals:
        fail(f"{path}: holds no id; write one id a line.")
    if integers:
        bad = [v for v in vals if not v.isdigit()]
        if bad:
            fail(f"{path}: {len(bad)} line(s) are not item ids (positive integers), first {bad[0]!r}; "
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
    if (ids is None) == (external_ids is None):
        fail("give exactly one of --ids FILE and --external-ids FILE.")
    try:
        if ids is not None:
            out = delete_items(name, item_ids=_read_ids(ids, True), missing_ok=missing_ok)
        else:
            out = delete_items(name, external_ids=_read_ids(external_ids, False), missing_ok=missing_ok)
    except PMVectorError as e:
        fail(printable(e))
    if as_json:
        echo_json(out)
        return
    typer.echo(f"deleted {out['deleted']} item(s) of {name!r} in {out['seconds']} s; runs erased: "
               f"{out['runs'] or 'none'}" + (f"; raw KAHM models to refit: {out['kahm_refit_needed']}"
                                             if out["kahm_refit_needed"] else ""))


@items_app.command("update")
def update(name: str = typer.Argument(..., help="The collection."),
           item_id: Optional[int] = typer.Option(None, "--id", help="The item id."),
           external_id: Optional[str] = typer.Option(None, "--external-id", help="The item's external id."),
           features: Optional[Path] = typer.Option(None, "--features", help="A .npy file of the new features "
                                                   "(one row, or a 1-d vector)."),
           label: Optional[int] = typer.Option(None, "--label", help="The new label."),
           payload: Optional[str] = typer.Option(None, "--payload", help="The new payload (JSON; 'null' clears it)."),
           as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Update one item in one transaction: a payload-only change touches no run data; a new feature
    vector or label erases the old item everywhere and places a new one (same external id) in the
    active run, as `embed --new-items` does.

    Example: pm-vector items update docs --external-id doc-17 --payload '{"title": "fixed"}'
    """
    if (item_id is None) == (external_id is None):
        fail("give exactly one of --id N and --external-id S.")
    X = None
    if features is not None:
        X = np.atleast_2d(np.asarray(read_table_file(features, "features"), dtype=np.float64))
    pay = UNSET
    if payload is not None:
        try:
            pay = [json.loads(payload)]
        except ValueError as e:
            fail(f"--payload is not JSON ({e}); quote it, e.g. --payload '{{\"title\": \"x\"}}'.")
    try:
        out = update_items(name, item_ids=None if item_id is None else [item_id],
                           external_ids=None if external_id is None else [external_id], features=X,
                           labels=None if label is None else [label], payloads=pay)
    except PMVectorError as e:
        fail(printable(e))
    if as_json:
        echo_json(out)
        return
    (old, new), = out["item_ids"].items()
    typer.echo(f"updated item {old} of {name!r}" + (f" (now item {new})" if new != old else "") + f" in {out['seconds']} s")


def attach(name: str = typer.Argument(..., help="The new collection's name (with --resync: an attached one)."),
           table: Optional[str] = typer.Option(None, "--table", help="The table, e.g. public.documents."),
           id_column: Optional[str] = typer.Option(None, "--id-column", help="Its key column."),
           vector_column: Optional[str] = typer.Option(None, "--vector-column", help="Its vector(n) column."),
           label_column: Optional[str] = typer.Option(None, "--label-column", help="Its integer label column."),
           payload_column: list[str] = typer.Option([], "--payload-column", help="A column returned as payload "
                                                    "(repeat for more)."),
           max_payload_bytes: Optional[int] = typer.Option(None, "--max-payload-bytes", help="The collection's "
                                                           "payload bound (default 256); rows over it are rejected."),
           resync: bool = typer.Option(False, "--resync", help="Rebuild the attached collection NAME from its "
                                       "table (after DDL marked it broken): its rows replace the items, the "
                                       "items of rows gone are erased, the mark is cleared."),
           as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Make a collection from a table you already have: pm_vector reads the vectors from it (no copy)
    and triggers queue its changes for `pm-vector sync`. Then register an anchor set and embed.

    Example: pm-vector attach docs --table public.documents --id-column id --vector-column embedding
    Example: pm-vector attach docs --resync     (after `pm-vector sync-status docs` says it is broken)
    """
    if resync:
        return _resync(name, as_json, table is not None or id_column is not None or vector_column is not None)
    if table is None or id_column is None or vector_column is None:
        fail("give --table, --id-column and --vector-column (or --resync for an attached collection).")
    try:
        out = attach_table(name, table, id_column, vector_column, label_column, payload_column,
                           max_payload_bytes=max_payload_bytes)
    except PMVectorError as e:
        fail(printable(e))
    if as_json:
        echo_json(out)
        return
    typer.echo(f"attached {printable(table)} as {printable(name)}: {out['items']} rows, {out['skipped']} skipped "
               f"(NULL vector, other dimension or label, payload over the bounds), dim {out['dim']}, labels "
               f"{out['labels']}" + _rejected_lines(out["rejected"]))


def _resync(name: str, as_json: bool, with_columns: bool) -> None:
    if with_columns:
        fail("--resync takes the attached collection's name alone: it rebuilds from the columns it was attached with.")
    try:
        out = resync(name)
    except PMVectorError as e:
        fail(printable(e))
    if as_json:
        echo_json(out)
        return
    typer.echo(f"resynced {name!r}: {out['rows']} row(s) of the table taken again, {out['gone']} gone; ", nl=False)
    _say_sync(out, False)


def sync(name: str = typer.Argument(..., help="The attached collection."),
         every: Optional[float] = typer.Option(None, "--every", min=0.05, max=3600.0,
                                               help="Keep syncing: a pass, then this many seconds, until Ctrl-C "
                                                    "(or --passes). The process keeps the run's items between "
                                                    "passes, which a new `pm-vector sync` reads again."),
         passes: Optional[int] = typer.Option(None, "--passes", min=1, help="With --every: stop after this many."),
         as_json: bool = typer.Option(False, "--json", help="Print one JSON object a pass.")):
    """Apply the queued changes of an attached table (in order, exactly once; a killed sync resumes).
    A change that cannot be applied is rejected (listed with its reason; sync-status counts them) and
    the others are applied. Exits 1 when the sync (with --passes, its last pass) failed.

    Example: pm-vector sync docs
    Example: pm-vector sync docs --every 1     (in a process of its own, beside the service with
    PM_VECTOR_SERVICE_SYNC_INTERVAL_S=0)
    """
    if passes is not None and every is None:
        fail("--passes counts the passes of --every; add --every SECONDS (e.g. --every 1).")
    done = 0
    try:
        while True:
            try:
                out = _sync(name)
            except (InvalidInputError, LookupError) as e:  # (no such collection, not attached): say so, stop
                fail(printable(e))
            except (PMVectorError, psycopg.Error) as e:
                if every is None:
                    fail(printable(describe(e)), 2 if isinstance(e, PMVectorError) else 1)
                # a loop outlives an outage: it says so and tries again at the next pass (the queue waits)
                out = None
                why = printable(describe(e))
                if passes is not None and done + 1 >= passes:  # its last pass failed: so does the command
                    fail(why, 1)
                typer.echo(f"error: {why} (trying again in {every:g} s)", err=True)
            if out is not None:
                _say_sync(out, as_json)
            done += 1
            if every is None or (passes is not None and done >= passes):
                return
            time.sleep(every)
    except KeyboardInterrupt:
        # (a pass cut short is one transaction rolled back: its changes stay queued for the next sync)
        typer.echo(f"stopped after {done} pass(es); a pass cut short left its changes queued.", err=True)


def _say_sync(out: dict, as_json: bool) -> None:
    if as_json:
        echo_json(out)
        return
    typer.echo(f"{out['applied']} change(s): {out['inserted']} new, {out['replaced']} replaced, {out['deleted']} "
               f"deleted, {out['payloads']} payload(s); {len(out['rejected'])} rejected" +
               _rejected_lines(out["rejected"]))


def _rejected_lines(rejected) -> str:
    """The first 20 rejected keys, a line each, escaped (a key or a reason is the table's text)."""
    return "".join(f"\n  rejected {printable(k)}: {printable(r)}" for k, r in list(rejected)[:20]) + (
        f"\n  ... and {len(rejected) - 20} more (pm_vector.db.sync_rejected)" if len(rejected) > 20 else "")


def sync_status(name: Optional[str] = typer.Argument(None, help="An attached collection (default: every one)."),
                as_json: bool = typer.Option(False, "--json", help="Print JSON: one object for NAME, else a list.")):
    """How far behind the sync of attached tables is: per collection, the changes queued and how long
    the oldest has waited (the view pm_vector.attach_status).

    Example: pm-vector sync-status docs
    Example: pm-vector sync-status --json     (every attached collection)
    """
    try:
        out = _status(name)
        listed = sync_rejected(name, limit=21) if name is not None and out["rejected"] else []
    except PMVectorError as e:
        fail(printable(e) + ("" if name is None else " `pm-vector sync-status` lists the attached collections."))
    if as_json:
        echo_json(out)
        return
    rows = [out] if name is not None else out
    if not rows:
        typer.echo("no attached collection (pm-vector attach makes one).")
    for r in rows:
        typer.echo(_status_line(r))
    if listed:
        typer.echo(_rejected_lines([(x["key"], x["reason"]) for x in listed][:20]).lstrip("\n") +
                   ("\n  ... (pm_vector.db.sync_rejected lists them all)" if len(listed) > 20 else ""))


def _status_line(r: dict) -> str:
    """``docs (documents): 1,204 queued, oldest 3.2 s ago`` or ``docs (documents): up to date``, and
    ``; 3 rejected`` when the sync rejected changes, ``; purge pending: 12 deleted, oldest 40.0 s ago``
    while deleted items' rows wait for the merge; a broken collection says so and how to mend it
    (names escaped: :func:`printable`)."""
    head = f"{printable(r['collection'])} ({printable(r['source_table'])})"
    tail = f"; {r['rejected']:,} rejected" if r.get("rejected") else ""
    if r.get("pending_purge"):  # deleted items whose rows wait for the merge (never answered)
        tail += f"; purge pending: {r['pending_purge']:,} deleted, oldest {r['purge_age_s'] or 0:.1f} s ago"
    if r.get("broken"):
        return (f"{head}: BROKEN since {r['broken_at']}: {printable(r['broken'])}; {r['queued']:,} queued{tail} "
                f"(`pm-vector attach {printable(r['collection'])} --resync` rebuilds it)")
    if not r["queued"]:
        return f"{head}: up to date{tail}"
    return f"{head}: {r['queued']:,} queued, oldest {r['lag_s']:.1f} s ago{tail}"
