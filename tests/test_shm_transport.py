"""The shared-memory transport beyond the conformance suite: processes, crashes, leases.

Cross-process tests start a child with ``python -c`` that talks to a listener in the test
process. Every test checks that it leaves no ``/dev/shm/tianji-*`` file and no process.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import signal
import socket
import struct
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
from shm_children import (
    COUNTING_CHILD,
    IDLE_CHILD,
    KILLED_CHILD,
    cpu_seconds,
    reap,
    spawn,
)
from tianji.transports import _shmring
from tianji.transports.shm import HELLO, HELLO_MAGIC, ShmConnection, socket_address

from tianji import transports
from tianji.runtime.core import Limits
from tianji.runtime.errors import BadFrame, BrokenByPeer, EndOfStream, WouldBlock
from tianji.testing import run_async

MiB = 1 << 20
DEFAULT_LIMITS = Limits()
SHM = Path(_shmring.SHM_DIR)


def segments(pid: int | None = None) -> list[str]:
    """Ring files in /dev/shm (of one creator pid, if given)."""
    prefix = _shmring.PREFIX + (f"{pid}-" if pid is not None else "")
    return sorted(p.name for p in SHM.iterdir() if p.name.startswith(prefix))


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    yield
    assert segments(os.getpid()) == [], "a test left ring files of this process behind"


@pytest.fixture(params=["uvloop", "asyncio"])
def loop_name(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on both event loops (``run_async`` reads TIANJI_LOOP)."""
    name: str = request.param
    monkeypatch.setenv("TIANJI_LOOP", name)
    return name


@contextlib.asynccontextmanager
async def shm_link(
    limits: Limits = DEFAULT_LIMITS,
) -> AsyncIterator[tuple[ShmConnection, ShmConnection]]:
    transport = transports.get("shm")
    listener = await transport.listen("shm://", limits=limits)
    try:
        client = await transport.connect(listener.address, limits=limits)
        server = await listener.accept()
        assert isinstance(client, ShmConnection) and isinstance(server, ShmConnection)
        try:
            yield client, server
        finally:
            client.abort()
            server.abort()
    finally:
        await listener.aclose()


# --------------------------------------------------------------------------- crashes


def test_a_killed_peer_is_broken_by_peer_after_its_messages_and_leaves_no_segment() -> None:
    async def main() -> int:
        transport = transports.get("shm")
        async with await transport.listen("shm://", limits=Limits()) as listener:
            child = await spawn(KILLED_CHILD, listener.address)
            try:
                conn = await listener.accept()
                assert child.stdout is not None
                assert await child.stdout.readline() == b"sent\n"
                assert segments(child.pid) == [], "rings must be unlinked once mapped"
                os.kill(child.pid, signal.SIGKILL)
                await child.wait()
                for seq in range(5):
                    frames = await conn.recv()
                    assert bytes(frames[1]) == seq.to_bytes(4, "little") * 1000
                with pytest.raises(BrokenByPeer):
                    await conn.recv()
                with pytest.raises((BrokenByPeer, EndOfStream)):
                    await conn.send([b"anyone?"])
                conn.abort()
            finally:
                await reap(child)
            return child.pid

    pid = run_async(main())
    assert segments(pid) == []


def test_a_segment_left_by_a_dead_process_is_removed_by_the_next_listen_and_connect(
    tmp_path: Path,
) -> None:
    dead = _dead_pid()
    own_start = _shmring._own_start_time()
    mine = f"tianji-{os.getpid()}-{own_start}-cafe"  # alive: kept
    stale = [
        f"tianji-{dead}-123-deadbeef",  # dead creator
        f"tianji-{dead}-deadbeef",  # the short form (pid only)
        f"tianji-{os.getpid()}-{own_start + 1}-beef",  # our pid, reused by a new process
    ]
    for name in [mine, *stale, "tianji-notapid-1-x", "other-123"]:
        (tmp_path / name).write_bytes(b"x")
    removed = _shmring.sweep_stale_segments(str(tmp_path))
    assert sorted(removed) == sorted(stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [mine, "tianji-notapid-1-x", "other-123"]
    )

    # In /dev/shm itself: listen sweeps it, and so does connect (even one that fails).
    async def listen() -> None:
        transport = transports.get("shm")
        await (await transport.listen("shm://", limits=Limits())).aclose()

    async def connect() -> None:
        with pytest.raises(BrokenByPeer):
            await transports.get("shm").connect("shm://nobody-listens-here", limits=Limits())

    for step in (listen, connect):
        leftover = SHM / f"tianji-{dead}-1-{step.__name__}"
        leftover.write_bytes(b"x")
        run_async(step())
        assert not leftover.exists(), f"{step.__name__} did not remove {leftover.name}"


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


# --------------------------------------------------------------------------- payloads


