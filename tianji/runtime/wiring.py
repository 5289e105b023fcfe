"""What a :class:`~tianji.runtime.service.Service` hands the parts it is composed of (its
subscriptions :mod:`tianji.runtime.links`, its controller link
:mod:`tianji.runtime.heartbeats`, its board :mod:`tianji.runtime.sharing`): its options, the
topic of requests and the types of the narrow callables each part is given."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

from tianji.runtime.codec import Codec, Frame
from tianji.runtime.core import Connection, Limits
from tianji.runtime.errors import BadFrame
from tianji.runtime.events import Event, event_type_of_topic

__all__ = [
    "CONTROL",
    "Decode",
    "Encode",
    "FrameList",
    "Messages",
    "Send",
    "ServiceOptions",
    "Spawn",
]

CONTROL = ""
"""The topic of requests and replies on a link and to the controller (not pub/sub)."""

FrameList = list[Frame]
"""One service message: ``[topic, *codec frames]``."""
Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]
"""Run a coroutine as a task of the service (cancelled when it stops)."""
Encode = Callable[[Event, str], FrameList]
"""``(event, topic) -> message``."""
Decode = Callable[[list[memoryview], str], tuple[str, Event]]
"""``(message, peer) -> (topic, event)``; raises ``BadFrame`` naming the peer."""
Send = Callable[[Connection | None, Event], Coroutine[Any, Any, None]]
"""Send a request in the background: a broken link is counted, not raised."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServiceOptions:
    """Runtime knobs shared by every service.

    Attributes:
        limits: bounds of every connection the service opens or accepts.
        heartbeat_interval: seconds between heartbeats to the controller.
        report_interval: the shortest gap (s) between two heartbeats; :meth:`Service.report_soon`
            asks for one early.
        reconnect_min: first retry delay (s) after a link breaks; doubles up to reconnect_max.
        reconnect_max: longest retry delay (s).
        controller_grace: a service that cannot reach its controller this long fails.
        drain_timeout: seconds a stopping service waits for subscribers to take queued data.
    """

    limits: Limits = dataclasses.field(default_factory=Limits)
    heartbeat_interval: float = 1.0
    report_interval: float = 0.01
    reconnect_min: float = 0.05
    reconnect_max: float = 2.0
    controller_grace: float = 15.0
    drain_timeout: float = 10.0


class Messages:
    """Service messages, ``[topic, *codec frames]``, made and read with one codec."""

    def __init__(self, codec: Codec) -> None:
        self._codec = codec

    def encode(self, ev: Event, topic_name: str) -> FrameList:
        """The message carrying ``ev`` on ``topic_name``."""
        return [topic_name.encode(), *self._codec.encode(ev)]

    def decode(self, frames: list[memoryview], peer: str) -> tuple[str, Event]:
        """The topic and event of a message from ``peer``.

        Raises:
            BadFrame: naming ``peer``, if the message is malformed or its event does not
                belong on its topic.
        """
        try:
            if len(frames) < 2:
                raise BadFrame("missing_topic", f"{len(frames)} frames; need topic + header")
            try:
                name = bytes(frames[0]).decode()
            except UnicodeDecodeError:
                raise BadFrame("bad_topic", f"topic frame {bytes(frames[0][:40])!r}") from None
            ev = self._codec.decode(frames[1:])
            if name and event_type_of_topic(name) != ev.TYPE:
                raise BadFrame("topic_mismatch", f"{ev.TYPE} event on topic {name!r}")
            return name, ev
        except BadFrame as exc:
            raise exc.with_peer(peer) from None
