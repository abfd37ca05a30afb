"""``record``: record live search traffic into a vcrpy cassette."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict

import click

from searchr1.commands.help_layout import SectionedCommand
from searchr1.basics.fileio import check_writable, is_write_failure, write_failure_line
from searchr1.search.base import HttpSearchBackend, SearchRefusedError
from searchr1.search.cache import normalise_query
from searchr1.search.env import MissingApiKeyError
from searchr1.search.factory import HTTP_BACKEND_NAMES as BACKEND_NAMES
from searchr1.search.factory import create_search_backend
from searchr1.search.recording import SecretLeakError, recording
from searchr1.search.wikipedia import WikipediaApiBackend
from searchr1.search.zhihu import ZhihuSearchBackend
from searchr1.commands.settings_options import FiniteFloatRange
from searchr1.basics import invocation


class RecordingFailed(click.ClickException):
    """The recording is not worth keeping (every request failed, or some did and failures
    were not allowed); nothing was written."""


def read_queries_file(path: Path) -> list[str]:
    """One query per line; blank lines and lines starting with '#' are skipped."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def read_dataset_questions(path: Path, limit: int | None) -> list[str]:
    """The ``question`` of each JSONL row (a bad row is an error naming its line)."""
    from searchr1.basics.jsonl import JsonInputError, iter_json_lines

    questions: list[str] = []
    try:
        for number, row in iter_json_lines(path):
            question = row.get("question") if isinstance(row, dict) else None
            if not isinstance(question, str) or not question.strip():
                raise click.BadParameter(
                    f"{path}:{number}: row has no string 'question'", param_hint="--from-dataset"
                )
            questions.append(question.strip())
            if limit is not None and len(questions) >= limit:
                break
    except JsonInputError as error:
        raise click.BadParameter(str(error), param_hint="--from-dataset") from None
    return questions


def unique(queries: list[str]) -> list[str]:
    seen: dict[str, str] = {}
    for query in queries:
        seen.setdefault(normalise_query(query), query)
    return [q for key, q in seen.items() if key]


