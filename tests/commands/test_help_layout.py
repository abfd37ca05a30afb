"""Help that is easy to scan: a group lists each subcommand with its whole one-line description,
and a misspelled command gets the nearest name suggested."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.runtime import invocation


def command_paths(group: click.Group, above: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """The group itself and every command and subcommand below it, by the words that reach it."""
    if not above:
        yield (), group
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        yield (*above, name), command
        if isinstance(command, click.Group):
            yield from command_paths(command, (*above, name))


COMMANDS = list(command_paths(main))


def help_of(words: tuple[str, ...]) -> str:
    result = CliRunner().invoke(main, [*words, "--help"], prog_name="cli.py")
    assert result.exit_code == 0, result.output
    return result.output


def described(text: str) -> dict[str, str]:
    """``{subcommand: its description}`` of a group's help, wrapped lines joined."""
    rows: dict[str, str] = {}
    inside, name = False, ""
    for line in text.splitlines():
        if line == "Commands:":
            inside = True
        elif inside and line.startswith("  ") and not line.startswith("   "):
            name, _, description = line.strip().partition(" ")
            rows[name] = description.strip()
        elif inside and line.startswith("   "):
            broken_word = rows[name][-2:-1].isalpha() and rows[name].endswith("-")  # wrapped at a hyphen
            rows[name] += ("" if broken_word else " ") + line.strip()
        elif inside and line.strip():
            inside = False
    return rows


@pytest.mark.parametrize("words", [()], ids=["main"])
def test_a_group_lists_each_subcommand_with_its_whole_first_sentence(words):
    group = dict(COMMANDS)[words]
    assert isinstance(group, click.Group)
    rows = described(help_of(words))
    assert set(rows) == set(group.list_commands(click.Context(group)))
    for name, description in rows.items():
        command = group.get_command(click.Context(group), name)
        assert command is not None
        written = command.short_help or command.help or ""
        first = " ".join(invocation.fill(written).partition("\n\n")[0].split())
        assert not description.endswith("..."), (name, description)
        assert description.endswith(".") and first.startswith(description), (name, description, first)


def test_the_top_level_list_shows_descriptions_longer_than_clicks_cut():
    rows = described(help_of(()))
    assert rows["eval"] == ("Evaluate a model on the dev set: exact match per source, macro and micro EM with "
                            "bootstrap 95% intervals, format rate, rollout and search metrics.")
    assert rows["ask"] == "Ask the agent one question and print each turn as it happens."


@pytest.mark.parametrize(("words", "suggested"), [(["trian"], "train"), (["evl"], "eval"),
                                                  (["prepare_data"], "prepare-data"), (["index", "biuld"], "build")])
def test_a_misspelled_command_gets_the_nearest_one_suggested(words, suggested):
    result = CliRunner().invoke(main, words, prog_name="cli.py")
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert error == [f"Error: No such command {words[-1]!r}. Did you mean {suggested!r}?"]
    assert "Traceback" not in result.output


def test_a_command_far_from_every_name_gets_no_suggestion():
    result = CliRunner().invoke(main, ["xyzzy"], prog_name="cli.py")
    assert result.exit_code == 2
    assert "Error: No such command 'xyzzy'." in result.output and "Did you mean" not in result.output
