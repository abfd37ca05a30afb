"""One line per request ``serve`` answers: method, path, status and time in milliseconds.

``POST /v1/chat/completions 200 812.4 ms`` is logged at INFO on the :data:`ACCESS_LOGGER` logger
when the answer's last byte is sent (a stream's too), or when the request ends without one
(status ``-``: the client went away first). The line holds no body, no header value and no
query string. The path is the client's, so it is shown as it travels (:func:`shown_path`:
percent-encoded, one line, at most :data:`MAX_PATH_CHARS`), with anything that looks like a
credential, or is the server's own key in any of its encodings, masked.
:func:`print_to_stderr` sends the lines to stderr when the program's logging sends them nowhere.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from searchr1.basics.secrets import MASK, Secret, redact, redact_known, secret_forms

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

ACCESS_LOGGER = "searchr1.serve.access"
MAX_PATH_CHARS = 200
log = logging.getLogger(ACCESS_LOGGER)


def shown_path(text: str, secrets: Iterable[Secret] = (), limit: int = MAX_PATH_CHARS) -> str:
    """``text`` (a request's path or method) as a log line may hold it: the known ``secrets``
    masked as sent, then percent-encoded (printable ASCII, no spaces), then masked again with
    anything that looks like a credential; the whole of it masked if a form of a secret is still
    there, as written or decoded; cut to ``limit`` characters."""
    secrets = tuple(secrets)
    shown = redact(quote(redact_known(text, secrets), safe="/[]"), secrets)
    if any(form in written for written in (shown, unquote(shown)) for secret in secrets
           for form in secret_forms(secret)):
        return MASK
    return shown if len(shown) <= limit else shown[:limit - 3] + "..."


def access_line(method: str, path: str, status: int | None, seconds: float,
                secrets: Iterable[Secret] = ()) -> str:
    """The line of one request (see the module docstring)."""
    secrets = tuple(secrets)
    return (f"{shown_path(method, secrets, 16) or '-'} {shown_path(path, secrets) or '/'} "
            f"{status if status is not None else '-'} {seconds * 1000:.1f} ms")


class AccessLog:
    """ASGI middleware that logs :func:`access_line` for every HTTP request ``app`` answers."""

    def __init__(self, app: ASGIApp, secrets: tuple[Secret, ...] = ()) -> None:
        self.app = app
        self.secrets = secrets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            status = status or 500  # what the server's last-resort handler answers
            raise
        finally:
            log.info(access_line(str(scope.get("method", "")), str(scope.get("path", "")), status,
                                 time.perf_counter() - started, self.secrets))

    def __repr__(self) -> str:
        return "AccessLog()"


class StderrHandler(logging.Handler):
    """Writes each record's message to the ``sys.stderr`` of the moment it is logged."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging's own way: report, never raise into the server
            self.handleError(record)


def print_to_stderr() -> None:
    """Make the access lines reach stderr: the logger logs INFO unless a level was set for it,
    and, when the program's logging has no handler (nothing configured it), writes to stderr
    itself rather than through the root logger, which would drop INFO."""
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    if not logging.getLogger().handlers and not any(isinstance(h, StderrHandler) for h in log.handlers):
        log.addHandler(StderrHandler())
        log.propagate = False