@click.command(
    cls=SectionedCommand,
    help="""Record real search requests into a vcrpy cassette, through the real client.

Give the queries with --query (repeatable), --queries FILE (one per line, '#' comments) or
--from-dataset JSONL (the 'question' of each row; --limit N rows). Requests run one at a
time, with the backend's real retry policy.

Failures: when every query fails, nothing is written and the exit code is 1. When some
fail, nothing is written either unless --allow-failures is given; the cassette then keeps the
failed exchanges too and lists them in its metadata (failed_queries).

The cassette stores what replay needs (the backend and the options that shape its requests:
retriever URL, Wikipedia API URL, DeepSeek model and tool type, ...), so it replays with
`--cassette PATH` alone.

Secrets never reach the file: key headers are dropped, key values are replaced by <SECRET_n>
and the Wikipedia contact by <CONTACT> everywhere (URLs, headers, bodies, echoes in
responses), and the file is checked for them before it replaces the target. An existing
cassette is kept unless --overwrite is given, and is never lost on a crash (the new one is
written to a temporary file and renamed).

Keys: DEEPSEEK_API_KEY / ZHIHU_SEARCH_KEYS from the environment or the .env file.

\b
Examples:
  %(prog)s record --backend wikipedia --query "The Little Prince author" \\
      --cassette cassettes/wikipedia/live-demo.yaml
  %(prog)s record --backend deepseek --from-dataset datasets/dev.jsonl --limit 20 \\
      --cassette cassettes/deepseek/dev20.yaml
""",
)
@click.option("--backend", type=click.Choice(BACKEND_NAMES), required=True, help="Search backend to record.")
@click.option("--query", "query_texts", multiple=True, metavar="TEXT", help="A query (repeatable).")
@click.option(
    "--queries",
    "queries_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File with one query per line.",
)
@click.option(
    "--from-dataset",
    "dataset",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSONL dataset; each row's 'question' is a query.",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use at most N queries.")
@click.option(
    "--cassette",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Cassette file to write (YAML).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing cassette.")
@click.option(
    "--allow-failures",
    is_flag=True,
    help="Write the cassette even if some (not all) queries failed; they are listed in its metadata.",
)
@click.option(
    "--search-timeout",
    type=FiniteFloatRange(min=0, min_open=True),
    default=None,
    help="Per-read timeout in seconds [default: the backend's].",
)
@click.option(
    "--search-total-timeout",
    type=FiniteFloatRange(min=0, min_open=True),
    default=None,
    help="Wall-clock limit of one request, a whole stream included [default: deepseek 300, "
    "others the per-read timeout].",
)
@click.option("--search-model", default=None, help="DeepSeek model name.")
@click.option("--search-tool-type", default=None, help="DeepSeek web-search tool type.")
@click.option("--retriever-url", default=None, help="Search-R1 retrieval server URL.")
@click.option(
    "--wikipedia-contact", default=None, help="Contact for the Wikipedia User-Agent [$SEARCHR1_CONTACT]."
)
@click.option(
    "--search-env-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="dotenv file with the keys [default: ./.env].",
)
def record(
    backend: str,
    query_texts: tuple[str, ...],
    queries_file: Path | None,
    dataset: Path | None,
    limit: int | None,
    cassette: Path,
    overwrite: bool,
    allow_failures: bool,
    search_timeout: float | None,
    search_total_timeout: float | None,
    search_model: str | None,
    search_tool_type: str | None,
    retriever_url: str | None,
    wikipedia_contact: str | None,
    search_env_file: Path | None,
) -> None:
    sources = [bool(query_texts), queries_file is not None, dataset is not None]
    if sum(sources) != 1:
        raise click.UsageError("give exactly one of --query, --queries or --from-dataset")
    if query_texts:
        queries = list(query_texts)
    elif queries_file is not None:
        queries = read_queries_file(queries_file)
    else:
        assert dataset is not None  # exactly one source is given
        queries = read_dataset_questions(dataset, limit)
    queries = unique(queries)[:limit] if limit else unique(queries)
    if not queries:
        raise click.UsageError("no queries to record")
    if cassette.exists() and not overwrite:
        raise click.ClickException(f"cassette {cassette} already exists; pass --overwrite to replace it")
    check_writable(cassette, "cassette", click.ClickException)  # before any (paid) search

    options: _BackendOptions = {}
    if search_total_timeout is not None:
        options["total_timeout"] = search_total_timeout
    if backend == "deepseek":
        if search_model:
            options["model"] = search_model
        if search_tool_type:
            options["tool_type"] = search_tool_type
    elif backend == "retriever":
        options["url"] = retriever_url  # None: $SEARCHR1_RETRIEVER_URL or the default
    elif backend == "wikipedia":
        options["contact"] = wikipedia_contact  # None: $SEARCHR1_CONTACT
    try:
        client = create_search_backend(backend, timeout=search_timeout, env_file=search_env_file, **options)
    except (MissingApiKeyError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if backend == "wikipedia" and isinstance(client, WikipediaApiBackend) and client.contact is None:
        click.echo(
            "warning: no Wikipedia contact set (--wikipedia-contact or SEARCHR1_CONTACT); "
            "Wikimedia may refuse anonymous User-Agents",
            err=True,
        )
    try:
        failed = asyncio.run(_record(client, queries, cassette, overwrite, allow_failures))
    except (FileExistsError, SecretLeakError, SearchRefusedError) as exc:
        raise click.ClickException(f"{exc}; nothing was written") from None
    except OSError as exc:
        if not is_write_failure(exc):
            raise
        raise click.ClickException(f"{write_failure_line(exc)}; nothing was written") from None
    click.echo(
        f"wrote {cassette}: {len(queries)} queries, {len(queries) - len(failed)} ok, {len(failed)} failed"
    )


def recording_verdict(queries: list[str], failed: list[str], allow_failures: bool) -> str | None:
    """Why a recording must not be kept (``None``: keep it)."""
    if len(failed) == len(queries):
        return (
            f"every one of the {len(queries)} queries failed (first: {failed[0]!r}); nothing was "
            "written; check the keys, the URL and the network"
        )
    if failed and not allow_failures:
        shown = ", ".join(repr(q) for q in failed[:3]) + (" ..." if len(failed) > 3 else "")
        return (
            f"{len(failed)} of {len(queries)} queries failed ({shown}); nothing was written; "
            "pass --allow-failures to keep the failed exchanges in the cassette"
        )
    return None


class _BackendOptions(TypedDict, total=False):
    """The flags ``record`` hands the backend (``create_search_backend``'s options of those names)."""

    total_timeout: float
    model: str
    tool_type: str
    url: str | None
    contact: str | None


async def _record(
    client: HttpSearchBackend, queries: list[str], cassette: Path, overwrite: bool, allow_failures: bool
) -> list[str]:
    """Record the queries; returns the ones that failed. Raises :class:`RecordingFailed`
    (inside the recording, so nothing is written) when the recording is not worth keeping."""
    metadata: dict[str, object] = {
        "backend": client.name,
        "generator": invocation.command("record"),
        "provenance": "live",
        "recorded_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "options": client.replay_options(),
    }
    if client.name == "zhihu" and isinstance(client, ZhihuSearchBackend):
        metadata["keys"] = len(client.pool)
    failed: list[str] = []
    async with client:
        with recording(
            cassette,
            secrets=client.secrets(),
            private=client.private_values(),
            metadata=metadata,
            overwrite=overwrite,
        ) as tape:
            for query in queries:
                result = await client.search(query)
                if not result.ok:
                    failed.append(query)
                status = f"{len(result.items)} items" if result.ok else f"error: {result.error}"
                click.echo(f"  {query!r}: {status} ({result.latency:.2f} s)")
            verdict = recording_verdict(queries, failed, allow_failures)
            if verdict is not None:
                raise RecordingFailed(verdict)
            if failed:
                tape.get_metadata("failed_queries", failed)
    return failed
