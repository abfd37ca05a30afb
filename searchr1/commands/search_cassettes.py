"""``cassettes …``: regenerate, check and extend the shipped search cassettes."""

from __future__ import annotations

import json
from pathlib import Path

import click

from searchr1.commands.help_layout import SectionedGroup
from searchr1.search.cache import normalise_query
from searchr1.search.cassette_specs import CASSETTE_ROOT, SpecError, build_cassettes, discover_specs
from searchr1.basics import invocation


@click.group(cls=SectionedGroup,
             help="Shipped search cassettes: generated from cassettes/specs/ (see cassettes/README.md).")
def cassettes() -> None:
    pass


def _root_option(function):
    return click.option(
        "--root",
        type=click.Path(file_okay=False, path_type=Path),
        default=CASSETTE_ROOT,
        show_default="the project's cassettes/",
        help="Cassette directory (holds specs/).",
    )(function)


@cassettes.command(
    help="""Regenerate every cassette from its spec.

Each spec is served by an in-process fake of the service (its documented wire format) and
recorded THROUGH THE REAL CLIENT with vcrpy, in virtual time, with placeholder keys. Live
recordings (made by `%(prog)s record`) are left alone. Also refreshes the table in
cassettes/README.md. With --check nothing is written: the command fails if any shipped
cassette (or the README table) differs from what the specs produce."""
)
@click.option("--check", is_flag=True, help="Compare only; exit 1 if anything is stale.")
@click.option("--only", default=None, metavar="NAME", help="Only the spec(s) with this name (e.g. demo).")
@_root_option
def build(check: bool, only: str | None, root: Path) -> None:
    try:
        report = build_cassettes(root, check=check, only=only)
    except SpecError as exc:
        raise click.ClickException(str(exc)) from None
    for path in report.written:
        click.echo(f"wrote     {path}")
    for path in report.skipped_live:
        click.echo(f"live      {path} (recorded by `{invocation.command('record')}`; left alone)")
    for path in report.differing:
        click.echo(f"STALE     {path}")
    for path in report.orphans:
        click.echo(f"ORPHAN    {path} (no spec makes it; delete it or add a spec)")
    if report.readme_stale:
        click.echo(f"STALE     {root / 'README.md'} (generated table)")
    from searchr1.basics.wording import plural

    click.echo(f"{plural(len(report.unchanged), 'cassette')} up to date")
    if check and not report.clean:
        raise click.ClickException(f"cassettes differ from their specs; run `{invocation.command('cassettes build')}`")
    if report.orphans and not check:
        raise click.ClickException("orphan cassettes found (see above)")


def parse_result(text: str) -> dict[str, str]:
    title, sep, body = text.partition("::")
    if not sep or not title.strip() or not body.strip():
        raise click.BadParameter(f"expected 'TITLE::TEXT', got {text!r}", param_hint="--result")
    return {"title": title.strip(), "text": body.strip()}


@cassettes.command(
    name="add",
    help="""Add a query with canned results to a spec, then rebuild its cassettes.

\b
Example (all four demo cassettes get the query):
  %(prog)s cassettes add demo --query "Who wrote Hamlet" \\
      --result "Hamlet::Hamlet is a tragedy written by William Shakespeare around 1600." \\
      --result "William Shakespeare::William Shakespeare was an English playwright and poet."

With no --result the query is added with no results (an empty answer).""",
)
@click.argument("spec_name")
@click.option("--query", required=True, help="The query, exactly as the policy will send it.")
@click.option(
    "--result", "results", multiple=True, metavar="TITLE::TEXT", help="A result, best first (repeatable)."
)
@click.option("--replace", is_flag=True, help="Replace the query if the spec already has it.")
@click.option("--no-build", is_flag=True, help="Only edit the spec.")
@_root_option
def add(
    spec_name: str, query: str, results: tuple[str, ...], replace: bool, no_build: bool, root: Path
) -> None:
    try:
        matches = [s for s in discover_specs(root) if s.name == spec_name]
    except SpecError as exc:
        raise click.ClickException(str(exc)) from None
    if len(matches) != 1:
        found = ", ".join(str(s.path) for s in matches) or "none"
        raise click.ClickException(
            f"need exactly one spec named {spec_name!r} under {root / 'specs'} (found: {found})"
        )
    path = matches[0].path
    data = json.loads(path.read_text(encoding="utf-8"))
    key = normalise_query(query)
    if not key:
        raise click.BadParameter("empty query", param_hint="--query")
    entries = data.setdefault("queries", [])
    existing = [n for n, e in enumerate(entries) if normalise_query(e.get("query", "")) == key]
    entry = {"query": key, "results": [parse_result(r) for r in results]}
    if existing and not replace:
        raise click.ClickException(f"{path} already has {key!r}; pass --replace to change it")
    if existing:
        entries[existing[0]] = entry
    else:
        entries.append(entry)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    click.echo(f"updated {path}")
    if not no_build:
        try:
            report = build_cassettes(root, only=spec_name)
        except SpecError as exc:
            raise click.ClickException(str(exc)) from None
        for written in report.written:
            click.echo(f"wrote   {written}")
