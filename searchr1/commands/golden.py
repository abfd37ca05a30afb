"""``golden``: check (default) or regenerate the golden trajectories."""

from __future__ import annotations

import json

from typing import TYPE_CHECKING

import click

from searchr1.commands.help_layout import SectionedCommand
from searchr1.basics import invocation

if TYPE_CHECKING:
    from pathlib import Path

    from searchr1.runtime.tokenizer import Qwen35Tokenizer
    from searchr1.twin import Twin


@click.command(cls=SectionedCommand)
@click.option("--update", is_flag=True, help="Rewrite golden/<name>.json from golden/scenarios/.")
@click.option("--only", default=None, metavar="NAME", help="Only this scenario.")
def golden(update: bool, only: str | None) -> None:
    """Replay every golden scenario through the real PyTRIO client against the offline twin
    (serving the scenario's script), the search cassettes and the real engine, and compare with
    the frozen golden/<name>.json (or rewrite it with --update).

    Exits 1 and lists the differing fields when a golden file is stale.
    """
    from searchr1.commands.options import run_guarded

    run_guarded(lambda: _golden(update, only))


def _golden(update: bool, only: str | None) -> None:
    import logging
    import tempfile

    from searchr1.tools.golden import scenario_paths
    from searchr1.wiring.services import load_tokenizer
    from searchr1.twin import start_twin

    tokenizer = load_tokenizer()
    paths = [p for p in scenario_paths() if only is None or p.stem == only]
    if not paths:
        raise click.ClickException(f"no golden scenario named {only!r}")
    # Some scenarios fail a search on purpose (search_error); what they log is part of the
    # replay, not news for the person checking the files: the comparison says what matters.
    search_log = logging.getLogger("searchr1.search")
    level = search_log.level
    search_log.setLevel(logging.ERROR)
    try:
        with tempfile.TemporaryDirectory(prefix="searchr1-golden-") as home, \
                start_twin(home=home, tokenizer=tokenizer, policy="toy") as twin:
            stale = _compare_or_write(paths, tokenizer, twin, update)
    finally:
        search_log.setLevel(level)
    from searchr1.basics.wording import plural

    if stale:
        raise click.ClickException(f"{plural(stale, 'golden file')} {'differs' if stale == 1 else 'differ'}; inspect, "
                                   f"then `{invocation.command('golden --update')}`")
    if not update:
        click.echo(f"{plural(len(paths), 'golden file')} {'matches' if len(paths) == 1 else 'match'}")


def _compare_or_write(paths: list[Path], tokenizer: Qwen35Tokenizer, twin: Twin, update: bool) -> int:
    from searchr1.basics.fileio import write_text_atomically
    from searchr1.tools.golden import differences, dumps, generate, golden_path

    stale = 0
    for path in paths:
        fresh = generate(path, tokenizer, twin=twin)
        target = golden_path(path)
        if update:
            text = dumps(fresh)
            if not target.is_file() or target.read_text("utf-8") != text:
                write_text_atomically(target, text)
                click.echo(f"wrote     {target}")
            continue
        if not target.is_file():
            click.echo(f"MISSING   {target} (run `{invocation.command('golden --update')}`)")
            stale += 1
            continue
        found = differences(json.loads(target.read_text("utf-8")), fresh)
        if found:
            stale += 1
            click.echo(f"STALE     {target}")
            for line in found:
                click.echo(f"    {line}")
    return stale
