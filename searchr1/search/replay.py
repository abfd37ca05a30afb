"""Replaying recorded search traffic (vcrpy cassettes) through the real backends.

A cassette is served by :class:`CassetteTransport`, an httpx transport given to the backend's
own client, instead of vcrpy's process-wide patching: replay then cannot capture anybody
else's HTTP traffic (the PyTRIO SDK also speaks httpx) and several cassettes can be open at
once. vcrpy still does the loading and the matching (method, scheme, host, port, path, query
and body, ``record_mode="none"``, repeats allowed).

Repeats: when a request matches several recorded interactions (a 429 followed by its
successful retry), the least-played one is served, earliest first; replaying the same query
again therefore replays the same episode again.

A request missing from the cassette raises :class:`CassetteMissError` naming the query and
saying what to do: add it to the spec (generated cassettes), record again (live ones), or
replay with the settings the cassette was recorded with (when it holds the query under other
settings). That is a harness error, not a search failure, so it propagates out of ``search()``.

A cassette carries what replay needs in its ``metadata``: the backend and the options that
shape its requests (retriever URL, Wikipedia API URL, DeepSeek model and tool type, …), so
``open_replay_backend(name, path)`` needs nothing else. A file that is not a cassette fails
with :class:`CassetteFormatError` naming it.

``open_replay_backend`` uses a :class:`~searchr1.search.clock.VirtualClock` by default, so
``Retry-After`` waits and backoff cost no real time.
"""

from __future__ import annotations

import hashlib
import pickle
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypeAlias, Unpack, cast
from urllib.parse import parse_qsl, urlsplit

import httpx
import yaml
from vcr import matchers
from vcr.cassette import Cassette
from vcr.record_mode import RecordMode
from vcr.request import Request as VcrRequest
from vcr.serializers import yamlserializer

from searchr1.core.errors import UserError
from searchr1.basics.jsonl import JsonInputError, Surrogates, decode_json
from searchr1.search.base import HttpSearchBackend
from searchr1.search.clock import Clock, VirtualClock
from searchr1.search.factory import SearchSettings, check_backend_name, create_search_backend
from searchr1.search.limits import Backoff
from searchr1.search.recording import CassetteMetadata
from searchr1.search.retriever import DEFAULT_URL as DEFAULT_RETRIEVER_URL
from searchr1.basics.secrets import redact, redact_url
from searchr1.core.types import SearchResult
from searchr1.basics import invocation

MATCH_ON = (
    matchers.method,
    matchers.scheme,
    matchers.host,
    matchers.port,
    matchers.path,
    matchers.query,
    matchers.body,
)
PLACEHOLDER_KEY = "replay-placeholder-key"
PLACEHOLDER_CONTACT = "replay@searchr1.invalid"


class CassetteMissError(UserError, LookupError):
    """The cassette has no recorded response for a request (names the query when known, and
    what to do about it)."""

    def __init__(
        self,
        *,
        cassette: str | Path,
        method: str,
        url: str,
        query: str | None = None,
        hint: str | None = None,
        differs_in: tuple[str, ...] = (),
    ) -> None:
        self.cassette = str(cassette)
        self.method = method
        self.url = redact_url(url)  # a URL given for replay may carry credentials; the message must not
        self.query = query
        self.differs_in = differs_in
        self.hint = hint or (
            f"Add the query to the cassette's spec and run `{invocation.command('cassettes build')}` "
            f"(generated cassettes), or record it with `{invocation.command('record')}` (live ones)."
        )
        subject = f"query {query!r}" if query is not None else "a request"
        verb = method if method.isascii() and method.isalpha() else repr(method)  # a cassette's method is data
        super().__init__(
            f"cassette {self.cassette} has no recorded response for {subject} ({verb} {self.url}). {self.hint}"
        )

    def with_hint(self, query: str, hint: str) -> CassetteMissError:
        return CassetteMissError(
            cassette=self.cassette,
            method=self.method,
            url=self.url,
            query=query,
            hint=hint,
            differs_in=self.differs_in,
        )


class CassetteFormatError(UserError, ValueError):
    """A cassette file that cannot be used (names the file and the problem)."""


# What vcrpy's matchers read of a request besides its method, URL and body: the headers that
# choose how bodies are compared (vcr.matchers._checker_transformer_pairs).
BODY_FORM_HEADERS = ("Content-Type", "Transfer-Encoding", "User-Agent")


# The recorded interactions each request matched, by cassette content (a digest of the parsed
# file) and then by request: every cassette opened again with the same content in this process
# (each run of one offline world, each replay of a benchmark) starts with its answers known.
# A request as the matches are remembered: its method, URI, body and the BODY_FORM_HEADERS it sent.
RequestKey: TypeAlias = tuple[str, str, bytes | str | None, tuple[str | None, ...]]
_MATCHES: dict[bytes, dict[RequestKey, tuple[int, ...]]] = {}
_MATCHES_KEPT = 8


