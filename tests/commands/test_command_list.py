"""``--help`` lists the commands without importing them: each one's line is made by click from the
help its source declares (:mod:`searchr1.commands.declared_help`), the same line the command gives
once imported, and the list costs at most twice a bare ``--version``, measured side by side."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest

import searchr1
from searchr1.commands.declared_help import declared_command
from searchr1.commands.main import COMMANDS, main

CHECKOUT_CLI = Path(searchr1.__file__).resolve().parent.parent / "cli.py"
RUNS = 7  # of each command, interleaved


def imported(name: str) -> click.Command:
    command = main.get_command(click.Context(main), name)
    assert command is not None
    return command


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_line_read_from_a_commands_source_is_the_line_the_imported_command_gives(name):
    declared = declared_command(COMMANDS[name], name)
    assert declared is not None, (f"{COMMANDS[name]}: its help is not written as literals in its click decorator "
                                  "or docstring, so `--help` imports it to list it")
    command = imported(name)
    assert declared.get_short_help_str(limit=sys.maxsize) == command.get_short_help_str(limit=sys.maxsize)
    assert declared.hidden == command.hidden


def test_a_command_whose_help_is_not_written_in_its_source_is_imported_to_be_listed(tmp_path, monkeypatch):
    (tmp_path / "computed_help_probe.py").write_text(
        "import click\nHELP = 'Made ' + 'at import.'\n\n\n@click.command(help=HELP)\ndef probe():\n    pass\n", "utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert declared_command("computed_help_probe:probe", "probe") is None
    monkeypatch.setitem(COMMANDS, "probe", "computed_help_probe:probe")
    listed = main.listed_command(click.Context(main), "probe")
    assert listed is not None and listed.get_short_help_str() == "Made at import."


def test_the_list_of_commands_imports_none_of_them():
    probe = ("import sys\n"
             "from searchr1.commands.main import COMMANDS, main\n"
             "try:\n"
             "    main(['--help'], prog_name='searchr1')\n"
             "except SystemExit:\n"
             "    pass\n"
             "modules = {target.split(':')[0] for target in COMMANDS.values()}\n"
             "print('IMPORTED', *sorted(modules & set(sys.modules)))\n")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    listed = [line for line in shown.stdout.splitlines() if line.startswith("IMPORTED")]
    assert listed == ["IMPORTED"], listed
    assert all(f"  {name} " in shown.stdout for name in COMMANDS)


def _seconds(*arguments: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, str(CHECKOUT_CLI), *arguments], capture_output=True, timeout=60, check=True)
    return time.perf_counter() - start


def test_help_takes_at_most_twice_as_long_as_version_side_by_side():
    """The ratio of the medians of cold runs, interleaved so that a busy moment of the machine
    falls on both; one warm-up run of each first (the bytecode caches)."""
    _seconds("--version"), _seconds("--help")
    version, listing = [], []
    for _ in range(RUNS):
        version.append(_seconds("--version"))
        listing.append(_seconds("--help"))
    ratio = statistics.median(listing) / statistics.median(version)
    assert ratio <= 2.0, f"--help {statistics.median(listing):.3f} s, --version {statistics.median(version):.3f} s"
