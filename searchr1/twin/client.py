"""A real, unmodified ``pytrio.ServiceClient`` pointed at a twin.

pytrio reads its settings from one process-wide ``Configuration`` that every new
``ServiceClient`` deep-copies when it is created. :func:`connect` sets the twin's address,
a private SDK home (so the user's ``~/.pytrio`` profile is never read for it) and the retry
timing, creates the client, and puts the process-wide settings back, all under one lock: other
clients of the same process keep their own settings. Telemetry is off by default (the twin
accepts it when on).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytrio import ServiceClient

TWIN_API_KEY = "twin-local-key"

# Retry timing for a local twin: pytrio's defaults wait seconds to minutes between attempts
# and poll for capacity every 30 s, which is right for a remote service and needlessly slow
# against a loopback one. Fault tests get retries within milliseconds.
LOCAL_RETRIES: Mapping[str, float] = {
    "retry_initial_delay_seconds": 0.05,
    "retry_max_delay_seconds": 0.5,
    "retry_jitter_ratio": 0.0,
    "control_retry_timeout_seconds": 30.0,
    "training_retry_timeout_seconds": 30.0,
    "sampling_retry_timeout_seconds": 30.0,
    "actor_capacity_poll_interval_seconds": 0.05,
    "actor_capacity_poll_jitter_ratio": 0.0,
}
FAST_RETRIES: Mapping[str, float] = {
    **LOCAL_RETRIES,
    "retry_initial_delay_seconds": 0.005,
    "retry_max_delay_seconds": 0.02,
    "control_retry_timeout_seconds": 3.0,
    "training_retry_timeout_seconds": 3.0,
    "sampling_retry_timeout_seconds": 3.0,
    "actor_capacity_poll_interval_seconds": 0.005,
}

_configure_lock = threading.Lock()


def connect(base_url: str, *, home: str | Path, api_key: str = TWIN_API_KEY, telemetry: bool = False,
            sdk_options: Mapping[str, float] = LOCAL_RETRIES) -> ServiceClient:
    """Create a ``pytrio.ServiceClient`` for ``base_url`` (a twin's, or any PyTRIO server's)."""
    import pytrio
    from pytrio.config import config as sdk_config
    from pytrio.observability import api as observability

    Path(home).mkdir(parents=True, exist_ok=True)
    with _configure_lock:
        saved = sdk_config.configuration.model_copy(deep=True)
        saved_auth = sdk_config.auth_state.model_copy()
        saved_telemetry = observability._enabled
        try:
            pytrio.configure(home=str(home))
            pytrio.configure(base_url=base_url, **dict(sdk_options))
            pytrio.configure_observability(enabled=telemetry)
            return pytrio.ServiceClient(api_key=api_key)
        finally:
            for name in type(saved).model_fields:
                setattr(sdk_config.configuration, name, getattr(saved, name))
            sdk_config.auth_state.api_key = saved_auth.api_key
            sdk_config.auth_state.config_error = saved_auth.config_error
            pytrio.configure_observability(enabled=saved_telemetry)


def session_closer(client: ServiceClient) -> Callable[[], object]:
    """A callable that ends ``client``'s session and releases its threads and connections
    (once; later calls do nothing), without keeping the client alive.

    pytrio 0.2.9 has no ``ServiceClient.close()``: its runtime is released by a
    ``weakref.finalize`` when the client and every client derived from it are unreachable,
    which closes the service session over HTTP. A twin that stops runs that same finalizer
    first (it is the runtime's private ``_finalizer``), so that no finalizer ever retries
    against a server that is gone.
    """
    return client._runtime._finalizer
