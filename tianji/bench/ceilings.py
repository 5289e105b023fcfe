"""The machine's ceilings, measured like the transports: ``memcpy``, ``raw-socket``, ``pyzmq``.

* ``memcpy``: ``np.copyto`` between two preallocated page-aligned arrays, in this process
  (in a worker thread, so Ctrl-C is not held up).
* ``raw-socket``: blocking ``sendmsg`` of an 8-byte length prefix and the payload over
  loopback TCP to a peer process doing blocking ``recv_into`` into one reused buffer.
* ``pyzmq``: PUSH (here) / PULL (peer) over loopback TCP, ``copy=False``, messages
  ``[8-byte seq, payload]``, queues bounded to about the bytes tianji's queues hold.

They move the payload bytes with that tiny header only: no tianji codec, no events.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import threading
import time
from typing import Any

import numpy as np

from tianji.bench.measure import RESULT_TIMEOUT, STARTUP_TIMEOUT, Settings, Throughput, make_payload
from tianji.bench.peer import HEADER, Job, zmq_hwm
from tianji.bench.spawn import spawn_peer

__all__ = ["measure_memcpy", "measure_pyzmq", "measure_raw_socket"]

log = logging.getLogger(__name__)

ZMQ_STALL_TIMEOUT_MS = 5_000  # a peer that takes no message for this long has gone
ZMQ_LINGER_MS = 10_000


def _copy_loop(payload_bytes: int, settings: Settings) -> Throughput:
    src, dst = make_payload(payload_bytes), make_payload(payload_bytes)
    copyto, clock = np.copyto, time.perf_counter
    warm_until = clock() + settings.warmup_s
    while clock() < warm_until:
        copyto(dst, src)
    count = 0
    start = clock()
    deadline = start + settings.duration(payload_bytes) - settings.warmup_s
    while True:
        copyto(dst, src)
        count += 1
        now = clock()
        if now >= deadline:
            return Throughput(count, count * payload_bytes, now - start)


async def measure_memcpy(payload_bytes: int, settings: Settings) -> Throughput:
    return await asyncio.to_thread(_copy_loop, payload_bytes, settings)


def _send_raw(sock: socket.socket, payload: np.ndarray, seconds: float) -> int:
    header = HEADER.pack(payload.nbytes)
    body = payload.data
    total = len(header) + body.nbytes
    clock = time.perf_counter
    deadline = clock() + seconds
    count = 0
    while clock() < deadline:
        sent = sock.sendmsg([header, body])  # one syscall, no concatenation
        if sent < len(header):
            sock.sendall(header[sent:])
            sock.sendall(body)
        elif sent < total:
            sock.sendall(body[sent - len(header) :])
        count += 1
    sock.shutdown(socket.SHUT_WR)  # the peer reads to EOF
    return count


async def measure_raw_socket(payload_bytes: int, settings: Settings) -> Throughput:
    loop = asyncio.get_running_loop()
    payload = make_payload(payload_bytes)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.setblocking(False)
        host, port = server.getsockname()
        job = Job(
            kind="raw-socket",
            address=f"{host}:{port}",
            payload_bytes=payload_bytes,
            warmup_s=settings.warmup_s,
        )
        async with spawn_peer(job) as peer:
            sock, _ = await peer.guard(loop.sock_accept(server), STARTUP_TIMEOUT, "connecting")
            with sock:
                sock.setblocking(True)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                seconds = settings.duration(payload_bytes)
                try:
                    sending = asyncio.to_thread(_send_raw, sock, payload, seconds)
                    await peer.guard(sending, seconds + RESULT_TIMEOUT, "sending")
                except BaseException:
                    try:  # wakes the sending thread
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError as exc:  # not connected any more: it is awake
                        log.debug("shutdown: %r", exc)
                    raise
            return Throughput.from_json(await peer.result(RESULT_TIMEOUT))


def _send_zmq(
    ctx: Any, push: Any, payload: np.ndarray, seconds: float, stop: threading.Event
) -> int:
    """Runs in a worker thread that owns ``push`` and ``ctx`` from here on."""
    import zmq

    ok = False
    try:
        push.send_multipart([HEADER.pack(0), payload], copy=False)  # waits for the peer
        push.setsockopt(zmq.SNDTIMEO, ZMQ_STALL_TIMEOUT_MS)
        clock = time.perf_counter
        deadline = clock() + seconds
        seq = 1
        while clock() < deadline:
            if stop.is_set():  # error or Ctrl-C: no end marker, no linger
                return seq
            push.send_multipart([HEADER.pack(seq), payload], copy=False)
            seq += 1
        push.send_multipart([HEADER.pack(-1), b""])
        ok = True
        return seq
    finally:
        push.close(linger=ZMQ_LINGER_MS if ok else 0)
        ctx.term()  # waits until the end marker is delivered (bounded by the linger)


async def measure_pyzmq(payload_bytes: int, settings: Settings) -> Throughput:
    import zmq

    payload = make_payload(payload_bytes)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    try:
        push.setsockopt(zmq.SNDTIMEO, int(STARTUP_TIMEOUT * 1000))
        push.setsockopt(zmq.SNDHWM, zmq_hwm(payload_bytes))
        push.bind("tcp://127.0.0.1:*")
        endpoint = push.getsockopt_string(zmq.LAST_ENDPOINT)
    except BaseException:
        ctx.destroy(linger=0)
        raise
    seconds = settings.duration(payload_bytes)
    stop = threading.Event()
    # submitted at once, so the thread (which closes socket and context) always runs
    sending = asyncio.get_running_loop().run_in_executor(
        None, functools.partial(_send_zmq, ctx, push, payload, seconds, stop)
    )
    job = Job(
        kind="pyzmq", address=endpoint, payload_bytes=payload_bytes, warmup_s=settings.warmup_s
    )
    async with spawn_peer(job) as peer:
        try:
            await peer.guard(sending, seconds + STARTUP_TIMEOUT + RESULT_TIMEOUT, "sending")
            return Throughput.from_json(await peer.result(RESULT_TIMEOUT))
        finally:
            stop.set()  # before the peer is stopped: the thread ends now, not at its deadline
