"""``tianji bench transport``: transport throughput against the machine's ceilings.

For payloads of 100 B, 64 KiB, 1 MiB and 16 MiB this measures, in one run and with one
method, messages/s and bytes/s of:

* ``inproc``, ``tcp``, ``shm`` - real events: ``ArraysPublished(seq, policy_version=0,
  arrays={"x": payload}, meta={})`` with a ``uint8`` payload, encoded with
  :mod:`tianji.runtime.codec` and sent with ``await conn.send(frames)`` in a loop; the receiver
  decodes every event (decoding is part of the cost). ``inproc`` runs both ends on one
  event loop; for ``tcp`` and ``shm`` this process sends and a child process
  (``python -m tianji.bench.peer``) receives.
* ``raw-socket`` - the loopback TCP ceiling: blocking ``sendmsg`` / ``recv_into`` of
  length-prefixed payloads between this process and a child.
* ``memcpy`` - the memory ceiling: ``np.copyto`` between two preallocated arrays.
* ``pyzmq`` (when installed, the ``bench`` extra) - PUSH/PULL over loopback TCP with
  ``copy=False``, to a child.

The ceilings and pyzmq move the payload bytes with an 8-byte header: no tianji codec.
Throughput is what the *receiver* fully received (and decoded) within its own window (see
:class:`~tianji.bench.measure.RateWindow`), so buffering on the sending side cannot
inflate it. It also measures the one-way wake-up latency of 100 B events on ``tcp`` and
``shm``: one event every ~1 ms carrying ``time.perf_counter_ns()`` (CLOCK_MONOTONIC,
system-wide on Linux), received in the child; and, first, what the codec costs per event
(:mod:`tianji.bench.codec_cost`).

Each cell runs ``seconds`` (16 MiB cells at most
:data:`~tianji.bench.measure.LARGE_MAX_S`) after a short
warm-up. A transport that is unavailable or fails is reported under ``skipped`` with the
reason instead of ending the run. Every child process is stopped on every exit path.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO, TypeVar

import numpy as np

import tianji.transports
from tianji.bench.ceilings import measure_memcpy, measure_pyzmq, measure_raw_socket
from tianji.bench.codec_cost import measure_codec
from tianji.bench.measure import (
    LARGE_MAX_S,
    RESULT_TIMEOUT,
    STARTUP_TIMEOUT,
    BenchError,
    BenchTimeout,
    Settings,
    Throughput,
    make_payload,
)
from tianji.bench.peer import STAMP, Job, receive_events
from tianji.bench.report import PAYLOADS, LatencyRow, Report, Row, Skip, format_rate, format_size
from tianji.bench.spawn import spawn_peer
from tianji.runtime.codec import Codec
from tianji.runtime.core import Connection, Limits
from tianji.runtime.events import ArraysPublished
from tianji.runtime.loop import run

__all__ = ["MEASURES", "run_transport_bench", "send_events"]

LATENCY_PAYLOAD = 100
LATENCY_INTERVAL_S = 0.001
LISTEN = {"inproc": "inproc://", "tcp": "tcp://127.0.0.1:0", "shm": "shm://"}
LIMITS = Limits()
T = TypeVar("T")
ORDER = ("memcpy", "raw-socket", "pyzmq", "inproc", "tcp", "shm")
"""Cells run payload by payload, all transports of one payload in a row (close in time)."""


# ------------------------------------------------------------------------------- tianji
async def send_events(conn: Connection, payload: np.ndarray, seconds: float) -> int:
    """Send ``ArraysPublished`` events carrying ``payload`` for ``seconds``; return the count."""
    encode = Codec().encode
    clock = time.perf_counter
    deadline = clock() + seconds
    seq = 0
    while clock() < deadline:
        ev = ArraysPublished(seq=seq, policy_version=0, arrays={"x": payload}, meta={})
        await conn.send(encode(ev))
        seq += 1
    return seq


async def _send_probes(conn: Connection, seconds: float) -> int:
    """One 100 B event every ~1 ms for ``seconds``, stamped just before ``send``.

    The stamp (``perf_counter_ns``) goes into the first 8 bytes of the payload after
    encoding (the frame is a view of the array), so the codec's cost, which a process
    waking from a 1 ms sleep pays cold, is not counted as transport latency.
    """
    encode = Codec().encode
    deadline = time.perf_counter() + seconds
    seq = 0
    while time.perf_counter() < deadline:
        payload = np.zeros(LATENCY_PAYLOAD, dtype=np.uint8)  # fresh: in flight untouched
        frames = encode(ArraysPublished(seq=seq, policy_version=0, arrays={"x": payload}, meta={}))
        payload[:8].view(STAMP)[0] = time.perf_counter_ns()
        await conn.send(frames)
        seq += 1
        await asyncio.sleep(LATENCY_INTERVAL_S)
    return seq


async def _inproc(payload_bytes: int, settings: Settings) -> Throughput:
    payload = make_payload(payload_bytes)
    transport = tianji.transports.get("inproc")
    listener = await transport.listen(LISTEN["inproc"], limits=LIMITS)
    try:
        async with (
            await transport.connect(listener.address, limits=LIMITS) as tx,
            await listener.accept() as rx,
        ):

            async def send() -> None:
                await send_events(tx, payload, settings.duration(payload_bytes))
                await tx.aclose()

            async with asyncio.TaskGroup() as tg:
                received = tg.create_task(receive_events(rx, payload_bytes, settings.warmup_s))
                tg.create_task(send())
            return received.result()
    finally:
        await listener.aclose()


async def _remote(scheme: str, payload_bytes: int, settings: Settings, latency: bool) -> Any:
    """Send to a peer process over ``scheme``; return the peer's JSON result."""
    transport = tianji.transports.get(scheme)
    listener = await transport.listen(LISTEN[scheme], limits=LIMITS)
    try:
        job = Job(
            kind="tianji",
            address=listener.address,
            payload_bytes=payload_bytes,
            warmup_s=settings.warmup_s,
            latency=latency,
        )
        async with spawn_peer(job) as peer:
            conn = await peer.guard(listener.accept(), STARTUP_TIMEOUT, "connecting")
            seconds = settings.duration(payload_bytes)
            try:
                if latency:
                    sending = _send_probes(conn, seconds)
                else:
                    sending = send_events(conn, make_payload(payload_bytes), seconds)
                await peer.guard(sending, seconds + RESULT_TIMEOUT, "sending")
                await peer.guard(conn.aclose(), RESULT_TIMEOUT, "closing")
            except BaseException:
                conn.abort()
                raise
            return await peer.result(RESULT_TIMEOUT)
    finally:
        await listener.aclose()


