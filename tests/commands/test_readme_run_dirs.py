"""The README evaluates the runs it trains: every ``eval --checkpoint`` of its ``bash`` blocks
names a directory that a ``train --run-dir`` of the README writes. A default run directory
would not do: after the quick start fills ``runs/<run-name>``, the next run goes to
``runs/<run-name>-2``, and an eval of the default directory quietly scores the earlier run."""

from __future__ import annotations

from readme_support import readme_commands


def flag(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def test_every_evaluated_checkpoint_is_a_run_directory_the_readme_trains_explicitly():
    commands = readme_commands()
    trained = {flag(words, "--run-dir") for words in commands if words[0] == "train"} - {None}
    evaluated = [flag(words, "--checkpoint") for words in commands if words[0] == "eval" and "--checkpoint" in words]
    assert evaluated and trained
    assert [run for run in evaluated if run not in trained] == []


def test_the_live_run_is_trained_and_checked_in_the_directory_it_evaluates():
    live = [words for words in readme_commands() if words[0] == "train" and "--offline" not in words]
    assert len(live) >= 2  # the preflight and the run
    assert len({flag(words, "--run-dir") for words in live}) == 1 and flag(live[0], "--run-dir") is not None
