"""The offline twin of PyTRIO: a PyTRIO server for 127.0.0.1 that the real, unmodified
``pytrio.ServiceClient`` talks to over loopback HTTP, so that the only difference between an
offline and a live run is the base URL.

Real: the client, its transport, event polling, batch splitting, retries and futures, and the
wire protocol (validated with pytrio's own protocol models). Modelled: the policy
(:mod:`.policy`: ``scripted``, ``toy``, ``learning``), the server's loss reduction and how
calls accumulate, limits, the stop-token convention, latencies and faults. Strict mode
(:mod:`.strict`) records protocol violations. Start one with :func:`start_twin`, or from the
command line with ``python cli.py twin serve``.

The core (protocol, rollout, reward, advantage, datum, packing, trainer) never imports from
here; commands reach it through ``searchr1.wiring.services``.
"""

from searchr1.twin.client import TWIN_API_KEY, connect
from searchr1.twin.config import Latencies, OperationLimits, StopConvention, Strictness, TwinFaults, TwinLimits
from searchr1.twin.server import LIVE_TWINS, Twin, start_twin, untaken_violations

__all__ = [
    "LIVE_TWINS",
    "TWIN_API_KEY",
    "Latencies",
    "OperationLimits",
    "StopConvention",
    "Strictness",
    "Twin",
    "TwinFaults",
    "TwinLimits",
    "connect",
    "start_twin",
    "untaken_violations",
]
