"""Connecting to PyTRIO with a deadline a person is willing to wait.

``pytrio.ServiceClient()`` verifies the key, checks the SDK version and opens a session, and
retries every control call for 15 minutes by default: with no network a command would print
nothing for a quarter of an hour. Here the constructor runs in a worker thread; the command
says where it is connecting, waits at most ``deadline`` seconds, and otherwise asks pytrio's own
connectivity probe what is wrong (DNS, refused, TLS, timeout) and stops with one line. The
client's own retry windows stay as they are for the run itself.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
DEFAULT_CONNECT_TIMEOUT = 30.0


class ConnectTimeout(RuntimeError):
    """PyTRIO did not answer within the deadline; the message names the URL and the cause."""


def pytrio_base_url() -> str:
    """The base URL the next ``ServiceClient`` will use (``PYTRIO_BASE_URL`` or the profile)."""
    from pytrio.config.config import configuration

    return str(configuration.base_url)


def diagnose(base_url: str) -> str:
    """pytrio's unauthenticated probe of the base URL, in a few words."""
    from pytrio.transport.connectivity import probe_base_url_connectivity

    try:
        diagnostic = asyncio.run(probe_base_url_connectivity(base_url))
    except Exception as error:  # noqa: BLE001 - the probe only explains, it never decides
        return f"the connectivity probe failed too ({type(error).__name__})"
    if diagnostic.status == "reachable":
        return f"{diagnostic.origin} answers (HTTP {diagnostic.http_status}) but the PyTRIO API does not"
    return f"{diagnostic.status.replace('_', ' ')} reaching {diagnostic.origin}"


def call_with_deadline(factory: Callable[[], T], deadline: float, *, what: str,
                       explain: Callable[[], str]) -> T:
    """``factory()`` in a daemon thread; its result or exception, or :class:`ConnectTimeout`
    after ``deadline`` seconds (the thread is left to die with the process)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = factory()
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = error

    worker = threading.Thread(target=target, name="searchr1-connect", daemon=True)
    worker.start()
    worker.join(deadline)
    if worker.is_alive():
        raise ConnectTimeout(f"{what}: no answer within {deadline:g} s ({explain()}); check the network "
                             "and PYTRIO_BASE_URL, or wait longer with --connect-timeout")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
