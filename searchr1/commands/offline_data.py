"""``offline-data``: regenerate the shipped offline question set and its cassettes."""

from __future__ import annotations

import click

from searchr1.commands.help_layout import SectionedCommand
from searchr1.basics import invocation


@click.command("offline-data", cls=SectionedCommand)
@click.option("--check", is_flag=True, help="Compare only; exit 1 if a generated file is stale.")
@click.option("--no-cassettes", is_flag=True, help="Write the generated files but do not re-record the cassettes.")
def offline_data(check: bool, no_cassettes: bool) -> None:
    """Regenerate the offline world from searchr1/offline/questions.json.

    Writes searchr1/offline/scenario.json (the scripted policy), train.jsonl, dev.jsonl,
    pages_train.jsonl, pages_dev.jsonl (from pages.json), known_train.jsonl, known_dev.jsonl and
    mixed_train.jsonl (from known.json), the long-horizon world (long.json,
    long_train.jsonl, long_dev.jsonl, from long_world.py) and cassettes/specs/offline.json and
    long.json, then records cassettes/<backend>/offline.yaml for every backend and
    cassettes/wikipedia/long.yaml through the real clients against the in-process fake services.
    """
    from searchr1.basics.fileio import write_text_atomically
    from searchr1.offline import (KNOWN, LONG_CASSETTE_NAME, PAGES, build_known_files, build_long_files,
                                  build_offline_files, build_page_files, load_source)
    from searchr1.offline.long_world import long_source
    from searchr1.search.cassette_specs import build_cassettes

    files = {**build_offline_files(load_source()), **build_page_files(load_source(PAGES)),
             **build_long_files(long_source()), **build_known_files(load_source(KNOWN), load_source())}
    stale = [path for path, text in files.items()
             if not path.is_file() or path.read_text("utf-8") != text]
    if check:
        for path in stale:
            click.echo(f"STALE     {path}")
        report = build_cassettes(check=True, only="offline")
        report.differing += build_cassettes(check=True, only=LONG_CASSETTE_NAME).differing
        for path in report.differing:
            click.echo(f"STALE     {path}")
        if stale or report.differing:
            raise click.ClickException(f"offline files are stale; run `{invocation.command('offline-data')}`")
        click.echo("offline files and cassettes are up to date")
        return
    for path in stale:
        write_text_atomically(path, files[path])
        click.echo(f"wrote     {path}")
    if not no_cassettes:
        report = build_cassettes(only="offline")
        report.written += build_cassettes(only=LONG_CASSETTE_NAME).written
        for path in report.written:
            click.echo(f"wrote     {path}")
    from searchr1.basics.wording import plural

    kept = len(files) - len(stale)
    click.echo(f"{plural(kept, 'generated file')} {'was' if kept == 1 else 'were'} already up to date")
