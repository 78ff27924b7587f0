"""``pm-vector keys create | list | revoke``: the HTTP service's API keys (stored hashed; a key is
shown once, when it is made)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..errors import PMVectorError
from ._service_common import echo_json, fail, err
from ..service.auth import create_key, list_keys, revoke_key

keys_app = typer.Typer(help="API keys of the HTTP service (stored hashed; the key is shown once).",
                       no_args_is_help=True)


@keys_app.command("create")
def keys_create(name: str = typer.Option(..., help="Who or what the key is for."),
                role: str = typer.Option("query", help="query (collections, anchor, resolve, KAHM distances) or "
                                                       "admin (also items, jobs, keys)."),
                collection: Optional[list[str]] = typer.Option(None, "--collection", help="A collection the key may "
                                                               "use (repeat; default: every collection)."),
                rate_per_minute: Optional[int] = typer.Option(None, help="The key's own request limit per minute "
                                                              "(default: the service's)."),
                as_json: bool = typer.Option(False, "--json", help="Print the key record as JSON.")):
    """Create an API key and print it (only this once). Keys are query keys unless --role admin.

    Example: pm-vector keys create --name alice-laptop --collection digits
    """
    try:
        rec = create_key(name, role=role, collections=collection or None, rate_per_minute=rate_per_minute)
    except PMVectorError as e:
        fail(str(e))
    if as_json:
        echo_json(rec)
        return
    scope = ", ".join(rec["collections"]) if rec["collections"] else "every collection"
    err.print(f"created {rec['role']} key {rec['id']} ({rec['name']}; {scope}); store it now, it is not shown again:")
    typer.echo(rec["key"])


@keys_app.command("list")
def keys_list(as_json: bool = typer.Option(False, "--json", help="Print JSON."),
              all_keys: bool = typer.Option(True, "--all/--active", help="Include revoked keys.")):
    """List API keys (id, name, prefix, role, collections, rate, created, revoked) -- never the keys themselves.

    Example: pm-vector keys list --active
    """
    try:
        rows = list_keys(include_revoked=all_keys)
    except PMVectorError as e:
        fail(str(e))
    if as_json:
        echo_json(rows)
        return
    t = Table(title="API keys")
    for c in ("id", "name", "prefix", "role", "collections", "rate/min", "created", "revoked"):
        t.add_column(c)
    for r in rows:
        t.add_row(str(r["id"]), r["name"], r["prefix"], r["role"], ", ".join(r["collections"] or ["*"]),
                  str(r["rate_per_minute"] or "-"), str(r["created_at"])[:19], str(r["revoked_at"] or "")[:19])
    Console().print(t)


@keys_app.command("revoke")
def keys_revoke(key: str = typer.Argument(..., help="The key's id or prefix (pmv_xxxxxxxx)."),
                as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """Revoke an API key; requests with it are refused from now on.

    Example: pm-vector keys revoke 3
    """
    try:
        rec = revoke_key(key)
    except PMVectorError as e:
        fail(str(e))
    if as_json:
        echo_json(rec)
    else:
        err.print(f"revoked key {rec['id']} ({rec['name']}, {rec['prefix']}).")
