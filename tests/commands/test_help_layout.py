"""Help that is easy to scan: every command lists its options under headings taken from their
declarations (``--offline`` under the first, "Run options"), a group lists each subcommand with
its whole one-line description, and a misspelled command gets the nearest name suggested."""

from __future__ import annotations


import click
import pytest
from click.testing import CliRunner
from cli_support import command_paths

from searchr1.cli import main
from searchr1.commands.help_layout import SECTIONS, SectionedCommand, heading
from searchr1.basics import invocation

# More options than this under one heading is a flat list again (eval had 48 under "Options").
MAX_PER_HEADING = 20


COMMANDS = list(command_paths(main))


def help_of(words: tuple[str, ...]) -> str:
    result = CliRunner().invoke(main, [*words, "--help"], prog_name="cli.py")
    assert result.exit_code == 0, result.output
    return result.output


def blocks(text: str) -> dict[str, list[str]]:
    """``{heading: the first word of each row under it}`` of a help text (a row starts two spaces
    in; a row's wrapped text and a long term's description are indented further)."""
    found: dict[str, list[str]] = {}
    rows: list[str] | None = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":") and not line.startswith("Usage:"):
            rows = found.setdefault(line[:-1], [])
        elif rows is not None and line.startswith("  ") and not line.startswith("   "):
            rows.append(line.split()[0].rstrip(","))
        elif not line.strip():
            continue
        elif not line.startswith("   "):
            rows = None  # text after the lists (an epilog)
    return found


def shown_options(command: click.Command) -> list[click.Parameter]:
    """The options ``--help`` lists, --help itself aside (the last row, under whatever comes last)."""
    ctx = click.Context(command)
    helper = command.get_help_option(ctx)
    return [param for param in command.get_params(ctx) if isinstance(param, click.Option)
            and param.get_help_record(ctx) is not None and param is not helper]


@pytest.mark.parametrize(("words", "command"), COMMANDS, ids=[" ".join(words) or "main" for words, _ in COMMANDS])
def test_every_option_is_listed_under_the_heading_its_declaration_names(words, command):
    assert isinstance(command, SectionedCommand), f"{' '.join(words)} is not laid out by its declarations"
    listed = blocks(help_of(words))
    params = shown_options(command)
    sections = {param.name: command.section_of(param) for param in params}
    named = {section for section in sections.values() if section is not None}
    assert named <= set(SECTIONS), named - set(SECTIONS)
    # nothing outside a group: once a command has headings, only --help and --version name none
    if named:
        assert {name for name, section in sections.items() if section is None} <= {"version"}
    for param in params:
        section = sections[param.name]
        expected = heading(section) if section else ("Other options" if named else "Options")
        row = param.get_help_record(click.Context(command))[0].split()[0].rstrip(",")  # "-o, --output FILE"
        assert row in listed.get(expected, []), (row, expected, listed)
    option_headings = [name for name in listed if name != "Commands"]
    assert option_headings == [heading(section) for section in SECTIONS if section in named] + [
        "Other options" if named else "Options"]  # the last holds --help
    assert "-h" in listed[option_headings[-1]]
    for name in option_headings:
        assert len(listed[name]) <= MAX_PER_HEADING, f"{' '.join(words)}: {len(listed[name])} options under {name}"


def test_offline_is_listed_first_wherever_a_command_takes_it():
    taking = [(words, command) for words, command in COMMANDS
              if any(param.name == "offline" for param in command.params)]
    assert {" ".join(words) for words, _ in taking} >= {"train", "eval", "ask", "rollout", "export", "probe-loss"}
    for words, _ in taking:
        listed = blocks(help_of(words))
        first = next(iter(listed))
        assert first == "Run options" and "--offline" in listed[first], (words, list(listed))


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


@pytest.mark.parametrize("words", [words for words, command in COMMANDS if isinstance(command, click.Group)],
                         ids=lambda words: " ".join(words) or "main")
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
                            "95% intervals (Wilson, never a point), format rate, rollout and search metrics.")
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
