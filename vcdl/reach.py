"""Whether anything listens at a Dask scheduler's address, asked before Dask is.

Dask's client retries a refused connection until its connect timeout (20 to
60 s): a mistyped port, or a scheduler not started yet, was a long wait and
then a traceback. One TCP connection says at once. The CLI asks before a run
is recorded (exit 2); the train flow asks before its first client, for runs
started without the CLI (a deployment, the API).
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from distributed.comm.addressing import parse_address, parse_host_port

if TYPE_CHECKING:
    from vcdl.config import ClusterSection


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


def local_resources_problem(cluster: ClusterSection) -> str | None:
    """Why no worker of the run's LocalCluster can ever run a shard task, or None.

    ``cluster.task_resources`` (e.g. ``{GPU = 1}``) make Dask hold each task
    for a worker offering them; vcdl starts local workers with none but what
    Dask's own config gives (``distributed.worker.resources``, e.g.
    ``DASK_DISTRIBUTED__WORKER__RESOURCES__GPU=1``), so the run waited forever,
    saying nothing. A scheduler at ``cluster.address`` is not asked: its
    workers may join later.
    """
    if cluster.address or not cluster.task_resources:
        return None
    import dask

    offered = dict(dask.config.get("distributed.worker.resources", None) or {})

    def amount(value: object) -> float:
        try:
            return float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return 0.0

    wanted = cluster.task_resources
    if all(amount(offered.get(name)) >= need for name, need in wanted.items()):
        return None
    want = ",".join(f"{name}={need:g}" for name, need in wanted.items())
    has = ", ".join(f"{name}={amount(v):g}" for name, v in offered.items()) or "none"
    return (
        f"cluster.task_resources asks each shard task for {want[:100]}, but the "
        f"{cluster.workers} local worker(s) offer {has[:100]}: no task could ever start; "
        "remove cluster.task_resources, or set cluster.address to a scheduler whose workers "
        f"offer them (`dask worker --resources {want[:100]}`)"
    )
