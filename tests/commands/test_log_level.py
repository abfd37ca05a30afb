"""The group's ``-v/--verbose`` and ``--log-level``: what a command logs under ``searchr1`` is shown
on standard error from the chosen level on; without either, Python's default (warnings shown,
information such as a search's retry and back-off wait hidden) is left as it is."""

from __future__ import annotations

import subprocess
import sys

import pytest

# A process that registers a command logging one record at each level under the logger the
# search retries use, then runs the group with the arguments it was given.
PROBE = """
import logging, sys
import click
from searchr1.commands import main as group

@click.command()
def probe():
    log = logging.getLogger("searchr1.search")
    log.debug("DEBUG-LINE")
    log.info("INFO-LINE: wikipedia: HTTP 429; retry 1/3 in 0.50 s")
    log.warning("WARNING-LINE api_key=canary-0123456789")
    log.error("ERROR-LINE")
    print("done")

group.COMMANDS["probe"] = "__main__:probe"
group.main([*sys.argv[1:], "probe"], prog_name="searchr1")
"""
LEVELS = ("DEBUG-LINE", "INFO-LINE", "WARNING-LINE", "ERROR-LINE")


def run(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE, *flags], capture_output=True, text=True, timeout=60)


def shown(*flags: str) -> list[str]:
    result = run(*flags)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"  # log records go to standard error only
    return [level for level in LEVELS if level in result.stderr]


@pytest.mark.parametrize(("flags", "expected"), [
    ((), LEVELS[2:]),  # Python's default: warnings and errors
    (("-v",), LEVELS[1:]),
    (("--verbose", "--verbose"), LEVELS),
    (("-vvv",), LEVELS),  # no level below debug
    (("--log-level", "debug"), LEVELS),
    (("--log-level", "info"), LEVELS[1:]),
    (("--log-level", "warning"), LEVELS[2:]),
    (("--log-level", "error"), LEVELS[3:]),
])
def test_a_commands_records_are_shown_from_the_chosen_level_on(flags, expected):
    assert shown(*flags) == list(expected)


def test_a_shown_record_is_the_message_with_credentials_masked():
    result = run("-v")
    lines = result.stderr.splitlines()
    assert "INFO-LINE: wikipedia: HTTP 429; retry 1/3 in 0.50 s" in lines
    assert "canary" not in result.stderr and "WARNING-LINE [redacted]" in lines


def test_both_flags_at_once_are_refused_in_one_line():
    result = run("-v", "--log-level", "debug")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "Error: -v/--verbose and --log-level both choose the log level; give one of them" in result.stderr


def test_an_unknown_level_is_refused_naming_the_flag():
    result = run("--log-level", "loud")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "Invalid value for '--log-level'" in result.stderr
