"""How every command's ``--help`` is laid out: its options under headings taken from their
declarations, a group's subcommands with their whole one-line descriptions, and the nearest
name suggested for a misspelled subcommand.

An option names its heading where it is declared: a declared setting by its ``Rule.group`` or,
lacking one, by the class that declares it (``setting_options(cls, section=...)``); a plain
flag by ``cls=SectionOption, section=...`` (the shared flags of ``commands/options.py`` do so
once for every command that takes them). Options that name none are the command's own: they are
listed under "Options" when nothing else has a heading, else under "Other options", last.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Sequence
from typing import Any

import click

from searchr1.core.settings import OnResume

# Every heading a command's --help may have, in the order they are listed ("run" first: where a
# newcomer looks for --offline, the data and the output).
SECTIONS = ("run", "data", "rollout", "context", "algorithm", "credit", "correction", "pipeline", "search", "judge",
            "archive", "service", "latency", "health", "cost", "logging")


def heading(section: str) -> str:
    """The --help heading of ``section``: ``"run"`` -> ``"Run options"``."""
    return f"{section.capitalize()} options"


class SectionOption(click.Option):
    """An option that knows the heading (one of :data:`SECTIONS`) :class:`SectionedCommand`
    lists it under and, for ``train``'s flags, what a resume does with it (``on_resume``) and,
    where the run's record holds its value under a setting of another name, that setting's name
    (``recorded_as``: ``--system-prompt-file`` is recorded as the file's text, ``system_prompt``)."""

    def __init__(self, param_decls: Sequence[str] | None = None, *, section: str | None = None,
                 on_resume: OnResume | None = None, recorded_as: str | None = None,
                 **attrs: Any) -> None:  # click.Option's own keywords, as click types them
        super().__init__(param_decls, **attrs)
        self.section = section
        self.on_resume = on_resume
        self.recorded_as = recorded_as


class SectionedCommand(click.Command):
    """A command whose ``--help`` lists its options under the headings of :data:`SECTIONS`, in
    that order (``sections`` names the section of options that are not :class:`SectionOption`)."""

    def __init__(self, name: str | None = None, *, sections: dict[str, str] | None = None,
                 **attrs: Any) -> None:  # click.Command's own keywords, as click types them
        super().__init__(name, **attrs)
        self.sections = dict(sections or {})

    def section_of(self, param: click.Parameter) -> str | None:
        """The section ``param`` is listed under; ``None`` for the command's own options."""
        return getattr(param, "section", None) or self.sections.get(param.name or "")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        grouped: dict[str | None, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and not isinstance(param, click.Argument):  # arguments are in the usage line
                grouped.setdefault(self.section_of(param), []).append(record)
        named = [section for section in grouped if section is not None]
        for section in [*SECTIONS, *sorted(set(named) - set(SECTIONS))]:
            if section in grouped:
                with formatter.section(heading(section)):
                    formatter.write_dl(grouped[section])
        if None in grouped:
            with formatter.section("Other options" if named else "Options"):
                formatter.write_dl(grouped[None])


class SectionedGroup(SectionedCommand, click.Group):
    """A group laid out as :class:`SectionedCommand`, whose subcommands are too (those made with
    ``@group.command()``); its list of subcommands shows each one's whole one-line description,
    and a misspelled subcommand gets the nearest names suggested (as a misspelled flag does)."""

    command_class = SectionedCommand
    group_class = type  # subgroups made with @group.group() are of this class too

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        SectionedCommand.format_options(self, ctx, formatter)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The subcommands, each with the first sentence of its help (or its ``short_help``)
        whole, wrapped rather than cut off."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.listed_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=sys.maxsize)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def listed_command(self, ctx: click.Context, name: str) -> click.Command | None:
        """What the list of subcommands shows for ``name``: the subcommand itself (a group that
        loads its commands lazily gives one that only knows its help)."""
        return self.get_command(ctx, name)

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """Click's, but an unknown name is answered with the one nearest subcommand ("No such
        command 'trian'. Did you mean 'train'?"), taken from :meth:`list_commands` (click's own
        looks in ``self.commands``, which a lazily loaded group leaves empty)."""
        try:
            return super().resolve_command(ctx, args)
        except click.NoSuchCommand as error:
            nearest = difflib.get_close_matches(error.command_name, self.list_commands(ctx), n=1)
            raise click.NoSuchCommand(error.command_name, possibilities=nearest, ctx=ctx) from None
