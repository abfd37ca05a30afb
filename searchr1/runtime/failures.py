"""Which exceptions are failures of the remote service or the network (they end a run with one
line and a resumable run directory) and which are bugs (they keep their traceback). Shared by
the trainer, eval and probe-loss."""

from __future__ import annotations

import concurrent.futures

# Where an exception comes from when it is a failure of the remote service or the network
# rather than of this program: pytrio itself, and what pytrio lets through from below it.
SERVICE_MODULES = ("pytrio", "httpx", "httpcore", "h11", "modelscope", "modelscope_hub", "requests", "urllib3")

# The code a service (the twin) answers when it cannot write its own files (a full, read-only or
# forbidden disk). Its message names the path; nothing is gained by retrying.
STORAGE_FAILURE_CODE = "twin.storage_failure"


def is_service_failure(error: BaseException) -> bool:
    """True for errors of the service or the network (PyTrioError, httpx and ModelScope
    errors, timeouts, dropped connections). Anything else is a bug."""
    if isinstance(error, (TimeoutError, ConnectionError, concurrent.futures.TimeoutError)):
        return True
    return any(cls.__module__.split(".")[0] in SERVICE_MODULES for cls in type(error).__mro__)


def describe_failure(error: BaseException) -> str:
    """``code or class: first line of the message`` (bounded; never a traceback, never a URL's
    ``user:password@``: a client's error names the server it called). A service's
    storage failure is its own message alone (the path and the cause), without the client's
    generic retry hint."""
    from searchr1.basics.secrets import strip_userinfo

    code = getattr(error, "code", None) or type(error).__name__
    message = getattr(error, "message", None)
    if code == STORAGE_FAILURE_CODE and isinstance(message, str):
        return f"{code}: {strip_userinfo(message.strip())[:300]}"
    text = strip_userinfo(str(error).strip().splitlines()[0])[:300] if str(error).strip() else "no message"
    return f"{code}: {text}"
