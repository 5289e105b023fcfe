"""A bounded (count and bytes) asyncio queue with backpressure and explicit close.

Used by the in-process transport and by services; every queue in tianji is bounded.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Generic, TypeVar

from tianji.runtime.errors import ClosedByUs, TianjiError, WouldBlock

__all__ = ["BoundedQueue", "QueueStatistics"]

T = TypeVar("T")


class QueueStatistics:
    """Snapshot of a queue: depth in items and bytes, and the bounds."""

    __slots__ = ("items", "max_bytes", "max_items", "nbytes", "waiting_putters")

    def __init__(self, items: int, nbytes: int, max_items: int, max_bytes: int, putters: int):
        self.items = items
        self.nbytes = nbytes
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.waiting_putters = putters

    def __repr__(self) -> str:
        return (
            f"QueueStatistics(items={self.items}/{self.max_items}, "
            f"bytes={self.nbytes}/{self.max_bytes}, waiting_putters={self.waiting_putters})"
        )


class BoundedQueue(Generic[T]):
    """FIFO bounded by item count and by bytes; ``put`` waits while it is full.

    An item larger than ``max_bytes`` is admitted only into an empty queue, so one huge item
    never deadlocks. After :meth:`close`, queued items can still be taken; then ``get``
    raises the close error. ``put`` on a closed queue raises it at once.

    Args:
        name: used in errors.
        max_items: bound on queued items.
        max_bytes: bound on the sum of the sizes given to ``put``.
    """

    def __init__(self, name: str, *, max_items: int, max_bytes: int) -> None:
        if max_items <= 0 or max_bytes <= 0:
            raise ValueError(f"queue {name}: bounds must be positive ({max_items}, {max_bytes})")
        self.name = name
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._items: collections.deque[tuple[T, int]] = collections.deque()
        self._nbytes = 0
        self._closed: TianjiError | None = None
        self._not_empty = asyncio.Event()
        self._not_full = asyncio.Event()
        self._not_full.set()
        self._putters = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def _admits(self, size: int) -> bool:
        if not self._items:
            return True
        return len(self._items) < self.max_items and self._nbytes + size <= self.max_bytes

    def put_nowait(self, item: T, size: int = 0) -> None:
        """Queue ``item`` now or raise :class:`WouldBlock` (or the close error)."""
        if self._closed is not None:
            raise self._closed
        if not self._admits(size):
            raise WouldBlock(self.name, len(self._items), self._nbytes)
        self._append(item, size)

    def put_force(self, item: T, size: int = 0) -> None:
        """Queue ``item`` even over the bounds; the caller must then stop its producer.

        For producers that cannot wait (protocol callbacks): they push, then pause reading
        while :meth:`full` is true, so the overshoot is bounded by one read.
        """
        if self._closed is not None:
            raise self._closed
        self._append(item, size)

    def full(self) -> bool:
        """True when the queue holds as much as its bounds allow."""
        return len(self._items) >= self.max_items or self._nbytes >= self.max_bytes

    async def put(self, item: T, size: int = 0) -> None:
        """Queue ``item``, waiting while the queue is full (backpressure)."""
        while True:
            if self._closed is not None:
                raise self._closed
            if self._admits(size):
                self._append(item, size)
                return
            self._not_full.clear()
            self._putters += 1
            try:
                await self._not_full.wait()
            finally:
                self._putters -= 1

    def _append(self, item: T, size: int) -> None:
        self._items.append((item, size))
        self._nbytes += size
        self._not_empty.set()

    def get_nowait(self) -> T:
        """Take the oldest item; raise :class:`WouldBlock` if empty (or the close error)."""
        if self._items:
            item, size = self._items.popleft()
            self._nbytes -= size
            if not self._items:
                self._not_empty.clear()
            self._not_full.set()
            return item
        if self._closed is not None:
            raise self._closed
        raise WouldBlock(self.name, 0, 0)

    async def get(self) -> T:
        """Take the oldest item, waiting while the queue is empty."""
        while not self._items:
            if self._closed is not None:
                raise self._closed
            await self._not_empty.wait()
        return self.get_nowait()

    def close(self, error: TianjiError | None = None, *, discard: bool = False) -> None:
        """Close the queue; waiters wake up. Idempotent: the first error wins.

        Args:
            error: what ``get`` raises once the queue is empty (default: ClosedByUs).
            discard: drop queued items now (a local close), instead of letting them drain.
        """
        if self._closed is None:
            self._closed = error if error is not None else ClosedByUs(self.name)
        if discard:
            self._items.clear()
            self._nbytes = 0
        self._not_empty.set()
        self._not_full.set()

    def statistics(self) -> QueueStatistics:
        return QueueStatistics(
            len(self._items), self._nbytes, self.max_items, self.max_bytes, self._putters
        )
