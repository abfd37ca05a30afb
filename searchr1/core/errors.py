"""The base of every error that is the user's to fix: a file, a flag or a setting we cannot take.
Its one line names the thing at fault (file and line, flag, field); the command layer prints it and
exits with ``exit_code`` (1, or 2 for a usage error such as a flag's value) instead of a traceback,
so a new kind of refusal only has to derive from :class:`UserError`. Pure (no imports): the core
raises these errors too."""

from __future__ import annotations


class UserError(Exception):
    """Input we cannot take; ``str(error)`` is the one line that says which and why."""

    exit_code = 1


class UsageError(UserError):
    """A flag or a setting holds a value its rule refuses (the shell's usage exit code, 2)."""

    exit_code = 2
