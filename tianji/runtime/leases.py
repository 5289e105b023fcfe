"""Zero-copy delivery: events whose arrays view a shared-memory ring while handlers run.

A subscription link over ``shm://`` receives each message as a lease on the ring
(:meth:`ShmConnection.recv_lease_batch`), decodes it without copying (the event's arrays are
``np.frombuffer`` views of the ring) and runs the handlers. What happens to the ring space
then depends on what the handlers kept, which :class:`Handoff` finds out by comparing
reference counts taken before the handlers with those after:

* nothing kept (the usual case: a handler that stacks, copies or loads the arrays into a
  model): the lease is released at once and the sender gets the space back;
* the event, or a dict/list that holds arrays, kept (e.g. queued for later): those arrays
  are replaced by copies in place, once, so whatever was kept stays valid after the ring
  is reused; the lease is released (counted as ``zero_copy_arrays_copied``);
* an array itself kept, or a view of it, a tensor made from it or a tuple holding it:
  that reference cannot be redirected, so the lease is held until nothing views the ring
  buffer any more (:meth:`Handoff.poll`, run after every message and every 50 ms while a
  lease is held; counted as ``zero_copy_leases_held``; ``held_leases`` is the number held
  now).
  A held lease holds back the ring space of later messages too, so the sender slows down
  (backpressure) instead of memory growing.

Nothing here copies unless something was kept, and a kept array never sees its bytes
overwritten. Reference counts are exact in CPython, which this relies on.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from tianji.runtime.events import Event

__all__ = ["Handoff", "Lease", "Marks"]

_CONTAINERS = (dict, list, tuple)
Marks = tuple[list[Any], list[int], int]
"""What :meth:`Handoff.before` saw: the objects, their reference counts and how many of
them (at the end) are root arrays."""


class Lease(Protocol):
    """A received message whose frames stay valid until :meth:`release` (``ShmLease``)."""

    frames: list[memoryview]

    def release(self) -> None: ...


class Handoff:
    """Settles each lease after its event's handlers ran (see the module docstring).

    Usage::

        handoff = Handoff()
        ev = codec.decode(lease.frames)  # the arrays view the ring
        with handoff.settled(lease, ev): # the lease is settled when the block ends
            ...                          # handlers run (they may raise)
        del ev                           # (the caller's reference, before the next one)
        handoff.poll()                   # now and then while ``held_now``: frees the holds

    :meth:`settled` is :meth:`before` and :meth:`after` around the block.
    """

    def __init__(self) -> None:
        self.arrays_copied = 0
        self.leases_held = 0  # leases ever held for a kept array
        self._held: list[tuple[Lease, list[np.ndarray]]] = []

    @property
    def held_now(self) -> int:
        """Leases held now for arrays a handler kept."""
        return len(self._held)

    def report(self, counters: dict[str, int], gauges: dict[str, float]) -> None:
        """Add what was copied and held (once anything was) to a heartbeat's counters,
        and the leases held now to its gauges."""
        if self.arrays_copied or self.leases_held:
            counters["zero_copy_arrays_copied"] = self.arrays_copied
            counters["zero_copy_leases_held"] = self.leases_held
        if self._held:
            gauges["held_leases"] = float(len(self._held))

    @contextlib.contextmanager
    def settled(self, lease: Lease, ev: Event) -> Iterator[None]:
        """Settle ``lease`` when the block ends, also when it raises: released, its kept
        arrays copied, or held (see the module docstring). References to ``ev`` that the
        block's caller holds count as not kept, as long as they live until the block ends."""
        marks = self.before(ev)
        try:
            yield
        finally:
            self.after(lease, ev, marks)
            del marks

    def before(self, ev: Event) -> Marks | None:
        """Reference counts of the event, of every array and container in it and of the
        buffers the arrays view (``None`` when it holds no array: nothing to track). Call
        :meth:`after` from the same frame, with the same references to ``ev`` alive."""
        objs = _holders(ev)
        if not objs:
            return None
        held = len(objs)
        objs += _roots(objs).values()  # (the dict is gone before the counts are taken)
        return objs, [sys.getrefcount(obj) for obj in objs], len(objs) - held

    def after(self, lease: Lease, ev: Event, marks: Marks | None) -> None:
        """Release ``lease``, or copy what was kept and release, or hold it (see above)."""
        if marks is None:
            lease.release()
            self.poll()
            return
        objs, counts, nroots = marks
        now = [sys.getrefcount(obj) for obj in objs]  # counted exactly as in before()
        hold = copy = False
        for i, count in enumerate(counts):
            if now[i] > count:
                if isinstance(objs[i], (np.ndarray, tuple)):
                    hold = True  # a reference we cannot redirect
                else:  # the event, a dict or a list: their arrays can be replaced by copies
                    copy = True
        roots = objs[len(objs) - nroots :]
        objs.clear()  # the caller's marks must not keep the arrays alive either
        if hold:
            self.leases_held += 1
            self._held.append((lease, roots))
        else:
            if copy:
                self.arrays_copied += _copy_arrays(ev)
            lease.release()
        self.poll()

    def poll(self) -> None:
        """Release the held leases whose arrays are all gone."""
        if not self._held:
            return
        still = []
        for lease, roots in self._held:
            # 3: the list ``roots``, the loop variable and getrefcount's argument
            if any(sys.getrefcount(r) > 3 for r in roots):
                still.append((lease, roots))
            else:
                roots.clear()
                lease.release()
        self._held = still


