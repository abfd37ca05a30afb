"""Showing the package's log records: from the chosen level, on the standard error of the moment,
credentials masked; the logger is left as it was found."""

from __future__ import annotations

import logging

from searchr1.run.log_output import DEFAULT_LOG_LEVEL, PACKAGE_LOGGER, LogLevel, more_verbose, showing_logs


def test_each_level_is_the_logging_level_of_its_name_and_more_verbose_stops_at_debug():
    assert [level.number for level in LogLevel] == [logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR]
    assert DEFAULT_LOG_LEVEL.number == logging.getLogger().getEffectiveLevel() == logging.WARNING  # Python's own
    assert more_verbose(LogLevel.WARNING, 1) is LogLevel.INFO
    assert more_verbose(LogLevel.ERROR, 9) is LogLevel.DEBUG
    assert more_verbose(LogLevel.INFO, 0) is LogLevel.INFO


def test_records_are_shown_from_the_level_on_and_the_logger_is_put_back(capsys):
    package = logging.getLogger(PACKAGE_LOGGER)
    level, handlers = package.level, list(package.handlers)
    child = logging.getLogger("searchr1.search")
    with showing_logs(LogLevel.INFO):
        child.debug("hidden")
        child.info("retry 1/3 in %.2f s", 0.5)
        child.warning("Authorization: Bearer abcdef123456")
    assert capsys.readouterr().err.splitlines() == ["retry 1/3 in 0.50 s", "Authorization: [redacted]"]
    assert package.level == level and package.handlers == handlers
