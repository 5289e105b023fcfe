"""Garbage on a live service's TCP port: 10,000 random and mutated messages (hypothesis).

Each fuzzed message goes over its own connection, after a valid handshake (most) or instead
of one (some). The service must close every such connection (a typed ``BadFrame`` reason,
logged, or ``BrokenByPeer`` for a stream cut short), allocate nothing for lengths it
refuses, stay within a bounded amount of memory, and keep a normal publisher/subscriber
pair on the same service working, in order and without a gap, the whole time.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tianji.transports._auth import PROOF_BYTES, Handshake
from tianji.transports._framing import PREAMBLE, encode_prefix

from tianji.runtime.codec import encode
from tianji.runtime.events import ArraysPublished, topic
from tianji.runtime.service import Service

BATCH = 500  # messages per hypothesis example
EXAMPLES = 20  # 20 x 500 = 10,000 messages
CONCURRENT = 25
TOPIC = topic(ArraysPublished).encode()


def _valid_message(seq: int) -> bytes:
    ev = ArraysPublished(seq=seq, policy_version=0, arrays={"x": np.arange(4.0)}, meta={})
    frames = [TOPIC, *(bytes(f) for f in encode(ev))]
    return encode_prefix([len(f) for f in frames]) + b"".join(frames)


VALID = _valid_message(7)

random_bytes = st.binary(min_size=1, max_size=300)
corrupt_bodies = st.lists(st.binary(max_size=120), min_size=1, max_size=4).map(
    lambda frames: encode_prefix([len(f) for f in frames]) + b"".join(frames)
)
topic_then_garbage = st.binary(max_size=200).map(
    lambda body: encode_prefix([len(TOPIC), len(body)]) + TOPIC + body
)
huge_lengths = st.tuples(
    st.lists(st.integers(min_value=2**31, max_value=2**64 - 1), min_size=1, max_size=3),
    st.binary(max_size=64),
).map(lambda t: encode_prefix(t[0]) + t[1])
bad_counts = st.tuples(st.sampled_from([0, 4097, 10**6, 0xFFFFFFFE]), st.binary(max_size=32)).map(
    lambda t: struct.pack("<I", t[0]) + t[1]
)
truncated = st.integers(min_value=1, max_value=len(VALID) - 1).map(lambda n: VALID[:n])
mutated = st.lists(
    st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8
).map(lambda flips: _flip(VALID, flips))


def _flip(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for i, value in flips:
        out[i] = value
    return bytes(out)


# (handshake first?, payload)
messages = st.one_of(
    st.tuples(st.just(True), random_bytes),
    st.tuples(st.just(True), corrupt_bodies),
    st.tuples(st.just(True), topic_then_garbage),
    st.tuples(st.just(True), huge_lengths),
    st.tuples(st.just(True), bad_counts),
    st.tuples(st.just(True), truncated),
    st.tuples(st.just(True), mutated),
    st.tuples(st.just(False), random_bytes),  # garbage instead of the handshake
    st.tuples(st.just(False), st.binary(max_size=40).map(lambda b: PREAMBLE + b)),
)


class _Collector(Service):
    role = "collector"

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.seen: list[int] = []
        self.subscribe(ArraysPublished, self.on_arrays)

    async def on_arrays(self, ev: ArraysPublished) -> None:
        self.seen.append(ev.seq)


class _Rig:
    """A publisher and a subscriber (over TCP) in a loop of their own thread; the
    publisher sends one event every 5 ms the whole time."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.pub = Service("pub", bind="tcp://127.0.0.1:0", publishes=[ArraysPublished])
        self.sub = _Collector("sub", bind="tcp://127.0.0.1:0")
        self.sent = 0
        self.closed = 0
        self.still_open = 0
        self._tasks = [self._call(self._start())]

    def _call(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        self.pub_task = asyncio.create_task(self.pub.run())
        self.sub_task = asyncio.create_task(self.sub.run())
        await self.pub.wait_ready()
        await self.sub.wait_ready()
        self.sub.add_publisher(ArraysPublished, self.pub.address)
        await self.pub.wait_subscribers(ArraysPublished)
        self.ticker = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await self.pub.publish(
                ArraysPublished(seq=self.sent, policy_version=0, arrays={"x": np.zeros(8)}, meta={})
            )
            self.sent += 1
            await asyncio.sleep(0.005)

    def fuzz(self, batch: list[tuple[bool, bytes]]) -> None:
        self._call(self._fuzz(batch), timeout=300)

    async def _fuzz(self, batch: list[tuple[bool, bytes]]) -> None:
        limit = asyncio.Semaphore(CONCURRENT)

        async def one(handshake: bool, payload: bytes) -> None:
            async with limit:
                await self._one(handshake, payload)

        await asyncio.gather(*(one(h, p) for h, p in batch))

    async def _one(self, handshake: bool, payload: bytes) -> None:
        host, port = self.pub.address.removeprefix("tcp://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            if handshake:
                hs = Handshake("client", None)
                writer.write(PREAMBLE + hs.hello())
                server = await asyncio.wait_for(reader.readexactly(len(PREAMBLE) + 16), 10)
                proof = hs.on_hello(server[len(PREAMBLE) :])
                assert proof is not None
                writer.write(proof)
                await asyncio.wait_for(reader.readexactly(PROOF_BYTES), 10)
            writer.write(payload)
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()  # a stream cut short: the service must not wait for more
            while await asyncio.wait_for(reader.read(65536), 10):
                pass  # the service closes its side: EOF
            self.closed += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed += 1  # refused during or right after the handshake
        except TimeoutError:
            self.still_open += 1
        finally:
            writer.close()

    def stop(self) -> None:
        async def stop() -> None:
            self.ticker.cancel()
            for s in (self.pub, self.sub):
                s.stop("test over")
            await asyncio.gather(self.pub_task, self.sub_task, return_exceptions=True)

        self._call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _rss_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096 / 2**20


@pytest.fixture(scope="module")
def rig() -> Iterator[_Rig]:
    r = _Rig()
    try:
        yield r
    finally:
        r.stop()


@pytest.mark.slow
def test_ten_thousand_bad_messages_close_their_connections_and_harm_nothing_else(
    rig: _Rig,
) -> None:
    batches: list[list[tuple[bool, bytes]]] = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(messages, min_size=BATCH, max_size=BATCH))
    def draw(batch: list[tuple[bool, bytes]]) -> None:
        batches.append(batch)

    draw()  # hypothesis draws first, so the RSS below is the service's alone
    rig.fuzz(batches[0])  # warm up: receive buffers, sockets, the allocator's arenas
    rss = [_rss_mb()]
    for i, batch in enumerate(batches[1:], 1):
        rig.fuzz(batch)
        if i in (len(batches) // 2, len(batches) - 1):
            rss.append(_rss_mb())
    total = sum(len(b) for b in batches)
    assert total >= 10_000
    assert rig.still_open == 0 and rig.closed == total
    pub = rig.pub
    refused = pub.counters["bad_frames"]
    assert refused > total // 2, dict(pub.counters)  # most were typed BadFrame closes
    # the normal pair kept working: every event, in order, no gap
    sent = rig.sent
    for _ in range(200):
        if len(rig.sub.seen) >= sent:
            break
        threading.Event().wait(0.05)
    seen = rig.sub.seen[:sent]
    assert seen == list(range(len(seen))) and len(seen) >= sent - 5 and sent > 100
    # bounded: after the first half (allocator arenas, pools) the second half of the
    # messages adds little (pytest's log capture keeps ~1 KB per message): < 16 MB in most
    # runs, 32 MB once in CI (allocator noise). The leak this guards against (exception
    # tracebacks pinning 256 KB receive buffers) grew ~700 MB per half.
    first, second = rss[1] - rss[0], rss[2] - rss[1]
    assert second < 64, f"RSS grew {first:.0f} MB, then {second:.0f} MB more (not bounded)"
    growth = rss[2] - rss[0]
    print(
        f"fuzz: {total} messages, {refused} BadFrame closes, {sent} events delivered, "
        f"RSS +{growth:.1f} MB"
    )
