"""A slow client for the servers' bound tests: how long a server keeps a connection that sends
too little, too slowly."""

from __future__ import annotations

import socket
import time


def seconds_until_dropped(address: tuple[str, int], first: bytes, then: bytes | None, *, every: float = 0.2,
                          limit: float = 10.0) -> float:
    """Seconds until the server at ``address`` closes a connection that sends ``first`` and then
    ``then`` every ``every`` seconds (nothing more when ``then`` is None); infinity when it is
    still open after ``limit`` seconds."""
    with socket.create_connection(address) as connection:
        started = time.monotonic()
        if first:
            connection.sendall(first)
        connection.settimeout(every)
        while time.monotonic() - started < limit:
            try:
                if connection.recv(4096) == b"":
                    return time.monotonic() - started
            except TimeoutError:
                if then is not None:
                    try:
                        connection.sendall(then)
                    except OSError:
                        return time.monotonic() - started
            except OSError:
                return time.monotonic() - started
    return float("inf")
