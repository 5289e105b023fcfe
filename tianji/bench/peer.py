"""Receiving process of ``tianji bench transport``: ``python -m tianji.bench.peer --parent PID``.

The job arrives as one JSON object on stdin (never pickle)::

    {"kind": "tianji", "address": "tcp://127.0.0.1:41234", "payload_bytes": 65536,
     "warmup_s": 0.25, "latency": false}
    {"kind": "raw-socket", "address": "127.0.0.1:41235", "payload_bytes": 100, "warmup_s": 0.25}
    {"kind": "pyzmq", "address": "tcp://127.0.0.1:41236", "payload_bytes": 100, "warmup_s": 0.25}

The peer connects, receives until the sender ends the stream and prints one JSON line on
stdout: a :class:`~tianji.bench.measure.Throughput` (``messages``, ``nbytes``, ``seconds``
of the receiver's window) or, for a latency job, ``{"samples", "p50_us", "p99_us"}`` (from
just before the sender's ``send`` to ``recv`` returning here).

* ``tianji``: a tianji connection; every message is decoded with :mod:`tianji.runtime.codec` into
  an :class:`~tianji.runtime.events.ArraysPublished` and checked (sequence number, payload size).
* ``raw-socket``: blocking ``recv_into`` (``MSG_WAITALL``) of an 8-byte length prefix and
  the payload into one reused buffer; the sender ends with EOF.
* ``pyzmq``: a PULL socket receiving ``[8-byte seq, payload]``; a negative seq ends.

The ceilings move the payload bytes with this tiny header only: no tianji codec.
Like the launcher's workers, the peer dies with its parent (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import logging
import os
import signal
import socket
import struct
import sys
import time
import traceback
from typing import Any

import numpy as np

import tianji.transports
from tianji.bench.measure import BenchError, RateWindow, Throughput, aligned_empty, percentile
from tianji.runtime.codec import Codec
from tianji.runtime.core import Connection, Limits, recv_batch
from tianji.runtime.errors import EndOfStream
from tianji.runtime.events import ArraysPublished, Event
from tianji.runtime.leases import Handoff
from tianji.runtime.links import RECV_BATCH, ZERO_COPY_MIN_BYTES
from tianji.runtime.loop import run

__all__ = ["HEADER", "STAMP", "Job", "main", "receive_events", "receive_latency", "zmq_hwm"]

log = logging.getLogger(__name__)

HEADER = struct.Struct("<q")
"""The ceilings' tiny header: the payload length (raw-socket) or sequence number (pyzmq)."""
STAMP = np.dtype("<i8")
"""Latency probes carry their send time (``perf_counter_ns``) in their payload's first bytes."""
LIMITS = Limits()
ZMQ_RECV_TIMEOUT_MS = 30_000


