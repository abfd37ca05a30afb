"""``python cli.py golden``: check (default) or regenerate the golden trajectories."""

from __future__ import annotations

import json

import click


@click.command()
@click.option("--update", is_flag=True, help="Rewrite golden/<name>.json from golden/scenarios/.")
@click.option("--only", default=None, metavar="NAME", help="Only this scenario.")
def golden(update: bool, only: str | None) -> None:
    """Replay every golden scenario through the scripted sampler, the search cassettes and the
    real engine, and compare with the frozen golden/<name>.json (or rewrite it with --update).

    Exits 1 and lists the differing fields when a golden file is stale.
    """
    from .options import run_guarded

    run_guarded(lambda: _golden(update, only))


def _golden(update: bool, only: str | None) -> None:
    from ..fileio import write_text_atomically
    from ..golden import differences, dumps, generate, golden_path, scenario_paths
    from ..services import load_tokenizer

    tokenizer = load_tokenizer()
    paths = [p for p in scenario_paths() if only is None or p.stem == only]
    if not paths:
        raise click.ClickException(f"no golden scenario named {only!r}")
    stale = 0
    for path in paths:
        fresh = generate(path, tokenizer)
        target = golden_path(path)
        if update:
            text = dumps(fresh)
            if not target.is_file() or target.read_text("utf-8") != text:
                write_text_atomically(target, text)
                click.echo(f"wrote     {target}")
            continue
        if not target.is_file():
            click.echo(f"MISSING   {target} (run `python cli.py golden --update`)")
            stale += 1
            continue
        found = differences(json.loads(target.read_text("utf-8")), fresh)
        if found:
            stale += 1
            click.echo(f"STALE     {target}")
            for line in found:
                click.echo(f"    {line}")
    if stale:
        raise click.ClickException(f"{stale} golden file(s) differ; inspect, then `python cli.py golden --update`")
    if not update:
        click.echo(f"{len(paths)} golden file(s) match")
