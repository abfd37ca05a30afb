"""The start-up checks of ``train`` and ``eval`` that need no tokenizer, reported together.

A command that cannot start for several reasons (no data, a search key missing, no PyTRIO key,
PyTRIO refusing connections, the run directory taken) says all of them in one message, one
line each, within a moment of starting: every check here reads a file, the environment or one
TCP connect, and the tokenizer (seconds) is loaded only once they have all passed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import click

from searchr1.core.errors import UserError

if TYPE_CHECKING:
    from searchr1.core.types import SearchExample

T = TypeVar("T")
P = ParamSpec("P")


class MissingPrerequisites(UserError):
    """Several things a command needs are missing or wrong; the message lists them, a line
    each. ``exit_code`` is the first one's."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Prerequisites:
    """Runs checks, keeps the line (and exit code) of each that fails, and raises them all at
    once with :meth:`raise_failures`."""

    def __init__(self) -> None:
        self._problems: list[tuple[str, int]] = []

    def check(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
        """``function(*args, **kwargs)``; when it refuses (a :class:`UserError`, a click
        exception or a missing file), its line is kept and None is returned."""
        try:
            return function(*args, **kwargs)
        except UserError as error:
            self.add(str(error), error.exit_code)
        except click.ClickException as error:
            self.add(error.format_message(), error.exit_code)
        except FileNotFoundError as error:
            self.add(str(error))
        return None

    def add(self, line: str, exit_code: int = 1) -> None:
        """Keep one problem (a line already kept is not repeated: two checks may need one key)."""
        if all(line != kept for kept, _ in self._problems):
            self._problems.append((line, exit_code))

    @property
    def lines(self) -> list[str]:
        return [line for line, _ in self._problems]

    def raise_failures(self, what: str) -> None:
        """Nothing when every check passed. Otherwise one error listing every problem, a line
        each, with the exit code of the first (the one that, checked alone, would have stopped
        the command first): 2 for a usage error, else 1. ``what`` names what cannot start."""
        if not self._problems:
            return
        from searchr1.basics.wording import plural

        lines = self.lines
        message = lines[0] if len(lines) == 1 else (
            f"{plural(len(lines), 'problem')} to fix before {what} can start:\n"
            + "\n".join("  - " + line.replace("\n", "\n    ") for line in lines))
        raise MissingPrerequisites(message, self._problems[0][1])


def check_examples_file(path: Path, *, what: str, missing_hint: str = "",
                        empty: str | None = None) -> SearchExample:
    """The first example of a data file that exists and can be read (one line is read; the whole
    file is read, and every row checked, once the start-up checks have passed)."""
    from searchr1.data.dataset import DataError, first_example

    if not path.is_file():
        problem = "is not a file" if path.exists() else "does not exist"
        raise DataError(f"{what} {path} {problem}{missing_hint}")
    try:
        first = first_example(path)
    except OSError as error:
        raise DataError(f"cannot read {what} {path}: {error.strerror or error}") from None
    if first is None:
        raise DataError(empty or f"{what} {path} holds no examples")
    return first


def check_pytrio(checks: Prerequisites) -> None:
    """What a live run needs of PyTRIO before its tokenizer is worth loading: a key (the
    environment or ``trio login``'s profile), and a base URL whose host does not refuse the
    connection (one TCP connect, waited for at most a moment; an answer that does not come in
    time is left to the connection itself, with its own deadline)."""
    from searchr1.runtime.connect import configured_base_url, refused_within
    from searchr1.wiring.services import require_pytrio_key
    from searchr1.basics.secrets import redact_url

    checks.check(require_pytrio_key)
    try:
        url = configured_base_url()
    except Exception:  # noqa: BLE001 - a profile the SDK cannot read: the connection itself says why
        return
    reason = refused_within(url)
    if reason is not None:
        checks.add(f"cannot connect to PyTRIO at {redact_url(url)}: {reason}; check PYTRIO_BASE_URL and that "
                   "the service is running (or use --offline to run against the offline twin)")
