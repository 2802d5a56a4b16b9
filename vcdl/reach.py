"""Whether anything listens at a Dask scheduler's address, asked before Dask is.

Dask's client retries a refused connection until its connect timeout (20 to
60 s): a mistyped port, or a scheduler not started yet, was a long wait and
then a traceback. One TCP connection says at once. The CLI asks before a run
is recorded (exit 2); the train flow asks before its first client, for runs
started without the CLI (a deployment, the API).
"""

from __future__ import annotations

import socket

from distributed.comm.addressing import parse_address, parse_host_port


def no_scheduler(address: str, detail: str) -> str:
    """The one sentence for "nothing answered at ``address``", ``detail`` saying how."""
    return (
        f"no Dask scheduler answered at {address[:200]} {detail}; "
        "is `dask scheduler` running there?"
    )


def scheduler_unreachable(address: str, timeout: float = 20.0) -> str | None:
    """Why nothing can be reached at a tcp:// or tls:// address, or None.

    A closed port (refused at once: Dask's client would retry it until its
    timeout), a host that does not answer, a name that does not resolve. A
    listener of another kind is left to the Dask handshake to judge.
    """
    try:
        scheme, location = parse_address(address)
        if scheme not in ("tcp", "tls"):
            return None
        host, port = parse_host_port(location)
        socket.create_connection((host, port), timeout=timeout).close()
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer within {timeout:.0f} s"
    except socket.gaierror as exc:
        return f"host not found: {exc.strerror}"
    except (OSError, ValueError):
        return None
    return None
