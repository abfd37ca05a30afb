"""Recording cassettes: vcrpy around the real client, secrets scrubbed, files replaced atomically.

Used by ``python cli.py record`` (live services) and ``python cli.py cassettes build`` (the
in-process fake services). Requests are recorded exactly as the client sends them, except:

- headers ``Authorization``, ``x-api-key``, ``Cookie``, ``Proxy-Authorization`` are dropped,
  and ``X-Request-Timestamp`` too (it changes every second and is never matched);
- query parameters that usually carry keys (``key``, ``api_key``, ``apikey``, ``token``,
  ``access_token``) are dropped;
- every known key value is replaced by ``<SECRET_n>`` anywhere in requests and responses
  (vcrpy's ``filter_sensitive_data``: bodies, URLs, echoes in responses), and personal values
  such as the Wikipedia contact (an e-mail in the User-Agent) by their own placeholder
  (``<CONTACT>``), the same way;
- the version of every library named in the ``User-Agent`` (``httpx/0.28`` after the client's
  own ``searchr1/<version>``) is stored as ``<version>``: the live request carries the installed
  library's real version, as Wikimedia's policy asks, and the cassette stays the same whatever
  release is installed;
- ``Set-Cookie`` response headers are dropped; compressed bodies are stored decoded, unless
  the caller keeps them compressed (the cassette builder does, so that replay exercises the
  client's gzip handling; they are then stored as YAML ``!!binary``).

The cassette is written to a temporary file next to the target, checked for every key and
personal value (raw, URL-encoded and JSON-escaped, inside compressed bodies too), and only
then renamed over the target, so an existing cassette survives a crash or a leak. A block
that raises writes nothing: that is how ``record`` refuses to keep a failed recording.
"""

from __future__ import annotations

import gzip
import os
import re
import threading
import zlib
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from secrets import token_hex
from typing import NoReturn, NotRequired, Protocol, TypedDict

import vcr
import yaml
from vcr.cassette import Cassette
from vcr.persisters.filesystem import CassetteNotFoundError
from vcr.serialize import serialize
from vcr.serializers import yamlserializer

from searchr1.search.base import CLIENT_PRODUCT
from searchr1.basics.secrets import Secret, redact_url, secret_forms

SECRET_REQUEST_HEADERS = (
    "authorization",
    "x-api-key",
    "cookie",
    "proxy-authorization",
    "x-request-timestamp",
)
SECRET_QUERY_PARAMETERS = ("key", "api_key", "apikey", "token", "access_token")
DROPPED_RESPONSE_HEADERS = ("set-cookie",)
# A recorder never plays a response back (record_mode "all"), yet vcrpy asks, before each
# request, whether it could: with matchers, by comparing the request with every one already
# recorded (quadratic in a cassette's length; 40% of building the shipped cassettes). Without
# matchers that question is answered at the first recorded request. Replay matches with its own
# (searchr1.search.replay).
RECORD_MATCH_ON: tuple[str, ...] = ()
# A product token of RFC 9110's User-Agent grammar: ``name/version``, outside a comment.
PRODUCT_TOKEN = re.compile(r"(?<![^\s])([!#$%&'*+.^_`|~0-9A-Za-z-]+)/([^\s()]+)")
VERSION_PLACEHOLDER = "<version>"


class SecretLeakError(RuntimeError):
    """A key value survived scrubbing; the cassette was not written."""


class CassetteMetadata(TypedDict, total=False):
    """A cassette's ``metadata``: what replaying it needs besides its path, and where it came from
    (written by ``cassettes build`` and ``record`` through :func:`recording`)."""

    backend: str
    options: dict[str, object]  # the backend's options that shape its requests
    keys: int  # zhihu: how many keys the client rotated
    provenance: str  # "live", or how a synthetic cassette was made
    generator: str
    spec: str  # a generated cassette's spec, under cassettes/
    recorded_at: str
    failed_queries: list[str]


