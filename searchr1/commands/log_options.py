"""``-v/--verbose`` and ``--log-level``: how much of what the program logs is shown (the group's own
options, given before the command: ``%(prog)s -v train ...``). The levels and the default are
:mod:`searchr1.run.log_output`'s."""

from __future__ import annotations

from collections.abc import Callable

import click

from searchr1.commands.settings_options import F
from searchr1.run.log_output import DEFAULT_LOG_LEVEL, LogLevel, more_verbose


def log_level_options() -> Callable[[F], F]:
    """The two flags: ``-v`` (repeatable) and ``--log-level LEVEL``; the command's callback gets
    ``verbose`` (a count) and ``log_level`` (a level's name, or None)."""
    once, twice = more_verbose(DEFAULT_LOG_LEVEL, 1), more_verbose(DEFAULT_LOG_LEVEL, 2)
    verbose = click.option(
        "-v", "--verbose", count=True,
        help=f"Show more of what the program logs: -v from {once.value} on (each search retry and back-off "
             f"wait), -vv from {twice.value} on.")
    level = click.option(
        "--log-level", type=click.Choice([level.value for level in LogLevel]), default=None, metavar="LEVEL",
        help=f"Show the program's log messages from LEVEL on ({', '.join(level.value for level in LogLevel)}) "
             f"[default: {DEFAULT_LOG_LEVEL.value}].")

    def decorate(command: F) -> F:
        return verbose(level(command))

    return decorate


def chosen_log_level(verbose: int, log_level: str | None) -> LogLevel | None:
    """The level the flags choose; None when neither is given (Python's default shows
    :data:`DEFAULT_LOG_LEVEL` and above). Both at once is a usage error."""
    if verbose and log_level is not None:
        raise click.UsageError("-v/--verbose and --log-level both choose the log level; give one of them")
    if log_level is not None:
        return LogLevel(log_level)
    return more_verbose(DEFAULT_LOG_LEVEL, verbose) if verbose else None
