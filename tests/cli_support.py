"""Helpers for tests that walk the command-line interface."""

from __future__ import annotations

from collections.abc import Iterator

import click


def command_paths(group: click.Group, above: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """The group itself and every command and subcommand below it, by the words that reach it."""
    if not above:
        yield (), group
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        yield (*above, name), command
        if isinstance(command, click.Group):
            yield from command_paths(command, (*above, name))
