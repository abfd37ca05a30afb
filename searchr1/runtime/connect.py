"""Connecting to PyTRIO with a deadline a person is willing to wait.

``pytrio.ServiceClient()`` verifies the key, checks the SDK version and opens a session, and
retries every control call for 15 minutes by default: with no network a command would print
nothing for a quarter of an hour. Here the constructor runs in a worker thread; the command
says where it is connecting, waits at most ``deadline`` seconds, and otherwise asks pytrio's own
connectivity probe what is wrong (DNS, refused, TLS, timeout) and stops with one line. A refused
connection is known at once: when the client has not answered after a moment, one TCP connect
to the URL's host and port tells, and a refusal stops the command then instead of at the
deadline. The client's own retry windows stay as they are for the run itself.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
DEFAULT_CONNECT_TIMEOUT = 30.0
REFUSAL_CHECK_AFTER = 0.5  # seconds the client gets before one TCP connect checks for a refusal
PROBE_TIMEOUT = 0.75  # seconds a start-up check waits for one TCP connect to PyTRIO


SDK_SAMPLING_QUEUE = 64  # pytrio's own sampling_request_queue_capacity


def sampling_capacity(concurrency: int) -> dict[str, int]:
    """The pytrio options under which one sampling client keeps ``concurrency`` requests in flight.

    pytrio keeps at most ``sampling_request_max_in_flight`` requests of a sampling client in
    flight (16 by default) and queues the rest locally, so a rollout's ``sampling_concurrency``
    above 16 would otherwise be 16. Given to every ``ServiceClient`` we create, live or on a twin."""
    return {"sampling_request_max_in_flight": concurrency,
            "sampling_request_queue_capacity": max(concurrency, SDK_SAMPLING_QUEUE)}


class ConnectTimeout(RuntimeError):
    """PyTRIO did not answer within the deadline; the message names the URL and the cause."""


class ConnectRefused(ConnectTimeout):
    """Nothing listens at the URL's host and port: no deadline will change that."""


def refusal(base_url: str, *, timeout: float = 2.0) -> str | None:
    """``host:port refused the connection`` when a TCP connect to the URL's host and port is
    refused; None when it connects, times out or fails otherwise (the deadline and the
    connectivity probe deal with those)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(base_url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if not host:
        return None
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return f"{host}:{port} refused the connection (nothing listens there)"
    except OSError:
        return None


def pytrio_base_url() -> str:
    """The base URL the next ``ServiceClient`` will use (``PYTRIO_BASE_URL`` or the profile)."""
    from pytrio.config.config import configuration

    return str(configuration.base_url)


def configured_base_url() -> str:
    """The base URL the next ``ServiceClient`` will use, as cheaply as it can be known:
    ``PYTRIO_BASE_URL`` when it is set (the SDK's own rule: the variable wins over any profile),
    read without importing the SDK (a second of start-up); otherwise :func:`pytrio_base_url`."""
    import os

    given = os.environ.get("PYTRIO_BASE_URL", "").strip()
    return given.rstrip("/") if given else pytrio_base_url()


def refused_within(base_url: str, *, timeout: float = PROBE_TIMEOUT) -> str | None:
    """:func:`refusal` of ``base_url``, waited for at most ``timeout`` seconds in all (a name
    lookup that hangs included): the reason when the host refused the connection, None when it
    connected, failed otherwise, or did not tell in time."""
    answer: list[str | None] = []
    worker = threading.Thread(target=lambda: answer.append(refusal(base_url, timeout=timeout)),
                              name="searchr1-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    return answer[0] if answer else None


# The variables that route httpx's requests (pytrio's included) through a proxy; NO_PROXY exempts hosts.
PROXY_VARIABLES = ("ALL_PROXY", "HTTP_PROXY", "HTTPS_PROXY")


def proxies_set() -> list[str]:
    """The proxy variables set in the environment, by name (any case), never their values."""
    import os

    return [name for name in PROXY_VARIABLES if os.environ.get(name) or os.environ.get(name.lower())]


def connect_failure(base_url: str, *, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why a request to ``base_url`` made the way pytrio's clients make theirs (httpx, with the
    environment's proxy settings) cannot connect, in a few words: a refused or failed connection
    to the server or to a proxy in between. None when it connects (whatever it answers) or does not
    tell within ``timeout`` seconds: a slow server is left to the client's own retries."""
    import httpx

    try:
        httpx.get(base_url, timeout=httpx.Timeout(timeout, connect=timeout))
    except (httpx.ConnectError, httpx.ProxyError, httpx.UnsupportedProtocol) as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no message'}"
    except httpx.HTTPError:
        return None
    return None


def diagnose(base_url: str, *, within: float) -> str:
    """pytrio's unauthenticated probe of the base URL, in a few words, waited for at most
    ``within`` seconds (the probe's own limit is 3 s): a command told to wait 0.3 s for the
    service does not then wait 3 s more for the reason."""
    from pytrio.transport.connectivity import probe_base_url_connectivity

    try:
        diagnostic = asyncio.run(asyncio.wait_for(probe_base_url_connectivity(base_url), within))
    except TimeoutError:
        return f"the connectivity probe had no answer within {within:g} s either"
    except Exception as error:  # noqa: BLE001 - the probe only explains, it never decides
        return f"the connectivity probe failed too ({type(error).__name__})"
    if diagnostic.status == "reachable":
        return f"{diagnostic.origin} answers (HTTP {diagnostic.http_status}) but the PyTRIO API does not"
    return f"{diagnostic.status.replace('_', ' ')} reaching {diagnostic.origin}"


def call_with_deadline(factory: Callable[[], T], deadline: float, *, what: str,
                       explain: Callable[[], str], refused: Callable[[], str | None] = lambda: None) -> T:
    """``factory()`` in a daemon thread; its result or exception, or :class:`ConnectTimeout`
    after ``deadline`` seconds (the thread is left to die with the process). When it has not
    answered after :data:`REFUSAL_CHECK_AFTER` seconds, ``refused()`` is asked once: a reason
    it gives ends the wait at once with :class:`ConnectRefused`."""
    values: list[T] = []  # what factory() returned, or
    errors: list[BaseException] = []  # what it raised

    def target() -> None:
        try:
            values.append(factory())
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            errors.append(error)

    worker = threading.Thread(target=target, name="searchr1-connect", daemon=True)
    worker.start()
    worker.join(min(deadline, REFUSAL_CHECK_AFTER))
    if worker.is_alive():
        reason = refused()
        if reason is not None and worker.is_alive():
            raise ConnectRefused(f"{what}: {reason}; check PYTRIO_BASE_URL and that the service is running")
        worker.join(max(0.0, deadline - REFUSAL_CHECK_AFTER))
    if worker.is_alive():
        raise ConnectTimeout(f"{what}: no answer within {deadline:g} s ({explain()}); check the network "
                             "and PYTRIO_BASE_URL, or wait longer with --connect-timeout")
    if errors:
        raise errors[0]
    return values[0]