def zmq_hwm(payload_bytes: int) -> int:
    """pyzmq's queue bound in messages, per side: about the bytes tianji's queues hold.

    zmq bounds queues by message count (default 1000): 1000 queued 16 MiB messages would
    be 16 GiB on the receiving side, and a sender that finishes minutes before its peer.
    """
    return max(2, min(1000, LIMITS.queue_bytes // payload_bytes))


_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """What the peer is asked to do (see the module docstring for the JSON form)."""

    kind: str
    address: str
    payload_bytes: int
    warmup_s: float
    latency: bool = False

    @classmethod
    def from_json(cls, doc: object) -> Job:
        """Validate a job document.

        Raises:
            BenchError: naming the bad field and value.
        """
        if not isinstance(doc, dict):
            raise BenchError(f"job must be a JSON object, got {doc!r:.200}")
        job = cls(**{f.name: doc[f.name] for f in dataclasses.fields(cls) if f.name in doc})
        if job.kind not in ("tianji", "raw-socket", "pyzmq"):
            raise BenchError(f"job.kind={job.kind!r}: expected tianji, raw-socket or pyzmq")
        if type(job.payload_bytes) is not int or job.payload_bytes <= 0:
            raise BenchError(f"job.payload_bytes={job.payload_bytes!r}: expected a positive int")
        return job

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------------------- tianji
async def receive_events(conn: Connection, payload_bytes: int, warmup_s: float) -> Throughput:
    """Receive and decode ``ArraysPublished`` events until the peer ends the stream.

    A message counts once it is decoded; the payload bytes are what is counted.

    Raises:
        BenchError: if an event is missing, out of order or of the wrong size.
    """
    window = RateWindow(warmup_s)
    decode = Codec().decode
    clock = time.perf_counter
    expected = 0
    leased = hasattr(conn, "recv_lease_batch") and payload_bytes >= ZERO_COPY_MIN_BYTES
    handoff = Handoff()

    def check(ev: Event) -> None:
        nonlocal expected
        if not isinstance(ev, ArraysPublished) or ev.seq != expected:
            raise BenchError(f"expected ArraysPublished seq={expected}, got {ev!r:.200}")
        if ev.arrays["x"].nbytes != payload_bytes:
            raise BenchError(f"event {expected}: {ev.arrays['x'].nbytes} bytes != {payload_bytes}")
        expected += 1
        window.add(clock(), payload_bytes)

    while True:  # as a service's link loop receives (tianji/runtime/links.py)
        try:
            if leased:  # shm, large: the event's arrays view the ring while checked
                for lease in await conn.recv_lease_batch(RECV_BATCH):  # type: ignore[attr-defined]
                    ev = decode(lease.frames)
                    with handoff.settled(lease, ev):
                        check(ev)
                    del ev
            else:
                for frames in await recv_batch(conn, RECV_BATCH):
                    check(decode(frames))
        except EndOfStream:
            return window.result()


async def receive_latency(conn: Connection, warmup_s: float) -> list[int]:
    """One-way delays (ns) of events whose payload starts with the send time (:data:`STAMP`).

    The receive time is taken as soon as ``recv`` returns, before decoding; events of the
    first ``warmup_s`` seconds are not sampled. ``time.perf_counter_ns`` is CLOCK_MONOTONIC,
    which is system-wide on Linux, so both processes read the same clock.
    """
    decode = Codec().decode
    clock = time.perf_counter_ns
    samples: list[int] = []
    first: int | None = None
    warmup_ns = int(warmup_s * 1e9)
    while True:
        try:
            frames = await conn.recv()
        except EndOfStream:
            return samples
        now = clock()
        ev = decode(frames)
        if not isinstance(ev, ArraysPublished) or ev.arrays["x"].nbytes < STAMP.itemsize:
            raise BenchError(f"expected ArraysPublished with a stamped payload, got {ev!r:.200}")
        if first is None:
            first = now
        if now - first >= warmup_ns:
            samples.append(now - int(ev.arrays["x"][: STAMP.itemsize].view(STAMP)[0]))


async def _tianji(job: Job) -> dict[str, Any]:
    transport = tianji.transports.for_address(job.address)
    async with await transport.connect(job.address, limits=LIMITS) as conn:
        if job.latency:
            samples = await receive_latency(conn, job.warmup_s)
            if not samples:
                raise BenchError("no latency samples after the warm-up")
            return {
                "samples": len(samples),
                "p50_us": percentile(samples, 50) / 1e3,
                "p99_us": percentile(samples, 99) / 1e3,
            }
        return (await receive_events(conn, job.payload_bytes, job.warmup_s)).to_json()


# ------------------------------------------------------------------------------- ceilings
def _recv_exact(sock: socket.socket, view: memoryview) -> int:
    got = 0
    while got < view.nbytes:
        n = sock.recv_into(view[got:], view.nbytes - got, socket.MSG_WAITALL)
        if n == 0:
            break
        got += n
    return got


def _raw_socket(job: Job) -> dict[str, Any]:
    host, _, port = job.address.rpartition(":")
    window = RateWindow(job.warmup_s)
    header = memoryview(bytearray(HEADER.size))
    payload = aligned_empty(job.payload_bytes).data
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            got = _recv_exact(sock, header)
            if got == 0:
                return window.result().to_json()
            (length,) = HEADER.unpack(header)
            if got != HEADER.size or length != job.payload_bytes:
                raise BenchError(f"bad raw frame header {bytes(header[:got])!r}")
            if _recv_exact(sock, payload) != length:
                raise BenchError("stream ended inside a frame")
            window.add(time.perf_counter(), length)


def _pyzmq(job: Job) -> dict[str, Any]:
    import zmq

    window = RateWindow(job.warmup_s)
    # pyzmq copies frames below COPY_THRESHOLD even when asked not to; on receive,
    # copying small frames is also what is fastest.
    copy = job.payload_bytes < zmq.COPY_THRESHOLD
    ctx = zmq.Context()
    try:
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.RCVTIMEO, ZMQ_RECV_TIMEOUT_MS)
        pull.setsockopt(zmq.LINGER, 0)
        pull.setsockopt(zmq.RCVHWM, zmq_hwm(job.payload_bytes))
        pull.connect(job.address)
        while True:
            header, payload = (
                p.buffer if isinstance(p, zmq.Frame) else memoryview(p)
                for p in pull.recv_multipart(0, copy)
            )
            (seq,) = HEADER.unpack(header)
            if seq < 0:
                return window.result().to_json()
            n = payload.nbytes
            if n != job.payload_bytes:
                raise BenchError(f"pyzmq message {seq}: {n} bytes != {job.payload_bytes}")
            window.add(time.perf_counter(), n)
    finally:
        ctx.destroy(linger=0)


# ------------------------------------------------------------------------------- main
def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError) as exc:  # EOF or a timeout still ends us
            log.debug("prctl: %r", exc)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    """Run the job read from stdin; print its result as one JSON line. Exit 0 or 1."""
    parser = argparse.ArgumentParser(prog="python -m tianji.bench.peer")
    parser.add_argument("--parent", type=int, required=True, help="pid of the benchmark")
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    try:
        job = Job.from_json(json.loads(sys.stdin.read()))
        if job.kind == "tianji":
            result = run(_tianji(job))
        elif job.kind == "raw-socket":
            result = _raw_socket(job)
        else:
            result = _pyzmq(job)
    except Exception as exc:
        traceback.print_exc()
        # the last line is what the benchmark shows as the reason
        print(f"tianji.bench.peer: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
