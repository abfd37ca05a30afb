"""The ``searchr1`` command group (``searchr1.cli:main``, also run by ``cli.py`` in a checkout).

Commands are loaded lazily so that ``--help`` answers instantly and a command only imports
what it needs (the tokenizer and the SDK are heavy): the list of commands is made from the help
written in each command's source (:mod:`searchr1.commands.declared_help`), and a command's module is
imported only when the command is run or its own help is asked for. The group records the name it was invoked
under, so that every command line printed during the run starts the same way
(:mod:`searchr1.basics.invocation`), and shows every help text with that name in place of
:data:`~searchr1.basics.invocation.PROGRAM`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

import click

from searchr1.commands.declared_help import declared_command
from searchr1.commands.help_layout import SectionedGroup
from searchr1.commands.log_options import chosen_log_level, log_level_options
from searchr1.basics import invocation

# command name -> "module:attribute" of a click.Command
COMMANDS: dict[str, str] = {
    "demo": "searchr1.commands.demo:demo",
    "offline-data": "searchr1.commands.offline_data:offline_data",
    "train": "searchr1.commands.train:train",
    "rollout": "searchr1.commands.rollout:rollout",
    "golden": "searchr1.commands.golden:golden",
    "record": "searchr1.commands.record:record",
    "cassettes": "searchr1.commands.search_cassettes:cassettes",
    "zhihu-quota": "searchr1.commands.search_zhihu_quota:zhihu_quota",
    "probe-loss": "searchr1.commands.probe_loss:probe_loss",
    "prepare-data": "searchr1.commands.prepare_data:prepare_data",
    "probe-data": "searchr1.commands.probe_data:probe_data",
    "plot": "searchr1.commands.plot:plot",
    "bench": "searchr1.commands.bench:bench",
    "mutants": "searchr1.commands.mutants:mutants",
    "eval": "searchr1.commands.eval:eval_command",
    "show": "searchr1.commands.show:show",
    "compare": "searchr1.commands.compare:compare",
    "export": "searchr1.commands.export:export",
    "ask": "searchr1.commands.ask:ask",
    "serve": "searchr1.commands.serve:serve",
    "twin": "searchr1.commands.twin:twin",
    "index": "searchr1.commands.index:index",
    "retriever": "searchr1.commands.retriever:retriever",
}


class InvokedHelpFormatter(click.HelpFormatter):
    """Help with the program as invoked in place of ``PROGRAM``, replaced before wrapping."""

    def write_usage(self, prog: str, args: str = "", prefix: str | None = None) -> None:
        super().write_usage(prog, invocation.fill(args), prefix)

    def write_heading(self, heading: str) -> None:
        super().write_heading(invocation.fill(heading))

    def write_text(self, text: str) -> None:
        super().write_text(invocation.fill(text))

    def write_dl(self, rows: Iterable[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        super().write_dl([(invocation.fill(term), invocation.fill(text)) for term, text in rows],
                         col_max, col_spacing)


class InvokedContext(click.Context):
    """The context of every command of the group: its help goes through
    :class:`InvokedHelpFormatter`."""

    formatter_class = InvokedHelpFormatter


def with_invoked_help(command: click.Command) -> click.Command:
    """``command``, and each subcommand of a group, with :class:`InvokedContext` for contexts
    (a command with a context class of its own keeps it)."""
    if command.context_class is click.Context:
        command.context_class = InvokedContext
    if isinstance(command, click.Group):
        for subcommand in command.commands.values():
            with_invoked_help(subcommand)
    return command


class LazyGroup(SectionedGroup):
    """The commands of :data:`COMMANDS`, each imported when it is first named; help laid out as
    :class:`~searchr1.commands.help_layout.SectionedGroup` lays it out."""

    context_class = InvokedContext

    def main(self, *args: Any, **kwargs: Any) -> Any:  # click's overloads (NoReturn when standalone), passed on
        """Click's ``main``; the program recorded while it runs is forgotten when it returns."""
        before = invocation.recorded()
        try:
            return super().main(*args, **kwargs)
        finally:
            invocation.record(before)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: object) -> click.Context:
        """Click's context; the group's own is named as the program runs
        (:func:`~searchr1.basics.invocation.program_for`: a script file runs with python, also in
        click's usage lines and its "Try ... -h" hints), and that program is recorded for the
        command lines the run prints."""
        if parent is None and info_name:  # the program's name, as click detected it or was given it
            info_name = invocation.program_for(info_name)
            invocation.record(info_name)
        return super().make_context(info_name, args, parent, **extra)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def listed_command(self, ctx: click.Context, name: str) -> click.Command | None:
        """``name`` as the list of commands shows it, from the help its source declares, without
        importing it (the command itself where the source does not say its help as a literal)."""
        target = COMMANDS.get(name)
        if target is None:
            return None
        return declared_command(target, name) or self.get_command(ctx, name)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        return with_invoked_help(getattr(importlib.import_module(module_name), attribute))


@click.group(invocation.INSTALLED, cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@log_level_options()
@click.version_option(package_name="searchr1")
def main(verbose: int, log_level: str | None) -> None:
    """Search-R1 on PyTRIO: teach an LLM when to search, what to search for, and when to answer.

    Live runs need PYTRIO_API_KEY and a search backend key. With --offline, train, eval and
    rollout run the same code, the real PyTRIO client included, against offline twins (a PyTRIO
    server on 127.0.0.1, recorded search cassettes) and the exact Qwen3.5 tokenizer: no key, no
    network.
    """
    chosen = chosen_log_level(verbose, log_level)
    if chosen is not None:
        from searchr1.run.log_output import showing_logs

        click.get_current_context().with_resource(showing_logs(chosen))
