"""A service's subscribers: the peers that connect to its listeners and what each of them
subscribes to (:class:`Peers`, owned by :class:`~tianji.runtime.service.Service`)."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence

from tianji.runtime import plugins
from tianji.runtime.core import Connection, Limits, Listener
from tianji.runtime.demand import Demand
from tianji.runtime.errors import BadFrame, ClosedByUs, EndOfStream, TianjiError
from tianji.runtime.events import Event, Subscribe, Want
from tianji.runtime.wiring import Decode, FrameList, Spawn

__all__ = ["Peers", "advertised"]

log = logging.getLogger("tianji.service")


class Peers:
    """Every peer connected to the service's listeners; a ``Subscribe`` adds the peer to
    the subscribers of its topics, any other event is a request for the service.

    Args:
        name: the owning service's name (for logs).
        counters: the service's counters (lost subscribers, bad frames, drain failures).
        spawn: serves each peer as a task of the service.
        decode: a service message from its frames.
        notify: wakes whoever waits for the subscribers to change.
        on_subscribed, on_request, on_peer_closed: the service's hooks.
        locality: gives the service's locality: a subscriber that says it shares it reads large
            events from the service's board (:mod:`tianji.runtime.sharing`).
    """

    def __init__(
        self,
        name: str,
        counters: collections.Counter[str],
        *,
        spawn: Spawn,
        decode: Decode,
        notify: Callable[[], None],
        on_subscribed: Callable[[Connection, Sequence[str]], Awaitable[None]],
        on_request: Callable[[Event, Connection], Awaitable[None]],
        on_peer_closed: Callable[[Connection], Awaitable[None]],
        locality: Callable[[], str] = str,
    ) -> None:
        self.name = name
        self.locality = locality
        self.counters = counters
        self.by_topic: dict[str, set[Connection]] = {}
        self.peers: set[Connection] = set()
        # peers that may read this service's board: they came through the local listener
        # or said they share its locality when they subscribed
        self.local: set[Connection] = set()
        self.demand = Demand(counters)  # the topics each peer takes on demand
        self.listeners: list[Listener] = []  # the listener, then the local one if any
        self._spawn = spawn
        self._decode = decode
        self._notify = notify
        self._on_subscribed = on_subscribed
        self._on_request = on_request
        self._on_peer_closed = on_peer_closed

    async def listen(
        self, bind: str, local_bind: str | None, advertise: str | None, limits: Limits
    ) -> tuple[str, str]:
        """Open the listener on ``bind`` (and one on ``local_bind`` for this host's peers);
        return the address to register (the host replaced by ``advertise``, if given) and
        the local listener's address (``""`` without one)."""
        listener = await plugins.transport_for(bind).listen(bind, limits=limits)
        self.listeners.append(listener)
        if local_bind is None:
            return advertised(listener.address, advertise), ""
        try:
            local = await plugins.transport_for(local_bind).listen(local_bind, limits=limits)
        except BaseException:
            await listener.aclose()
            raise
        self.listeners.append(local)
        return advertised(listener.address, advertise), local.address

    def accept_all(self) -> None:
        """Serve every peer that connects to the listeners (see :meth:`listen`)."""
        for i, listener in enumerate(self.listeners):
            self._spawn(self.accept(listener, local=i > 0))

    async def accept(self, listener: Listener, local: bool = False) -> None:
        """Serve every peer that connects; ``local``: the listener for this host's peers
        (they may read large events from this service's board)."""
        while True:
            try:
                conn = await listener.accept()
            except ClosedByUs as exc:  # we closed it: the service is stopping
                log.debug("%s: listener closed: %s", self.name, exc)
                return
            except TianjiError as exc:  # no new peer reaches us from now on: say so
                self.counters["listener_failures"] += 1
                log.error("%s: listener %s failed: %s", self.name, listener.address, exc)
                return
            if local:
                self.local.add(conn)
            self._spawn(self._serve(conn))

    async def _serve(self, conn: Connection) -> None:
        self.peers.add(conn)
        try:
            while True:
                frames = await conn.recv()
                _, ev = self._decode(frames, conn.peer)
                if isinstance(ev, Subscribe):
                    if ev.locality and ev.locality == self.locality():
                        self.local.add(conn)
                    for name in ev.topics:
                        self.by_topic.setdefault(name, set()).add(conn)
                    self.demand.subscribe(conn, set(ev.on_demand) & set(ev.topics))
                    self._notify()
                    await self._on_subscribed(conn, ev.topics)
                elif isinstance(ev, Want):
                    held = self.demand.want(conn, ev.topic)
                    if held is not None:
                        await conn.send(held)
                else:
                    await self._on_request(ev, conn)
        except BadFrame as exc:
            self.counters["bad_frames"] += 1
            log.warning("%s: closing connection from %s: %s", self.name, conn.peer, str(exc))
            conn.abort()
        except TianjiError as exc:
            log.debug("%s: peer %s gone: %s", self.name, conn.peer, str(exc))
        finally:
            self.peers.discard(conn)
            self.local.discard(conn)
            self.demand.forget(conn)
            for conns in self.by_topic.values():
                conns.discard(conn)
            self._notify()
            await self._on_peer_closed(conn)

    def admitted(
        self, name: str, conns: Iterable[Connection], frames: FrameList, shared: FrameList | None
    ) -> list[tuple[Connection, FrameList]]:
        """The subscribers an event of topic ``name`` goes to now, each with its frames
        (``shared``, the board reference, for those on this host): all of ``conns`` but
        those that take it on demand and want none now (it is held for them)."""
        out = []
        for conn in conns:
            mine = shared if shared is not None and conn in self.local else frames
            if self.demand.admit(conn, name, mine):
                out.append((conn, mine))
        return out

    def drop(self, conn: Connection, exc: TianjiError) -> None:
        """A send to ``conn`` failed with ``exc``: it is a subscriber no more."""
        if isinstance(exc, EndOfStream):  # it said goodbye: left, not lost
            self.counters["subscribers_left"] += 1
            log.info("%s: subscriber %s left", self.name, conn.peer)
        else:
            self.counters["subscribers_lost"] += 1
            log.warning("%s: subscriber %s lost: %s", self.name, conn.peer, str(exc))
        for conns in self.by_topic.values():
            conns.discard(conn)
        conn.abort()
        self._notify()

    async def close(self, deadline: float) -> None:
        """Let every subscriber take what is queued (``deadline`` s each), then say goodbye
        to every peer."""
        subscribers = {c for conns in self.by_topic.values() for c in conns}

        async def close(conn: Connection) -> None:
            try:
                await asyncio.wait_for(conn.drain(), deadline)
                await asyncio.wait_for(conn.aclose(), deadline)
            except EndOfStream:  # the peer said goodbye first: nothing left to deliver
                conn.abort()
            except (TianjiError, TimeoutError) as exc:
                self.counters["drain_failures"] += 1
                log.warning("%s: could not drain %s: %s", self.name, conn.peer, str(exc))
                conn.abort()

        await asyncio.gather(*(close(c) for c in subscribers | self.peers))

    async def abort(self) -> None:
        """Close the listeners and drop every peer's connection at once."""
        for listener in self.listeners:
            await listener.aclose()
        for conn in list(self.peers):
            conn.abort()

    def queue_depths(self, depths: dict[str, int]) -> None:
        """Add the bytes waiting to go to each subscriber to ``depths``."""
        for conns in self.by_topic.values():
            for conn in conns:
                depths[f"to:{conn.peer}"] = conn.statistics().send_queue_bytes


def advertised(address: str, host: str | None) -> str:
    """``address`` with its host replaced by ``host`` (``tcp://0.0.0.0:5000`` advertised as
    ``tcp://10.0.0.1:5000``); unchanged when ``host`` is ``None`` or the address has no
    ``host:port`` part."""
    if not host:
        return address
    scheme, rest = plugins.split_address(address)
    _, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return address
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{scheme}://{host}:{port}"
