"""Every command the README shows runs as printed and exits 0, in a fresh folder, block after
block as a reader types them (the install lines are CI's own: ``.ci/run`` runs them). A command
that needs a key or the network runs as its offline variant: ``train`` gets ``--offline``, and
``prepare-data`` (it downloads the QA release) is the one command left out, by name."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from readme_support import cli_commands, readme_blocks, readme_lines

from searchr1.cli import main

NEEDS_THE_NETWORK = {"prepare-data"}  # no offline variant: it downloads the QA release


def offline_variant(words: list[str]) -> list[str]:
    """The command as it runs with no key: training on the offline twin."""
    return [*words, "--offline"] if words[0] == "train" and "--offline" not in words else words


def run_block(commands: list[list[str]], folder: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Run the commands in ``folder``, in this process (the CLI's entry point, as ``python cli.py``
    calls it); the names of those left out."""
    left_out = []
    monkeypatch.chdir(folder)
    for words in commands:
        if words[0] in NEEDS_THE_NETWORK:
            left_out.append(words[0])
            continue
        done = CliRunner().invoke(main, offline_variant(words))
        assert done.exit_code == 0, f"`{shlex.join(words)}` exited {done.exit_code}:\n{done.output[-3000:]}"
    return left_out


BLOCKS = readme_blocks(install=False)


def test_the_readme_shows_blocks_of_commands():
    assert len(BLOCKS) >= 3 and all(BLOCKS)


def test_every_line_of_a_block_is_a_command_run_here_or_an_export():
    """A line this test would not run (another program, a pipe) would go unchecked."""
    for block in readme_lines(install=False):
        for words in block:
            assert words[0] == "export" or (words[:2] == ["python", "cli.py"] and cli_commands(words) == [words[2:]]), \
                f"README command not understood: {shlex.join(words)}"


def test_the_offline_blocks_run_one_after_another_as_printed(tmp_path, monkeypatch):
    offline = [block for block in BLOCKS if all("--offline" in words or words[0] != "train" for words in block)]
    assert offline, "the README has no offline block"
    for block in offline:
        assert run_block(block, tmp_path, monkeypatch) == []


@pytest.mark.parametrize("block", [block for block in BLOCKS if any(words[0] == "train" and "--offline" not in words
                                                                    for words in block)])
def test_the_live_block_runs_offline_in_a_fresh_folder(block, tmp_path, monkeypatch):
    assert run_block(block, tmp_path, monkeypatch) == sorted(NEEDS_THE_NETWORK)
