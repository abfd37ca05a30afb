"""``retriever serve``: the official Search-R1 ``/retrieve`` API over a local index."""

from __future__ import annotations

from pathlib import Path

import click

from searchr1.commands.help_layout import SectionedGroup
from searchr1.commands.options import run_guarded
from searchr1.commands.server_access import server_access_options, server_key
from searchr1.basics.secrets import Secret

MAX_WORKERS = 64


@click.group("retriever", cls=SectionedGroup)
def retriever() -> None:
    """A retrieval server of our own (the official Search-R1 API)."""


@retriever.command("serve")
@click.option("--index", "index_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Index directory built by `%(prog)s index build`.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 to share the index with other machines; then --api-key).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=1, show_default=True,
              help="Processes answering from the one memory-mapped index (its pages are cached once); "
                   "each has the bounds of a single server.")
@server_access_options()
def serve(index_dir: Path, host: str, port: int, workers: int, **access: object) -> None:
    """Serve INDEX on POST /retrieve ({"queries": [...], "topk": 3, "return_scores": true}) with
    uvicorn, so `--backend retriever`, the official Search-R1 code and other machines share one
    index. Concurrent requests are answered in shared batches; malformed ones get a 4xx naming
    the field. GET /healthz tells what is served. A --host other machines reach needs --api-key
    (clients send it as `Authorization: Bearer KEY`; ours read $SEARCHR1_RETRIEVER_API_KEY).
    Ctrl-C stops it."""
    run_guarded(lambda: _serve(index_dir, host, port, workers, access))


def _serve(index_dir: Path, host: str, port: int, workers: int, access: dict[str, object]) -> None:
    from searchr1.bm25.index import BM25Index
    from searchr1.bm25.server import make_server
    from searchr1.runtime.http_bounds import PortTakenError, listening_socket, listening_sockets
    from searchr1.bm25.workers import WorkerExited, serve_in_workers

    api_key: Secret | None = server_key(host, access)  # who may call it: refused before the index is opened
    index = BM25Index(index_dir)
    try:  # a taken port is said before anything claims to serve
        sockets = listening_sockets(host, port, workers) if workers > 1 else [listening_socket(host, port)]
    except PortTakenError as error:
        raise click.ClickException(str(error)) from None
    port = sockets[0].getsockname()[1]
    click.echo(f"serving {len(index)} passages from {index_dir} on http://{host}:{port}/retrieve "
               f"(corpus sha256 {index.manifest['corpus']['sha256'][:12]}…"
               f"{f', {workers} worker processes' if workers > 1 else ''})", err=True)
    if workers == 1:
        make_server(index, host=host, port=port, log_level="warning", api_key=api_key).run(sockets=sockets)
        return
    import uvicorn  # noqa: F401 - imported before the fork: a broken install fails here, not in every worker

    try:
        serve_in_workers(lambda inherited: make_server(index, host=host, port=port, log_level="warning",
                                                       api_key=api_key).run(sockets=[inherited]), sockets)
    except WorkerExited as error:
        raise click.ClickException(str(error)) from None
