"""One exception vocabulary for tianji.

Every error raised by the runtime derives from :class:`TianjiError` and carries the
offending values as attributes, so callers can react to them without parsing messages.

The transport-facing errors mirror anyio's small vocabulary:

* :class:`ClosedByUs` - the local side already closed the resource.
* :class:`BrokenByPeer` - the peer vanished without a graceful goodbye.
* :class:`EndOfStream` - the peer closed gracefully; no more messages will come.
* :class:`WouldBlock` - a ``*_nowait`` call could not complete without waiting.
* :class:`BadFrame` - bytes on the wire (or handed to the codec) are malformed.
* :class:`ConfigError` - a configuration key or value is wrong.
* :class:`SyncFailed` - data-parallel learners could not complete a gradient all-reduce.
"""

from __future__ import annotations

__all__ = [
    "BadFrame",
    "BrokenByPeer",
    "ClosedByUs",
    "ConfigError",
    "EndOfStream",
    "HandshakeRefused",
    "RegistryError",
    "ServiceFailed",
    "SyncFailed",
    "TianjiError",
    "WouldBlock",
]


class TianjiError(Exception):
    """Base class of every error tianji raises on purpose."""


class ClosedByUs(TianjiError):
    """The resource was closed locally and can no longer be used.

    Attributes:
        resource: a human-readable name of the closed resource (e.g. an address).
    """

    def __init__(self, resource: str) -> None:
        super().__init__(f"{resource} is closed (closed by us)")
        self.resource = resource


class BrokenByPeer(TianjiError):
    """The peer disappeared without a graceful goodbye (crash, reset, kill).

    Attributes:
        peer: the peer's address or name.
        reason: what the local side observed (e.g. ``"connection reset"``).
    """

    def __init__(self, peer: str, reason: str) -> None:
        super().__init__(f"peer {peer} vanished: {reason}")
        self.peer = peer
        self.reason = reason


class HandshakeRefused(BrokenByPeer):
    """The listener was reached but the connection's handshake failed: it closed on us
    while we proved the run token (it has another one), or TLS did not agree (another CA,
    TLS on one side only). Retrying does not help until a setting changes.

    Attributes:
        peer: the listener's address.
        reason: what the local side observed.
        hint: the likely cause, for a person to act on.
    """

    def __init__(self, peer: str, reason: str, hint: str) -> None:
        super().__init__(peer, reason)
        self.hint = hint


class EndOfStream(TianjiError):
    """The peer closed the connection gracefully; no further messages will arrive.

    Attributes:
        peer: the peer's address or name.
    """

    def __init__(self, peer: str) -> None:
        super().__init__(f"peer {peer} closed the stream")
        self.peer = peer


class WouldBlock(TianjiError):
    """A non-blocking operation could not proceed without waiting.

    Attributes:
        resource: the queue or connection that is full.
        count: messages queued at the time of the call.
        nbytes: bytes queued at the time of the call.
    """

    def __init__(self, resource: str, count: int, nbytes: int) -> None:
        super().__init__(f"{resource} is full ({count} messages, {nbytes} bytes queued)")
        self.resource = resource
        self.count = count
        self.nbytes = nbytes


class BadFrame(TianjiError):
    """Malformed bytes: truncated, oversized, unknown type, inconsistent shape, ...

    Attributes:
        reason: a short machine-friendly reason (e.g. ``"frame_too_large"``).
        detail: a human-readable explanation naming the offending value.
        peer: where the frame came from, when known.
    """

    def __init__(self, reason: str, detail: str, peer: str | None = None) -> None:
        where = f" from {peer}" if peer else ""
        super().__init__(f"bad frame{where} ({reason}): {detail}")
        self.reason = reason
        self.detail = detail
        self.peer = peer

    def with_peer(self, peer: str) -> BadFrame:
        """Return a copy of this error that names the peer it came from."""
        return BadFrame(self.reason, self.detail, peer)


class ConfigError(TianjiError):
    """A configuration key or value is invalid.

    Attributes:
        key: the dotted key that is wrong (e.g. ``"transport.max_frame_bytes"``).
        value: the offending value as given.
        expected: what would have been accepted.
    """

    def __init__(self, key: str, value: object, expected: str) -> None:
        super().__init__(f"bad config {key}={value!r}: expected {expected}")
        self.key = key
        self.value = value
        self.expected = expected


class RegistryError(TianjiError):
    """A name could not be resolved in a registry (transport scheme, algorithm, ...).

    Attributes:
        kind: what was looked up (``"transport"``, ``"algorithm"``).
        name: the unknown name.
        known: the names that are registered.
    """

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(sorted(known)) or 'none'}")
        self.kind = kind
        self.name = name
        self.known = known


class ServiceFailed(TianjiError):
    """A service (or a process running one) failed.

    Attributes:
        service: the service name.
        reason: what happened (exit code, exception text, missed heartbeats).
    """

    def __init__(self, service: str, reason: str) -> None:
        super().__init__(f"service {service} failed: {reason}")
        self.service = service
        self.reason = reason


class SyncFailed(TianjiError):
    """A data-parallel learner could not complete a gradient all-reduce step.

    Attributes:
        learner: the learner that gave up.
        step: the all-reduce step (optimizer steps since the start, from 0).
        peers: the peers it is about (those that did not answer, or that disagree).
        reason: what went wrong.
    """

    def __init__(self, learner: str, step: int, peers: list[str], reason: str) -> None:
        super().__init__(f"{learner} at all-reduce step {step}: {reason} (peers {peers})")
        self.learner = learner
        self.step = step
        self.peers = peers
        self.reason = reason
