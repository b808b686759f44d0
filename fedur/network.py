"""Is a download host reachable? Asked before any compute, so an offline run fails at once."""

from __future__ import annotations

import socket


def reachable(host: str, timeout: float = 5.0) -> bool:
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False
