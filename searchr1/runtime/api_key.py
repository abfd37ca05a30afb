"""Who may call our servers (``serve``, ``retriever serve``): an API key every request sends as
``Authorization: Bearer <key>``, and the rule that a server other machines can reach has one.

* :func:`required_key` is the rule, applied before a server binds: a ``--host`` other than
  loopback (127.0.0.0/8, ::1, ``localhost``) without a key is refused in one line naming
  ``--api-key``, unless its owner passed ``--allow-anyone``.
* :class:`ApiKeyGuard` is the ASGI middleware that checks each request: a request to any path
  but :data:`OPEN_PATHS` without the key is a 401 in OpenAI's error shape (``code:
  "invalid_api_key"``) with ``WWW-Authenticate: Bearer``. Its body is never handed to the server:
  the guard reads and drops up to :data:`MAX_DRAINED_BYTES` of it first, so that closing the
  connection after the answer does not reset it under a client still reading the 401. The check
  compares SHA-256 digests with :func:`hmac.compare_digest`, so it takes the same time whatever
  the key sent, its length included. The guard keeps only the key's digest; the key itself
  lives in a :class:`~searchr1.basics.secrets.Secret` and is never in a log line, an answer or a
  ``repr``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import TYPE_CHECKING

from searchr1.core.errors import UsageError
from searchr1.runtime.http_bounds import shown
from searchr1.basics.json_types import JsonObject
from searchr1.basics.secrets import Secret

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

API_KEY_ENV = "SEARCHR1_SERVE_API_KEY"  # where --api-key is read from when the flag is not given
OPEN_PATHS = ("/healthz",)  # answered without a key: what is served, for load balancers and probes
INVALID_API_KEY = "invalid_api_key"  # OpenAI's error code for a missing or wrong key
MAX_DRAINED_BYTES = 1 << 20  # of a refused request's body, read and dropped before the 401
MIN_KEY_CHARS = 16  # a shorter key is guessed sooner, and too short to be masked reliably wherever it is echoed


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as ``--host`` takes it) is reachable from this machine only: ``localhost``
    or a loopback address (127.0.0.0/8, ::1, also written ``[::1]``). Any other name, the
    wildcard addresses (0.0.0.0, ::, the empty host) and every other address are not."""
    name = host.strip().lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def check_key_text(value: str) -> str | None:
    """Why ``value`` cannot be an API key (it travels in an HTTP header), or ``None``. The reason
    never quotes the value."""
    if not all("!" <= character <= "~" for character in value):
        return "must be printable ASCII without spaces (it travels in an Authorization header)"
    if len(value) < MIN_KEY_CHARS:
        return (f"must be at least {MIN_KEY_CHARS} characters, e.g. "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
    return None


def required_key(host: str, key: Secret | None, allow_anyone: bool) -> Secret | None:
    """The key a server on ``host`` requires (``None``: anyone may call it), or
    :class:`~searchr1.core.errors.UsageError` in one line: a host other machines reach needs a key
    or ``--allow-anyone``, and the two together contradict each other."""
    if key is not None and allow_anyone:
        raise UsageError(f"--allow-anyone serves without a key, but a key is given (--api-key or ${API_KEY_ENV}); "
                         "drop one of them")
    if key is None and not allow_anyone and not is_loopback(host):
        written = host if host and all("!" <= c <= "~" for c in host) and len(host) <= 64 else shown(host)
        raise UsageError(f"--host {written} lets other machines call this server: pass --api-key (or set "
                         f"${API_KEY_ENV}), or --allow-anyone to let anyone who reaches the port call it")
    return key


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def presented_key(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The key a request's first ``Authorization: Bearer <key>`` header carries (the scheme read
    case-insensitively), or ``None`` when there is no such header."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


def unauthorized_body(presented: bytes | None) -> JsonObject:
    """The 401 body in OpenAI's error shape; it never quotes what was sent."""
    message = ("no API key: send the header `Authorization: Bearer <key>`" if presented is None
               else "the API key sent is not this server's")
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": INVALID_API_KEY}}


async def drain(receive: Receive, limit: int) -> None:
    """Read and drop a request's body until its end, the client's disconnect, or ``limit`` bytes."""
    read = 0
    while read <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        read += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class ApiKeyGuard:
    """ASGI middleware: HTTP requests to paths other than ``open_paths`` reach ``app`` only with
    ``Authorization: Bearer <key>``; others get 401 (see the module docstring)."""

    def __init__(self, app: ASGIApp, key: Secret, open_paths: tuple[str, ...] = OPEN_PATHS) -> None:
        self.app = app
        self.open_paths = open_paths
        self._digest = _digest(key.reveal().encode())

    def authorized(self, presented: bytes | None) -> bool:
        """Whether ``presented`` is the key, compared in constant time (digests of equal length)."""
        return presented is not None and hmac.compare_digest(_digest(presented), self._digest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        presented = presented_key(scope.get("headers") or [])
        if self.authorized(presented):
            await self.app(scope, receive, send)
            return
        from starlette.responses import JSONResponse

        await drain(receive, MAX_DRAINED_BYTES)
        # connection: close, so that a body left unread is never taken for the next request
        response = JSONResponse(unauthorized_body(presented), status_code=401,
                                headers={"www-authenticate": "Bearer", "connection": "close"})
        await response(scope, receive, send)

    def __repr__(self) -> str:
        return f"ApiKeyGuard(open_paths={self.open_paths!r})"
