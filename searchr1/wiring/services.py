"""Where the remote services come from: PyTRIO and a search backend (live), or their offline
twins (a PyTRIO server on 127.0.0.1 serving the scripted policy, and the search cassettes).
Either way the training loop and the evaluation talk to a real ``pytrio.ServiceClient``; offline
only its address differs."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

from searchr1.basics.json_types import JsonObject
from searchr1.core.errors import UserError
from searchr1.core.rollout import RolloutConfig
from searchr1.core.tools import ToolBackend
from searchr1.core.types import Tokenizer
from searchr1.search.tool import SearchBackend
from searchr1.offline import SCENARIO, cassette_path
from searchr1.search.options import SearchOptions, build_search_backend

if TYPE_CHECKING:
    import pytrio

    from searchr1.search.factory import HttpSearchBackend
    from searchr1.search.replay import ReplayBackend
    from searchr1.twin.config import Latencies, StopConvention, TwinFaults, TwinLimits
    from searchr1.twin.policy import Reduction
    from searchr1.twin.scenario import Scenario
    from searchr1.twin.server import Twin
    from searchr1.twin.training_run import Accumulation

QWEN35_PREFIX = "Qwen/Qwen3.5-"
SAMPLING_CONCURRENCY = RolloutConfig.sampling_concurrency  # the rollout's declared default


class ServiceSetupError(UserError, RuntimeError):
    """A service cannot be reached or configured; the message says what to do."""


class TwinOptions(TypedDict, total=False):
    """What a command or a test may set of an offline twin beside its home, policy, scenario and
    tokenizer (``searchr1.twin.start_twin``'s keywords of the same names)."""

    limits: TwinLimits
    faults: TwinFaults
    convention: StopConvention
    latencies: Latencies
    reduction: Reduction
    accumulation: Accumulation
    model_name: str
    serve_tokenizer: bool
    report_grad_norm: bool


def require_pytrio_key() -> None:
    """Fail fast, without a traceback and without echoing anything secret, when no PyTRIO key
    is configured (environment variable or the profile written by ``trio login``)."""
    if os.environ.get("PYTRIO_API_KEY"):
        return
    home = Path.home() / ".pytrio"
    if (home / "config.toml").is_file() or (home / "envs").is_dir():
        return
    raise ServiceSetupError(
        "no PyTRIO API key: set PYTRIO_API_KEY or run `trio login` "
        "(or use --offline to run against the offline twin)"
    )


def check_base_model(base_model: str) -> None:
    if not base_model.startswith(QWEN35_PREFIX):
        raise ServiceSetupError(
            f"--base-model {base_model!r}: the search protocol is Qwen3.5's XML tool-call format; "
            f"use a {QWEN35_PREFIX}* model"
        )


def load_tokenizer(chat_template: str | None = None) -> Tokenizer:
    from searchr1.runtime.tokenizer import shared_tokenizer

    return shared_tokenizer(chat_template)


def live_service(connect_timeout: float | None = None, *,
                 sampling_concurrency: int = SAMPLING_CONCURRENCY) -> pytrio.ServiceClient:
    """A real ``pytrio.ServiceClient``, after saying where it connects, whose sampling clients keep
    ``sampling_concurrency`` requests in flight; it stops with one line when PyTRIO does not
    answer within ``connect_timeout`` seconds (see :mod:`searchr1.runtime.connect`)."""
    require_pytrio_key()
    import sys

    import pytrio

    from searchr1.runtime.connect import (DEFAULT_CONNECT_TIMEOUT, ConnectTimeout, call_with_deadline, diagnose,
                                          pytrio_base_url, refusal, sampling_capacity)

    from searchr1.basics.secrets import redact_url, strip_userinfo

    url = pytrio_base_url()
    shown = redact_url(url)  # a user:password@ in PYTRIO_BASE_URL is never printed
    print(f"connecting to PyTRIO at {shown}...", file=sys.stderr, flush=True)
    pytrio.configure(**sampling_capacity(sampling_concurrency))  # read when the client is created
    deadline = connect_timeout or DEFAULT_CONNECT_TIMEOUT
    try:
        return call_with_deadline(pytrio.ServiceClient, deadline, what=f"cannot connect to PyTRIO at {shown}",
                                  explain=lambda: strip_userinfo(diagnose(url, within=deadline)),
                                  refused=lambda: refusal(url))
    except ConnectTimeout as error:
        raise ServiceSetupError(strip_userinfo(str(error))) from None
    except pytrio.PyTrioError as error:
        code = getattr(error, "code", "") or type(error).__name__
        raise ServiceSetupError(f"cannot connect to PyTRIO at {shown} ({code}); check the key and the "
                                "network") from None


def offline_scenario(path: str | Path | None = None) -> Scenario:
    from searchr1.twin.scenario import load_scenario

    return load_scenario(path or SCENARIO)


def offline_service(home: Path, tokenizer: Tokenizer, scenario: Scenario | None = None, *, policy: str = "scripted",
                    max_staleness: int = 0, sampling_concurrency: int = SAMPLING_CONCURRENCY,
                    **twin_options: Unpack[TwinOptions]) -> pytrio.ServiceClient:
    """A real ``pytrio.ServiceClient`` connected to an offline twin started for it on 127.0.0.1
    (checkpoints under ``home``, strict mode on, ``policy`` replying from ``scenario``), whose
    sampling clients keep ``sampling_concurrency`` requests in flight. The twin stops once the
    client and every client derived from it are gone (or at exit)."""
    from searchr1.runtime.connect import sampling_capacity
    from searchr1.twin import Strictness, start_twin
    from searchr1.twin.client import LOCAL_RETRIES

    twin = start_twin(home=home, tokenizer=tokenizer, policy=policy, scenario=scenario,
                      strictness=Strictness(max_staleness=max_staleness), **twin_options)
    try:
        check_twin_reachable(twin.base_url)
        client = twin.service_client(sdk_options={**LOCAL_RETRIES, **sampling_capacity(sampling_concurrency)})
    except Exception as error:
        twin.close()
        from searchr1.runtime.failures import describe_failure, is_service_failure

        if not is_service_failure(error):
            raise
        raise ServiceSetupError(f"cannot connect to the offline twin at {twin.base_url} "
                                f"({describe_failure(error)}){_proxy_hint()}") from None
    twin.stop_with(client)
    return client


def _proxy_hint() -> str:
    """What to do when the environment routes requests through a proxy (the names, not the values)."""
    from searchr1.runtime.connect import proxies_set

    named = proxies_set()
    verb = "sends" if len(named) == 1 else "send"
    return (f"; {' and '.join(named)} {verb} requests through a proxy: add 127.0.0.1 to NO_PROXY so that the "
            "twin on this machine is reached directly") if named else ""


def check_twin_reachable(base_url: str) -> None:
    """One request to the twin just started at ``base_url``, made as pytrio makes its own: a
    connection that fails (a proxy variable that routes 127.0.0.1 through a proxy, a firewall)
    is :class:`ServiceSetupError` at once, where pytrio would retry it for half a minute."""
    from searchr1.runtime.connect import connect_failure

    problem = connect_failure(base_url)
    if problem is not None:
        raise ServiceSetupError(f"cannot connect to the offline twin at {base_url} ({problem}){_proxy_hint()}")


def start_service(tokenizer: Tokenizer, *, offline: bool, home: Path | None, sampling_concurrency: int,
                  policy: str | None = None, connect_timeout: float | None = None, max_staleness: int = 0,
                  **twin_options: Unpack[TwinOptions]) -> pytrio.ServiceClient:
    """The ``pytrio.ServiceClient`` that ``train`` and ``eval`` work with: offline, one on a twin
    started for it (checkpoints under ``home``, serving ``policy``, default the scripted one, from
    the shipped scenario, lagging at most ``max_staleness`` updates behind; ``twin_options`` go to
    the twin); live, one connected to PyTRIO. Either
    way its sampling clients keep ``sampling_concurrency`` requests in flight."""
    if offline:
        assert home is not None, "an offline service needs a home for the twin's checkpoints"
        return offline_service(home, tokenizer, offline_scenario(), policy=policy or "scripted",
                               max_staleness=max_staleness, sampling_concurrency=sampling_concurrency,
                               **twin_options)
    return live_service(connect_timeout, sampling_concurrency=sampling_concurrency)


@asynccontextmanager
async def open_search(options: SearchOptions, *,
                      offline: bool) -> AsyncIterator[HttpSearchBackend | ReplayBackend]:
    """The search backend for the block (offline: the replayed cassette or the local index),
    closed when the block ends however it ends."""
    backend = search_backend(options, offline=offline)
    try:
        yield backend
    finally:
        await backend.aclose()


@contextmanager
def scripted_sampling_client(scenario: Scenario, tokenizer: Tokenizer, *, twin: Twin | None = None,
                             **twin_options: Unpack[TwinOptions]) -> Iterator[pytrio.SamplingClient]:
    """A real ``pytrio.SamplingClient`` for the base model on a twin serving ``scenario``'s script.

    With ``twin`` (a running one) the twin is switched to the script and reused; otherwise a
    twin is started in a temporary home for the duration of the ``with`` block.
    """
    from searchr1.twin import start_twin
    from searchr1.twin.scripted_policy import ScriptedPolicy

    policy = ScriptedPolicy(scenario, tokenizer)
    if twin is not None:
        twin.policy = policy
        yield twin.service_client().create_sampling_client(base_model=twin.backend.settings.model_name)
        return
    with tempfile.TemporaryDirectory(prefix="searchr1-twin-") as home, \
            start_twin(home=home, tokenizer=tokenizer, policy=policy, **twin_options) as started:
        yield started.service_client().create_sampling_client(base_model=started.backend.settings.model_name)


def offline_search_options(options: SearchOptions) -> SearchOptions:
    """Offline search replays a cassette: the one given, or the backend's offline cassette.
    The local backend needs none: it searches the index given, or the shipped corpus's index
    (built into the user cache on first use), without the persistent query cache."""
    if options.backend == "local" and options.cassette is None:
        if options.index is None:
            from searchr1.bm25.shipped import offline_index

            options = replace(options, index=str(offline_index()))
        return replace(options, cache="off")
    if options.cassette is not None:
        return options
    return replace(options, cassette=cassette_path(options.backend))


# Search settings only some backends read: SearchOptions field -> the backends that read it.
BACKEND_SETTINGS = {
    "index": ("local",),
    "topk": ("local", "retriever"),
    "retriever_url": ("retriever",),
    "model": ("deepseek",),
    "tool_type": ("deepseek",),
    "wikipedia_contact": ("wikipedia",),
}
# What an offline replay of a shipped cassette ignores: it replays the requests that cassette
# holds, made with the URL and contact it was recorded with.
REPLAY_IGNORES = ("retriever_url", "wikipedia_contact")


# The tools other than search, and the search backends whose corpus each can read pages of.
TOOL_READERS = {"open_page": ("local", "wikipedia", "retriever")}


def check_tool_setup(tools: Sequence[str], options: SearchOptions) -> None:
    """``--tools`` names only tools the chosen search backend can run (refused before any work)."""
    from searchr1.core.settings import SettingError

    for name in tools:
        readers = TOOL_READERS.get(name)
        if readers is not None and options.backend not in readers:
            listed = readers[0] if len(readers) == 1 else f"{', '.join(readers[:-1])} or {readers[-1]}"
            raise SettingError("--tools", f"{name} reads the pages of --backend {listed} only (this "
                                          f"command searches with {options.backend}); pass --backend {readers[0]} "
                                          f"or drop {name}")


def tool_backends(tools: Sequence[str], search: SearchBackend) -> dict[str, ToolBackend]:
    """What runs each declared tool other than search, over the same corpus as ``search``:
    ``open_page`` reads the pages of the local backend's index, Wikipedia's pages (each pinned to
    one revision for the run, through the search backend's client, limiter and contact), or the
    pages of the retriever's server (its ``POST /page``); a replayed backend's pages come from its
    cassette (:func:`searchr1.search.pages.page_backend_for`)."""
    from searchr1.search.pages import page_backend_for

    backends: dict[str, ToolBackend] = {}
    for name in tools:
        if name == "open_page":
            try:
                backends[name] = page_backend_for(search)
            except ValueError:
                raise ServiceSetupError(
                    f"--tools open_page: no page backend for the {search.name} search backend") from None
    return backends


def check_search_setup(options: SearchOptions, *, offline: bool) -> None:
    """Everything about search that can be refused before PyTRIO is contacted or anything is
    written (commands call this first; the backend itself is built later, as opening its cache
    has side effects):

    - a flag the chosen backend does not read, or that an offline replay ignores, is a
      :class:`SettingError` saying what would use it;
    - a cassette to replay (the one given, or the offline one) that cannot be replayed is a
      :class:`~searchr1.search.replay.CassetteFormatError` naming the file and the interaction;
    - a live backend without its key is a :class:`~searchr1.search.env.MissingApiKeyError`
      naming the variable and the ``.env`` file (replay uses placeholder keys and needs none).
    """
    from searchr1.core.settings import SettingError, flag_of, settings_of

    flags = {field.name: flag_of(field) for field, _ in settings_of(SearchOptions)}
    for field, readers in BACKEND_SETTINGS.items():
        flag = flags[field]
        if getattr(options, field) is None:
            continue
        if options.backend not in readers:
            raise SettingError(flag, f"is read only by --backend {' or '.join(readers)} (this command searches "
                                     f"with {options.backend}); pass --backend {readers[0]} or drop {flag}")
        if offline and options.cassette is None and field in REPLAY_IGNORES:
            raise SettingError(flag, f"has no effect with --offline: search replays the shipped "
                                     f"{options.backend} cassette, recorded with its own address; drop {flag}, "
                                     "or pass --cassette FILE recorded with it")
    cassette = options.cassette or (cassette_path(options.backend) if offline and options.backend != "local" else None)
    if cassette is not None:
        from searchr1.search.replay import read_cassette_data

        read_cassette_data(cassette)
        return
    if offline:
        return
    from searchr1.search.env import require_keys
    from searchr1.search.factory import KEY_ENV_VARS

    variables = KEY_ENV_VARS.get(options.backend)
    if variables:
        require_keys(variables, env_file=options.env_file)


def search_backend(options: SearchOptions, *, offline: bool) -> HttpSearchBackend | ReplayBackend:
    """The backend the options make. Offline it remembers every answer for its lifetime (the
    run), in memory: a query is searched once, and every repeat, whether the first is still in
    flight or done, is answered without a request, so the run's search usage does not depend on
    how its searches interleave. Live, a repeat that finds the first request finished is a new
    request unless the persistent cache holds the answer."""
    if offline:
        return build_search_backend(offline_search_options(options), remember=True)
    return build_search_backend(options)


def describe_search(options: SearchOptions, *, offline: bool) -> JsonObject:
    """The search configuration as recorded in run configs and eval summaries (no secrets): the
    backend, its concurrency, timeout, model, cassette and cache; a local one's index and topk."""
    from searchr1.search.factory import resolve_concurrency, resolve_timeout

    if offline and options.backend == "local" and options.index is None:
        from searchr1.bm25.shipped import CORPUS
        from searchr1.basics.fileio import file_sha256

        effective = replace(options, cache="off")
        index: str | None = f"shipped:{CORPUS.name}@{file_sha256(CORPUS)[:16]}"
    else:
        effective = offline_search_options(options) if offline else options
        index = str(effective.index) if effective.index is not None else None
    described: JsonObject = {
        "backend": effective.backend,
        "concurrency": resolve_concurrency(effective.backend, effective.concurrency),
        "timeout": resolve_timeout(effective.backend, effective.timeout),
        "model": effective.model if effective.backend == "deepseek" else None,
        "cassette": str(effective.cassette) if effective.cassette else None,
        "cache": None if not effective.cache_enabled else effective.cache,
    }
    if effective.backend == "local":
        described["index"] = index
        described["topk"] = effective.topk or 3
    return described
