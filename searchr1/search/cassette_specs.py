"""Cassette specs: the hand-written source from which the shipped cassettes are generated.

A spec is a JSON file. ``cassettes/specs/<backend>/<name>.json`` makes
``cassettes/<backend>/<name>.yaml``; ``cassettes/specs/<name>.json`` lists its ``backends``
and makes one cassette per backend (the ``demo`` set works this way). Layout::

    {
      "description": "what the cassette is for",
      "backends": ["wikipedia", "zhihu"],        # top-level specs only
      "options": {"max_retries": 2},             # backend options when recording and replaying
      "keys": 2,                                 # zhihu: how many keys the client rotates
      "queries": [
        {"query": "The Little Prince author",
         "results": [{"title": "The Little Prince", "text": "..."}]},        # shorthand
        {"query": "...", "scenario": "429 then success",
         "responses": [{"status": 429, "retry_after": 2}, {"results": [...]}],
         "expect": {"ok": true, "rate_limited": true, "min_latency": 2}}
      ]
    }

Responses use the fake-service vocabulary (:mod:`searchr1.search.fake_service`). ``expect``
(optional) states the outcome the replay tests check: ``ok``, ``error`` (a substring),
``status``, ``rate_limited``, ``min_latency``, ``titles``; without it a query is expected to succeed with
the titles of its last scripted ``results``.

A spec for wikipedia or retriever may also list ``pages``, read with ``open_page`` (through the
page backend the search backend makes, :func:`searchr1.search.pages.page_backend_for`) after
its queries::

      "pages": [
        {"page": "Eiffel Tower", "scenario": "a page longer than the window, read on",
         "paragraphs": ["...", "..."],          # null: no such page
         "title": "Eiffel Tower",               # optional: another title is a redirect (wikipedia)
         "offsets": [0, 4],                     # the reads, in order (default [0])
         "responses": [{"status": 503}, {}],    # optional: what the next requests get ({}: the page)
         "expect": {"ok": false, "error": "HTTP 503", "attempts": 3}}
      ]

``expect`` for a page (of its first read): ``ok``, ``error``, ``status``, ``min_latency`` and
``attempts`` (requests sent); without it every read is expected to succeed with the scripted
paragraphs from its offset.

``build`` records every spec through the real client against the fake service (virtual time,
placeholder keys) and writes the cassettes atomically; ``check`` rebuilds in a temporary
directory and reports every cassette that differs. Cassettes recorded live (metadata
``provenance: live``) are never overwritten by ``build`` and never compared.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, cast

import httpx

from searchr1.core.errors import UserError
from searchr1.core.tools import ToolCall
from searchr1.search.cache import normalise_query
from searchr1.search.clock import VirtualClock
from searchr1.search.factory import HTTP_BACKEND_NAMES as BACKEND_NAMES
from searchr1.search.factory import BackendSettings, create_search_backend
from searchr1.search.fake_service import (PAGE_BACKENDS, FakeSearchService, PageScript, ScriptedResponse,
                                         check_page_script, check_response_spec)
from searchr1.search.limits import Backoff
from searchr1.search.recording import recording
from searchr1.search.replay import read_cassette_metadata
from searchr1.basics.secrets import Secret
from searchr1.basics import invocation

CASSETTE_ROOT = Path(__file__).resolve().parents[2] / "cassettes"
GENERATOR = invocation.command("cassettes build", checkout=True)  # generated files read the same whoever ran it
SYNTHETIC = (
    "synthetic: served by the in-process fake service to the documented wire format "
    f"(not a capture of the live service); regenerate with `{GENERATOR}`"
)
BUILD_CONTACT = "cassette-builder@searchr1.invalid"
EXPECT_KEYS = {"ok", "error", "status", "rate_limited", "min_latency", "titles"}
SPEC_KEYS = {"description", "backends", "options", "keys", "queries", "pages"}
QUERY_KEYS = {"query", "scenario", "results", "responses", "expect"}
PAGE_ENTRY_KEYS = {"page", "scenario", "offsets", "expect", "title", "paragraphs", "revision", "responses"}
PAGE_EXPECT_KEYS = {"ok", "error", "status", "min_latency", "attempts"}
README_BEGIN = f"<!-- BEGIN GENERATED: {GENERATOR} -->"
README_END = "<!-- END GENERATED -->"


class SpecError(UserError, ValueError):
    """A spec file is malformed, or disagrees with what the client does (names file and query)."""


class QueryExpect(TypedDict, total=False):
    """What replaying a query gives (``EXPECT_KEYS``)."""

    ok: bool
    error: str  # a part of the error
    status: int
    rate_limited: bool
    min_latency: float
    titles: list[str]


class PageExpect(TypedDict, total=False):
    """What the first read of a page gives (``PAGE_EXPECT_KEYS``)."""

    ok: bool
    error: str
    status: int
    min_latency: float
    attempts: int


@dataclass(frozen=True)
class QuerySpec:
    query: str
    responses: tuple[ScriptedResponse, ...]
    scenario: str = ""
    expect: QueryExpect = field(default_factory=lambda: QueryExpect())

    @property
    def expected_ok(self) -> bool:
        return bool(self.expect.get("ok", True))

    def expected_titles(self, limit: int = 3) -> list[str]:
        """``expect.titles`` if given, else the titles of the last scripted results that have
        text, best first (what parsing must recover)."""
        if "titles" in self.expect:
            return list(self.expect["titles"])
        for response in reversed(self.responses):
            if "results" in response:
                return [r["title"] for r in response["results"] if (r["text"] or "").strip()][:limit]
        return []


@dataclass(frozen=True)
class PageSpec:
    """One page a spec opens with ``open_page``: its script for the fake service (``title``,
    ``paragraphs``, ``revision``, ``responses``), the offsets read, and what the first read gives."""

    page: str
    script: PageScript
    offsets: tuple[int, ...] = (0,)
    scenario: str = ""
    expect: PageExpect = field(default_factory=lambda: PageExpect())

    @property
    def expected_ok(self) -> bool:
        return bool(self.expect.get("ok", True))

    @property
    def paragraphs(self) -> tuple[str, ...]:
        """The page's scripted paragraphs (none: no such page)."""
        return tuple(self.script.get("paragraphs") or ())


