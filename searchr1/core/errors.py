"""The base of every error that is the user's to fix: a file, a flag or a setting we cannot take.

An error deriving from :class:`UserError` carries one line that names the thing at fault (the
file and line, the flag, the field). The command layer prints that line and exits (``exit_code``:
1, or 2 for a usage error such as a flag's value) instead of a traceback, so a new kind of
refusal only has to derive from this class to be reported that way.

This module is pure (no imports): the core raises these errors too.
"""

from __future__ import annotations


class UserError(Exception):
    """Input we cannot take; ``str(error)`` is the one line that says which and why."""

    exit_code = 1


class UsageError(UserError):
    """A flag or a setting holds a value its rule refuses (the shell's usage exit code, 2)."""

    exit_code = 2
