"""Gradient all-reduce between data-parallel learners, over tianji's own transports: the
way of ``learner.allreduce = "transport"``, and of ``"auto"`` for small gradients.

PyTorch's collective (:mod:`tianji.services.collective`) sends about twice a gradient's
bytes per learner per step whatever K is; this all-to-all sends K - 1 copies, but without
the collective's per-call latency. Measured on 2 cores (``docs/scaling.md``), it is the
faster of the two while ``(K - 1) x parameters`` stays under about 2 M (K = 2 up to 1 M
parameters, K = 4 up to 100 k or more), the collective above (0.35x the all-to-all's time at
K = 4 and 10 M parameters): :func:`tianji.services.learner_sync.choose_way`.

Each of the K learners publishes its flat float32 gradient of every optimizer step as
:class:`~tianji.runtime.events.GradientsShared` on its own topic (:func:`gradients_topic`) and
subscribes to the K-1 others. Once it holds all K vectors of a step it averages them in
learner-index order: every learner runs the same float operations on the same inputs, so
the means are bit-identical and so are the weights after ``optimizer.step()``.

Steps are numbered by calls (one per optimizer step, from 0), never by batches: a learner
that drops a stale batch takes no step and fetches another one while its peers wait. A
peer can be at most one step ahead (it needs our vector to leave a step), so what is kept
is bounded; a vector for a past step is counted (``allreduce/late``), a second one for the
same step too (``allreduce/duplicate``). A peer that does not answer within ``timeout``
seconds, a peer far out of step, a gradient of another size or weights that differ (the
``digest`` of the weights before a step, compared every :attr:`AllReduce.DIGEST_EVERY`
steps and at step 0) fail the step with :class:`~tianji.runtime.errors.SyncFailed`, naming the
peer and the step.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence

import numpy as np

from tianji.rl.events import GradientsShared
from tianji.rl.topics import learner_name
from tianji.runtime.errors import SyncFailed
from tianji.runtime.loop import wait_set

__all__ = ["AllReduce", "average", "weights_digest"]

Publish = Callable[[GradientsShared], Awaitable[object]]


def average(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The float32 mean of ``parts``, summed in the order given, then divided by their number.

    The same inputs in the same order give bit-identical results on every learner.
    """
    total = np.array(parts[0], dtype=np.float32, copy=True)
    for part in parts[1:]:
        np.add(total, part, out=total)
    np.divide(total, np.float32(len(parts)), out=total)
    return total


def weights_digest(weights: Mapping[str, np.ndarray]) -> str:
    """A short hash of named arrays (names, dtypes, shapes and bytes, in name order)."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(weights):
        arr = np.ascontiguousarray(weights[name])
        h.update(f"{name}:{arr.dtype.str}:{arr.shape};".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


class AllReduce:
    """One learner's end of the all-reduce (runs on the event loop; see the module docstring).

    Usage (what the learner service does)::

        ar = AllReduce("learner-1", index=1, count=2, publish=publish, timeout=60.0)
        service.subscribe(gradients_topic(peer), ar.received)     # for every peer
        mean = await ar.reduce(flat_grads, digest)                 # steps 0, 1, 2, ...

    Args:
        name: this learner's service name.
        index: its index among the K learners.
        count: K.
        publish: sends a :class:`GradientsShared` to the peers.
        timeout: seconds to wait for the peers at one step.
        counters: where ``allreduce/late`` and ``allreduce/duplicate`` are counted.
    """

    DIGEST_EVERY = 100
    AHEAD = 2  # steps a peer may be ahead of us (it can be one; one more for slack)

    def __init__(
        self,
        name: str,
        *,
        index: int,
        count: int,
        publish: Publish,
        timeout: float,
        counters: collections.Counter[str] | None = None,
    ) -> None:
        self.name = name
        self.index = index
        self.count = count
        self.peers = {j: learner_name(j) for j in range(count) if j != index}
        self.timeout = timeout
        self.step = 0
        self.wait_s = 0.0
        self.counters = counters if counters is not None else collections.Counter()
        self._publish = publish
        self._parts: dict[int, dict[int, GradientsShared]] = {}
        self._error: SyncFailed | None = None
        self._changed = asyncio.Event()

    def wants_digest(self) -> bool:
        """Whether the next step carries a digest of the weights (step 0 and every
        :attr:`DIGEST_EVERY` steps)."""
        return self.step % self.DIGEST_EVERY == 0

    async def received(self, ev: GradientsShared) -> None:
        """Handler of the peers' :class:`GradientsShared` events."""
        if ev.step < self.step:
            self.counters["allreduce/late"] += 1
            return
        if ev.step > self.step + self.AHEAD or ev.index not in self.peers:
            self._error = SyncFailed(
                self.name,
                self.step,
                [ev.learner],
                f"got step {ev.step} from index {ev.index}: the learners are out of step",
            )
        else:
            parts = self._parts.setdefault(ev.step, {})
            if ev.index in parts:
                self.counters["allreduce/duplicate"] += 1
                return
            parts[ev.index] = ev
        self._changed.set()

    async def reduce(self, flat: np.ndarray, digest: str = "") -> np.ndarray:
        """Share ``flat`` for the current step, wait for the peers' and return the mean.

        Raises:
            SyncFailed: naming the peers that did not answer within ``timeout``, or that
                sent a vector of another size or a different weights digest.
        """
        step = self.step
        own = GradientsShared(
            learner=self.name, index=self.index, step=step, grads=flat, digest=digest
        )
        await self._publish(own)
        parts = await self._gather(step)
        parts[self.index] = own
        self._check(step, parts)
        mean = average([parts[j].grads for j in range(self.count)])
        del self._parts[step]
        self.step = step + 1
        return mean

    async def _gather(self, step: int) -> dict[int, GradientsShared]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.timeout
        try:
            while True:
                if self._error is not None:
                    raise self._error
                parts = self._parts.setdefault(step, {})
                if len(parts) == self.count - 1:
                    return dict(parts)
                if loop.time() >= deadline:
                    missing = [n for j, n in self.peers.items() if j not in parts]
                    reason = f"no gradient within {self.timeout:g} s from the peers listed"
                    raise SyncFailed(self.name, step, missing, reason)
                self._changed.clear()
                # a timeout is no error here: the loop above names who is late
                await wait_set(self._changed, deadline - loop.time())
        finally:
            self.wait_s += loop.time() - started

    def _check(self, step: int, parts: Mapping[int, GradientsShared]) -> None:
        own = parts[self.index]
        for j, ev in sorted(parts.items()):
            if ev.grads.shape != own.grads.shape or ev.grads.dtype != np.float32:
                reason = (
                    f"gradient {ev.grads.dtype}{ev.grads.shape} != ours float32{own.grads.shape}"
                )
                raise SyncFailed(self.name, step, [self.peers.get(j, ev.learner)], reason)
            if own.digest and ev.digest and ev.digest != own.digest:
                reason = "weights differ before this step (digests differ)"
                raise SyncFailed(self.name, step, [self.peers.get(j, ev.learner)], reason)