async def _throughput(scheme: str, payload_bytes: int, settings: Settings) -> Throughput:
    return Throughput.from_json(await _remote(scheme, payload_bytes, settings, latency=False))


async def _latency(scheme: str, settings: Settings) -> LatencyRow:
    doc = await _remote(scheme, LATENCY_PAYLOAD, settings, latency=True)
    try:
        return LatencyRow(scheme, float(doc["p50_us"]), float(doc["p99_us"]))
    except (TypeError, KeyError, ValueError):
        raise BenchError(f"the peer reported {doc!r:.200}, not a latency") from None


# ------------------------------------------------------------------------------- the run
Measure = Callable[[int, Settings], Awaitable[Throughput]]
MEASURES: dict[str, Measure] = {
    "memcpy": measure_memcpy,
    "raw-socket": measure_raw_socket,
    "pyzmq": measure_pyzmq,
    "inproc": _inproc,
    "tcp": functools.partial(_throughput, "tcp"),
    "shm": functools.partial(_throughput, "shm"),
}


def _unavailable() -> list[Skip]:
    skipped = []
    try:
        tianji.transports.get("shm")
    except Exception as exc:  # missing, half-written or broken: say which
        skipped.append(Skip("shm", f"unavailable: {type(exc).__name__}: {exc}"))
    try:
        import zmq  # noqa: F401
    except ImportError as exc:
        reason = f"pyzmq is not installed ({exc}); pip install 'tianji[bench]' to compare"
        skipped.append(Skip("pyzmq", reason))
    return skipped


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # from a TaskGroup
        return _describe(exc.exceptions[0])
    if isinstance(exc, BenchError):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"