class VcrRequest(Protocol):
    """What the recorder changes of a request vcrpy is about to record."""

    uri: str
    headers: MutableMapping[str, str]


class VcrStatus(TypedDict):
    code: int
    message: NotRequired[str | None]


class VcrBody(TypedDict):
    string: bytes | str | None


class VcrResponse(TypedDict):
    """A response as vcrpy records it."""

    status: VcrStatus
    headers: dict[str, list[str]]  # each name with every value it was sent with
    body: VcrBody


def _drop_response_headers(response: VcrResponse) -> VcrResponse:
    headers = response.get("headers") or {}
    response["headers"] = {
        name: values for name, values in headers.items() if name.lower() not in DROPPED_RESPONSE_HEADERS
    }
    return response


def find_leaks(text: str, secrets: Sequence[Secret]) -> list[int]:
    """1-based numbers of the secrets that appear in ``text``."""
    return [
        n for n, secret in enumerate(secrets, start=1) if any(form in text for form in secret_forms(secret))
    ]


def compressed_bodies(text: str) -> list[str]:
    """The decompressed text of every binary (compressed) response body in a cassette file."""
    try:
        data = yamlserializer.deserialize(text)
    except yaml.YAMLError:
        return []
    out: list[str] = []
    for interaction in (data or {}).get("interactions") or []:
        body = ((interaction.get("response") or {}).get("body") or {}).get("string")
        if isinstance(body, bytes):
            try:
                out.append(gzip.decompress(body).decode("utf-8", "replace"))
            except (OSError, EOFError, zlib.error):
                out.append(body.decode("latin-1"))
    return out


def placeholders(secrets: Sequence[Secret], private: Mapping[str, Secret]) -> list[tuple[str, str]]:
    """``(placeholder, value)`` pairs for vcrpy's ``filter_sensitive_data``: ``<SECRET_n>`` for
    every form of key n (:func:`secret_forms`: an echo may hold it URL-quoted or in base64), the
    given placeholder for personal values. Longer values come first, so a value is replaced
    before any shorter one inside it."""
    pairs = [(f"<SECRET_{n}>", form) for n, s in enumerate(secrets, start=1) for form in secret_forms(s)]
    pairs += [(placeholder, s.reveal()) for placeholder, s in private.items() if s.reveal()]
    return sorted(pairs, key=lambda pair: (-len(pair[1]), pair))


def unversioned_user_agent(agent: str) -> str:
    """``agent`` with every library's version replaced by ``<version>``; the client's own product
    token (``searchr1/<version>``, this checkout's version) and the comments in parentheses are
    kept as sent."""
    own_name = CLIENT_PRODUCT.split("/", 1)[0]

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        return match.group(0) if name == own_name else f"{name}/{VERSION_PLACEHOLDER}"

    parts, depth = [], 0
    for part in re.split(r"([()])", agent):
        if part == "(":
            depth += 1
        elif part == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            part = PRODUCT_TOKEN.sub(replace, part)
        parts.append(part)
    return "".join(parts)


def _normalise_request(request: VcrRequest) -> VcrRequest:
    """The request as recorded: its URI without userinfo or credential parameters (httpx sends
    userinfo as an Authorization header, which is dropped too), and its User-Agent without the
    installed libraries' versions (:func:`unversioned_user_agent`)."""
    request.uri = redact_url(request.uri)
    agent = request.headers.get("User-Agent")
    if isinstance(agent, str):
        request.headers["User-Agent"] = unversioned_user_agent(agent)
    return request


class _FreshFilePersister:
    """vcrpy's persister for one recording: nothing is loaded (every recording starts empty),
    and the file is created exclusively (``O_EXCL``, ``O_NOFOLLOW``): a file or symlink planted
    under the temporary name is never followed. A failure is kept in ``error`` and raised by
    :func:`recording` after vcrpy has removed its patches (raising inside vcrpy's exit would
    leave them in place)."""

    def __init__(self) -> None:
        self.error: OSError | None = None

    def load_cassette(self, cassette_path: str, serializer: object) -> NoReturn:
        raise CassetteNotFoundError()

    def save_cassette(self, cassette_path: str, cassette_dict: dict[str, object], serializer: object) -> None:
        data = serialize(cassette_dict, serializer).encode("utf-8")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        try:
            descriptor = os.open(cassette_path, flags, 0o666)  # the umask decides
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as error:
            self.error = error


