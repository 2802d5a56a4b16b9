"""A loopback port for a test: free when asked, so nothing listens there until the test binds it."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that the OS just handed out and nobody holds."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