def _names(ev: Event) -> tuple[str, ...]:
    """The field names of an event (a msgspec struct)."""
    return ev.__struct_fields__


def _holders(ev: Event) -> list[Any]:
    """The arrays in the event, the containers on the way to them and (if there are any)
    the event itself."""
    out: list[Any] = []
    for name in _names(ev):
        _collect(getattr(ev, name), 4, out)
    if out:
        out.append(ev)
    return out


def _collect(value: object, depth: int, out: list[Any]) -> bool:
    """Append the arrays in ``value`` and the containers holding them; whether any."""
    kind = type(value)
    if kind is np.ndarray:
        out.append(value)
        return True
    if not depth or kind not in _CONTAINERS:
        return False
    found = False
    items: Any = value.values() if isinstance(value, dict) else value
    for item in items:
        found = _collect(item, depth - 1, out) or found
    if found:
        out.append(value)
    return found


def _roots(objs: list[Any]) -> dict[int, np.ndarray]:
    """The arrays made straight from the ring buffers that the arrays among ``objs`` view
    (by id): every view of those, however derived, keeps its root alive (numpy points a
    view's ``base`` at the root array). An array that is its own root is watched twice."""
    roots = {}
    for obj in objs:
        if type(obj) is np.ndarray:
            root = obj
            while isinstance(root.base, np.ndarray):
                root = root.base
            roots[id(root)] = root
    return roots


def _copy_arrays(ev: Event) -> int:
    """Replace every array in ``ev`` by a copy, in place (fields, dicts, lists; tuples are
    rebuilt); the number of arrays copied."""
    copied = 0

    def fix(value: Any, depth: int) -> Any:
        nonlocal copied
        if isinstance(value, np.ndarray):
            copied += 1
            return value.copy()
        if not depth:
            return value
        if isinstance(value, dict):
            for k, v in value.items():
                value[k] = fix(v, depth - 1)
        elif isinstance(value, list):
            value[:] = [fix(v, depth - 1) for v in value]
        elif isinstance(value, tuple):
            return tuple(fix(v, depth - 1) for v in value)
        return value

    for name in _names(ev):
        old = getattr(ev, name)
        new = fix(old, 4)
        if new is not old:
            object.__setattr__(ev, name, new)
    return copied