def _matches_of(data: dict[str, object]) -> dict[RequestKey, tuple[int, ...]]:
    digest = hashlib.sha256(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    if digest not in _MATCHES and len(_MATCHES) >= _MATCHES_KEPT:
        _MATCHES.clear()
    return _MATCHES.setdefault(digest, {})


class _LeastPlayedCassette(Cassette):
    """Serve the least-played matching interaction (earliest first) instead of always the first.

    vcrpy compares a request with every recorded one, and writes a diff for each body that
    differs. A replayed run asks the same queries again and again, so the indices a request
    matches are remembered per request (its method, URL, body and the headers the matchers
    read), for every cassette of the same content (:func:`_matches_of`): a cassette is
    read-only, so the answer cannot change."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._matching: dict[RequestKey, tuple[int, ...]] = {}

    def _responses(self, request):
        key = (request.method, request.uri, request.body,
               tuple(request.headers.get(name) for name in BODY_FORM_HEADERS))
        if key not in self._matching:
            self._matching[key] = tuple(index for index, _ in super()._responses(request))
        for index in self._matching[key]:
            yield index, self.data[index][1]

    def play_response(self, request):
        candidates = list(self._responses(request))
        if not candidates:
            return super().play_response(request)  # raises vcrpy's own "not found" error
        index, response = min(candidates, key=lambda pair: (self.play_counts[pair[0]], pair[0]))
        self.play_counts[index] += 1
        return response


def _not_a_cassette(path: Path, why: str) -> CassetteFormatError:
    return CassetteFormatError(
        f"{path} is not a search cassette ({why}); expected a vcrpy YAML file with "
        f"'interactions' (make one with `{invocation.command('record')}` or "
        f"`{invocation.command('cassettes build')}`)"
    )


def _is_headers(value: object) -> bool:
    """vcrpy's headers: each name with a list of string values."""
    return isinstance(value, Mapping) and all(
        isinstance(name, str) and isinstance(values, list) and all(isinstance(item, str) for item in values)
        for name, values in value.items())


def _broken_field(interaction: object) -> str | None:
    """What is wrong with one recorded interaction, naming its field (``None`` when it is one
    the transport can replay)."""
    if not isinstance(interaction, Mapping):
        return "not a mapping with a request and a response"
    request, response = interaction.get("request"), interaction.get("response")
    if not isinstance(request, Mapping) or not {"method", "uri", "body", "headers"} <= set(request):
        return "lacks a request (method, uri, body, headers)"
    if not isinstance(response, Mapping) or not {"status", "headers", "body"} <= set(response):
        return "lacks a response (status, headers, body)"
    if not isinstance(request["method"], str) or not isinstance(request["uri"], str):
        return "request.method and request.uri must be strings"
    if request["body"] is not None and not isinstance(request["body"], str | bytes):
        return "request.body must be text, bytes or null"
    if not _is_headers(request["headers"]):
        return "request.headers must map each name to a list of strings"
    status = response["status"]
    code = status.get("code") if isinstance(status, Mapping) else None
    if isinstance(code, bool) or not isinstance(code, int) or not 100 <= code <= 599:
        return f"response.status.code must be an HTTP status (100-599), got {code!r}"
    if status.get("message") is not None and not isinstance(status.get("message"), str):
        return "response.status.message must be text"
    if not _is_headers(response["headers"]):
        return "response.headers must map each name to a list of strings"
    body = response["body"]
    if not isinstance(body, Mapping) or "string" not in body or not (
            body["string"] is None or isinstance(body["string"], str | bytes)):
        return "response.body.string must be text, bytes or null"
    return None


# Cassettes parsed in this process, as pickles keyed by the file's identity: an offline run checks
# its cassette before the run and opens it again to replay it, and each parse costs tens of ms.
_PARSED: dict[tuple[str, int, int, int], bytes] = {}
_PARSED_KEPT = 8


def read_cassette_data(path: str | Path) -> dict[str, object]:
    """The parsed cassette file, checked for the shape of a vcrpy cassette. A file read before in
    this process and unchanged since (same inode, size and modification time) is not parsed
    again; every caller gets its own copy."""
    path = Path(path)
    if not path.is_file():
        raise CassetteFormatError(f"cassette {path} does not exist")
    try:
        info = path.stat()
    except OSError as exc:
        raise CassetteFormatError(f"cassette {path} cannot be read: {exc}") from exc
    key = (str(path.resolve()), info.st_ino, info.st_size, info.st_mtime_ns)
    kept = _PARSED.get(key)
    if kept is not None:
        return pickle.loads(kept)
    data = _parse_cassette(path)
    if len(_PARSED) >= _PARSED_KEPT:
        _PARSED.clear()
    _PARSED[key] = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
    return data


def _parse_cassette(path: Path) -> dict[str, object]:
    try:
        data = yamlserializer.deserialize(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise _not_a_cassette(path, "binary data, not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise _not_a_cassette(path, f"not valid YAML{where}") from None
    except OSError as exc:
        raise CassetteFormatError(f"cassette {path} cannot be read: {exc}") from exc
    if data is None:
        raise _not_a_cassette(path, "the file is empty")
    if not isinstance(data, dict):
        raise _not_a_cassette(path, f"its top level is {type(data).__name__}, not a mapping")
    interactions = data.get("interactions")
    if not isinstance(interactions, list):
        raise _not_a_cassette(path, "no 'interactions' list")
    for number, interaction in enumerate(interactions, start=1):
        broken = _broken_field(interaction)
        if broken:
            raise _not_a_cassette(path, f"interaction {number}: {broken}")
    if not interactions:
        raise CassetteFormatError(f"cassette {path} holds no interactions")
    return data


class _Parsed:
    """A vcrpy serializer for a cassette already parsed and checked by :func:`read_cassette_data`:
    vcrpy's loader builds its requests and responses from that data instead of parsing the YAML
    again (the parse is most of the cost of opening a cassette)."""

    def __init__(self, data: dict[str, object]) -> None:
        self.data = data

    def deserialize(self, cassette_string: str) -> dict[str, object]:
        return self.data

    def serialize(self, cassette_dict: dict[str, object]) -> str:
        return yamlserializer.serialize(cassette_dict)


def load_cassette(path: str | Path, data: dict[str, object] | None = None) -> Cassette:
    """Load a cassette for replay only (no recording, no patching); ``data``: the file as
    :func:`read_cassette_data` returned it, when the caller has read it already (vcrpy takes
    the response dicts over)."""
    path = Path(path)
    if data is None:
        data = read_cassette_data(path)
    matches = _matches_of(data)  # of the file's content, before vcrpy takes its dicts over
    try:
        cassette = _LeastPlayedCassette.load(
            path=str(path),
            serializer=_Parsed(data),
            match_on=MATCH_ON,
            record_mode=RecordMode.NONE,
            allow_playback_repeats=True,
        )
    except (ValueError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise CassetteFormatError(f"cassette {path} cannot be loaded: {exc}") from exc
    if len(cassette) == 0:
        raise CassetteFormatError(f"cassette {path} holds no interactions")
    cassette._matching = matches
    return cassette


def _metadata(data: Mapping[str, object]) -> CassetteMetadata:
    metadata = data.get("metadata")
    return cast(CassetteMetadata, dict(metadata)) if isinstance(metadata, Mapping) else {}  # the file's YAML


def read_cassette_metadata(path: str | Path) -> CassetteMetadata:
    """The ``metadata`` mapping stored in a cassette ({} when there is none)."""
    return _metadata(read_cassette_data(path))


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def recorded_texts(cassette: Cassette) -> set[str]:
    """Every string a recorded request carried (query parameters, JSON body values): where
    a query shows up if it was recorded at all."""
    texts: set[str] = set()
    for request in cassette.requests:
        texts.update(value for _, value in parse_qsl(urlsplit(request.uri).query))
        body = request.body
        if isinstance(body, bytes):
            body = body.decode("utf-8", "replace")
        if body:
            try:
                texts.update(_strings(decode_json(body, where=str(cassette.path), surrogates=Surrogates.MEND)))
            except JsonInputError:
                texts.add(body)
    return {text.strip() for text in texts}


class CassetteTransport(httpx.AsyncBaseTransport):
    """An httpx transport that answers from a cassette and never touches the network."""

    def __init__(self, cassette: Cassette | str | Path) -> None:
        self.cassette = cassette if isinstance(cassette, Cassette) else load_cassette(cassette)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        wanted = VcrRequest(request.method, str(request.url), body, request.headers)
        if not self.cassette.can_play_response_for(wanted):
            closest = self.cassette.find_requests_with_most_matches(wanted)
            differs = tuple(name for name, _message in closest[0][2]) if closest else ()
            raise CassetteMissError(
                cassette=self.cassette.path, method=request.method, url=str(request.url), differs_in=differs
            )
        recorded = self.cassette.play_response(wanted)
        message = recorded["status"].get("message") or ""
        return httpx.Response(
            recorded["status"]["code"],
            # as UTF-8 bytes: httpx would encode a str as ASCII and fail on any other recorded
            # character; the client reads back the same text (httpx decodes ASCII, then UTF-8)
            headers=[(name.encode("utf-8", "surrogatepass"), value.encode("utf-8", "surrogatepass"))
                     for name, values in recorded["headers"].items() for value in values],
            stream=httpx.ByteStream(recorded["body"]["string"] or b""),
            extensions={"reason_phrase": message.encode("ascii", "replace")} if message else {},
            request=request,
        )


class ReplayBackend:
    """A backend answering from a cassette. Same interface as the backend it wraps
    (``name``, ``search``, ``stats``, ``aclose``, async context manager)."""

    def __init__(
        self,
        backend: HttpSearchBackend,
        cassette_path: str | Path,
        *,
        metadata: CassetteMetadata | None = None,
        cassette: Cassette | None = None,
    ) -> None:
        self.backend = backend
        self.name = backend.name
        self.stats = backend.stats
        self.cassette_path = Path(cassette_path)
        self.metadata: CassetteMetadata = metadata.copy() if metadata else {}
        self._cassette = cassette

    async def search(self, query: str) -> SearchResult:
        try:
            return await self.backend.search(query)
        except CassetteMissError as exc:
            raise exc.with_hint(query, self.miss_hint(query, exc.differs_in)) from None

    def miss_hint(self, query: str, differs_in: tuple[str, ...] = ()) -> str:
        """What to do about a query this cassette cannot answer."""
        if self._cassette is not None and query.strip() in recorded_texts(self._cassette):
            settings = redact(", ".join(
                f"{k}={(redact_url(v) if isinstance(v, str) else v)!r}"
                for k, v in sorted((self.metadata.get("options") or {}).items())
            ))
            parts = ", ".join(differs_in) or "the request"
            return (
                f"The cassette holds this query, but recorded with other request settings (the "
                f"requests differ in: {parts}). Replay with the settings it was recorded with"
                + (f" ({settings})" if settings else "")
                + ", or record it again with the new ones."
            )
        if self.metadata.get("provenance") == "live":
            return (
                f"This cassette was recorded live: record it again with the query included "
                f"(`{invocation.command('record')} --backend {self.name} --query ... --cassette "
                f"{self.cassette_path} --overwrite`)."
            )
        spec = self.metadata.get("spec")
        if spec:
            return (
                f"Add the query to cassettes/{spec} and run `{invocation.command('cassettes build')}` "
                "(this cassette is generated from that spec)."
            )
        return (
            f"Record the query into a cassette with `{invocation.command('record')}`, or add it to a "
            f"spec under cassettes/specs/ and run `{invocation.command('cassettes build')}`."
        )

    async def aclose(self) -> None:
        await self.backend.aclose()

    async def __aenter__(self) -> ReplayBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"ReplayBackend({self.backend!r}, cassette={str(self.cassette_path)!r})"


def open_replay_backend(
    name: str,
    cassette_path: str | Path,
    *,
    clock: Clock | None = None,
    **options: Unpack[SearchSettings],
) -> ReplayBackend:
    """A backend of kind ``name`` whose HTTP traffic is answered by the cassette.

    Options recorded in the cassette's metadata (e.g. ``max_retries``) apply unless
    overridden by ``options``. Keys are placeholders (as many as were used when recording),
    so no real key is needed. Time is virtual unless a ``clock`` is given. No cache unless
    ``cache=`` is passed (replayed answers must not leak into a live cache).
    """
    check_backend_name(name)
    data = read_cassette_data(cassette_path)
    metadata = _metadata(data)  # before vcrpy takes the interactions over
    recorded_backend = metadata.get("backend")
    if recorded_backend is not None and recorded_backend != name:
        raise CassetteFormatError(
            f"cassette {cassette_path} was recorded for {recorded_backend!r}, not {name!r}"
        )
    given = {key: value for key, value in options.items() if value is not None}
    # The options the cassette was recorded with (its YAML: the factory checks them), then the caller's.
    settings = cast(SearchSettings, {**(metadata.get("options") or {}), **given})
    if name == "zhihu":
        settings.setdefault(
            "keys", tuple(f"{PLACEHOLDER_KEY}-{i + 1}" for i in range(int(metadata.get("keys", 1))))
        )
    elif name == "deepseek":
        settings.setdefault("api_key", PLACEHOLDER_KEY)
    elif name == "wikipedia":
        settings.setdefault("contact", PLACEHOLDER_CONTACT)  # never the user's: not needed to match
    elif name == "retriever":
        settings.setdefault("url", DEFAULT_RETRIEVER_URL)  # never $SEARCHR1_RETRIEVER_URL
    settings.setdefault("backoff", Backoff(rng=random.Random(0)))
    cassette = load_cassette(cassette_path, data)
    try:
        backend = create_search_backend(
            name,
            clock=clock or VirtualClock(),
            transport=CassetteTransport(cassette),
            **settings,
        )
    except (TypeError, ValueError) as exc:
        raise CassetteFormatError(
            f"cassette {cassette_path}: its recorded options do not fit {name}: {redact(str(exc))}"
        ) from None
    return ReplayBackend(backend, cassette_path, metadata=metadata, cassette=cassette)
