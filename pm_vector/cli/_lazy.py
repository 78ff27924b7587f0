"""Command groups whose commands live in modules imported only when one of them runs.

A command module of ``pm_vector/cli/`` imports what it needs at its top (the database layer, the
client, the benchmarks: torch, sklearn, psycopg, ...); ``pm-vector --help`` and ``pm-vector db
--help`` must not pay for all of them. :func:`lazy_group` makes a typer group class from a table
``name -> (module, attribute)``: listing the commands (``--help``) reads each one's help from its
module's source (:mod:`ast`, nothing imported); running one (or asking for its own ``--help``)
imports its module then. The attribute is a command function or a ``typer.Typer`` (a sub-group,
or the app a command was registered on under ``name``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
from functools import lru_cache

import click
import typer
from typer.core import TyperCommand, TyperGroup

#: a lazy table: command name -> (module, attribute)
Table = dict[str, tuple[str, str]]


@lru_cache(maxsize=None)
def _module_tree(module: str) -> ast.Module:
    spec = importlib.util.find_spec(module)
    with open(spec.origin, encoding="utf-8") as f:
        return ast.parse(f.read())


def source_help(module: str, attr: str, name: str) -> str:
    """The help of command ``name`` as its module's source gives it, without importing it: the
    docstring of function ``attr``, the ``help=`` of ``attr = typer.Typer(help=...)``, or the
    docstring of the function registered as ``@attr.command("name")``."""
    tree = _module_tree(module)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == attr:
                return inspect.cleandoc(ast.get_docstring(node) or "")
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command" \
                        and isinstance(d.func.value, ast.Name) and d.func.value.id == attr and d.args \
                        and isinstance(d.args[0], ast.Constant) and d.args[0].value == name:
                    return inspect.cleandoc(ast.get_docstring(node) or "")
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets) \
                and isinstance(node.value, ast.Call):
            for kw in node.value.keywords:
                if kw.arg == "help" and isinstance(kw.value, ast.Constant):
                    return kw.value.value
    return ""


def load(name: str, module: str, attr: str) -> click.Command:
    """The click command ``name`` from ``module.attr`` (the module imported now)."""
    obj = getattr(importlib.import_module(module), attr)
    if isinstance(obj, typer.Typer):
        group = typer.main.get_group(obj)  # as a sub-group: no completion options of its own
        return group.commands.get(name, group)  # a command registered on a shared app, or the group
    app = typer.Typer(add_completion=False)
    app.command(name)(obj)
    return typer.main.get_command(app)


def lazy_group(table: Table) -> type[TyperGroup]:
    """A typer group class whose commands of ``table`` are imported when run (module doc); the
    commands registered on the group itself come first."""

    class LazyGroup(TyperGroup):
        lazy = table

        def list_commands(self, ctx: click.Context) -> list[str]:
            return list(self.commands) + [n for n in self.lazy if n not in self.commands]

        def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
            if cmd_name in self.commands or cmd_name not in self.lazy:
                return super().get_command(ctx, cmd_name)
            if getattr(self, "_listing", False):  # --help's list: the help from the source
                module, attr = self.lazy[cmd_name]
                return TyperCommand(cmd_name, help=source_help(module, attr, cmd_name))
            return load(cmd_name, *self.lazy[cmd_name])

        def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
            self._listing = True
            try:
                super().format_help(ctx, formatter)
            finally:
                self._listing = False

    return LazyGroup
