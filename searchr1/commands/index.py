"""``index``: build a BM25 index from a corpus JSONL, and generate the shipped
offline corpus."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from searchr1.commands.help_layout import SectionedGroup
from searchr1.commands.options import run_guarded
from searchr1.basics import invocation


@click.group("index", cls=SectionedGroup)
def index() -> None:
    """BM25 indexes for `--backend local` and `retriever serve`."""


@index.command("build")
@click.argument("corpus", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Index directory to create (written atomically: complete, or not at all).")
@click.option("--shard-passages", type=click.IntRange(min=1), default=None, metavar="N",
              help="Passages per shard: the build's memory grows with it, not with the corpus "
                   "[default: 250000, about 1.3 GB per worker on wiki-18's passages].")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="Shards tokenised and scored at once, each in its own process [default: the CPUs, at most 2].")
@click.option("--overwrite", is_flag=True, help="Replace an existing index at --out.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def build(corpus: Path, out: Path, shard_passages: int | None, workers: int | None, overwrite: bool,
          quiet: bool) -> None:
    """Index CORPUS (JSONL rows {"id": ..., "contents": "\\"Title\\"\\ntext"}, the wiki-18 format)
    with BM25 (Lucene scoring, k1=0.9 b=0.4, English stopwords, Snowball stemmer; the scores of
    one bm25s index over the whole corpus).

    \b
    %(prog)s index build wiki-18.jsonl --out indexes/wiki-18
    %(prog)s train --backend local --index indexes/wiki-18 ...

    The corpus is read as a stream and indexed in shards, each scored with the corpus-wide
    statistics, so memory stays bounded whatever its size. The build happens in a hidden
    directory beside --out and is renamed into place with its manifest (corpus sha256, every
    file's size and sha256) only when complete. An interrupted build, run again with the same
    corpus and shard size, resumes from its last finished shard.
    """
    run_guarded(lambda: _build(corpus, out, shard_passages, workers or min(2, os.cpu_count() or 1), overwrite, quiet))


class _BuildProgress:
    """One line per shard (or per 5 s): phase, passages, passages per second, ETA, peak memory."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.monotonic()
        self.last = 0.0

    def __call__(self, phase: str, passages: int, done: int, total: int) -> None:
        now = time.monotonic()
        if self.quiet or (now - self.last < 5 and done < total):
            return
        self.last = now
        elapsed = max(now - self.started, 1e-9)
        fraction = done / total if total else 0.0
        eta = f"{elapsed * (1 - fraction) / fraction:,.0f} s" if fraction > 0 else "?"
        from searchr1.bm25.index import peak_memory_kib

        peak = peak_memory_kib() / 1024 ** 2  # KiB -> GiB, this process and its workers
        click.echo(f"index: {phase} {passages:,} passages ({100 * fraction:.0f}%), "
                   f"{passages / elapsed:,.0f} passages/s, ETA {eta}, peak memory {peak:.2f} GiB", err=True)


def _build(corpus: Path, out: Path, shard_passages: int | None, workers: int, overwrite: bool, quiet: bool) -> None:
    from searchr1.bm25.index import DEFAULT_SHARD_PASSAGES, build_index
    from searchr1.basics.wording import plural

    manifest = build_index(corpus, out, overwrite=overwrite, shard_passages=shard_passages or DEFAULT_SHARD_PASSAGES,
                           workers=workers, progress=_BuildProgress(quiet))
    rows = manifest["corpus"]["rows"]
    seconds = manifest["build_seconds"]
    resumed = f", {plural(manifest['resumed_shards'], 'shard')} resumed" if manifest["resumed_shards"] else ""
    click.echo(f"indexed {plural(rows, 'passage')} ({plural(manifest['vocabulary'], 'term')}, "
               f"{plural(len(manifest['shards']), 'shard')}"
               f"{resumed}) in {seconds:.1f} s ({rows / max(seconds, 1e-9):,.0f} passages/s) -> {out}")


@index.command("verify")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def verify(directory: Path) -> None:
    """Check every file of the index in DIRECTORY against its manifest (size, sha256, value
    ranges, no links). Exit 1 naming the first damaged file."""
    run_guarded(lambda: _verify(directory))


def _verify(directory: Path) -> None:
    from searchr1.bm25.index import verify_index

    manifest = verify_index(directory)
    click.echo(f"{directory}: intact ({len(manifest['files'])} files, {manifest['corpus']['rows']} passages)")


@index.command("offline-corpus")
@click.option("--check", is_flag=True, help="Fail if the shipped corpus differs from what its sources produce.")
def offline_corpus(check: bool) -> None:
    """Generate searchr1/offline/corpus.jsonl: the passages of the cassette specs, distractors
    sharing their titles, and generated filler (never edit the file by hand)."""
    run_guarded(lambda: _offline_corpus(check))


def _offline_corpus(check: bool) -> None:
    from searchr1.bm25.shipped import CORPUS, build_corpus_text, check_hops_found
    from searchr1.basics.fileio import write_text_atomically

    text = build_corpus_text()
    if check:
        current = CORPUS.read_text("utf-8") if CORPUS.is_file() else None
        if current != text:
            raise click.ClickException(f"{CORPUS} differs from what `{invocation.command('index offline-corpus')}` "
                                       "produces; regenerate it")
        click.echo(f"{CORPUS} is up to date")
        return
    problems = check_hops_found(text)
    if problems:
        raise click.ClickException("the generated corpus buries a hop passage: " + "; ".join(problems[:3]))
    write_text_atomically(CORPUS, text)
    click.echo(f"wrote {CORPUS} ({text.count(chr(10))} passages)")
