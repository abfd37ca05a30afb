"""Where the package's log messages go: standard error, from the level the user chose.

Every module logs under ``searchr1`` (``searchr1.search``'s retries and back-off waits at INFO,
its failures at WARNING; ``searchr1.core.rollout``'s sampling retries). Python shows a
logger's WARNING and above on standard error, as the bare message, when nothing is configured:
that is :data:`DEFAULT_LOG_LEVEL`, and a command run without a chosen level keeps it. A chosen
level (:func:`showing_logs`) sets the ``searchr1`` logger's level and prints each of its
records, as the bare message with anything that looks like a credential masked
(:func:`searchr1.basics.secrets.redact`), to the standard error of the moment; other libraries'
loggers are left as they are.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum

from searchr1.basics.secrets import redact

PACKAGE_LOGGER = "searchr1"


class LogLevel(str, Enum):
    """The levels a user can choose, most verbose first."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def number(self) -> int:
        """The :mod:`logging` level of the same name."""
        return int(getattr(logging, self.name))


DEFAULT_LOG_LEVEL = LogLevel.WARNING  # what Python shows of a logger with nothing configured


def more_verbose(level: LogLevel, steps: int) -> LogLevel:
    """The level ``steps`` places more verbose than ``level`` (at most :attr:`LogLevel.DEBUG`)."""
    order = list(LogLevel)
    return order[max(0, order.index(level) - steps)]


class RedactingFormatter(logging.Formatter):
    """The bare message (and a traceback, if the record has one), credential-looking spans masked."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class StderrHandler(logging.Handler):
    """Writes each record to ``sys.stderr`` as it is when the record is emitted (a command's
    standard error, captured or not), a line each."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: a failing handler never stops the program
            self.handleError(record)


@contextmanager
def showing_logs(level: LogLevel) -> Iterator[None]:
    """For the block, the package's records at ``level`` and above are printed on standard error;
    the logger's level and handlers are put back afterwards."""
    logger = logging.getLogger(PACKAGE_LOGGER)
    handler = StderrHandler(level.number)
    handler.setFormatter(RedactingFormatter("%(message)s"))
    before = logger.level
    logger.setLevel(level.number)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
