"""The tianji vocabulary: read this file first.

Everything in tianji is one of a few things declared here:

* a :class:`Transport` moves *messages* (lists of byte frames) between two endpoints.
  It knows nothing of events or RL; the codec turns events into frames.
* a :class:`Service` is an asyncio object with a lifecycle that publishes and subscribes to
  typed events (see :mod:`tianji.events`) over transports.
* an :class:`Algorithm` is the RL math: batched ``act`` and ``update``; no I/O.
* a :class:`Buffer` stores samples and hands out batches; no I/O.

The concrete runtime lives in :mod:`tianji.service`, transports in :mod:`tianji.transports`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tianji.errors import BadFrame, ConfigError

__all__ = [
    "Algorithm",
    "Buffer",
    "BufferSpec",
    "Connection",
    "ConnectionStatistics",
    "Frames",
    "GradientSync",
    "Limits",
    "Listener",
    "Service",
    "ServiceState",
    "SupportsGradientSync",
    "Transport",
    "UpdateResult",
]

Frames = Sequence[bytes | bytearray | memoryview]
"""One message on the wire: a header frame followed by zero or more payload frames."""

MAX_FRAMES = 16384
"""Upper bound of ``Limits.max_frames`` (a message's length prefix must fit a read buffer)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Bounds every connection enforces (see ``[transport]`` in the run config).

    Attributes:
        max_frame_bytes: a frame longer than this is refused before it is allocated.
        max_frames: a message with more frames than this is refused.
        queue_messages: messages a connection buffers per direction before the sender waits.
        queue_bytes: bytes a connection buffers per direction before the sender waits. A
            single message larger than this is still admitted into an empty queue.
    """

    max_frame_bytes: int = 1 << 30
    max_frames: int = 4096
    queue_messages: int = 1024
    queue_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        for name in ("max_frame_bytes", "max_frames", "queue_messages", "queue_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ConfigError(f"transport.{name}", value, "a positive integer")
        if self.max_frames > MAX_FRAMES:
            raise ConfigError("transport.max_frames", self.max_frames, f"at most {MAX_FRAMES}")

    def check_message(self, frames: Frames) -> tuple[list[memoryview], int]:
        """Validate an outgoing message before anything is copied or written.

        Returns:
            The frames as byte memoryviews, and the payload size in bytes.

        Raises:
            BadFrame: if the message is empty, has too many frames or a frame is too large.
        """
        if not frames:
            raise BadFrame("empty_message", "a message needs at least one frame")
        if len(frames) > self.max_frames:
            raise BadFrame("too_many_frames", f"{len(frames)} frames > max {self.max_frames}")
        views = [memoryview(f).cast("B") for f in frames]
        size = 0
        for i, v in enumerate(views):
            if v.nbytes > self.max_frame_bytes:
                raise BadFrame(
                    "frame_too_large", f"frame {i} is {v.nbytes} bytes > max {self.max_frame_bytes}"
                )
            size += v.nbytes
        return views, size


@dataclasses.dataclass(slots=True)
class ConnectionStatistics:
    """Counters and queue depths of one connection (a snapshot; see ``statistics()``).

    Messages and bytes count payload frames as the application sees them (no framing
    overhead): a message counts as sent when ``send`` accepted it and as received when
    ``recv`` returned it, so both ends of a drained link agree.
    """

    messages_sent: int = 0
    bytes_sent: int = 0
    messages_received: int = 0
    bytes_received: int = 0
    send_queue_messages: int = 0
    send_queue_bytes: int = 0
    recv_queue_messages: int = 0
    recv_queue_bytes: int = 0


@runtime_checkable
class Connection(Protocol):
    """A bidirectional, ordered, message-oriented link to one peer.

    Usage::

        async with await transport.connect("tcp://127.0.0.1:5555") as conn:
            await conn.send([header, payload])     # waits while the peer is slow
            frames = await conn.recv()             # raises EndOfStream / BrokenByPeer

    ``send`` applies backpressure: it returns once the message is queued within the
    connection's :class:`Limits`; ``send_nowait`` raises ``WouldBlock`` instead of waiting.
    The caller must not mutate buffers passed to ``send`` until ``drain()`` returns.
    ``recv`` returns frames owned by the caller. ``aclose`` is idempotent, flushes what
    was queued (bounded by a timeout) and tells the peer goodbye, so the peer's ``recv``
    raises ``EndOfStream``; a peer that vanishes without goodbye raises ``BrokenByPeer``.
    """

    @property
    def peer(self) -> str: ...

    async def send(self, frames: Frames) -> None: ...

    def send_nowait(self, frames: Frames) -> None: ...

    async def drain(self) -> None: ...

    async def recv(self) -> list[memoryview]: ...

    async def aclose(self) -> None: ...

    def abort(self) -> None: ...

    def statistics(self) -> ConnectionStatistics: ...

    async def __aenter__(self) -> Connection: ...

    async def __aexit__(self, *exc: object) -> None: ...


@runtime_checkable
class Listener(Protocol):
    """Accepts connections on one address.

    Usage::

        listener = await transport.listen("tcp://127.0.0.1:0")
        print(listener.address)                    # "tcp://127.0.0.1:41234": port resolved
        conn = await listener.accept()
        await listener.aclose()                    # idempotent; accepted connections live on
    """

    @property
    def address(self) -> str: ...

    async def accept(self) -> Connection: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Transport(Protocol):
    """A way to move messages: ``inproc``, ``tcp``, ``shm`` or a third-party one.

    A transport is looked up by the scheme of an address (``tcp://host:port``) in
    :mod:`tianji.transports`; third parties register under the entry-point group
    ``tianji.transports``. Every transport passes ``tests/test_transport_conformance.py``.

    Usage::

        transport = tianji.transports.get("tcp")
        listener = await transport.listen("tcp://127.0.0.1:0", limits=Limits())
        conn = await transport.connect(listener.address, limits=Limits())
    """

    scheme: str

    async def listen(self, address: str, *, limits: Limits) -> Listener: ...

    async def connect(self, address: str, *, limits: Limits) -> Connection: ...


class ServiceState(enum.Enum):
    """Lifecycle of a service: each state is entered once, in this order."""

    CREATED = "created"
    STARTING = "starting"
    READY = "ready"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


@runtime_checkable
class Service(Protocol):
    """An asyncio component that talks only through typed events.

    Usage::

        svc = MyService(name="actor-0", controller="tcp://127.0.0.1:7000")
        task = asyncio.create_task(svc.run())
        await svc.wait_ready()        # listening, registered, subscriptions wired
        ...
        svc.stop("done")               # graceful drain; cancel ``task`` to force
        await task
    """

    name: str
    role: str

    @property
    def state(self) -> ServiceState: ...

    async def run(self) -> None: ...

    async def wait_ready(self) -> None: ...

    def stop(self, reason: str) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BufferSpec:
    """The buffer an algorithm wants; the buffer service builds it.

    Attributes:
        kind: ``"replay"`` (uniform), ``"prioritized"`` (proportional, with importance
            weights and priority updates from the learner) or ``"rollout"`` (FIFO of whole
            trajectory fragments, for on-policy learning).
        capacity: transitions (replay kinds) or fragments (rollout) kept at most; the
            oldest are evicted and counted.
        batch_size: transitions per learner batch (replay kinds) or fragments per batch
            (rollout; they are concatenated along the env axis).
        min_size: stored items needed before the first batch is handed out.
        alpha: priority exponent (prioritized only).
        beta: importance-weight exponent (prioritized only).
    """

    kind: str
    capacity: int
    batch_size: int
    min_size: int = 0
    alpha: float = 0.6
    beta: float = 0.4


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UpdateResult:
    """What one learner update returns.

    Attributes:
        metrics: scalars to log (``loss``, ``entropy``, ...).
        priorities: new priorities for the sampled transitions (prioritized replay), in
            the order of the batch, or ``None``.
    """

    metrics: dict[str, float]
    priorities: np.ndarray | None = None


@runtime_checkable
class Algorithm(Protocol):
    """RL math in one object: no asyncio, transports, processes or logging inside.

    An algorithm is one file in ``algorithms/`` (or a third-party module registered under
    the entry-point group ``tianji.algorithms``) defining a config dataclass ``Config`` and
    a class with this interface. The same object runs on actors (``act``,
    ``postprocess``, ``set_weights``) and on the learner (``update``, ``get_weights``).

    Usage (what the actor and learner services do)::

        cls = tianji.algorithms.get("ppo")
        problem = cls.check_spaces(obs_space, action_space)   # None or an error message
        algo = cls(cls.Config(), obs_space, action_space, seed=0, device="auto")
        out = algo.act(obs_batch, explore=True)     # {"action": [N,...], + extras to store}
        samples = algo.postprocess(fragment)        # actor side, numpy only (e.g. n-step)
        result = algo.update(batch)                 # learner side -> UpdateResult
        weights = algo.get_weights()                # published as ParamsPublished
        actor_algo.set_weights(weights, version)    # version drives e.g. epsilon schedules

    A *fragment* is what an actor collected with N envs over T steps: arrays shaped
    ``[T, N, ...]`` named ``obs``, ``action``, ``reward``, ``terminated``, ``truncated``,
    ``next_obs`` (the true next observation, also at episode ends) plus every extra key
    ``act`` returned (e.g. ``logp``, ``value``).

    A multi-agent algorithm sets ``multi_agent = True`` and takes ``state_space=`` in its
    constructor; its envs stack A agents (``obs [N, A, D]``, ``action [N, A]``) and its
    fragments also carry ``agent_reward``, ``state`` and ``next_state``
    (``tianji/multiagent.py``).
    """

    name: str

    def act(self, obs: np.ndarray, *, explore: bool) -> dict[str, np.ndarray]: ...

    def postprocess(self, fragment: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult: ...

    def get_weights(self) -> dict[str, np.ndarray]: ...

    def set_weights(self, weights: Mapping[str, np.ndarray], version: int) -> None: ...

    def buffer_spec(self) -> BufferSpec: ...


GradientSync = Callable[[np.ndarray], np.ndarray]
"""Averages a flat float32 vector over the data-parallel learners (``learner.count > 1``).

The learner service installs one on its algorithm; the algorithm calls it after
``backward()`` with all its gradients flattened into one vector, and puts what it returns
back before clipping and ``optimizer.step()``. It blocks until every learner has handed in
its vector for the same step and returns their mean, bit-identical on every learner, so
identical weights stay identical. Each call is one all-reduce step: every learner must make
the same sequence of calls with vectors of the same size (an algorithm that takes a
data-dependent decision, e.g. PPO's early stop on ``target_kl``, averages its input through
the same hook first). It raises if a peer does not answer in time.
"""


@runtime_checkable
class SupportsGradientSync(Protocol):
    """An :class:`Algorithm` that can run as one of several data-parallel learners.

    Usage (the learner service does this when ``learner.count > 1``)::

        algo.gradient_sync = hook    # None (the default): a single learner, no overhead
        algo.update(batch)           # calls hook(flat_grads) once per optimizer step
    """

    gradient_sync: GradientSync | None


@runtime_checkable
class Buffer(Protocol):
    """Sample storage with a sampling strategy (replay, prioritized replay, FIFO rollouts).

    Usage::

        buf.add({"obs": o, "action": a, ...}, policy_version=7)   # returns items added
        batch = buf.sample(256)   # None while fewer than min_size items are stored
        buf.update_priorities(batch["index"], new_priorities)       # prioritized only
        stats = buf.statistics()  # {"size": ..., "inserted": ..., "evicted": ...}
    """

    def add(self, arrays: Mapping[str, np.ndarray], *, policy_version: int) -> int: ...

    def sample(self, batch_size: int) -> dict[str, np.ndarray] | None: ...

    def __len__(self) -> int: ...

    def statistics(self) -> dict[str, Any]: ...
