"""A command's help as its module declares it, read from the module's source without importing it.

The group's ``--help`` lists every command with the first sentence of its help. Importing a command
to ask it would import what the command needs (the SDK, numpy, the tokenizer's libraries): most of
a second for the whole list. The help a command shows is written in its source, in the
``@click.command(...)`` or ``@click.group(...)`` decorator of the function that makes it (``help=``,
``short_help=``, ``hidden=``, ``deprecated=``) or the function's docstring; :func:`declared_command`
reads those with :mod:`ast` and gives them to a plain :class:`click.Command`, so the list is made by
click's own rules from the same text. Anything it cannot read as written (help computed at import
time, another decorator, no source file) is ``None``, and the caller imports the command instead.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import click

# The keywords of click's decorators that change how a command is listed, read when they are literals.
LISTING_KEYWORDS = ("help", "short_help", "hidden", "deprecated")
DECORATORS = ("command", "group")


def _source_of(module: str) -> str | None:
    """The text of ``module``'s source file, found without importing the module (its package is)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    if origin is None or not origin.endswith(".py"):
        return None
    try:
        return Path(origin).read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _click_decorator(function: ast.FunctionDef) -> ast.Call | None:
    """The ``@click.command(...)`` or ``@click.group(...)`` call decorating ``function``, if any."""
    for decorator in function.decorator_list:
        if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                and decorator.func.attr in DECORATORS and isinstance(decorator.func.value, ast.Name)
                and decorator.func.value.id == "click"):
            return decorator
    return None


def _top_level_function(source: str, name: str) -> ast.FunctionDef | None:
    """The module-level ``def name`` of ``source``, if it has one."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    return next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name), None)


def _definition(source: str, name: str) -> ast.FunctionDef | None:
    """The module-level ``def name`` of ``source`` with its decorators. Only the lines of that
    definition are parsed (the decorators above the ``def`` up to a blank or comment line, the body
    up to the next line that starts at the margin): a whole command module takes ten times as long.
    Lines that do not parse alone, or parse as something else, are read from the whole module."""
    lines = source.splitlines()
    header = re.compile(rf"def {re.escape(name)}\b")
    found = next((index for index, line in enumerate(lines) if header.match(line)), None)
    if found is None:
        return None
    start = found
    while start > 0 and lines[start - 1].strip() and not lines[start - 1].startswith("#"):
        start -= 1
    end = found + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t)#"):
        end += 1
    part = _top_level_function("\n".join(lines[start:end]), name)
    return part if part is not None else _top_level_function(source, name)


def declared_command(target: str, name: str) -> click.Command | None:
    """A callback-less :class:`click.Command` named ``name`` with the help, short help, hidden and
    deprecated flags that the function ``target`` (``"module:attribute"``) is declared with; ``None``
    when the source does not say them as literals."""
    module, _, attribute = target.partition(":")
    source = _source_of(module)
    if source is None:
        return None
    function = _definition(source, attribute)
    decorator = _click_decorator(function) if function is not None else None
    if function is None or decorator is None:
        return None
    declared: dict[str, object] = {}
    for keyword in decorator.keywords:
        if keyword.arg is None:  # **options: what they hold is not written here
            return None
        if keyword.arg in LISTING_KEYWORDS:
            try:
                declared[keyword.arg] = ast.literal_eval(keyword.value)
            except ValueError:
                return None
    written = declared.get("help")
    help_text = ast.get_docstring(function, clean=False) if written is None else written  # click's rule
    short_help, hidden, deprecated = (declared.get("short_help"), declared.get("hidden", False),
                                      declared.get("deprecated", False))
    if not (isinstance(help_text, (str, type(None))) and isinstance(short_help, (str, type(None)))
            and isinstance(hidden, bool) and isinstance(deprecated, (bool, str))):
        return None
    return click.Command(name, help=help_text, short_help=short_help, hidden=hidden, deprecated=deprecated)
