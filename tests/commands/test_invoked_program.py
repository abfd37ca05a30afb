"""Hints, examples and help name the program the way it was started: ``searchr1 …`` from the
installed script, ``python cli.py …`` from a checkout, and each printed command runs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from cli_support import command_paths

from searchr1.cli import COMMANDS, main
from searchr1.basics import invocation

REPO = Path(__file__).resolve().parents[2]
CHECKOUT = re.compile(r"\bcli\.py\b")
INSTALLED = re.compile(r"\bsearchr1 (?:%s)\b" % "|".join(map(re.escape, COMMANDS)))
PROGRAMS = [("searchr1", "searchr1", CHECKOUT), ("cli.py", "python cli.py", INSTALLED)]  # name, shown, the other


def names_the_program(command: click.Command) -> bool:
    """Whether the help written for ``command`` (its text, its options') has the placeholder."""
    texts = [command.help or "", command.epilog or "", command.short_help or ""]
    texts += [getattr(param, "help", None) or "" for param in command.params]
    return any(invocation.PROGRAM in text for text in texts)


@pytest.mark.parametrize(("name", "shown", "other"), PROGRAMS, ids=["installed", "checkout"])
def test_every_help_names_the_program_as_invoked(name, shown, other):
    runner, with_examples = CliRunner(), 0
    for words, command in command_paths(main):
        result = runner.invoke(main, [*words, "--help"], prog_name=name)
        assert result.exit_code == 0, (words, result.output)
        text = result.output
        assert invocation.PROGRAM not in text and not other.search(text.replace("\n", " ")), (words, text)
        assert text.startswith(f"Usage: {' '.join([shown, *words])} ")
        if names_the_program(command):
            with_examples += 1
            assert f"{shown} " in text.replace("\n", " "), (words, text)
    assert with_examples >= 10  # train, eval, show, export, ask, compare, record, index build, ...


@pytest.mark.parametrize(("name", "shown", "other"), PROGRAMS, ids=["installed", "checkout"])
def test_a_hint_names_the_program_as_invoked_and_is_forgotten_after_the_run(name, shown, other, tmp_path,
                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)  # no datasets/ here
    result = CliRunner().invoke(main, ["eval", "--backend", "zhihu"], prog_name=name)
    assert result.exit_code == 1
    assert f"run `{shown} prepare-data` first, or pass --data" in result.output and not other.search(result.output)
    assert invocation.recorded() is None and invocation.command("eval") == "searchr1 eval"


def printed_command(output: str) -> list[str]:
    """The command between the backticks of the last line of ``output``."""
    return output.strip().splitlines()[-1].split("`")[1].split()


def test_the_checkout_and_the_installed_script_each_print_a_command_that_runs(tmp_path):
    missing = tmp_path / "no-index"
    checkout = subprocess.run([sys.executable, "cli.py", "index", "verify", str(missing)],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
    assert checkout.returncode == 1
    hint = printed_command(checkout.stderr)
    assert hint[:4] == ["python", "cli.py", "index", "build"], checkout.stderr
    ran = subprocess.run([sys.executable, *hint[1:4], "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 0 and ran.stdout.startswith("Usage: python cli.py index build "), ran.stderr

    script = shutil.which("searchr1", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the searchr1 script is not installed next to this Python")
    installed = subprocess.run([script, "index", "verify", str(missing)], cwd=tmp_path, capture_output=True,
                               text=True, timeout=60)
    assert installed.returncode == 1
    hint = printed_command(installed.stderr)
    assert hint[:3] == ["searchr1", "index", "build"], installed.stderr
    ran = subprocess.run([script, *hint[1:3], "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout.startswith("Usage: searchr1 index build "), ran.stderr
