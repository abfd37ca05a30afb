"""``python cli.py index``: build a BM25 index from a corpus JSONL, and generate the shipped
offline corpus."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from searchr1.commands.options import run_guarded


@click.group("index")
def index() -> None:
    """BM25 indexes for `--backend local` and `retriever serve`."""


@index.command("build")
@click.argument("corpus", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Index directory to create (written atomically: complete, or not at all).")
@click.option("--overwrite", is_flag=True, help="Replace an existing index at --out.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def build(corpus: Path, out: Path, overwrite: bool, quiet: bool) -> None:
    """Index CORPUS (JSONL rows {"id": ..., "contents": "\\"Title\\"\\ntext"}, the wiki-18 format)
    with BM25 (bm25s, Lucene scoring, k1=0.9 b=0.4, English stopwords, Snowball stemmer).

    \b
    python cli.py index build wiki-18.jsonl --out indexes/wiki-18
    python cli.py train --backend local --index indexes/wiki-18 ...

    The corpus is read once as a stream; a malformed row stops the build naming its line. The
    index is built in a hidden directory beside --out and renamed into place with its manifest
    (corpus sha256, row count, tokenizer, library versions) only when complete: an interrupted
    build leaves nothing that --backend local would open.
    """
    run_guarded(lambda: _build(corpus, out, overwrite, quiet))


def _build(corpus: Path, out: Path, overwrite: bool, quiet: bool) -> None:
    from searchr1.bm25.index import build_index

    if quiet or not sys.stderr.isatty():
        def progress(done: int, total: int, rows: int) -> None:
            if not quiet and (rows % 1_000_000 == 0 or done == total):
                click.echo(f"index: {rows} passages read ({100 * done / max(total, 1):.0f}%)", err=True)

        manifest = build_index(corpus, out, overwrite=overwrite, progress=progress)
    else:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        with Progress(TextColumn("index {task.fields[rows]} passages"), BarColumn(), TimeElapsedColumn(),
                      TimeRemainingColumn(), transient=True) as bar:
            task = bar.add_task("read", total=corpus.stat().st_size if corpus.is_file() else 1, rows=0)

            def progress(done: int, total: int, rows: int) -> None:
                bar.update(task, completed=done, rows=rows)

            manifest = build_index(corpus, out, overwrite=overwrite, progress=progress)
    rows = manifest["corpus"]["rows"]
    seconds = manifest["build_seconds"]
    click.echo(f"indexed {rows} passages ({manifest['vocabulary']} terms) in {seconds:.1f} s "
               f"({rows / max(seconds, 1e-9):,.0f} passages/s) -> {out}")


@index.command("offline-corpus")
@click.option("--check", is_flag=True, help="Fail if the shipped corpus differs from what its sources produce.")
def offline_corpus(check: bool) -> None:
    """Generate searchr1/offline/corpus.jsonl: the passages of the cassette specs, distractors
    sharing their titles, and generated filler (never edit the file by hand)."""
    run_guarded(lambda: _offline_corpus(check))


def _offline_corpus(check: bool) -> None:
    from searchr1.bm25.shipped import CORPUS, build_corpus_text, check_hops_found
    from searchr1.run.fileio import write_text_atomically

    text = build_corpus_text()
    if check:
        current = CORPUS.read_text("utf-8") if CORPUS.is_file() else None
        if current != text:
            raise click.ClickException(f"{CORPUS} differs from what `python cli.py index offline-corpus` "
                                       "produces; regenerate it")
        click.echo(f"{CORPUS} is up to date")
        return
    problems = check_hops_found(text)
    if problems:
        raise click.ClickException("the generated corpus buries a hop passage: " + "; ".join(problems[:3]))
    write_text_atomically(CORPUS, text)
    click.echo(f"wrote {CORPUS} ({text.count(chr(10))} passages)")