@dataclass(frozen=True)
class CassetteSpec:
    name: str
    path: Path
    backends: tuple[str, ...]
    description: str
    queries: tuple[QuerySpec, ...]
    options: BackendSettings = field(default_factory=lambda: BackendSettings())
    keys: int = 1
    pages: tuple[PageSpec, ...] = ()

    def script(self) -> dict[str, list[ScriptedResponse]]:
        return {q.query: list(q.responses) for q in self.queries}

    def page_script(self) -> dict[str, PageScript]:
        return {p.page: p.script for p in self.pages}

    def cassette_path(self, backend: str, root: Path = CASSETTE_ROOT) -> Path:
        return root / backend / f"{self.name}.yaml"


def load_spec(path: Path, root: Path = CASSETTE_ROOT) -> CassetteSpec:
    """Parse and validate one spec file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path}: cannot read JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: top level must be an object")
    unknown = sorted(set(data) - SPEC_KEYS)
    if unknown:
        raise SpecError(f"{path}: unknown key(s) {unknown}; allowed: {sorted(SPEC_KEYS)}")
    parent = path.parent.name
    if parent in BACKEND_NAMES:
        backends = (parent,)
        if "backends" in data and tuple(data["backends"]) != backends:
            raise SpecError(f"{path}: a spec under specs/{parent}/ is for {parent} only")
    else:
        backends = tuple(data.get("backends") or ())
        if not backends:
            raise SpecError(f"{path}: a top-level spec must list its 'backends'")
    for backend in backends:
        if backend not in BACKEND_NAMES:
            raise SpecError(f"{path}: unknown backend {backend!r}; choose from {', '.join(BACKEND_NAMES)}")
    queries: list[QuerySpec] = []
    seen: set[str] = set()
    for n, entry in enumerate(data.get("queries") or []):
        where = f"{path}: queries[{n}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("query"), str):
            raise SpecError(f"{where}: needs a string 'query'")
        extra = sorted(set(entry) - QUERY_KEYS)
        if extra:
            raise SpecError(f"{where}: unknown key(s) {extra}; allowed: {sorted(QUERY_KEYS)}")
        query = normalise_query(entry["query"])
        if not query:
            raise SpecError(f"{where}: empty query")
        if query in seen:
            raise SpecError(f"{where}: query {query!r} appears twice; give it several 'responses' instead")
        seen.add(query)
        if ("results" in entry) == ("responses" in entry):
            raise SpecError(f"{where} ({query!r}): give exactly one of 'results' or 'responses'")
        responses = [{"results": entry["results"]}] if "results" in entry else entry["responses"]
        if not isinstance(responses, list) or not responses:
            raise SpecError(f"{where} ({query!r}): 'responses' must be a non-empty list")
        for backend in backends:
            for k, response in enumerate(responses):
                if not isinstance(response, dict):
                    raise SpecError(f"{where} ({query!r}): responses[{k}] must be an object")
                try:
                    check_response_spec(backend, response, f"{where} ({query!r}) responses[{k}]")
                except ValueError as exc:
                    raise SpecError(str(exc)) from exc
        expect = entry.get("expect") or {}
        bad = sorted(set(expect) - EXPECT_KEYS)
        if bad:
            raise SpecError(
                f"{where} ({query!r}): unknown expect key(s) {bad}; allowed: {sorted(EXPECT_KEYS)}"
            )
        queries.append(QuerySpec(query, tuple(responses), str(entry.get("scenario", "")),
                                 cast(QueryExpect, dict(expect))))  # the spec's JSON, its keys checked
    pages = _load_pages(path, data.get("pages"), backends)
    if not queries and not pages:
        raise SpecError(f"{path}: no queries (and no pages)")
    keys = data.get("keys", 1)
    if not isinstance(keys, int) or keys < 1:
        raise SpecError(f"{path}: 'keys' must be an integer >= 1")
    return CassetteSpec(
        name=path.stem,
        path=path,
        backends=backends,
        description=str(data.get("description", "")),
        queries=tuple(queries),
        options=cast(BackendSettings, dict(data.get("options") or {})),  # checked by the factory when recording
        keys=keys,
        pages=pages,
    )


def _load_pages(path: Path, entries: object, backends: tuple[str, ...]) -> tuple[PageSpec, ...]:
    """The ``pages`` of a spec, checked against the fake services of ``backends``."""
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise SpecError(f"{path}: 'pages' must be a list")
    without = [backend for backend in backends if backend not in PAGE_BACKENDS]
    if entries and without:
        raise SpecError(f"{path}: {without[0]} has no pages to open (pages are {', '.join(PAGE_BACKENDS)}'s)")
    pages: list[PageSpec] = []
    seen: set[str] = set()
    for n, entry in enumerate(entries):
        where = f"{path}: pages[{n}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("page"), str):
            raise SpecError(f"{where}: needs a string 'page'")
        extra = sorted(set(entry) - PAGE_ENTRY_KEYS)
        if extra:
            raise SpecError(f"{where}: unknown key(s) {extra}; allowed: {sorted(PAGE_ENTRY_KEYS)}")
        name = normalise_query(entry["page"])
        if not name:
            raise SpecError(f"{where}: empty page name")
        if name in seen:
            raise SpecError(f"{where}: page {name!r} appears twice; read it at several 'offsets' instead")
        seen.add(name)
        offsets = entry.get("offsets", [0])
        if not isinstance(offsets, list) or not offsets or any(
                isinstance(o, bool) or not isinstance(o, int) or o < 0 for o in offsets):
            raise SpecError(f"{where} ({name!r}): 'offsets' must be a non-empty list of integers >= 0")
        script = {key: entry[key] for key in ("title", "paragraphs", "revision", "responses") if key in entry}
        for backend in backends:
            try:
                check_page_script(backend, script, f"{where} ({name!r})")
            except ValueError as exc:
                raise SpecError(str(exc)) from exc
        expect = entry.get("expect") or {}
        bad = sorted(set(expect) - PAGE_EXPECT_KEYS)
        if bad:
            raise SpecError(f"{where} ({name!r}): unknown expect key(s) {bad}; allowed: {sorted(PAGE_EXPECT_KEYS)}")
        pages.append(PageSpec(name, cast(PageScript, script), tuple(offsets), str(entry.get("scenario", "")),
                              cast(PageExpect, dict(expect))))  # the spec's JSON, checked above
    return tuple(pages)


def discover_specs(root: Path = CASSETTE_ROOT) -> list[CassetteSpec]:
    """Every spec under ``root/specs``, checking that no two make the same cassette."""
    specs = [load_spec(p, root) for p in sorted((root / "specs").rglob("*.json"))]
    owners: dict[Path, Path] = {}
    for spec in specs:
        for backend in spec.backends:
            target = spec.cassette_path(backend, root)
            if target in owners:
                raise SpecError(f"{spec.path} and {owners[target]} both make {target}")
            owners[target] = spec.path
    return specs


def _build_keys(backend: str, count: int) -> tuple[Secret, ...]:
    if backend == "zhihu":
        return tuple(Secret(f"builder-zhihu-key-{n}") for n in range(1, count + 1))
    if backend == "deepseek":
        return (Secret("builder-deepseek-key"),)
    return ()


async def record_spec(spec: CassetteSpec, backend: str, target: Path, root: Path = CASSETTE_ROOT) -> None:
    """Record one spec for one backend into ``target`` (through the real client): its queries,
    then its pages, each read at its offsets in turn."""
    service = FakeSearchService(backend, spec.script(), spec.page_script())
    keys = _build_keys(backend, spec.keys)
    credentials: BackendSettings = {}
    if backend == "zhihu":
        credentials["keys"] = keys
    elif backend == "deepseek":
        credentials["api_key"] = keys[0]
    elif backend == "wikipedia":
        credentials["contact"] = BUILD_CONTACT
    clash = sorted(set(credentials) & set(spec.options))
    if clash:
        raise SpecError(f"{spec.path}: options do not fit {backend}: the builder sets {clash[0]!r} itself")
    settings: BackendSettings = {**credentials, **spec.options}
    try:
        client = create_search_backend(
            backend,
            transport=httpx.MockTransport(service.handler),
            clock=VirtualClock(),
            backoff=Backoff(rng=random.Random(0)),
            **settings,
        )
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{spec.path}: options do not fit {backend}: {exc}") from exc
    metadata: dict[str, object] = {
        "backend": backend,
        "spec": spec.path.relative_to(root).as_posix(),
        "generator": GENERATOR,
        "provenance": SYNTHETIC,
        # What replay needs besides the path: the options that shape the requests.
        "options": {**client.replay_options(), **spec.options},
    }
    if backend == "zhihu":
        metadata["keys"] = spec.keys
    async with client:
        # Compressed bodies stay compressed, so that replay exercises the client's gzip path.
        with recording(
            target,
            secrets=keys,
            private=client.private_values(),
            metadata=metadata,
            overwrite=True,
            decode_compressed=False,
        ):
            for query in spec.queries:
                await client.search(query.query)
            if spec.pages:
                from searchr1.search.pages import page_backend_for

                pages = page_backend_for(client)
                for page in spec.pages:
                    for offset in page.offsets:
                        await pages.call(ToolCall("open_page", {"page": page.page, "offset": offset}))
    unused = service.unused()
    if unused:
        raise SpecError(
            f"{spec.path}: {backend}: the client never asked for these scripted responses "
            f"(query: count) {unused}; the script and the client's retry policy disagree"
        )


@dataclass
class BuildReport:
    written: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    differing: list[Path] = field(default_factory=list)
    skipped_live: list[Path] = field(default_factory=list)
    orphans: list[Path] = field(default_factory=list)
    readme_stale: bool = False

    @property
    def clean(self) -> bool:
        return not (self.differing or self.orphans or self.readme_stale)


def is_live_recording(path: Path) -> bool:
    return path.is_file() and read_cassette_metadata(path).get("provenance") == "live"


def build_cassettes(
    root: Path = CASSETTE_ROOT, *, check: bool = False, only: str | None = None
) -> BuildReport:
    """Regenerate (or with ``check``, compare) every cassette made from a spec, or only those
    of the spec(s) named ``only``. The README table always reflects every spec."""
    all_specs = discover_specs(root)
    specs = all_specs if only is None else [s for s in all_specs if s.name == only]
    if not specs:
        raise SpecError(f"no spec named {only!r} under {root / 'specs'}")
    report = BuildReport()
    search_log = logging.getLogger("searchr1.search")
    previous_level = search_log.level
    search_log.setLevel(logging.ERROR)  # the fault specs fail on purpose; don't warn about it
    try:
        with tempfile.TemporaryDirectory(prefix="searchr1-cassettes-") as scratch:
            for spec in specs:
                for backend in spec.backends:
                    _build_one(spec, backend, root, Path(scratch), check, report)
    finally:
        search_log.setLevel(previous_level)
    if only is None:
        _check_orphans(all_specs, root, report)
    _refresh_readme(all_specs, root, check, report)
    return report


def _build_one(
    spec: CassetteSpec, backend: str, root: Path, scratch: Path, check: bool, report: BuildReport
) -> None:
    target = spec.cassette_path(backend, root)
    if is_live_recording(target):
        report.skipped_live.append(target)
        return
    fresh = scratch / backend / f"{spec.name}.yaml"
    asyncio.run(record_spec(spec, backend, fresh, root))
    text = fresh.read_text(encoding="utf-8")
    current = target.read_text(encoding="utf-8") if target.is_file() else None
    if current == text:
        report.unchanged.append(target)
    elif check:
        report.differing.append(target)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        fresh.replace(target)
        report.written.append(target)


def _check_orphans(specs: list[CassetteSpec], root: Path, report: BuildReport) -> None:
    made = {spec.cassette_path(b, root) for spec in specs for b in spec.backends}
    for path in sorted(root.glob("*/*.yaml")):
        if path not in made and not is_live_recording(path):
            report.orphans.append(path)


def _refresh_readme(specs: list[CassetteSpec], root: Path, check: bool, report: BuildReport) -> None:
    readme = root / "README.md"
    current = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    updated = render_readme(current, specs, root)
    if updated != current:
        if check:
            report.readme_stale = True
        else:
            readme.write_text(updated, encoding="utf-8")
            report.written.append(readme)


def render_readme(current: str, specs: list[CassetteSpec], root: Path = CASSETTE_ROOT) -> str:
    """README with the generated per-cassette table between the markers (appended if absent)."""
    lines = [
        README_BEGIN,
        "",
        "| Cassette | Spec | Provenance | Queries (scenario) |",
        "| --- | --- | --- | --- |",
    ]
    for spec in sorted(specs, key=lambda s: (s.name != "demo", s.path.as_posix())):
        for backend in spec.backends:
            target = spec.cassette_path(backend, root)
            provenance = (
                f"live recording (`{invocation.command('record', checkout=True)}`)"
                if is_live_recording(target)
                else ("synthetic: fake service, documented wire format; not a live capture")
            )
            scenarios = "; ".join(
                [f"`{q.query}`" + (f" ({q.scenario})" if q.scenario else "") for q in spec.queries]
                + [f"open_page `{p.page}`" + (f" ({p.scenario})" if p.scenario else "") for p in spec.pages]
            ).replace("|", "\\|")
            lines.append(
                f"| `{target.relative_to(root).as_posix()}` | `{spec.path.relative_to(root).as_posix()}` "
                f"| {provenance} | {scenarios} |"
            )
    lines += ["", README_END]
    block = "\n".join(lines)
    if README_BEGIN in current and README_END in current:
        head, _, rest = current.partition(README_BEGIN)
        _, _, tail = rest.partition(README_END)
        return head + block + tail
    return (current.rstrip() + "\n\n" if current.strip() else "") + block + "\n"