def test_a_payload_bigger_than_the_ring_round_trips_bit_exact(loop_name: str) -> None:
    rng = np.random.default_rng(40)
    big = rng.integers(0, 256, size=40 * MiB, dtype=np.uint8)
    frames = [b"head", b"", big[: 3 * MiB], b"", big[3 * MiB :]]

    async def main() -> None:
        for limits in (Limits(), Limits(queue_bytes=1 * MiB)):  # 4 MiB and 1 MiB rings
            async with shm_link(limits) as (client, server):
                sending = asyncio.create_task(client.send(frames))
                got = await server.recv()
                await sending
                assert [f.nbytes for f in got] == [memoryview(f).nbytes for f in frames]
                assert bytes(got[0]) == b"head"
                assert np.array_equal(np.frombuffer(got[2], np.uint8), big[: 3 * MiB])
                assert np.array_equal(np.frombuffer(got[4], np.uint8), big[3 * MiB :])
                await client.send([b"after"])  # the stream goes on
                assert bytes((await server.recv())[0]) == b"after"

    run_async(main())


def test_a_large_message_frees_its_place_in_the_message_count() -> None:
    """With queue_messages=1, the message after a chunked one must be admitted."""

    async def main() -> None:
        async with shm_link(Limits(queue_messages=1, queue_bytes=64)) as (client, server):
            for size in (3 * MiB, 10, 3 * MiB, 0, 10):
                sending = asyncio.create_task(client.send([bytes(size), b"tail"]))
                frames = await asyncio.wait_for(server.recv(), 5)
                await asyncio.wait_for(sending, 5)
                assert [f.nbytes for f in frames] == [size, 4]

    run_async(main())


