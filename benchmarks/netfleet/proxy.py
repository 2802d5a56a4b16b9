"""The userspace TCP proxy of every link: latency, jitter, loss as stalls, and cuts.

Worker hosts cannot reach the root namespace's loopback, where the services
listen (the scheduler, moto's S3, PostgreSQL, Prefect's API). Each service
gets one listener on the bridge's address; a connection belongs to the link
of the address it comes from (a worker host's, or ``driver`` for the root
namespace) and, for a route into a host (a Dask worker's contact address),
to that host's link too. Each chunk read is held for its links' sampled
one-way delay and delivered in order (a chunk never overtakes the one before
it, as on TCP). A ``stall`` cut holds every chunk and every new connection
until it ends; a ``reset`` cut resets the link's connections and resets each
new one at once. The event loop runs in a thread of the process that owns
the fleet, so it dies with it.

Each of its sockets probes a silent peer as Dask's comms do (TCP keepalive,
30 s in all by default): with the proxy in the middle, the probes of a
process in the root namespace are answered by the proxy's kernel, so they
never find a peer gone silent (a host whose veth is down, a host that
vanished meanwhile). The proxy's own probe, on its socket toward the host,
does; when it gives up, the proxy resets the other side at once, as that
side's own probe would have given up about then (a reset sent by a peer,
in contrast, crosses the link: a cut holds it).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import struct
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from benchmarks.netfleet.links import CutMode, Link, LinkProfile

__all__ = ["DRIVER", "LinkProxy", "Route", "route_link"]

DRIVER = "driver"  # the link of connections from the root namespace (the driver's side)
CHUNK = 64 * 1024
# Chunks one direction may hold before it stops reading: about a TCP window,
# so a bulk transfer is held back by the link, not buffered here without end.
QUEUED_CHUNKS = 64
# Dask's TCP keepalive for its default 30-s comm timeout (distributed's
# comm/tcp.py, set_tcp_timeout): first probe after 10 s idle, then every
# 2 s, 10 unanswered ones end the connection.
KEEPALIVE = {"TCP_KEEPIDLE": 10, "TCP_KEEPINTVL": 2, "TCP_KEEPCNT": 10}

T = TypeVar("T")


def route_link(link: str, route: str) -> str:
    """The name that cuts ``link``'s connections over ``route`` alone (``driver>s3``).

    Every connection crosses its source's link and, as well, this narrower one of
    its own (link, route) pair: cutting it cuts one service for one side, e.g.
    the driver from the store while its scheduler and ledger stay reachable.
    It adds no delay of its own.
    """
    return f"{link}>{route}"


@dataclass
class Route:
    """One listener: ``listen`` (bridge address, port) forwarded to ``target``.

    ``into`` names the host whose link a connection also crosses (a route into
    that host's namespace); ``None`` for a service in the root namespace.
    """

    name: str
    listen: tuple[str, int]
    target: tuple[str, int]
    into: str | None = None
    server: asyncio.AbstractServer | None = None
    connections: set[_Conn] = field(default_factory=set)


@dataclass(eq=False)
class _Conn:
    links: tuple[Link, ...]
    transports: list[asyncio.Transport] = field(default_factory=list)

    def reset(self) -> None:
        for transport in self.transports:
            _reset(transport)


def _keepalive(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in KEEPALIVE.items():
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _reset(transport: asyncio.Transport) -> None:
    # SO_LINGER 0: close() sends a RST, as a host that forgot the connection does.
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class LinkProxy:
    """Every route of one fleet, on one event loop in a daemon thread."""

    def __init__(self, source_links: Callable[[str], str]) -> None:
        """``source_links`` maps a connection's source address to its link's name."""
        self._source_link = source_links
        self.links: dict[str, Link] = {DRIVER: Link(DRIVER)}
        self.routes: dict[str, Route] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="netfleet-proxy")
        self._thread.daemon = True
        self._thread.start()

    # -- called from the owner's thread --------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def add_link(self, name: str, profile: LinkProfile | None = None) -> None:
        """A link named ``name`` (a host's), unshaped unless ``profile`` says otherwise."""
        self._call(self._add_link(name, profile or LinkProfile()))

    def set_profile(self, name: str, profile: LinkProfile) -> None:
        """Change a link's latency, jitter and loss from now on (its bandwidth is tbf's)."""
        self._call(self._set_profile(name, profile))

    def add_route(
        self, name: str, listen_host: str, target: tuple[str, int], into: str | None = None
    ) -> tuple[str, int]:
        """Listen on ``listen_host`` (a free port) and forward to ``target``; the address bound."""
        return self._call(self._add_route(Route(name, (listen_host, 0), target, into)))

    def cut(self, name: str, seconds: float, mode: CutMode) -> None:
        """Cut link ``name`` for ``seconds`` (``stall``/``down``: hold; ``reset``: refuse).

        ``name`` may be a whole link or one link's route (:func:`route_link`)."""
        self._call(self._cut(name, seconds, mode))

    def uncut(self, name: str) -> None:
        """End link ``name``'s cut now."""
        self._call(self._cut(name, 0.0, "stall"))

    def close(self) -> None:
        """Stop every listener, reset every connection, end the loop's thread."""
        if not self._loop.is_running():
            return
        with contextlib.suppress(Exception):
            self._call(self._close(), timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    # -- on the loop ---------------------------------------------------------------------

    async def _add_link(self, name: str, profile: LinkProfile) -> None:
        self.links[name] = Link(name, profile, changed=asyncio.Event())

    async def _set_profile(self, name: str, profile: LinkProfile) -> None:
        self.links[name].profile = profile

    async def _add_route(self, route: Route) -> tuple[str, int]:
        route.server = await asyncio.start_server(
            lambda r, w: self._serve(route, r, w), route.listen[0], route.listen[1]
        )
        sock = route.server.sockets[0]
        route.listen = (route.listen[0], int(sock.getsockname()[1]))
        self.routes[route.name] = route
        return route.listen

    def _link(self, name: str) -> Link:
        """Link ``name``; a (link, route) pair's is made on first use."""
        if name in self.links:
            return self.links[name]
        source, _, route = name.partition(">")
        if not route or source not in self.links or route not in self.routes:
            known = ", ".join(sorted(n for n in self.links if ">" not in n))
            raise KeyError(
                f"no link {name!r}: a link is one of {known}, or LINK>ROUTE with a route of "
                f"{', '.join(sorted(self.routes)) or '(none yet)'}"
            )
        self.links[name] = Link(name, changed=asyncio.Event())
        return self.links[name]

    async def _cut(self, name: str, seconds: float, mode: CutMode) -> None:
        link = self._link(name)
        link.cut_until = time.monotonic() + seconds
        link.cut_mode = mode
        if link.changed is None:
            link.changed = asyncio.Event()
        link.changed.set()  # wake the held ones: they look again
        link.changed = asyncio.Event()
        if mode == "reset" and seconds > 0:
            for route in self.routes.values():
                for conn in list(route.connections):
                    if link in conn.links:
                        conn.reset()

    async def _close(self) -> None:
        for route in self.routes.values():
            if route.server is not None:
                route.server.close()
            for conn in list(route.connections):
                conn.reset()

    def _links_of(self, route: Route, peer: str) -> tuple[Link, ...]:
        source = self.links.get(self._source_link(peer)) or self.links[DRIVER]
        links = [source]
        if route.into is not None and route.into != source.name:
            links.append(self.links.get(route.into) or self.links[DRIVER])
        # Last: the source's own link over this route alone (cut by route_link's name).
        links.append(self._link(route_link(source.name, route.name)))
        return tuple(links)

    async def _serve(
        self, route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peer = str(writer.get_extra_info("peername")[0])
        links = self._links_of(route, peer)
        conn = _Conn(links, [writer.transport])  # type: ignore[list-item]
        _keepalive(writer.transport)
        route.connections.add(conn)
        try:
            if any(link.resets() for link in links):
                conn.reset()
                return
            await _held(links)
            # A real link's handshake costs a round trip before the first byte.
            await asyncio.sleep(sum(_one_way(link) for link in links) * 2)
            try:
                up_reader, up_writer = await asyncio.open_connection(*route.target)
            except OSError:
                conn.reset()  # the service is down: the client sees what it would
                return
            conn.transports.append(up_writer.transport)  # type: ignore[arg-type]
            _keepalive(up_writer.transport)
            if any(link.resets() for link in links):
                conn.reset()
                return
            await asyncio.gather(
                _pump(reader, up_writer, links, route.name),
                _pump(up_reader, writer, links, route.name),
            )
        finally:
            route.connections.discard(conn)
            for transport in conn.transports:
                transport.close()


def _one_way(link: Link) -> float:
    return link.profile.one_way_s(link.rng)


async def _held(links: tuple[Link, ...]) -> None:
    """Wait while any of ``links`` is cut (a stall); return at once when none is."""
    while True:
        waits = [link for link in links if link.cut_left() > 0]
        if not waits:
            return
        link = waits[0]
        changed = link.changed
        if changed is None:
            await asyncio.sleep(link.cut_left())
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), link.cut_left())


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    links: tuple[Link, ...],
    route: str,
) -> None:
    """Copy one direction, each chunk delivered at its arrival plus the links' delay, in order."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUED_CHUNKS)

    async def read() -> None:
        last = 0.0
        try:
            while chunk := await reader.read(CHUNK):
                due = max(time.monotonic() + sum(_one_way(link) for link in links), last)
                last = due
                await queue.put((due, chunk))
        except OSError as exc:  # ConnectionError too
            if exc.errno == errno.ETIMEDOUT:  # our keepalive gave up: so would the other side's
                _reset(writer.transport)  # type: ignore[arg-type]
        await queue.put((last, b""))

    async def write() -> None:
        try:
            while True:
                due, chunk = await queue.get()
                if writer.transport.is_closing():  # reset by the other direction
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await _held(links)
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                for link in links:
                    link.carried[route] = link.carried.get(route, 0) + len(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            writer.transport.abort()

    reading = asyncio.ensure_future(read())
    try:
        await write()
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