def recorder(
    secrets: Sequence[Secret],
    private: Mapping[str, Secret] | None = None,
    *,
    decode_compressed: bool = True,
    persister: _FreshFilePersister | None = None,
    thread: int | None = None,
) -> vcr.VCR:
    """A vcrpy recorder that scrubs ``secrets`` and ``private`` values. vcrpy patches httpx for
    the whole process; with ``thread`` (a ``threading.get_ident()``) only the requests made on
    that thread are kept, so what another thread sends meanwhile (a server of another test
    shutting down, a library's background call) never lands in the cassette."""

    def kept(request: VcrRequest) -> VcrRequest | None:
        if thread is not None and threading.get_ident() != thread:
            return None  # vcrpy neither records nor replays it: the request goes out as it would
        return _normalise_request(request)

    tape = vcr.VCR(
        before_record_request=kept,
        serializer="yaml",
        record_mode="all",
        match_on=RECORD_MATCH_ON,
        filter_headers=list(SECRET_REQUEST_HEADERS),
        filter_query_parameters=list(SECRET_QUERY_PARAMETERS),
        before_record_response=_drop_response_headers,
        decode_compressed_response=decode_compressed,
        filter_sensitive_data=placeholders(secrets, private or {}),
    )
    tape.register_persister(persister or _FreshFilePersister())
    return tape


@contextmanager
def recording(
    path: str | Path,
    *,
    secrets: Sequence[Secret],
    metadata: Mapping[str, object],
    overwrite: bool = False,
    private: Mapping[str, Secret] | None = None,
    decode_compressed: bool = True,
) -> Iterator[Cassette]:
    """Record every httpx request made inside the block, on the thread that opened it, into the
    cassette at ``path``.

    ``secrets`` (keys) and ``private`` (placeholder → personal value) are scrubbed. Refuses to
    replace an existing file unless ``overwrite``. Nothing is written to ``path`` if the block
    raises or a secret would leak. Metadata may be added inside the block with
    ``cassette.get_metadata(key, value)``.
    """
    private = dict(private or {})
    target = Path(path)
    if target.exists() and not overwrite:
        raise FileExistsError(f"cassette {target} already exists; pass --overwrite to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    # An unpredictable name, created exclusively by the persister: nothing planted is followed.
    temporary = target.with_name(f".{target.name}.{os.getpid()}-{token_hex(8)}.recording")
    finished = False
    try:
        persister = _FreshFilePersister()
        with recorder(secrets, private, decode_compressed=decode_compressed, persister=persister,
                      thread=threading.get_ident()).use_cassette(str(temporary)) as cassette:
            for key, value in metadata.items():
                cassette.get_metadata(key, value)
            yield cassette
        if persister.error is not None:  # named as the cassette (the temporary name means nothing)
            raise OSError(persister.error.errno, persister.error.strerror, str(target))
        text = temporary.read_text(encoding="utf-8")
        texts = [text, *compressed_bodies(text)]
        leaked = sorted({n for part in texts for n in find_leaks(part, secrets)})
        if leaked:
            raise SecretLeakError(
                f"key number(s) {leaked} would have been written to {target}; nothing was written"
            )
        personal = sorted({p for part in texts for p, s in private.items() if find_leaks(part, [s])})
        if personal:
            raise SecretLeakError(
                f"the value behind {', '.join(personal)} would have been written to {target}; "
                "nothing was written"
            )
        os.replace(temporary, target)
        finished = True
    finally:
        if not finished:
            temporary.unlink(missing_ok=True)
