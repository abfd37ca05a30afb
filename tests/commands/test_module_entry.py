"""``python -m searchr1`` runs the same command group as ``python cli.py`` and the ``searchr1``
script, and the command lines it prints start the way it was started."""

from __future__ import annotations

import re
import subprocess
import sys

from click.testing import CliRunner

from searchr1.cli import main


def run_module(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "searchr1", *arguments], capture_output=True, text=True, timeout=60)


def words(text: str) -> list[str]:
    """The words of a help text whatever its width: a word a line break split at its hyphen is one."""
    return re.sub(r"-\n\s*", "-", text).split()


def test_python_dash_m_searchr1_lists_the_same_commands_as_the_group():
    shown = run_module("--help")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == "Usage: python -m searchr1 [OPTIONS] COMMAND [ARGS]..."
    expected = CliRunner().invoke(main, ["--help"], prog_name="python -m searchr1")
    assert expected.exit_code == 0
    assert words(shown.stdout) == words(expected.output)  # the same words in order (wrapped to another width)


def test_python_dash_m_searchr1_runs_a_command_and_names_itself_in_its_hints():
    shown = run_module("export", "--help")
    assert shown.returncode == 0, shown.stderr
    assert "python -m searchr1 export runs/<run-name> --out exported/<run-name>" in shown.stdout
    refused = run_module("trian")
    assert refused.returncode == 2
    assert "Try 'python -m searchr1 --help' for help." in refused.stderr