def _heading(settings: Settings) -> str:
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    large = min(settings.seconds, LARGE_MAX_S)
    return (
        f"tianji bench transport: {settings.seconds:g} s per cell (16 MiB: {large:g} s) after "
        f"{settings.warmup_s:g} s warm-up; {loop} loop; {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )


class _Run:
    """Runs cells one by one: progress on ``progress``, failures into ``report.skipped``."""

    def __init__(self, report: Report, total: int, progress: TextIO) -> None:
        self.report = report
        self.total = total
        self.progress = progress
        self.step = 0
        self.timed_out: set[str] = set()  # a transport that hung once is not retried

    def say(self, text: str, end: str = "\n") -> None:
        print(text, end=end, file=self.progress, flush=True)

    async def attempt(
        self, name: str, what: str, make: Callable[[], Awaitable[T]], timeout: float
    ) -> T | None:
        """Run ``make()`` within ``timeout``; ``None`` (and a skip entry) if it fails."""
        self.step += 1
        self.say(f"[{self.step:>2}/{self.total}] {name:<10} {what:<8} ... ", end="")
        if name in self.timed_out:
            why = f"not run, an earlier {name} cell timed out"
        else:
            try:
                got = await asyncio.wait_for(make(), timeout)
            except Exception as exc:
                if isinstance(exc, (TimeoutError, BenchTimeout)):
                    self.timed_out.add(name)
                why = _describe(exc)
            else:
                _raise_if_cancelled()
                return got
        _raise_if_cancelled()
        self.report.skipped.append(Skip(name, f"{what}: {why}"))
        self.say(f"failed: {why}")
        return None


def _raise_if_cancelled() -> None:
    """Ctrl-C during a cell that runs in a thread (memcpy): ``wait_for`` can return the
    thread's result and drop the cancellation (Python 3.11); the task still counts it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _bench(settings: Settings, progress: TextIO) -> Report:
    report = Report(heading=_heading(settings))
    report.skipped += _unavailable()
    gone = {s.transport for s in report.skipped}
    cells = [(t, p) for p in PAYLOADS for t in ORDER if t not in gone]
    probes = [t for t in ("tcp", "shm") if t not in gone]
    cells_run = _Run(report, len(cells) + len(probes), progress)
    # 20,000 events a round in a 2-s run; fewer in short runs (the tests' 0.3 s)
    report.codec = measure_codec(count=max(2_000, int(10_000 * min(settings.seconds, 2.0))))
    for c in report.codec:
        cells_run.say(f"codec {c.event}: encode {c.encode_us:.2f} us, decode {c.decode_us:.2f} us")
    for name, size in cells:
        make = functools.partial(MEASURES[name], size, settings)
        tp = await cells_run.attempt(name, format_size(size), make, settings.timeout(size))
        if tp is not None:
            report.rows.append(Row(name, size, tp.msgs_per_s, tp.bytes_per_s))
            cells_run.say(f"{tp.msgs_per_s:>12,.0f} msg/s {format_rate(tp.bytes_per_s):>11}")
    for name in probes:
        make_lat = functools.partial(_latency, name, settings)
        lat = await cells_run.attempt(name, "latency", make_lat, settings.timeout(LATENCY_PAYLOAD))
        if lat is not None:
            report.latency.append(lat)
            cells_run.say(f"p50 {lat.p50_us:.1f} us, p99 {lat.p99_us:.1f} us")
    report.heading += f", {os.getloadavg()[0]:.2f} at the end"  # was the box busy meanwhile?
    return report


def run_transport_bench(seconds: float, *, progress: TextIO | None = None) -> Report:
    """Measure every cell for about ``seconds`` each; progress lines go to ``progress``.

    Runs on tianji's event loop (uvloop unless ``TIANJI_LOOP=asyncio``).

    Raises:
        ValueError: if ``seconds`` is not positive.
    """
    if not seconds > 0:
        raise ValueError(f"seconds={seconds!r}: expected a positive number")
    return run(_bench(Settings(seconds), progress if progress is not None else sys.stderr))