def test_a_cancelled_send_of_a_large_message_still_delivers_it_whole() -> None:
    big = bytes(range(256)) * (12 * MiB // 256)

    async def main() -> None:
        async with shm_link(Limits(queue_bytes=1 * MiB)) as (client, server):
            sending = asyncio.create_task(client.send([big]))
            await asyncio.sleep(0.1)  # the ring is full, nobody reads: the send waits
            assert not sending.done()
            sending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sending
            following = asyncio.create_task(client.send([b"next"]))
            assert bytes((await server.recv())[0]) == big
            await following
            assert bytes((await server.recv())[0]) == b"next"

    run_async(main())


def test_recv_lease_views_the_ring_and_frees_space_only_on_release(loop_name: str) -> None:
    array_ = np.arange(4096, dtype=np.float32)

    async def main() -> None:
        async with shm_link() as (client, server):
            await client.send([b"first", array_])
            await client.send([b"second"])
            lease = await server.recv_lease()
            second = await server.recv_lease()
            got = np.frombuffer(lease.frames[1], dtype=np.float32)
            assert np.array_equal(got, array_)
            assert got.ctypes.data % 64 == 0, "ring frames are 64-byte aligned"
            assert server._r is not None
            ring = np.frombuffer(server._r.ring.mm, dtype=np.uint8)
            start = ring.ctypes.data
            assert start <= got.ctypes.data < start + ring.nbytes, "not a view of the ring"
            del got, ring

            assert client.statistics().send_queue_messages == 2
            second.release()  # out of order: the first still holds the ring
            assert client.statistics().send_queue_messages == 2
            with lease as frames:
                assert bytes(frames[0]) == b"first"
            assert client.statistics().send_queue_messages == 0
            lease.release()  # idempotent
            with pytest.raises(ValueError):
                bytes(lease.frames[0])  # released views cannot be used by mistake

            await client.send([b"third"])  # recv (copy) and leases mix
            assert bytes((await server.recv())[0]) == b"third"

    run_async(main())


def test_a_held_lease_is_backpressure() -> None:
    limits = Limits(queue_messages=2)

    async def main() -> None:
        async with shm_link(limits) as (client, server):
            client.send_nowait([b"a"])
            client.send_nowait([b"b"])
            with pytest.raises(WouldBlock):
                client.send_nowait([b"c"])
            lease = await server.recv_lease()
            blocked = asyncio.create_task(client.send([b"c"]))
            await asyncio.sleep(0.05)
            assert not blocked.done(), "the leased message still counts"
            lease.release()
            await asyncio.wait_for(blocked, 5)
            assert [bytes((await server.recv())[0]) for _ in range(2)] == [b"b", b"c"]

    run_async(main())


# --------------------------------------------------------------------------- processes


def test_64_kib_messages_cross_processes() -> None:
    count, size = 3000, 64 << 10

    async def main() -> None:
        transport = transports.get("shm")
        async with await transport.listen("shm://", limits=Limits()) as listener:
            child = await spawn(COUNTING_CHILD, listener.address, str(count))
            try:
                conn = await listener.accept()
                payload = bytearray(size)
                for seq in range(count):
                    payload[-1] = seq % 251
                    await conn.send([seq.to_bytes(8, "little"), payload])
                reply = await conn.recv()
                assert int.from_bytes(reply[0], "little") == count
                assert int.from_bytes(reply[1], "little") == count * (size + 8)
                with pytest.raises(EndOfStream):
                    await conn.recv()
                await conn.aclose()
                assert await child.wait() == 0
            finally:
                await reap(child)

    run_async(main(), timeout=120)


def test_an_idle_link_costs_no_cpu() -> None:
    async def main() -> float:
        transport = transports.get("shm")
        async with await transport.listen("shm://", limits=Limits()) as listener:
            child = await spawn(IDLE_CHILD, listener.address)
            try:
                conn = await listener.accept()
                assert bytes((await conn.recv())[0]) == b"connected"
                before, started = cpu_seconds(child.pid), time.monotonic()
                own_before = time.process_time()
                await asyncio.sleep(3.0)  # the measurement window itself
                used = cpu_seconds(child.pid) - before
                own = time.process_time() - own_before
                elapsed = time.monotonic() - started
                await conn.aclose()
                assert await child.wait() == 0
            finally:
                await reap(child)
            assert own / elapsed < 0.02, f"this side of the idle link used {own:.3f}s of CPU"
            return used / elapsed

    share = run_async(main())
    assert share < 0.02, f"the idle child used {share:.1%} of a CPU"


# --------------------------------------------------------------------------- malformed input


def test_a_forged_hello_is_bad_frame_and_the_listener_survives(tmp_path: Path) -> None:
    not_a_ring = tmp_path / "not-a-ring"
    not_a_ring.write_bytes(b"\0" * 4096)

    async def main() -> None:
        transport = transports.get("shm")
        async with await transport.listen("shm://", limits=Limits()) as listener:
            client = await transport.connect(listener.address, limits=Limits())
            server = await listener.accept()
            # a hello without a descriptor, and one with a descriptor that is no ring
            for fds in ([], [os.open(not_a_ring, os.O_RDONLY)]):
                raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    raw.connect(socket_address(listener.address))
                    hello = HELLO.pack(HELLO_MAGIC, 1, os.getpid(), 1 * MiB, 0)
                    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    raw.sendmsg([hello], rights if fds else [])
                    victim = await listener.accept()
                    with pytest.raises(BadFrame) as info:
                        await victim.recv()
                    assert info.value.reason == "bad_handshake"
                    victim.abort()
                finally:
                    raw.close()
                    for fd in fds:
                        os.close(fd)
            await client.send([b"still fine"])
            assert bytes((await server.recv())[0]) == b"still fine"
            client.abort()
            server.abort()

    run_async(main())


REASONS = {
    "control_byte": "bad_control",
    "record_header": "bad_record",
    "frame_count": "bad_frame_count",
    "frame_size": "frame_too_large",
}


@pytest.mark.parametrize("how", sorted(REASONS))
def test_a_peer_corrupting_the_link_is_bad_frame_for_that_link_only(how: str) -> None:
    limits = Limits(max_frames=8, max_frame_bytes=1024)

    async def main() -> None:
        async with shm_link(limits) as (good_client, good_server):
            async with shm_link(limits) as (client, server):
                await client.send([b"before"])
                _corrupt(client, how)
                assert bytes((await server.recv())[0]) == b"before"
                with pytest.raises(BadFrame) as info:
                    await server.recv()
                assert info.value.reason == REASONS[how]
                assert info.value.peer == server.peer
                with pytest.raises(BadFrame):  # it stays broken
                    await server.recv()
                with pytest.raises((BrokenByPeer, EndOfStream)):
                    for _ in range(100):
                        await client.send([b"x"])
                        await asyncio.sleep(0.01)
            await good_client.send([b"unaffected"])
            assert bytes((await good_server.recv())[0]) == b"unaffected"

    run_async(main())


def _corrupt(conn: ShmConnection, how: str) -> None:
    """Play a misbehaving peer: bad bytes on the socket, or a bad record in the ring."""
    if how == "control_byte":
        assert conn._sock is not None
        conn._sock.send(b"garbage")
        return
    assert conn._w is not None
    w = conn._w
    nframes, size, lengths = {
        "record_header": (1, 1 << 40, [0]),
        "frame_count": (9, 128, [0] * 9),
        "frame_size": (1, 2048 + 64, [2048]),
    }[how]
    pos = w.tail % w.size
    _shmring.RECORD.pack_into(w.ring.data, pos, _shmring.KIND_MSG, nframes, size, sum(lengths))
    struct.pack_into(f"<{len(lengths)}Q", w.ring.data, pos + _shmring.RECORD_BYTES, *lengths)
    w._publish(min(size, 4096), 1, 0)


# --------------------------------------------------------------------------- addresses


def test_named_addresses_are_exclusive_and_free_again_once_closed() -> None:
    name = f"shm://tianji-test-{os.getpid()}"

    async def main() -> None:
        transport = transports.get("shm")
        listener = await transport.listen(name, limits=Limits())
        assert listener.address == name
        with pytest.raises(OSError, match="already in use"):
            await transport.listen(name, limits=Limits())
        await listener.aclose()
        with pytest.raises(BrokenByPeer):  # no socket file lingers, nothing answers
            await transport.connect(name, limits=Limits())
        again = await transport.listen(name, limits=Limits())
        conn = await transport.connect(name, limits=Limits())
        conn.abort()
        await again.aclose()
        for bad in ("shm://has space", "shm://a/b", "tcp://x:1"):
            with pytest.raises(ValueError):
                await transport.listen(bad, limits=Limits())
        with pytest.raises(ValueError):
            await transport.connect("shm://", limits=Limits())

    run_async(main())
