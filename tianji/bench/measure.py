"""Pure measuring helpers shared by the benchmark and its peer process (no I/O).

A throughput is measured where messages arrive: :class:`RateWindow` counts messages the
receiver has fully received (and decoded) between the first message after a warm-up and
the last one, so buffering on the sending side cannot inflate it::

    >>> w = RateWindow(warmup_s=1.0)
    >>> for t in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0):
    ...     w.add(t, 100)
    >>> w.result()
    Throughput(messages=3, nbytes=300, seconds=2.0)
    >>> percentile([1, 2, 3, 4], 50)
    2.5
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "BenchError",
    "BenchTimeout",
    "RateWindow",
    "Settings",
    "Throughput",
    "aligned_empty",
    "make_payload",
    "percentile",
]

PAGE = 4096
WARMUP_MAX_S = 0.25
LARGE_PAYLOAD = 16 << 20
LARGE_MAX_S = 1.0  # a 16 MiB cell moves dozens of messages per second: 1 s is plenty
STARTUP_TIMEOUT = 30.0  # a child imports numpy and tianji, then connects (slow on a busy box)
RESULT_TIMEOUT = 60.0  # draining queued 16 MiB messages included


class BenchError(Exception):
    """A benchmark cell could not be measured; the message says why."""


class BenchTimeout(BenchError):
    """A step of a cell (a peer connecting, sending, reporting) took too long."""


@dataclasses.dataclass(frozen=True, slots=True)
class Throughput:
    """``messages`` of ``nbytes`` in total arrived within ``seconds`` (receiver's window)."""

    messages: int
    nbytes: int
    seconds: float

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def bytes_per_s(self) -> float:
        return self.nbytes / self.seconds

    def to_json(self) -> dict[str, Any]:
        return {"messages": self.messages, "nbytes": self.nbytes, "seconds": self.seconds}

    @classmethod
    def from_json(cls, doc: object) -> Throughput:
        """Parse what :meth:`to_json` produced (e.g. a peer's report).

        Raises:
            BenchError: if ``doc`` is not such a report or its window is empty.
        """
        if not isinstance(doc, dict):
            raise BenchError(f"expected a throughput report, got {doc!r:.200}")
        messages, nbytes, seconds = doc.get("messages"), doc.get("nbytes"), doc.get("seconds")
        if not (
            type(messages) is int
            and type(nbytes) is int
            and isinstance(seconds, (int, float))
            and messages > 0
            and seconds > 0
        ):
            raise BenchError(f"expected a non-empty throughput report, got {doc!r:.200}")
        return cls(messages, nbytes, float(seconds))


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """How long each cell runs.

    Attributes:
        seconds: measured seconds per (transport, payload) cell.
    """

    seconds: float

    @property
    def warmup_s(self) -> float:
        return min(WARMUP_MAX_S, self.seconds / 2)

    def duration(self, payload_bytes: int) -> float:
        """Seconds the sender sends in a cell, warm-up included."""
        seconds = self.seconds
        if payload_bytes >= LARGE_PAYLOAD:
            seconds = min(seconds, LARGE_MAX_S)
        return self.warmup_s + seconds

    def timeout(self, payload_bytes: int) -> float:
        return self.duration(payload_bytes) + STARTUP_TIMEOUT + RESULT_TIMEOUT


class RateWindow:
    """Receiver-side throughput window.

    The window opens at the first message arriving at least ``warmup_s`` after the very
    first one; that message marks the start and every later one counts (n messages over
    the n intervals they took). If the stream ended before the warm-up did, the window
    falls back to the whole stream (all messages but the first).

    Args:
        warmup_s: seconds after the first message during which nothing is counted.
    """

    def __init__(self, warmup_s: float) -> None:
        self.warmup_s = warmup_s
        self._first: float | None = None
        self._start: float | None = None
        self._last = 0.0
        self._messages = 0
        self._nbytes = 0
        self._all_messages = 0  # after the first message, for the fallback
        self._all_nbytes = 0

    def add(self, now: float, nbytes: int) -> None:
        """Record a message of ``nbytes`` that became available at time ``now`` (seconds)."""
        if self._first is None:
            self._first = now
            return
        self._last = now
        self._all_messages += 1
        self._all_nbytes += nbytes
        if self._start is not None:
            self._messages += 1
            self._nbytes += nbytes
        elif now - self._first >= self.warmup_s:
            self._start = now

    def result(self) -> Throughput:
        """The measured window.

        Raises:
            BenchError: if fewer than two messages arrived (no interval to measure).
        """
        if self._start is not None and self._messages > 0:
            return Throughput(self._messages, self._nbytes, self._last - self._start)
        if self._first is not None and self._all_messages > 0 and self._last > self._first:
            return Throughput(self._all_messages, self._all_nbytes, self._last - self._first)
        raise BenchError(
            f"only {self._all_messages + (self._first is not None)} message(s) arrived"
        )


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), interpolating linearly between ranks (numpy's default).

    Raises:
        ValueError: if ``values`` is empty or ``q`` is outside 0..100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def aligned_empty(nbytes: int, align: int = PAGE) -> np.ndarray:
    """An uninitialised ``uint8`` array whose data starts on an ``align``-byte boundary.

    A 64 KiB copy between buffers 8 or 16 bytes apart modulo 4 KiB was measured at about
    2 GB/s instead of 25-33, so every buffer the benchmark copies from or into is aligned.
    """
    raw = np.empty(nbytes + align, dtype=np.uint8)
    offset = -raw.ctypes.data % align
    out: np.ndarray = raw[offset : offset + nbytes]
    return out


def make_payload(nbytes: int) -> np.ndarray:
    """A page-aligned ``uint8`` payload with every page touched (no page faults when timed)."""
    out = aligned_empty(nbytes)
    out[:] = np.arange(nbytes, dtype=np.uint8)
    return out
